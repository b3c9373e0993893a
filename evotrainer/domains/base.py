"""What a domain is: a source of tasks for the train and held-out splits plus a trusted verifier."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from evotrainer.api import Outcome

# What a domain partitions its tasks into. A task may also be in "validation": the trainer carves
# that from the train pool (train/splits.py) and never trains on it; domains are never asked for it.
SPLITS = ("train", "heldout")
TASK_SPLITS = (*SPLITS, "validation")


@dataclass(frozen=True)
class Task:
    """One problem. `prompt` is the bare question; the harness's rollout.py template wraps it."""

    task_id: str
    domain: str
    split: str
    level: int
    prompt: str
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.split not in TASK_SPLITS:
            raise ValueError(f"task split {self.split!r} is not one of {', '.join(TASK_SPLITS)}")
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))


@runtime_checkable
class Domain(Protocol):
    """A task source plus its trusted verifier. Harness code never reaches either."""

    name: str

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """n tasks of one split, deterministic for (split, n, seed) and the domain's options."""
        ...

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        """The verified outcome of one completion. Must never raise on any string."""
        ...


def prompt_scaffold(domain: object) -> str:
    """The `scaffold` a harness PROMPT is rendered with: the domain's (swe: edit, line or agent), else ''."""
    return str(getattr(domain, "scaffold", "") or "")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
