"""SQLAlchemy ORM tables of the rollout store: runs, rounds, tasks, rollouts, evals."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    domain: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(32), default="running")


class Round(Base):
    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("run_id", "index", name="uq_round_run_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    harness_version: Mapped[str] = mapped_column(String(128))
    model_version: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    adapter_path: Mapped[str | None] = mapped_column(String(1024))


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("domain", "task_id", name="uq_task_domain_task"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    domain: Mapped[str] = mapped_column(String(64))
    task_id: Mapped[str] = mapped_column(String(256))
    split: Mapped[str] = mapped_column(String(16))  # "train" | "validation" | "heldout"
    level: Mapped[int] = mapped_column(Integer, default=0)
    prompt: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class RolloutRow(Base):
    __tablename__ = "rollouts"
    __table_args__ = (
        Index("ix_rollouts_run_round", "run_id", "round_id"),
        Index("ix_rollouts_domain", "domain"),
        Index("ix_rollouts_task", "task_id"),
        Index("ix_rollouts_group", "group_id"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Insert order, drawn by Store.add_rollouts from the "rollout_seq" counter: the key that
    # iteration pages on, so exports and listings follow training order whatever the id scheme is.
    seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    round_id: Mapped[int | None] = mapped_column(ForeignKey("rounds.id"))
    step: Mapped[int | None] = mapped_column(Integer)
    task_id: Mapped[str] = mapped_column(String(256))
    group_id: Mapped[str] = mapped_column(String(256))
    domain: Mapped[str] = mapped_column(String(64))
    prompt: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)
    turns: Mapped[list[Any]] = mapped_column(JSON, default=list)
    outcome_success: Mapped[bool] = mapped_column(Boolean)
    outcome_score: Mapped[float] = mapped_column(Float)
    outcome_kind: Mapped[str] = mapped_column(String(32))
    outcome_flags: Mapped[list[Any]] = mapped_column(JSON, default=list)
    num_tokens: Mapped[int] = mapped_column(Integer)
    truncated: Mapped[bool] = mapped_column(Boolean)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reward_components: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reward: Mapped[float | None] = mapped_column(Float)
    advantage: Mapped[float | None] = mapped_column(Float)
    kept: Mapped[bool | None] = mapped_column(Boolean)
    model_version: Mapped[str | None] = mapped_column(String(128))
    seed: Mapped[int | None] = mapped_column(BigInteger)
    harness_version: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# The longest rollout id the store holds (a String column: its stubs type it TypeEngine, with no length).
ROLLOUT_ID_CHARS: int = RolloutRow.__table__.c.id.type.length  # type: ignore[attr-defined]


class Counter(Base):
    """Named counters that several writers draw from, one locked row each (see Store.add_rollouts)."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class Eval(Base):
    __tablename__ = "evals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    round_id: Mapped[int | None] = mapped_column(ForeignKey("rounds.id"))
    split: Mapped[str] = mapped_column(String(16))
    adapter: Mapped[str | None] = mapped_column(String(1024))
    seed: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(Integer)
    successes: Mapped[int] = mapped_column(Integer)
    success_rate: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Backtest(Base):
    """Index of the backtest reports in <workdir>/backtests/ (the row keeps the whole report too)."""

    __tablename__ = "backtests"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    base: Mapped[str] = mapped_column(String(64))  # commit shas
    candidate: Mapped[str] = mapped_column(String(64))
    candidate_rev: Mapped[str | None] = mapped_column(String(256))
    decision: Mapped[str] = mapped_column(String(16))
    target: Mapped[str | None] = mapped_column(String(64))
    n_rollouts: Mapped[int] = mapped_column(Integer)
    path: Mapped[str | None] = mapped_column(String(1024))  # the JSON report; its .md twin sits beside it
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)



class JudgeVerdictRow(Base):
    """One judge role's verdict on one rollout: a proxy signal, never a verified outcome.

    Keyed by (judge model, prompt hash, rollout id), the verdict cache: the same prompt to the
    same model is never paid for twice. A reply that stayed malformed after the retries is kept
    with status "missing" and no verdict (and is asked again next time)."""

    __tablename__ = "judge_verdicts"
    __table_args__ = (UniqueConstraint("judge_model", "prompt_hash", "rollout_id", name="uq_judge_verdict_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rollout_id: Mapped[str] = mapped_column(String(128), index=True)
    judge_model: Mapped[str] = mapped_column(String(256))
    prompt_hash: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # "rollout" | "steps"
    status: Mapped[str] = mapped_column(String(16))  # "ok" | "missing"
    verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class JudgeReview(Base):
    """A rollout the judge roles disagreed on, waiting for (or holding) a person's label."""

    __tablename__ = "judge_reviews"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rollout_id: Mapped[str] = mapped_column(String(128), unique=True)
    reason: Mapped[str] = mapped_column(String(32))  # "disagreement"
    votes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # "pending" | "labelled" | "skipped"
    human_success: Mapped[bool | None] = mapped_column(Boolean)
    human_quality: Mapped[int | None] = mapped_column(Integer)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    labelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Lesson(Base):
    """A lesson of the experience pool (evotrainer/experience), distilled from stored rollouts.

    The id is a hash of domain and text, so distilling the same lesson again updates one row."""

    __tablename__ = "lessons"
    __table_args__ = (Index("ix_lessons_domain", "domain"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    domain: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16))  # "rules" | "llm"
    kind: Mapped[str] = mapped_column(String(64))  # the rule, or the failure kind it addresses
    support: Mapped[int] = mapped_column(Integer, default=0)  # failed rollouts behind it
    evidence: Mapped[list[Any]] = mapped_column(JSON, default=list)  # a sample of their ids
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LessonEmbedding(Base):
    """The embedding cache of lessons: one float32 vector per (lesson, embedding model)."""

    __tablename__ = "lesson_embeddings"

    lesson_id: Mapped[str] = mapped_column(ForeignKey("lessons.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    dim: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)  # little-endian float32, dim values


__all__ = ["Base", "Run", "Round", "Task", "RolloutRow", "Eval", "Backtest", "JudgeVerdictRow", "JudgeReview",
           "utcnow"]
__all__ += ["ROLLOUT_ID_CHARS"]
__all__ += ["Lesson", "LessonEmbedding"]
