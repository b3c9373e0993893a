"""The outer loop's resume point: which round and stage a co-evolution run has reached.

Written atomically after every stage, so `coevolve --resume` picks up where a kill left off.
Rollouts need no such care: the store commits them as they are scored.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.errors import UserError
from evotrainer.jsonfile import write_json

STAGES = ("train", "verify", "diagnose", "propose", "backtest", "promote", "done")


class RunStateError(UserError, RuntimeError):
    """The workspace's run does not fit the command: an unfinished round without --resume,
    another run's state, a finished round the control arm needs that the store lacks."""


@dataclass
class Candidate:
    slug: str
    branch: str
    skill: str | None
    params: dict
    targets: str
    expected: str
    backtest: str | None = None
    decision: str | None = None
    reasons: list[str] = field(default_factory=list)
    gain: float | None = None
    pilot: dict | None = None  # a dynamics change's live pilot (coevolve/pilot.py), once run


@dataclass
class Pending:
    """A promotion waiting for live verification in the next round."""

    merge: str
    branch: str
    skill: str | None
    params: dict
    backtest: str
    target: str
    round: int  # the round whose rollouts were backtested; its held-out success is the baseline


@dataclass
class RunState:
    run: str
    domain: str
    round: int = 0
    stage: str = "train"
    candidates: list[Candidate] = field(default_factory=list)
    pending: Pending | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # one summary per finished round
    guard: dict[str, Any] | None = None  # this round's held-out guard (coevolve/heldout.py)
    # After a revert with a control arm: the next round starts from the control arm's adapter
    # (trained without the reverted change), not from the round trained with it.
    start_adapter: str | None = None
    # This round's verdict on the last round's promotion: {branch, kept, describe, skill}
    verdict: dict[str, Any] | None = None
    # This round's wall seconds by stage (train, control, evaluation, verify, diagnose, propose,
    # backtest, pilot, promote), saved as each stage ends; a stage a kill interrupted counts
    # only the run that finished it.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Arms trained beside a stage (coevolve/beside.py: the control arm): their own wall seconds;
    # stage_seconds counts only what they added to the round's wall time.
    beside_seconds: dict[str, float] = field(default_factory=dict)
    # This round's external agent (coevolve.agent: external): how its wait ended (finished,
    # submit_limit, timeout), its submissions, those taken as candidates and those skipped.
    agent: dict[str, Any] | None = None

    @classmethod
    def load(cls, path: Path) -> RunState | None:
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        data["candidates"] = [Candidate(**c) for c in data.get("candidates", [])]
        data["pending"] = Pending(**data["pending"]) if data.get("pending") else None
        return cls(**data)

    def save(self, path: Path) -> None:
        write_json(path, asdict(self), indent=2, sort_keys=True)

    def advance(self, stage: str, path: Path) -> None:
        assert stage in STAGES, stage
        self.stage = stage
        self.save(path)


def describe_cost(stage_seconds: dict[str, float], beside: dict[str, float] | None = None) -> str:
    """'round cost 4m 05s: train 180s, evaluation 41s, ...', largest part first; then the arms
    that trained beside the main round, by their own time: '; beside train: control 170s'."""
    total = sum(stage_seconds.values())
    parts = ", ".join(f"{name} {sec:.0f}s" for name, sec in
                      sorted(stage_seconds.items(), key=lambda kv: kv[1], reverse=True))
    aside = ", ".join(f"{name} {sec:.0f}s" for name, sec in sorted((beside or {}).items()))
    return f"round cost {int(total // 60)}m {total % 60:02.0f}s: {parts}" + (f"; beside train: {aside}" if aside else "")
