"""Voting: N judge roles judge each rollout; agreement is a label, disagreement goes to a person.

Named results (`PanelResult.label`):
- success / failure: every role gave a valid verdict and they agree;
- disputed: every role voted but they disagree; the rollout is queued for review
  (`evotrainer review`), and the person's label then wins;
- missing: some role gave no valid verdict (malformed after retries). A missing vote could have
  been the dissent, so there is no label: never a pass.

The panel's summary is written to the stored rollout's `meta["judge"]`, where a harness reads it
to build reward components (a proxy signal; `rollout.outcome` stays the verified truth).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evotrainer.api import Rollout
from evotrainer.config import JudgeConfig
from evotrainer.judge.backends import JudgeBackend
from evotrainer.judge.records import META_KEY, JudgeRecords
from evotrainer.judge.runtime import Judge, JudgeResult

LABELS = ("success", "failure", "disputed", "missing")


@dataclass(frozen=True)
class PanelResult:
    rollout_id: str
    label: str  # one of LABELS
    quality: float | None  # mean quality of the valid votes
    votes: dict[str, JudgeResult]
    source: str = "vote"  # "vote" | "human"

    @property
    def success(self) -> bool | None:
        return {"success": True, "failure": False}.get(self.label)

    def summary(self) -> dict[str, Any]:
        """meta["judge"]: what a harness sees."""
        models = sorted({v.model for v in self.votes.values()})
        return {"label": self.label, "success": self.success, "quality": self.quality, "source": self.source,
                "model": ",".join(models), "votes": {role: v.vote() for role, v in self.votes.items()}}


def decide(votes: dict[str, JudgeResult]) -> tuple[str, float | None]:
    """The label and mean quality of a set of votes (see the module docstring)."""
    valid = [v.verdict for v in votes.values() if v.verdict is not None]
    quality = sum(v.quality for v in valid) / len(valid) if valid else None
    if not votes or len(valid) < len(votes):
        return "missing", quality
    outcomes = {v.success for v in valid}
    if len(outcomes) > 1:
        return "disputed", quality
    return ("success" if outcomes.pop() else "failure"), quality


class JudgePanel:
    """The voting roles of one judge config, sharing one backend and the store's verdict cache."""

    def __init__(self, judges: Sequence[Judge], records: JudgeRecords | None = None) -> None:
        if not judges:
            raise ValueError("a judge panel needs at least one role")
        names = [j.role.name for j in judges]
        if len(set(names)) != len(names):
            raise ValueError(f"judge role names must be unique, got {names}")
        self.judges, self.records = list(judges), records

    @classmethod
    def from_config(cls, config: JudgeConfig, backend: JudgeBackend, records: JudgeRecords | None = None) -> JudgePanel:
        return cls([Judge.from_config(backend, config, role, records) for role in config.roles], records)

    def judge(self, rollout: Rollout) -> PanelResult:
        votes = {j.role.name: j.judge(rollout) for j in self.judges}
        label, quality = decide(votes)
        result = PanelResult(rollout.id, label, quality, votes)
        if self.records is not None:
            if label == "disputed":
                self.records.enqueue(rollout.id, "disagreement", {r: v.vote() for r, v in votes.items()})
            review = self.records.review(rollout.id)
            if review is not None and review.status == "labelled":
                result = PanelResult(rollout.id, "success" if review.human_success else "failure",
                                     review.human_quality if review.human_quality is not None else quality,
                                     votes, source="human")
            self.records.set_meta(rollout.id, META_KEY, result.summary())
        return result


def apply_human_label(records: JudgeRecords, rollout_id: str, success: bool, quality: int | None = None,
                      note: str | None = None) -> None:
    """Record a person's label and make it the rollout's judge label (meta["judge"])."""
    records.label(rollout_id, success, quality, note)
    stored = records.store.get_rollout(rollout_id)
    if stored is None:
        return
    before = dict(stored.rollout.meta.get(META_KEY) or {})
    votes = before.get("votes") or (records.review(rollout_id).votes if records.review(rollout_id) else {})
    records.set_meta(rollout_id, META_KEY, {
        **before, "label": "success" if success else "failure", "success": success,
        "quality": quality if quality is not None else before.get("quality"), "source": "human", "votes": votes,
        **({"note": note} if note else {})})


__all__ = ["JudgePanel", "LABELS", "PanelResult", "apply_human_label", "decide"]
