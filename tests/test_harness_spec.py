"""The harness.yaml contract is what runs: every key that loads reaches the trainer, and every bad one fails at load.

The knob walk writes a real harness.yaml, loads it with the real loader and builds GRPOConfig and
LoraConfig through train/loop.py's own functions. The backtest tests run the real gate.
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest
from test_backtest import PARTIAL_CREDIT, propose, run, ws  # noqa: F401  (ws: a fixture)

from evotrainer.config import Config
from evotrainer.harness import HarnessError, load_harness
from evotrainer.harness.spec import GRPO_KNOBS, KNOBS, SECTIONS, HarnessYaml, Knob, contract_markdown, parse_spec
from evotrainer.paths import HARNESSES_DIR
from evotrainer.skills import set_yaml_key
from evotrainer.train.loop import grpo_config, lora_config

ROOT = Path(__file__).resolve().parents[1]
SEED = HARNESSES_DIR / "math"
# The keys harness.yaml accepted and silently dropped before the table (issue 13).
DROPPED_BEFORE = ("top_p", "top_k", "min_p", "repetition_penalty", "epsilon", "epsilon_high", "num_iterations",
                  "max_grad_norm", "warmup_ratio", "lora_dropout")
# GRPOConfig fields that follow from a knob besides its own argument.
FOLLOWS = {"num_generations": {"per_device_train_batch_size", "generation_batch_size"},
           "warmup_ratio": {"lr_scheduler_type"}}


def harness_with(tmp_path: Path, text: str | None = None, **grpo) -> Path:
    """A copy of the math seed whose harness.yaml is `text`, or the seed's with grpo keys set."""
    folder = tmp_path / "harness"
    shutil.copytree(SEED, folder)
    spec = (folder / "harness.yaml").read_text() if text is None else text
    for key, value in grpo.items():
        spec = set_yaml_key(spec, f"grpo.{key}", value)
    (folder / "harness.yaml").write_text(spec)
    return folder


def other_value(knob: Knob):
    """A value in bounds that is not the knob's default (nor the seed's)."""
    if knob.kind == "bool":
        return not knob.default
    if knob.kind == "choice":
        return next(c for c in knob.choices if c not in (knob.default, "dapo"))
    middle = (knob.low + knob.high) / 2
    return round(middle) if knob.kind == "int" else middle


def configs(folder: Path, tmp_path: Path):
    spec = load_harness(folder).spec
    return grpo_config(spec, Config(), 3, 0, tmp_path / "trainer"), lora_config(spec.grpo)


# ---------------------------------------------------------------- the table


@pytest.mark.parametrize("knob", GRPO_KNOBS, ids=lambda k: k.name)
def test_every_knob_reaches_its_trainer_config(tmp_path, knob):
    """Set one knob off its default; exactly its argument (and what follows from it) changes."""
    base_grpo, base_lora = configs(harness_with(tmp_path / "base"), tmp_path)
    value = other_value(knob)
    grpo, lora = configs(harness_with(tmp_path / "changed", **{knob.name: value}), tmp_path)
    owner, arg = knob.config_arg
    built, base = (grpo, base_grpo) if owner == "GRPOConfig" else (lora, base_lora)
    assert getattr(built, arg) == value != getattr(base, arg)
    changed = {k for k, v in built.to_dict().items() if base.to_dict()[k] != v}
    assert changed == {arg} | FOLLOWS.get(knob.name, set())
    other, other_base = (lora, base_lora) if owner == "GRPOConfig" else (grpo, base_grpo)
    assert other.to_dict() == other_base.to_dict()
    if knob.name == "warmup_ratio":  # it must warm up, not only be stored
        assert grpo.lr_scheduler_type == "constant_with_warmup" and grpo.get_warmup_steps(10) == 5


def test_the_keys_dropped_before_are_walked():
    walked = {k.name for k in GRPO_KNOBS if k.config_arg}
    assert set(DROPPED_BEFORE) <= walked == {k.name for k in GRPO_KNOBS}


def test_every_key_the_model_accepts_is_in_the_table():
    assert list(HarnessYaml.model_fields) == list(SECTIONS)
    for section, knobs in SECTIONS.items():
        if section == "reward_weights":
            continue  # free component names, each typed by the table's one row
        model = HarnessYaml.model_fields[section].annotation
        assert list(model.model_fields) == [k.name for k in knobs], section
        assert model.model_config["extra"] == "forbid"
    assert HarnessYaml.model_config["extra"] == "forbid"


def test_every_destination_exists():
    from peft import LoraConfig
    from trl import GRPOConfig

    params = {"GRPOConfig": inspect.signature(GRPOConfig).parameters,
              "LoraConfig": inspect.signature(LoraConfig).parameters}
    for knob in KNOBS:
        if knob.config_arg:
            owner, arg = knob.config_arg
            assert arg in params[owner], knob.key
        else:
            assert (ROOT / "evotrainer" / knob.target).is_file(), knob.key
        assert knob.doc and knob.bounds()


def test_grpo_defaults_are_trls_and_lora_defaults_are_build_pefts():
    from trl import GRPOConfig

    trl_defaults = inspect.signature(GRPOConfig).parameters
    for knob in GRPO_KNOBS:
        owner, arg = knob.config_arg
        if owner == "GRPOConfig":
            assert knob.default == trl_defaults[arg].default, knob.name
    assert {k.name: k.default for k in GRPO_KNOBS if k.config_arg[0] == "LoraConfig"} == {
        "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.0}


def test_docs_are_the_table():
    assert (ROOT / "docs" / "harness-yaml.md").read_text() == contract_markdown(), \
        "docs/harness-yaml.md is stale: regenerate it (the command is in its header)"


def test_seed_harnesses_build_the_configs_they_built_before(tmp_path):
    """Honest harnesses train exactly as before: the old grpo_args' explicit arguments, TRL's
    defaults for the rest, and the LoRA build_peft always made."""
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig

    for domain in ("math", "code", "swe"):
        spec = load_harness(HARNESSES_DIR / domain).spec
        g = spec.grpo
        before = GRPOConfig(
            output_dir=str(tmp_path), max_steps=3, seed=0, per_device_train_batch_size=2 * g["num_generations"],
            gradient_accumulation_steps=1, num_generations=g["num_generations"], temperature=g["temperature"],
            max_completion_length=g["max_completion_length"], loss_type=g["loss_type"],
            scale_rewards=g["scale_rewards"], beta=g["beta"], learning_rate=g["learning_rate"],
            lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True, gradient_checkpointing=False,
            mask_truncated_completions=False)
        assert grpo_config(spec, Config(), 3, 0, tmp_path).to_dict() == before.to_dict(), domain
        assert lora_config(g).to_dict() == LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                       target_modules="all-linear", task_type="CAUSAL_LM").to_dict()


def test_every_skill_renders_a_valid_harness_yaml_on_every_seed_it_applies_to():
    from evotrainer.harness.loader import read_sources
    from evotrainer.skills import SkillLibrary

    checked = 0
    for skill in SkillLibrary.load(None):
        for domain in ("math", "code", "swe"):
            if not skill.applies_to(domain):
                continue
            sources = read_sources(HARNESSES_DIR / domain)
            for params in skill.grid_points():
                text = skill.render(sources, params).get("harness.yaml")
                if text is not None:
                    parse_spec(text)
                    checked += 1
    assert checked >= 10  # the skills that edit harness.yaml, on each of their domains and grid points


# ---------------------------------------------------------------- one regression test per hole


def test_empty_grpo_section_trains_with_the_documented_defaults(tmp_path):
    """`grpo: {}` loaded, then training died with KeyError after promotion; now it is TRL's defaults."""
    from trl import GRPOConfig

    folder = harness_with(tmp_path, "grpo: {}\nreward_weights: {correct: 1.0}\n")
    grpo, lora = configs(folder, tmp_path)
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)  # TRL with nothing set
    for knob in GRPO_KNOBS:
        owner, arg = knob.config_arg
        if owner == "GRPOConfig" and arg != "warmup_steps":
            assert getattr(grpo, arg) == getattr(plain, arg), arg
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 32, 0.0)
    assert parse_spec("grpo:\nmemory:\n").grpo == parse_spec("grpo: {}").grpo  # empty sections are defaults


@pytest.mark.parametrize("text, message", [
    ("experiance: {share: 0.5}\n", "harness.yaml: experiance: unknown section (did you mean experience?)"),
    ("grpo: {toop_p: 0.9}\n", "harness.yaml: grpo.toop_p: unknown key (did you mean top_p?)"),
    ("memory: {size: 3}\n", "harness.yaml: memory.size: unknown key (known: enabled, capacity"),
    ("step_credit: {enabled: true, gamma: 1}\n", "harness.yaml: step_credit.gamma: unknown key"),
])
def test_unknown_sections_and_keys_fail_at_load_naming_file_and_key(tmp_path, text, message):
    with pytest.raises(HarnessError) as info:
        load_harness(harness_with(tmp_path, text))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("key, value, message", [
    ("num_generations", 1_000_000_000, "grpo.num_generations: must be an integer in [2, 64], got 1000000000"),
    ("num_generations", "1e9", "grpo.num_generations: must be an integer in [2, 64], got '1e9'"),
    ("num_generations", 1.0e9, "grpo.num_generations: must be an integer in [2, 64], got 1000000000.0"),
    ("lora_rank", 1_000_000_000, "grpo.lora_rank: must be an integer in [1, 256], got 1000000000"),
    ("lora_rank", "1e9", "grpo.lora_rank: must be an integer in [1, 256], got '1e9'"),
    ("max_completion_length", 10**6, "grpo.max_completion_length: must be an integer in [1, 8192]"),
    ("learning_rate", 1.0, "grpo.learning_rate: must be a number in (0, 0.01], got 1.0"),
    ("temperature", 0, "grpo.temperature: must be a number in (0, 4], got 0"),
    ("temperature", ".nan", "grpo.temperature: must be a number in (0, 4]"),
    ("num_generations", True, "grpo.num_generations: must be an integer in [2, 64], got True"),
    ("lora_dropout", 0.9, "grpo.lora_dropout: must be a number in [0, 0.5], got 0.9"),
])
def test_out_of_bounds_and_mistyped_knobs_fail_at_load(tmp_path, key, value, message):
    folder = harness_with(tmp_path, **{key: value})
    if value == ".nan":  # a YAML float, not a string
        text = (folder / "harness.yaml").read_text().replace("'.nan'", ".nan")
        (folder / "harness.yaml").write_text(text)
    with pytest.raises(HarnessError) as info:
        load_harness(folder)
    assert str(info.value).startswith(f"harness.yaml: {message}"), str(info.value)


@pytest.mark.parametrize("section, message", [
    ("{enabled: yes please}", "step_credit.enabled: must be true or false, got 'yes please'"),
    ("{enabled: true, alpha: -1}", "step_credit.alpha: must be a number in [0, 1], got -1"),
    ("{alpha: 5}", "step_credit.alpha: must be a number in [0, 1], got 5"),
    ("[on]", "step_credit: must be a mapping, got list"),
])
def test_step_credit_is_validated_at_load_not_at_training(tmp_path, section, message):
    seed = (SEED / "harness.yaml").read_text()
    with pytest.raises(HarnessError) as info:
        load_harness(harness_with(tmp_path, seed + f"step_credit: {section}\n"))
    assert str(info.value) == f"harness.yaml: {message}"


def test_a_key_given_twice_fails_instead_of_the_last_one_winning(tmp_path):
    """PyYAML keeps the last of two equal keys: the reviewer would read one value and training another."""
    seed = (SEED / "harness.yaml").read_text()
    with pytest.raises(HarnessError, match=r"harness.yaml: invalid YAML at line \d+: key 'grpo' given twice"):
        load_harness(harness_with(tmp_path, seed + "grpo: {num_generations: 64}\n"))
    with pytest.raises(HarnessError, match="key 'beta' given twice"):
        parse_spec("grpo: {beta: 0.0, beta: 9}")


def test_hostile_yaml_fails_cleanly_and_fast():
    """Deep nesting, an alias bomb, merge keys, unsafe tags, a 5000-digit integer and a huge file are
    named load failures, never a hang, a traceback or a value that hides behind another."""
    for levels in (20000, 9):
        with pytest.raises(HarnessError, match="invalid YAML at line 1: nested deeper than 8 levels"):
            parse_spec("grpo: {top_k: " + "[" * levels + "]" * levels + "}")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))
    for text, message in (
        (bomb + "grpo: {top_k: *i}\n", "line 1: anchors and aliases (&, *) are not allowed"),  # 10**9 leaves
        ("grpo: {<<: {num_generations: 64}, num_generations: 8}", "line 1: merge keys (<<) are not allowed"),
        ("grpo: !!python/object/apply:os.system [id]", "line 1: could not determine a constructor"),
        ("grpo: {num_generations: " + "9" * 5000 + "}", "invalid YAML: Exceeds the limit"),
        ("# " + "x" * 70000 + "\ngrpo: {}\n", "70012 bytes, more than the 65536"),
        ("grpo: {num_generations: 8}\x00", "invalid YAML: unacceptable character"),
    ):
        with pytest.raises(HarnessError) as info:
            parse_spec(text)
        assert message in str(info.value) and len(str(info.value)) < 300, str(info.value)[:300]


def test_reward_weights_are_bounded_and_named():
    assert parse_spec("reward_weights: {correct: 1, partial: -0.5}").reward_weights == {"correct": 1.0,
                                                                                       "partial": -0.5}
    for text, message in (("reward_weights: {correct: 1.0e9}", "reward_weights.correct: must be a number in "
                                                               "[-1000, 1000], got '1.0e9'"),
                          ("reward_weights: {7: 1}", "reward_weights: a key must be a non-empty string, got 7"),
                          ("reward_weights: {correct: .inf}", "reward_weights.correct: must be a number")):
        with pytest.raises(HarnessError) as info:
            parse_spec(text)
        assert str(info.value).startswith(f"harness.yaml: {message}"), str(info.value)


# ---------------------------------------------------------------- the gate


def yaml_edit(**grpo) -> str:
    text = (SEED / "harness.yaml").read_text()
    for key, value in grpo.items():
        text = set_yaml_key(text, f"grpo.{key}", value)
    return text


@pytest.mark.parametrize("knob, value", [("num_generations", 1_000_000_000), ("lora_rank", 1_000_000_000),
                                         ("toop_p", 0.9)])
def test_a_real_fix_with_a_bad_harness_yaml_is_rejected_by_the_backtest(ws, knob, value):  # noqa: F811
    """PARTIAL_CREDIT alone is promoted (tests/test_backtest.py); with the bad key it fails to load."""
    report = run(ws, propose(ws, "partial-" + knob.replace("_", "-"), PARTIAL_CREDIT, **{"harness.yaml": yaml_edit(**{knob: value})}))
    assert report["decision"] == "reject"
    assert report["failure"]["harness"] == "candidate"
    assert f"harness.yaml: grpo.{knob}:" in report["failure"]["reason"], report["failure"]
    assert report["reasons"][0].startswith("the candidate failed: ")


def test_the_same_fix_with_an_in_bounds_change_is_still_promoted(ws):  # noqa: F811
    report = run(ws, propose(ws, "partial-wide", PARTIAL_CREDIT,
                             **{"harness.yaml": yaml_edit(num_generations=64, lora_rank=256, top_p=0.95)}))
    assert report["decision"] == "promote", report["reasons"]
    assert report["failure"] is None


# ---------------------------------------------------------------- training


@pytest.mark.slow
def test_a_round_trains_with_the_knobs_that_were_dropped_before(tmp_path, embedded_model_dir):
    """What now reaches TRL must also train: one real round of the tiny config with each of them set."""
    import json

    from evotrainer.config import load_config
    from evotrainer.paths import CONFIGS_DIR
    from evotrainer.store import Store
    from evotrainer.train.loop import open_session, run_training

    folder = harness_with(tmp_path, num_generations=4, max_completion_length=16, top_p=0.9, top_k=20,
                          min_p=0.05, repetition_penalty=1.1, epsilon=0.1, epsilon_high=0.28, num_iterations=2,
                          max_grad_norm=0.5, warmup_ratio=0.5, lora_rank=8, lora_alpha=16, lora_dropout=0.1)
    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", [f"harness={folder}"])
    session = open_session(cfg, tmp_path / "work")
    assert session.grpo["num_iterations"] == 2 and session.grpo["warmup_ratio"] == 0.5
    result = run_training(session)
    adapter = json.loads((Path(result["rounds"][0].adapter) / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["lora_dropout"]) == (8, 16, 0.1)
    rows = list(Store.open(tmp_path / "work").iter_rollouts(run_id=session.run_id))
    # num_iterations 2: the second step trains again on the first step's generations
    assert len(rows) == cfg.train.prompts_per_step * 4
    assert all(row.rollout.num_tokens <= 16 for row in rows)
