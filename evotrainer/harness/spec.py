"""harness.yaml: one table of every key (where it goes, its bounds, its doc) and the typed model built from it.

Every key harness.yaml accepts is a row of KNOBS, and the pydantic model that validates the file
is generated from those rows, so no key can load without a bound, a doc and a place it goes: a
`GRPOConfig` or `LoraConfig` argument (train/loop.py builds both through `trainer_kwargs`), or the
part of our own code that reads it. A GRPO knob left out gets TRL 1.16's default; a LoRA knob the
value build_peft always used; every section may be left out or empty. Unknown sections and keys,
wrong types and values out of bounds fail at load, naming the file and the key, so a bad
harness.yaml fails its backtest, never training after promotion. docs/harness-yaml.md is
`contract_markdown()`, kept equal by a test.

Bounds are sanity limits for LoRA GRPO on one machine, wide enough for any honest setting: they
stop a value that would exhaust the machine (num_generations, max_completion_length, lora_rank)
or make the update meaningless (a learning rate above 1e-2, a clip below zero).
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from evotrainer.harness.errors import HarnessError

SPEC_FILE = "harness.yaml"
MAX_BYTES = 64 * 1024  # the seeds are ~1.5 KB; a bigger file is a mistake or an attack on the parser
MAX_DEPTH = 8  # the seeds nest 2 deep; PyYAML composes recursively, so deep nesting costs seconds
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16
SCALE_REWARDS = ("group", "batch", "none")
# Loss types whose ratio is clipped to [1 - epsilon, 1 + epsilon_high] (TRL 1.16), where a wider
# upper clip for guided rollouts (experience.clip_high) means what it says.
RATIO_CLIP_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo", "luspo")


@dataclass(frozen=True)
class Knob:
    """One harness.yaml key: its type and bounds, its default, and where its value goes.

    `target` is "GRPOConfig.<arg>" or "LoraConfig.<arg>" for a trainer argument, else the module
    of ours that reads it. Number bounds are closed unless `low_open` / `high_open`."""

    section: str
    name: str
    kind: Literal["int", "float", "bool", "choice"]
    default: Any
    target: str
    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False  # null is a value too (TRL's "unset")
    legacy: tuple[tuple[Any, str], ...] = ()  # old spellings read as a choice, e.g. (True, "group")

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def config_arg(self) -> tuple[str, str] | None:
        """("GRPOConfig", "top_p") for a trainer argument, else None."""
        owner, _, arg = self.target.partition(".")
        return (owner, arg) if owner in TRAINER_CONFIGS else None

    def bounds(self) -> str:
        """The accepted values, e.g. "an integer in [2, 64]", "a number in (0, 4] or null"."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(self.choices)
        else:
            text = (f"{'an integer' if self.kind == 'int' else 'a number'} in {'(' if self.low_open else '['}"
                    f"{self.low:g}, {self.high:g}{')' if self.high_open else ']'}")
        return text + (" or null" if self.nullable else "")

    def annotation(self) -> Any:
        """The pydantic type that enforces `bounds()`."""
        if self.kind == "bool":
            inner: Any = Annotated[bool, Strict()]
        elif self.kind == "choice":
            inner = Annotated[Literal[self.choices], BeforeValidator(_legacy(self.legacy))]
        elif self.kind == "int":
            inner = Annotated[int, Strict(), Field(ge=self.low, le=self.high)]
        else:
            limits = {("gt" if self.low_open else "ge"): self.low, ("lt" if self.high_open else "le"): self.high}
            inner = Annotated[float, BeforeValidator(_yaml_float), Strict(), Field(allow_inf_nan=False, **limits)]
        return inner | None if self.nullable else inner


def _yaml_float(value: Any) -> Any:
    """PyYAML (YAML 1.1) reads `5e-5`, an exponent without a dot, as a string."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _legacy(spellings: tuple[tuple[Any, str], ...]):
    def read(value: Any) -> Any:
        for old, new in spellings:
            if value is old:  # `is`: True must not match 1
                return new
        return value

    return read


TRAINER_CONFIGS = ("GRPOConfig", "LoraConfig")


def _grpo(name: str, kind: str, default: Any, doc: str, low: float | None = None, high: float | None = None,
          arg: str | None = None, owner: str = "GRPOConfig", **more: Any) -> Knob:
    return Knob("grpo", name, kind, default, f"{owner}.{arg or name}", doc, low, high, **more)  # type: ignore[arg-type]


# The GRPO and LoRA knobs a harness owns. Defaults: TRL 1.16's GRPOConfig defaults (a test checks
# them against its signature), and for LoRA what build_peft has always used.
GRPO_KNOBS: tuple[Knob, ...] = (
    _grpo("num_generations", "int", 8, "completions per prompt (the GRPO group); the batch is "
          "train.prompts_per_step x this", 2, 64),
    _grpo("temperature", "float", 1.0, "sampling temperature of training rollouts", 0, 4, low_open=True),
    _grpo("top_p", "float", 1.0, "nucleus sampling: keep the smallest token set with this much mass; 1 = off",
          0, 1, low_open=True),
    _grpo("top_k", "int", 0, "keep only the k most likely tokens; 0 = off", 0, 1000),
    _grpo("min_p", "float", None, "drop tokens below this share of the top token's probability; null = off",
          0, 1, nullable=True),
    _grpo("repetition_penalty", "float", 1.0, "> 1 discourages repeating tokens, < 1 encourages it; "
          "1 = off", 0.5, 2),
    _grpo("max_completion_length", "int", 512, "tokens per completion; longer ones are truncated", 1, 8192),
    _grpo("loss_type", "choice", "dapo", "TRL's loss formulation (token normalisation / clipping)",
          choices=LOSS_TYPES),
    _grpo("scale_rewards", "choice", "group", "divide advantages by the reward std of the group, the "
          "batch, or not at all (true/false: group/none)", choices=SCALE_REWARDS,
          legacy=((True, "group"), (False, "none"))),
    _grpo("mask_truncated_completions", "bool", False, "truncated completions carry no loss"),
    _grpo("beta", "float", 0.0, "KL coefficient against the reference model; 0 = no reference model", 0, 10),
    _grpo("epsilon", "float", 0.2, "lower clip of the importance ratio (1 - epsilon)", 0, 1),
    _grpo("epsilon_high", "float", None, "upper clip of the importance ratio (1 + epsilon_high; cispo: "
          "its epsilon max); null = epsilon", 0, 10, low_open=True, nullable=True),
    _grpo("num_iterations", "int", 1, "optimisation passes over each generated batch (mu)", 1, 16),
    _grpo("learning_rate", "float", 1e-6, "AdamW learning rate of the LoRA weights", 0, 1e-2, low_open=True),
    _grpo("max_grad_norm", "float", 1.0, "gradient clipping norm; 0 = no clipping", 0, 100),
    _grpo("warmup_ratio", "float", 0.0, "share of a round's steps the learning rate warms up over "
          "(then constant)", 0, 1, arg="warmup_steps", high_open=True),
    _grpo("lora_rank", "int", 16, "LoRA rank r of every linear layer's adapter", 1, 256,
          arg="r", owner="LoraConfig"),
    _grpo("lora_alpha", "int", 32, "LoRA scaling numerator (the update is scaled by alpha / r)", 1, 1024,
          owner="LoraConfig"),
    _grpo("lora_dropout", "float", 0.0, "dropout on the LoRA path during training", 0, 0.5, owner="LoraConfig"),
)

# Our own sections: where each is read is its target.
EXPERIENCE_KNOBS: tuple[Knob, ...] = (
    Knob("experience", "share", "float", 0.0, "experience/inject.py", "share of training prompts that carry "
         "stored lessons; 0 = off", 0, 1),
    Knob("experience", "k", "int", 2, "experience/inject.py", "lessons per guided prompt", 1, 16),
    Knob("experience", "min_score", "float", -1.0, "experience/inject.py", "least cosine similarity of a "
         "lesson to the task", -1, 1),
    Knob("experience", "clip_high", "float", None, "train/grpo.py", "upper ratio clip of guided rollouts "
         "(ratio-clipped losses only); null = epsilon_high", 0, 10, low_open=True, nullable=True),
)
MEMORY_KNOBS: tuple[Knob, ...] = (
    Knob("memory", "enabled", "bool", False, "memory/run.py", "the curriculum sees only the run's replay memory"),
    Knob("memory", "capacity", "int", 256, "memory/run.py", "tasks the memory holds at most", 1, 100_000),
    Knob("memory", "frontier", "int", 64, "memory/run.py", "admit unseen tasks while fewer mid tasks are "
         "held", 0, 100_000),
    Knob("memory", "admit", "int", 64, "memory/run.py", "unseen tasks admitted per round at most", 1, 100_000),
    Knob("memory", "variant_var", "float", 1.0, "memory/run.py", "how far a frontier variant's belief is "
         "widened from its parent's", 0, 100),
)
STEP_CREDIT_KNOBS: tuple[Knob, ...] = (
    Knob("step_credit", "enabled", "bool", False, "train/credit.py", "a step judge's GOOD/BAD labels become "
         "per-token advantages (needs config `judge:`)"),
    # |z| of a label is at most a few, so alpha <= 1 keeps the step terms at or under the outcome's scale
    Knob("step_credit", "alpha", "float", 0.1, "train/credit.py", "weight of a step's z-scored label", 0, 1),
)
# reward_weights holds any component name; this row is every entry's type.
REWARD_WEIGHT = Knob("reward_weights", "<component>", "float", 1.0, "harness/loader.py",
                     "weight of a reward.py component in the training reward; an unweighted one counts 1",
                     -1000, 1000)

SECTIONS: dict[str, tuple[Knob, ...]] = {
    "grpo": GRPO_KNOBS,
    "reward_weights": (REWARD_WEIGHT,),
    "experience": EXPERIENCE_KNOBS,
    "memory": MEMORY_KNOBS,
    "step_credit": STEP_CREDIT_KNOBS,
}
KNOBS: tuple[Knob, ...] = tuple(k for knobs in SECTIONS.values() for k in knobs)
GRPO_KEYS: dict[str, Knob] = {k.name: k for k in GRPO_KNOBS}
_BY_KEY: dict[tuple[str, str], Knob] = {(k.section, k.name): k for k in KNOBS}


# ---------------------------------------------------------------- the model


def _section(name: str, knobs: tuple[Knob, ...]) -> type[BaseModel]:
    fields: dict[str, Any] = {k.name: (k.annotation(), Field(k.default, description=k.doc)) for k in knobs}
    title = "".join(part.title() for part in name.split("_")) + "Section"
    return create_model(title, __config__=ConfigDict(extra="forbid", frozen=True), __module__=__name__, **fields)


GrpoSection = _section("grpo", GRPO_KNOBS)
ExperienceSection = _section("experience", EXPERIENCE_KNOBS)
MemorySection = _section("memory", MEMORY_KNOBS)
StepCreditSection = _section("step_credit", STEP_CREDIT_KNOBS)
ComponentName = Annotated[str, Strict(), Field(min_length=1)]
RewardWeight = REWARD_WEIGHT.annotation()


class HarnessYaml(BaseModel):
    """The whole of harness.yaml; a section left out or empty is all defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grpo: GrpoSection = Field(default_factory=GrpoSection)  # type: ignore[valid-type]
    reward_weights: dict[ComponentName, RewardWeight] = Field(default_factory=dict)  # type: ignore[valid-type]
    experience: ExperienceSection = Field(default_factory=ExperienceSection)  # type: ignore[valid-type]
    memory: MemorySection = Field(default_factory=MemorySection)  # type: ignore[valid-type]
    step_credit: StepCreditSection = Field(default_factory=StepCreditSection)  # type: ignore[valid-type]

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_default(cls, value: Any) -> Any:
        return {} if value is None else value  # `memory:` with nothing under it

    @model_validator(mode="after")
    def _clip_needs_a_clipped_loss(self) -> HarnessYaml:
        loss = self.grpo.loss_type  # type: ignore[attr-defined]
        if self.experience.clip_high is not None and loss not in RATIO_CLIP_LOSSES:  # type: ignore[attr-defined]
            raise ValueError(f"experience.clip_high: needs a ratio-clipped loss ({', '.join(RATIO_CLIP_LOSSES)}), "
                             f"not grpo.loss_type {loss}")
        return self


@dataclass(frozen=True)
class HarnessSpec:
    """The validated harness.yaml: every section as a plain dict with its defaults filled in."""

    grpo: dict
    reward_weights: dict[str, float]
    experience: dict
    memory: dict
    step_credit: dict

    @classmethod
    def from_model(cls, model: HarnessYaml) -> HarnessSpec:
        return cls(grpo=model.grpo.model_dump(), reward_weights=dict(model.reward_weights),
                   experience=model.experience.model_dump(), memory=model.memory.model_dump(),
                   step_credit=model.step_credit.model_dump())


def trainer_kwargs(grpo: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """The `owner` ("GRPOConfig" or "LoraConfig") arguments of a spec's grpo section, by the table."""
    return {k.config_arg[1]: grpo[k.name] for k in GRPO_KNOBS if k.config_arg and k.config_arg[0] == owner}


# ---------------------------------------------------------------- parsing


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice (PyYAML keeps the last and drops the first silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` lets a hidden value be overridden
                raise yaml.constructor.ConstructorError(None, None, "merge keys (<<) are not allowed",
                                                        key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_short = reprlib.Repr()  # bounded even on a value that YAML aliases make exponentially large
_short.maxlevel, _short.maxlist, _short.maxdict, _short.maxstring, _short.maxother = 2, 4, 4, 40, 40


def _problem(error: Mapping[str, Any]) -> str:
    """One pydantic error as `section.key: what is wrong`, in the table's words."""
    loc = tuple(_short.repr(part) if not isinstance(part, str) else part[:64] for part in error["loc"])
    where, kind = ".".join(loc), error["type"]
    if kind == "extra_forbidden":
        known = list(SECTIONS) if len(loc) == 1 else [k.name for k in SECTIONS[loc[0]]]
        what = "unknown section" if len(loc) == 1 else "unknown key"
        hint = difflib.get_close_matches(loc[-1], known, n=1)
        return f"{where}: {what} " + (f"(did you mean {hint[0]}?)" if hint else f"(known: {', '.join(known)})")
    knob = REWARD_WEIGHT if loc[:1] == ("reward_weights",) and len(loc) == 2 else _BY_KEY.get(loc[:2])
    if knob is not None and len(loc) == 2:
        return f"{where}: must be {knob.bounds()}, got {_short.repr(error['input'])}"
    if kind in ("model_type", "dict_type"):
        return f"{where}: must be a mapping, got {type(error['input']).__name__}"
    if loc[-1:] == ("[key]",):  # a dict key failed: loc is (section, key, "[key]")
        return f"{'.'.join(loc[:-2])}: a key must be a non-empty string, got {_short.repr(error['input'])}"
    if kind == "invalid_key":
        return f"a section name must be a string, got {_short.repr(error['input'])}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _check_depth(text: str) -> None:
    """Refuse nesting past MAX_DEPTH from the event stream, which PyYAML reads without recursion."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            # a flat config needs no references, and references are how a small file grows huge
            raise HarnessError(f"{SPEC_FILE}: invalid YAML at line {event.start_mark.line + 1}: "
                               "anchors and aliases (&, *) are not allowed")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise HarnessError(f"{SPEC_FILE}: invalid YAML at line {event.start_mark.line + 1}: "
                                   f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_spec(text: str) -> HarnessSpec:
    """Parse and validate harness.yaml text (HarnessError naming the file and key)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise HarnessError(f"{SPEC_FILE}: {len(text.encode('utf-8', 'surrogatepass'))} bytes, more than "
                           f"the {MAX_BYTES} a harness.yaml may hold")
    try:
        _check_depth(text)
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise HarnessError(f"{SPEC_FILE}: invalid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise HarnessError(f"{SPEC_FILE}: invalid YAML: nested too deeply") from None
    except ValueError as exc:  # a constructor's own, e.g. an integer of more than 4300 digits
        raise HarnessError(f"{SPEC_FILE}: invalid YAML: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{SPEC_FILE}: expected a mapping of sections ({', '.join(SECTIONS)}), "
                           f"got {type(raw).__name__}")
    return validate_spec(raw)


def validate_spec(raw: Mapping[str, Any]) -> HarnessSpec:
    """Validate parsed harness.yaml sections (HarnessError naming the file and key)."""
    try:
        model = HarnessYaml.model_validate(raw)
    except ValidationError as exc:
        problems = list(dict.fromkeys(_problem(e) for e in exc.errors(include_url=False)))
        raise HarnessError(f"{SPEC_FILE}: " + "; ".join(problems)) from None
    except RecursionError:
        raise HarnessError(f"{SPEC_FILE}: nested too deeply") from None
    return HarnessSpec.from_model(model)


# ---------------------------------------------------------------- the document

WHY_BOUNDS = (
    "`num_generations` 2..64: a group needs two completions to have a variance; 64 x prompts_per_step "
    "completions a step is the most one machine generates in reasonable time.",
    "`max_completion_length` <= 8192: past the context of the models this trains; a longer "
    "completion is only a longer wait.",
    "`temperature` (0, 4]: 0 divides the logits by zero; past 4 sampling is close to uniform noise.",
    "`learning_rate` (0, 1e-2]: LoRA runs use 1e-5..1e-3; past 1e-2 the adapter diverges.",
    "`lora_rank` 1..256, `lora_alpha` <= 1024: past rank 256 the adapter of a small model is as big as "
    "the layer it adapts (and vLLM's LoRA slots end at 512).",
    "`epsilon` <= 1 (a lower clip below zero is no clip), `epsilon_high` <= 10 (cispo's recommended 5 "
    "fits), `beta` <= 10 (a KL term that large leaves the reward nothing to move).",
    "`num_iterations` <= 16: every pass is another backward over the batch, and later passes are "
    "off-policy; `top_k` <= 1000 is off in all but name (use 0).",
    "`warmup_ratio` < 1: TRL reads a `warmup_steps` of 1 or more as a step count, not a share.",
    "`reward_weights` within +-1000: the seeds' weights are at most 1; a larger one drowns every other "
    "component (and, with scale_rewards none, scales the update).",
)



def contract_markdown() -> str:
    """docs/harness-yaml.md: every section and key with its bounds, default and destination."""
    lines = [
        "# harness.yaml",
        "",
        "<!-- Generated from evotrainer/harness/spec.py (KNOBS); tests/test_harness_spec.py keeps it equal. -->",
        "<!-- Regenerate: python -c 'from evotrainer.harness.spec import contract_markdown as m; "
        "print(m(), end=\"\")' > docs/harness-yaml.md -->",
        "",
        "Every key below is validated when the harness loads; an unknown section or key, a wrong",
        "type or a value out of bounds fails the load with the file and key named, so a candidate",
        "with a bad harness.yaml fails its backtest. Every section may be left out or empty: a GRPO",
        "knob left out gets TRL 1.16's default, every other key the default shown. `goes to` is the",
        "`GRPOConfig` / `LoraConfig` argument the value is passed as, or the module that reads it.",
        "`warmup_ratio` is passed as `warmup_steps` (a fraction below 1 is a ratio of the round's",
        "steps) and switches the schedule from constant to constant with warmup.",
        "",
        "Bounds are sanity limits for LoRA GRPO on one machine, wide enough for any honest setting:",
        "",
        *(f"- {line}" for line in WHY_BOUNDS),
        "",
    ]
    for section, knobs in SECTIONS.items():
        lines += [f"## `{section}`", "", "| key | accepts | default | goes to | what it does |",
                  "|---|---|---|---|---|"]
        for k in knobs:
            default = "null" if k.default is None else str(k.default).lower() if k.kind == "bool" else f"{k.default}"
            lines.append(f"| `{k.name}` | {k.bounds()} | `{default}` | `{k.target}` | {k.doc} |")
        lines.append("")
    lines += [(f"Also checked across sections: `experience.clip_high` needs a ratio-clipped `grpo.loss_type` "
               f"({', '.join(RATIO_CLIP_LOSSES)})."), ""]
    return "\n".join(lines)

