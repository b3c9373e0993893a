"""The harness loader: the seed math harness works, and every harness fault is a named HarnessError."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from factories import make_rollout

from evotrainer.api import TaskStats, Turn
from evotrainer.harness import Harness, HarnessError, load_harness
from evotrainer.harness.loader import read_sources

SEED = Path(__file__).resolve().parents[1] / "harnesses" / "math"


def rollout(success=True, kind="ok", flags=("answer_marker",), group="g1", tokens=10, truncated=False, i=0):
    return make_rollout(f"r{i}", task_id="math-L0-abc", group_id=group, prompt="What is 7 + 5?", completion="Answer: 12",
                        success=success, kind=kind, flags=flags, num_tokens=tokens, truncated=truncated)


@pytest.fixture
def harness_dir(tmp_path):
    folder = tmp_path / "harness"
    shutil.copytree(SEED, folder)
    return folder


def edit(folder: Path, filename: str, text: str) -> Path:
    (folder / filename).write_text(text)
    return folder


def fails(folder: Path, *parts: str) -> str:
    with pytest.raises(HarnessError) as info:
        load_harness(folder)
    for part in parts:
        assert part in str(info.value), str(info.value)
    return str(info.value)


# ---------------------------------------------------------------- the seed harness


def test_seed_harness_loads_and_rewards():
    harness = load_harness(SEED)
    given = {
        "num_generations": 8, "temperature": 1.0, "max_completion_length": 32, "loss_type": "dapo",
        "scale_rewards": "group", "beta": 0.0, "learning_rate": 2.0e-4, "lora_rank": 16, "lora_alpha": 32,
    }
    assert {k: harness.spec.grpo[k] for k in given} == given  # the rest: defaults (test_harness_spec.py)
    assert harness.spec.reward_weights == {"correct": 1.0, "format": 0.1}
    assert re.fullmatch(r"[0-9a-f]{12}", harness.version)

    right = harness.reward(rollout())
    assert right == {"correct": 1.0, "format": 1.0}
    assert harness.training_reward(right) == pytest.approx(1.1)
    wrong = harness.reward(rollout(success=False, kind="wrong", flags=()))
    assert wrong == {"correct": 0.0, "format": 1.0} and harness.training_reward(wrong) == pytest.approx(0.1)
    cut = harness.reward(rollout(success=False, kind="truncated", flags=(), truncated=True))
    assert cut == {"correct": 0.0, "format": 0.0} and harness.training_reward(cut) == 0.0
    assert harness.training_reward({"correct": 1.0, "unweighted": 0.5}) == 1.5

    assert harness.keep_rollout(rollout()) is True
    assert harness.keep_group([rollout(), rollout()], [1.1, 1.1]) is True
    stats = [TaskStats("a", 4, 1), TaskStats("b", 0, 0)]
    assert harness.weights(stats) == {"a": 1.0, "b": 1.0}
    assert harness.render_prompt("What is 7 + 5?") == 'What is 7 + 5?\nGive the final answer after "Answer:".'
    assert harness.stop([Turn("assistant", "hi")]) is None


def test_seed_probes():
    harness = load_harness(SEED)
    probes = {p.name: p for p in harness.probes}
    original = {"success_rate", "dead_group_ratio", "format_error_rate", "truncation_rate", "mean_tokens"}
    assert original <= set(probes)
    batch = [
        rollout(group="g1", i=0), rollout(success=False, kind="wrong", flags=(), group="g1", i=1),
        rollout(success=False, kind="format_error", flags=(), group="g2", tokens=32, truncated=True, i=2),
        rollout(success=False, kind="format_error", flags=(), group="g2", tokens=32, truncated=True, i=3),
    ]
    rewards = [harness.training_reward(harness.reward(r)) for r in batch]
    values = {k: v for k, v in harness.probe_values(batch, rewards).items() if k in original}
    assert values == {"success_rate": 0.25, "dead_group_ratio": 0.5, "format_error_rate": 0.5,
                      "truncation_rate": 0.5, "mean_tokens": 21.0}
    assert probes["dead_group_ratio"].level(0.5) == "warn" and probes["dead_group_ratio"].level(0.6) == "critical"
    assert probes["success_rate"].level(0.25) == "ok" and probes["success_rate"].level(0.01) == "critical"
    assert all(v in (0.0, None) for v in harness.probe_values([], []).values())


def test_two_versions_side_by_side_and_no_bytecode_in_the_repo(harness_dir):
    seed = load_harness(SEED)
    edit(harness_dir, "reward.py", (SEED / "reward.py").read_text().replace('"correct": 1.0', '"correct": 2.0'))
    changed = load_harness(harness_dir)
    assert changed.version != seed.version
    assert seed.reward(rollout())["correct"] == 1.0 and changed.reward(rollout())["correct"] == 2.0
    assert load_harness(SEED).version == seed.version
    assert not list(harness_dir.rglob("__pycache__")) and not list(SEED.rglob("__pycache__"))


def test_harness_from_sources_without_a_folder():
    sources = read_sources(SEED)
    assert Harness(sources, Path("commit:abc")).version == load_harness(SEED).version


def test_harness_code_may_use_numpy_and_dataclasses(harness_dir):
    edit(harness_dir, "filters.py", (
        "from __future__ import annotations\nfrom dataclasses import dataclass\nimport numpy as np\n"
        "@dataclass\nclass Rule:\n    min_std: float = 0.0\n"
        "def keep_rollout(rollout):\n    return True\n"
        "def keep_group(rollouts, rewards):\n    return np.std(rewards) > Rule().min_std\n"
    ))
    harness = load_harness(harness_dir)
    assert harness.keep_group([rollout(), rollout()], [1.0, 0.0]) is True
    assert harness.keep_group([rollout(), rollout()], [1.0, 1.0]) is False


# ---------------------------------------------------------------- faults


def test_missing_folder(tmp_path):
    fails(tmp_path / "nope", "nope", "harness folder not found")


@pytest.mark.parametrize("filename, needs", [("reward.py", "reward()"), ("filters.py", "keep_group()"),
                                             ("diagnostics.py", "PROBES"), ("harness.yaml", "reward weights")])
def test_missing_file(harness_dir, filename, needs):
    (harness_dir / filename).unlink()
    fails(harness_dir, f"{filename}: file not found", needs)


@pytest.mark.parametrize("filename, text, parts", [
    ("reward.py", "def rewards(rollout):\n    return {}\n", ["reward.py: reward() is not defined"]),
    ("filters.py", "def keep_rollout(r):\n    return True\n", ["filters.py: keep_group() is not defined"]),
    ("filters.py", "keep_rollout = True\ndef keep_group(r, w):\n    return True\n",
     ["filters.py: keep_rollout is bool, expected a function keep_rollout()"]),
    ("rollout.py", "def stop(t):\n    return None\n", ["rollout.py: PROMPT is not defined"]),
    ("rollout.py", "PROMPT = 3\ndef stop(t):\n    return None\n", ["rollout.py: PROMPT is int"]),
    ("rollout.py", "PROMPT = '{{ question'\ndef stop(t):\n    return None\n", ["rollout.py: PROMPT is not a valid Jinja"]),
    ("diagnostics.py", "PROBES = {}\n", ["diagnostics.py: PROBES is dict"]),
])
def test_missing_or_wrong_definitions(harness_dir, filename, text, parts):
    fails(edit(harness_dir, filename, text), *parts)


def test_syntax_error_names_file_line_and_function(harness_dir):
    edit(harness_dir, "curriculum.py", "def weights(task_stats)\n    return {}\n")
    fails(harness_dir, "curriculum.py: syntax error at line 1", "weights()")


def test_module_that_raises_on_load(harness_dir):
    edit(harness_dir, "reward.py", "import json\nVALUE = 1 / 0\ndef reward(r):\n    return {}\n")
    fails(harness_dir, "reward.py", "reward()", "ZeroDivisionError")


def test_forbidden_imports(harness_dir):
    fails(edit(harness_dir, "reward.py", "import torch\ndef reward(r):\n    return {}\n"),
          "reward.py: import of 'torch' at line 1 is not allowed")
    fails(edit(harness_dir, "reward.py", "from evotrainer import store\ndef reward(r):\n    return {}\n"),
          "reward.py: import of 'evotrainer.store'")
    fails(edit(harness_dir, "reward.py", "from . import x\ndef reward(r):\n    return {}\n"),
          "reward.py: relative import")


@pytest.mark.parametrize("text, parts", [
    ("grpo: [unclosed\n", ["harness.yaml: invalid YAML at line"]),
    ("- just\n- a list\n", ["harness.yaml: expected a mapping"]),
    ("grpo: 3\n", ["harness.yaml: grpo: must be a mapping"]),
    ("grpo: {temperature: hot}\n", ["harness.yaml: grpo.temperature: must be a number in (0, 4], got 'hot'"]),
    ("grpo: {num_generations: 1}\n", ["harness.yaml: grpo.num_generations: must be an integer in [2, 64], got 1"]),
    ("grpo: {loss_type: ppo}\n", ["harness.yaml: grpo.loss_type: must be one of"]),
    ("grpo: {temprature: 1.0}\n", ["harness.yaml: grpo.temprature: unknown key (did you mean temperature?)"]),
    ("grpo: {}\nreward_weights: {correct: lots}\n", ["harness.yaml: reward_weights.correct: must be a number"]),
    ("grpo: {}\nreward_weights: [1]\n", ["harness.yaml: reward_weights: must be a mapping"]),
])
def test_bad_harness_yaml(harness_dir, text, parts):
    fails(edit(harness_dir, "harness.yaml", text), *parts)


def test_yaml_exponent_without_dot_is_read_as_a_number(harness_dir):
    edit(harness_dir, "harness.yaml", "grpo: {learning_rate: 5e-5, scale_rewards: false}\n")
    grpo = load_harness(harness_dir).spec.grpo
    assert (grpo["learning_rate"], grpo["scale_rewards"]) == (5e-5, "none")


def call_fails(harness_dir, filename, text, method, *args, parts):
    harness = load_harness(edit(harness_dir, filename, text))
    with pytest.raises(HarnessError) as info:
        getattr(harness, method)(*args)
    for part in parts:
        assert part in str(info.value), str(info.value)


def test_function_that_raises_keeps_type_and_message(harness_dir):
    call_fails(harness_dir, "reward.py", "def reward(r):\n    return {'x': r.meta['missing']}\n",
               "reward", rollout(), parts=["reward.py: reward() raised KeyError: 'missing'"])


def test_function_that_exits_is_a_harness_error(harness_dir):
    call_fails(harness_dir, "curriculum.py", "import sys\ndef weights(s):\n    sys.exit(3)\n",
               "weights", [TaskStats("a", 1, 1)], parts=["curriculum.py: weights() raised SystemExit"])


@pytest.mark.parametrize("body, parts", [
    ("return [1.0]", ["reward.py: reward() returned list, expected dict[str, float]"]),
    ("return {'x': '1'}", ["reward.py: reward()", "'x': '1'", "finite float"]),
    ("return {'x': float('nan')}", ["reward.py: reward()", "nan"]),
    ("return {'x': True}", ["reward.py: reward()", "True"]),
    ("return {1: 1.0}", ["reward.py: reward() returned a int key"]),
])
def test_reward_wrong_return(harness_dir, body, parts):
    call_fails(harness_dir, "reward.py", f"def reward(r):\n    {body}\n", "reward", rollout(), parts=parts)


def test_reward_accepts_ints_and_numpy(harness_dir):
    edit(harness_dir, "reward.py", "import numpy as np\ndef reward(r):\n    return {'a': 1, 'b': np.float32(0.5)}\n")
    assert load_harness(harness_dir).reward(rollout()) == {"a": 1.0, "b": 0.5}


def test_filters_wrong_return(harness_dir):
    text = "def keep_rollout(r):\n    return 'yes'\ndef keep_group(rs, ws):\n    return 1\n"
    call_fails(harness_dir, "filters.py", text, "keep_rollout", rollout(),
               parts=["filters.py: keep_rollout() returned str, expected bool"])
    call_fails(harness_dir, "filters.py", text, "keep_group", [rollout()], [1.0],
               parts=["filters.py: keep_group() returned int, expected bool"])


@pytest.mark.parametrize("body, parts", [
    ("return [1.0]", ["curriculum.py: weights() returned list"]),
    ("return {'a': -1.0}", ["curriculum.py: weights()", "'a': -1.0", ">= 0"]),
    ("return {'zzz': 1.0}", ["curriculum.py: weights() returned a weight for unknown task id 'zzz'"]),
    ("return {'a': 0, 'b': 0.0}", ["curriculum.py: weights() gave every task weight 0"]),
])
def test_weights_wrong_return(harness_dir, body, parts):
    call_fails(harness_dir, "curriculum.py", f"def weights(s):\n    {body}\n", "weights",
               [TaskStats("a", 1, 0), TaskStats("b", 2, 1)], parts=parts)


def test_weights_default_missing_tasks_to_one(harness_dir):
    edit(harness_dir, "curriculum.py", "def weights(s):\n    return {'a': 3}\n")
    assert load_harness(harness_dir).weights([TaskStats("a", 1, 0), TaskStats("b", 0, 0)]) == {"a": 3.0, "b": 1.0}


def test_stop_and_prompt_faults(harness_dir):
    text = "PROMPT = '{{ question }} {{ hint }}'\ndef stop(t):\n    return 5\n"
    call_fails(harness_dir, "rollout.py", text, "stop", [], parts=["rollout.py: stop() returned 5"])
    call_fails(harness_dir, "rollout.py", text, "render_prompt", "q?",
               parts=["rollout.py: rendering PROMPT", "'hint' is undefined"])
    assert load_harness(harness_dir).render_prompt("q?", hint="h") == "q? h"


def test_prompt_template_is_sandboxed(harness_dir):
    text = "PROMPT = '{{ question.__class__.__mro__[1].__subclasses__() }}'\ndef stop(t):\n    return None\n"
    call_fails(harness_dir, "rollout.py", text, "render_prompt", "q", parts=["rollout.py: rendering PROMPT"])


@pytest.mark.parametrize("probe, parts", [
    ("{'name': 'p', 'dimension': 'vibes', 'fn': f, 'warn': 1, 'critical': 2, 'direction': 'above'}",
     ["diagnostics.py: PROBES[0] (p): dimension must be one of"]),
    ("{'name': 'p', 'dimension': 'result', 'fn': 3, 'warn': 1, 'critical': 2, 'direction': 'above'}",
     ["diagnostics.py: PROBES[0] (p): fn must be callable"]),
    ("{'name': 'p', 'dimension': 'result', 'fn': f, 'warn': 1, 'critical': 2, 'direction': 'below'}",
     ["diagnostics.py: PROBES[0] (p): critical 2 is milder than warn 1"]),
    ("{'name': 'p', 'dimension': 'result', 'fn': f, 'warn': None, 'critical': 2, 'direction': 'above'}",
     ["diagnostics.py: PROBES[0] (p): warn must be a finite number"]),
])
def test_bad_probes(harness_dir, probe, parts):
    fails(edit(harness_dir, "diagnostics.py", f"def f(rs, ws):\n    return 0.0\nPROBES = [{probe}]\n"), *parts)


def test_probe_that_raises_or_returns_junk(harness_dir):
    edit(harness_dir, "diagnostics.py", (
        "from types import SimpleNamespace\n"
        "def boom(rs, ws):\n    return 1 / len(rs)\n"
        "def junk(rs, ws):\n    return 'high'\n"
        "PROBES = [SimpleNamespace(name='boom', dimension='result', fn=boom, warn=1, critical=2, direction='above'),\n"
        "          {'name': 'junk', 'dimension': 'model_state', 'fn': junk, 'warn': 1, 'critical': 2, 'direction': 'above'}]\n"
    ))
    boom, junk = load_harness(harness_dir).probes
    with pytest.raises(HarnessError, match=r"diagnostics\.py: probe boom\(\) raised ZeroDivisionError"):
        boom.evaluate([], [])
    with pytest.raises(HarnessError, match=r"diagnostics\.py: probe junk\(\) returned 'high'"):
        junk.evaluate([], [])
