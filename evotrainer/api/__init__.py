"""The public contract between evotrainer and harness code: frozen dataclasses and signatures.

Harness files import only from this package (here and evotrainer.api.probes, the standard
health probes), so every module in it imports only what harness code may: pure standard-library
modules, nothing of evotrainer outside it. Rollouts travel as JSONL in exactly this shape
(`rollout_to_dict` / `rollout_from_dict`), so a user can write a harness against exported
rollouts without touching the store or the trainer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

OUTCOME_KINDS = (
    "ok",
    "wrong",
    "format_error",
    "empty",
    "truncated",
    "timeout",
    "patch_failed",
    "tampering",
    "error",
)
# An Outcome flag: success is the verdict of an LLM judge panel (the `judged` domain), not of a
# trusted check. Such outcomes are counted and shown apart from verified ones, never pooled.
JUDGE_VERIFIED = "judge_verified"
# An Outcome flag: success is what another engine reported (a field of its rollouts named at import,
# e.g. verl's `acc`), not a check of ours. Reports say so wherever they count such outcomes.
SOURCE_REPORTED = "source_reported"


def _frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class Outcome:
    """The verified result of a rollout. Set by trusted code only; harnesses read it."""

    success: bool
    score: float
    kind: str
    flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in OUTCOME_KINDS:
            raise ValueError(f"outcome kind {self.kind!r} is not one of {', '.join(OUTCOME_KINDS)}")
        if not isinstance(self.success, bool):
            raise ValueError(f"outcome success must be a bool, got {type(self.success).__name__}")
        if not isinstance(self.score, (int, float)) or not math.isfinite(self.score):
            raise ValueError(f"outcome score must be a finite number, got {self.score!r}")
        object.__setattr__(self, "score", float(self.score))
        object.__setattr__(self, "flags", tuple(self.flags))


@dataclass(frozen=True)
class Turn:
    """One message of a multi-turn trajectory."""

    role: str
    content: str


@dataclass(frozen=True)
class Rollout:
    """One sampled completion (or trajectory) for one task, with its verified outcome."""

    id: str
    task_id: str
    group_id: str
    domain: str
    prompt: str
    completion: str
    turns: tuple[Turn, ...]
    outcome: Outcome
    num_tokens: int
    truncated: bool
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))
        object.__setattr__(self, "meta", _frozen_map(self.meta))


@dataclass(frozen=True)
class TaskStats:
    """Per-task history from the store, the input of a curriculum."""

    task_id: str
    attempts: int
    successes: int
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", _frozen_map(self.meta))

    @property
    def pass_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


# The functions a harness defines, one file each (see docs/design.md, "The harness contract").
RewardFn = Callable[[Rollout], dict[str, float]]  # reward.py: reward(rollout)
KeepRolloutFn = Callable[[Rollout], bool]  # filters.py: keep_rollout(rollout)
KeepGroupFn = Callable[[Sequence[Rollout], Sequence[float]], bool]  # filters.py: keep_group
WeightsFn = Callable[[Sequence[TaskStats]], dict[str, float]]  # curriculum.py: weights
StopFn = Callable[[Sequence[Turn]], "str | None"]  # rollout.py: stop(trajectory)


def rollout_to_dict(rollout: Rollout) -> dict[str, Any]:
    """The JSONL shape of a rollout: plain JSON types, nested outcome, turns and meta."""
    # Built field by field: dataclasses.asdict would try to deep-copy the mappingproxy meta and fail.
    data = {name: getattr(rollout, name) for name in _ROLLOUT_FIELDS}
    data["turns"] = [asdict(t) for t in rollout.turns]
    data["outcome"] = {
        "success": rollout.outcome.success,
        "score": rollout.outcome.score,
        "kind": rollout.outcome.kind,
        "flags": list(rollout.outcome.flags),
    }
    data["meta"] = copy.deepcopy(dict(rollout.meta))
    return data


_ROLLOUT_FIELDS = {
    "id": str,
    "task_id": str,
    "group_id": str,
    "domain": str,
    "prompt": str,
    "completion": str,
    "num_tokens": int,
    "truncated": bool,
}


def rollout_from_dict(data: Any) -> Rollout:
    """Build a Rollout from its JSON shape, raising ValueError that names the bad field."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    expected = set(_ROLLOUT_FIELDS) | {"turns", "outcome", "meta"}
    unknown = sorted(set(data) - expected)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    missing = sorted(expected - set(data) - {"meta", "turns"})
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    for name, kind in _ROLLOUT_FIELDS.items():
        value = data[name]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise ValueError(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    if data["num_tokens"] < 0:
        raise ValueError("field 'num_tokens' must be >= 0")
    out = data["outcome"]
    if not isinstance(out, dict):
        raise ValueError("field 'outcome' must be an object")
    extra = sorted(set(out) - {"success", "score", "kind", "flags"})
    if extra:
        raise ValueError(f"unknown outcome field(s): {', '.join(extra)}")
    for name in ("success", "score", "kind"):
        if name not in out:
            raise ValueError(f"missing field 'outcome.{name}'")
    if isinstance(out["score"], bool):
        raise ValueError("field 'outcome.score' must be a number")
    flags = out.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ValueError("field 'outcome.flags' must be a list of strings")
    try:
        outcome = Outcome(out["success"], out["score"], out["kind"], tuple(flags))
    except ValueError as exc:
        raise ValueError(f"field 'outcome': {exc}") from None
    turns_raw = data.get("turns", [])
    if not isinstance(turns_raw, list):
        raise ValueError("field 'turns' must be a list")
    turns = []
    for i, t in enumerate(turns_raw):
        if not (isinstance(t, dict) and set(t) == {"role", "content"}
                and isinstance(t["role"], str) and isinstance(t["content"], str)):
            raise ValueError(f"field 'turns[{i}]' must be an object with string 'role' and 'content'")
        turns.append(Turn(t["role"], t["content"]))
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError("field 'meta' must be an object")
    fields = {k: data[k] for k in _ROLLOUT_FIELDS}
    return Rollout(**fields, turns=tuple(turns), outcome=outcome, meta=meta)


__all__ = [
    "OUTCOME_KINDS",
    "JUDGE_VERIFIED",
    "SOURCE_REPORTED",
    "Outcome",
    "Turn",
    "Rollout",
    "TaskStats",
    "RewardFn",
    "KeepRolloutFn",
    "KeepGroupFn",
    "WeightsFn",
    "StopFn",
    "rollout_to_dict",
    "rollout_from_dict",
]
