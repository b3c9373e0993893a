"""The judge's rows: the verdict cache, the review queue, and verdicts copied into rollout meta."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from evotrainer.store.models import JudgeReview, JudgeVerdictRow, RolloutRow, utcnow
from evotrainer.store.sql import chunks

if TYPE_CHECKING:
    from evotrainer.store.store import Store


@dataclass(frozen=True)
class StoredVerdict:
    """One row of the verdict cache, as plain data."""

    rollout_id: str
    judge_model: str
    prompt_hash: str
    role: str
    kind: str
    status: str  # "ok" | "missing"
    verdict: dict[str, Any] | None
    error: str | None
    attempts: int


@dataclass(frozen=True)
class ReviewItem:
    rollout_id: str
    reason: str
    votes: dict[str, Any]
    status: str
    human_success: bool | None
    human_quality: int | None
    note: str | None


def _verdict(row: JudgeVerdictRow) -> StoredVerdict:
    return StoredVerdict(row.rollout_id, row.judge_model, row.prompt_hash, row.role, row.kind, row.status,
                         row.verdict, row.error, row.attempts)


def _review(row: JudgeReview) -> ReviewItem:
    return ReviewItem(row.rollout_id, row.reason, dict(row.votes or {}), row.status, row.human_success,
                      row.human_quality, row.note)


class JudgeRecords:
    """Judge persistence over an open Store (same database, its own short sessions)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._session = sessionmaker(store.engine, expire_on_commit=False)

    # -- the verdict cache ------------------------------------------------------------------

    def cached(self, judge_model: str, prompt_hash: str, rollout_id: str) -> StoredVerdict | None:
        """A usable cached verdict; a MISSING one is not a cache hit (the judge is asked again)."""
        with self._session() as s:
            row = s.scalar(select(JudgeVerdictRow).where(
                JudgeVerdictRow.judge_model == judge_model, JudgeVerdictRow.prompt_hash == prompt_hash,
                JudgeVerdictRow.rollout_id == rollout_id))
            return _verdict(row) if row is not None and row.status == "ok" else None

    def put(self, v: StoredVerdict) -> None:
        with self._session.begin() as s:
            row = s.scalar(select(JudgeVerdictRow).where(
                JudgeVerdictRow.judge_model == v.judge_model, JudgeVerdictRow.prompt_hash == v.prompt_hash,
                JudgeVerdictRow.rollout_id == v.rollout_id))
            if row is None:
                row = JudgeVerdictRow(rollout_id=v.rollout_id, judge_model=v.judge_model, prompt_hash=v.prompt_hash)
                s.add(row)
            row.role, row.kind, row.status = v.role, v.kind, v.status
            row.verdict, row.error, row.attempts = v.verdict, v.error, v.attempts
            row.created_at = utcnow()

    def has_verdicts(self) -> bool:
        with self._session() as s:
            return s.scalar(select(JudgeVerdictRow.id).limit(1)) is not None

    def verdicts(self, rollout_ids: Iterable[str] | None = None, kind: str = "rollout") -> Iterator[StoredVerdict]:
        """Every stored verdict of this kind (for these rollouts), newest last."""
        query = select(JudgeVerdictRow).where(JudgeVerdictRow.kind == kind).order_by(JudgeVerdictRow.id)
        with self._session() as s:
            if rollout_ids is None:
                yield from [_verdict(r) for r in s.scalars(query)]
                return
            for ids in chunks(dict.fromkeys(rollout_ids)):
                yield from [_verdict(r) for r in s.scalars(query.where(JudgeVerdictRow.rollout_id.in_(ids)))]

    # -- rollout meta -----------------------------------------------------------------------

    def set_meta(self, rollout_id: str, key: str, value: Any) -> bool:
        """meta[key] = value on a stored rollout (False when it is not in the store)."""
        with self._session.begin() as s:
            row = s.get(RolloutRow, rollout_id)
            if row is None:
                return False
            row.meta = {**(row.meta or {}), key: value}  # a new dict: JSON columns track assignment only
            return True

    # -- the review queue -------------------------------------------------------------------

    def enqueue(self, rollout_id: str, reason: str, votes: dict[str, Any]) -> None:
        """Queue a rollout for a person; an existing item keeps its label, only its votes refresh."""
        with self._session.begin() as s:
            row = s.scalar(select(JudgeReview).where(JudgeReview.rollout_id == rollout_id))
            if row is None:
                s.add(JudgeReview(rollout_id=rollout_id, reason=reason, votes=votes, status="pending"))
            else:
                row.votes = votes

    def reviews(self, status: str | None = "pending", limit: int | None = None) -> list[ReviewItem]:
        query = select(JudgeReview).order_by(JudgeReview.id).limit(limit)
        if status is not None:
            query = query.where(JudgeReview.status == status)
        with self._session() as s:
            return [_review(r) for r in s.scalars(query)]

    def review(self, rollout_id: str) -> ReviewItem | None:
        with self._session() as s:
            row = s.scalar(select(JudgeReview).where(JudgeReview.rollout_id == rollout_id))
            return _review(row) if row is not None else None

    def label(self, rollout_id: str, success: bool, quality: int | None = None, note: str | None = None) -> None:
        """A person's label: stored on the review item (created if the rollout was not queued)."""
        with self._session.begin() as s:
            row = s.scalar(select(JudgeReview).where(JudgeReview.rollout_id == rollout_id))
            if row is None:
                row = JudgeReview(rollout_id=rollout_id, reason="manual", votes={})
                s.add(row)
            row.status, row.human_success, row.human_quality = "labelled", success, quality
            row.note, row.labelled_at = note, utcnow()

    def skip(self, rollout_id: str) -> None:
        with self._session.begin() as s:
            row = s.scalar(select(JudgeReview).where(JudgeReview.rollout_id == rollout_id))
            if row is not None and row.status == "pending":
                row.status = "skipped"

    def human_labels(self, rollout_ids: Iterable[str] | None = None) -> dict[str, bool]:
        """rollout id -> a person's success label, for every labelled review item."""
        query = select(JudgeReview.rollout_id, JudgeReview.human_success).where(JudgeReview.status == "labelled")
        with self._session() as s:
            if rollout_ids is None:
                return {rid: bool(ok) for rid, ok in s.execute(query)}
            out = {}
            for ids in chunks(dict.fromkeys(rollout_ids)):
                out.update({rid: bool(ok) for rid, ok in s.execute(query.where(JudgeReview.rollout_id.in_(ids)))})
            return out



__all__ = ["JudgeRecords", "ReviewItem", "StoredVerdict"]
