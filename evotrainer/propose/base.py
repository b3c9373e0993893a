"""What an outer agent sees and what it returns: evidence in, harness-edit proposals out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Proposal:
    """One falsifiable, single-variable harness change."""

    slug: str  # short kebab-case name, used in the branch candidate/<round>-<slug>
    diagnosis: str  # what the evidence shows
    edits: Mapping[str, str]  # harness file name -> its full new text (files at the harness root only)
    targets: str  # the backtest metric this change is meant to move (docs/design.md, "Backtest metrics")
    expected: str  # the effect it predicts, in words and numbers
    skill: str | None = None  # the skill it was rendered from, if any
    params: Mapping[str, Any] = field(default_factory=dict)  # the grid point used
    # An agent that wrote its candidate itself (through the tool surface, evotrainer/tools) names
    # the branch; the loop takes that branch as it is instead of committing `edits` again.
    branch: str | None = None


@dataclass(frozen=True)
class Evidence:
    """What the agent reads: the round's health report, sample rollouts, and the run so far."""

    round_index: int
    domain: str
    report: Any  # evotrainer.diagnose.HealthReport
    samples: Sequence[Any]  # StoredRollout examples, failing ones first
    history: Sequence[Mapping[str, Any]] = ()  # earlier rounds' metrics, oldest first
    # Where the round lives, for an agent that reads it through the tool surface itself
    # (propose/llm_tools.py): the workspace root and the run's name.
    workdir: Any = None
    run: str | None = None


class Agent(Protocol):
    """An outer agent: evidence + harness view + skills -> proposals."""

    name: str

    def propose(self, evidence: Evidence, harness: Mapping[str, str],
                skills: Sequence[Any]) -> list[Proposal]: ...


_AGENTS: dict[str, type] = {}


def register_agent(name: str):
    def wrap(cls):
        _AGENTS[name] = cls
        return cls
    return wrap


def get_agent(name: str, **options) -> Agent:
    if name not in _AGENTS:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(sorted(_AGENTS))}")
    return _AGENTS[name](**options)
