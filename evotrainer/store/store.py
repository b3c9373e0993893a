"""The rollout store: runs, rounds, tasks, rollouts and evals behind one small SQL API."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Select, Table, case, create_engine, event, func, insert, select, text, update
from sqlalchemy.engine import CursorResult, Engine, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from evotrainer.api import Outcome, Rollout, TaskStats, Turn
from evotrainer.sandbox.protected import protect
from evotrainer.store.lessons import LessonRows
from evotrainer.store.models import Backtest, Base, Counter, Eval, RolloutRow, Round, Run, Task, utcnow
from evotrainer.store.replay import ReplayReads
from evotrainer.store.sql import IN_CHUNK, RolloutScope, by_id_or_prefix, chunks
from evotrainer.store.views import ViewReads

ROLLOUT_SEQ = "rollout_seq"  # the Counter row that rollout seqs are drawn from
ABANDONED_SUFFIX = "~abandoned"  # the sibling run that holds the rows of crashed round attempts
_SCHEMA_LOCK = 0x65766F74  # PostgreSQL advisory-lock key of schema creation ("evot")


@dataclass(frozen=True)
class StoredRollout:
    """An api.Rollout plus the training-side fields the store keeps next to it."""

    rollout: Rollout
    reward_components: dict[str, float] = field(default_factory=dict)
    reward: float | None = None
    advantage: float | None = None
    kept: bool | None = None
    model_version: str | None = None
    seed: int | None = None
    harness_version: str | None = None
    run_id: int | None = None
    round_id: int | None = None
    step: int | None = None


# How long a new connection waits to switch a fresh database to WAL while another holds it.
_WAL_WAIT_S = 30.0


def _journal_wal(cur: Any) -> None:
    """PRAGMA journal_mode=WAL, waiting while another process holds the database.

    The switch needs the database to itself and SQLite does not apply the busy timeout to it: when
    several processes open a new store at once (the ranks of a distributed run), the one whose
    connect lands while another creates the schema fails at once with "database is locked"
    (1 in 120 opens, 4 processes at a time). It is retried until _WAL_WAIT_S have passed."""
    deadline = time.monotonic() + _WAL_WAIT_S
    delay = 0.01
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _setup_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        # WAL lets the CLI read while the trainer writes; a killed process loses no commit.
        _journal_wal(cur)
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


def _draw_seqs(s: Session, n: int) -> int:
    """Reserve n consecutive rollout seqs in this transaction; returns the first.

    Several writers (rollout workers) may add at once. The UPDATE locks the counter row until
    the transaction ends (SQLite: the database's write lock), so writers take turns: seqs never
    collide, and one writer's seqs commit before the next writer draws any. Readers therefore
    never see a seq while a lower one is still uncommitted, which keyset paging on seq and
    `until_seq` pinning rely on (a plain sequence would hand out numbers that commit out of order).
    """
    table = cast(Table, Counter.__table__)
    done = cast("CursorResult[Any]", s.execute(update(table).where(table.c.name == ROLLOUT_SEQ).values(value=table.c.value + n)))
    if done.rowcount == 0:  # the counter row was removed: rebuild it from the rows themselves
        start = s.scalar(select(func.max(RolloutRow.seq))) or 0
        s.execute(insert(table).values(name=ROLLOUT_SEQ, value=start + n))
    return cast(int, s.scalar(select(table.c.value).where(table.c.name == ROLLOUT_SEQ))) - n + 1


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _to_row(sr: StoredRollout) -> RolloutRow:
    r = sr.rollout
    if "train" in r.meta:
        # meta["train"] carries the training fields in JSONL; a rollout's own key would be lost.
        raise ValueError(f"rollout {r.id!r}: meta key 'train' is reserved for the store")
    return RolloutRow(
        id=r.id, run_id=sr.run_id, round_id=sr.round_id, step=sr.step,
        task_id=r.task_id, group_id=r.group_id, domain=r.domain,
        prompt=r.prompt, completion=r.completion,
        turns=[{"role": t.role, "content": t.content} for t in r.turns],
        outcome_success=r.outcome.success, outcome_score=r.outcome.score,
        outcome_kind=r.outcome.kind, outcome_flags=list(r.outcome.flags),
        num_tokens=r.num_tokens, truncated=r.truncated, meta=dict(r.meta),
        # Floats throughout, so an int from the trainer exports the same as it re-imports.
        reward_components={k: float(v) for k, v in sr.reward_components.items()},
        reward=_float(sr.reward), advantage=_float(sr.advantage),
        kept=sr.kept, model_version=sr.model_version, seed=sr.seed,
        harness_version=sr.harness_version,
    )


def _from_row(row: RolloutRow) -> StoredRollout:
    rollout = Rollout(
        id=row.id, task_id=row.task_id, group_id=row.group_id, domain=row.domain,
        prompt=row.prompt, completion=row.completion,
        turns=tuple(Turn(t["role"], t["content"]) for t in row.turns or ()),
        outcome=Outcome(row.outcome_success, row.outcome_score, row.outcome_kind,
                        tuple(row.outcome_flags or ())),
        num_tokens=row.num_tokens, truncated=row.truncated, meta=row.meta or {},
    )
    return StoredRollout(
        rollout=rollout, reward_components=dict(row.reward_components or {}),
        reward=row.reward, advantage=row.advantage, kept=row.kept,
        model_version=row.model_version, seed=row.seed, harness_version=row.harness_version,
        run_id=row.run_id, round_id=row.round_id, step=row.step,
    )


class Store(LessonRows, ReplayReads, ViewReads):
    """All persistence of evotrainer. Each call opens and closes its own short session.

    No SQL is built outside evotrainer/store: each read a stage needs is a named method here,
    in replay.py (the backtest's bulk reads), views.py (report, status and guard aggregates) or
    lessons.py; the judge's tables are in judge.py.
    """

    def __init__(self, url: str):
        self.url = url
        parsed = make_url(url)
        kwargs: dict[str, Any] = {}
        is_sqlite = parsed.get_backend_name() == "sqlite"
        if is_sqlite and parsed.database in (None, "", ":memory:"):
            # One shared connection, or every session would see its own empty in-memory db.
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        elif is_sqlite:
            assert parsed.database is not None  # the branch above took None
            kwargs.update(connect_args={"timeout": 30})
            # Answers and hidden tests live here: no sandboxed command may read or change them.
            protect(*(parsed.database + suffix for suffix in ("", "-wal", "-shm", "-journal")))
        self.engine = create_engine(url, **kwargs)
        if is_sqlite:
            _setup_sqlite(self.engine)
        self._create_schema()
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        self._ensure_counter()

    def _create_schema(self) -> None:
        """Create missing tables, safe when several processes open a new store at once.

        `create_all` checks which tables exist, then creates the rest: two processes doing that
        at the same moment both see a table missing, and the slower one fails with "already
        exists". So the check and the creation run in one transaction under a lock the backend
        holds for us: SQLite's write lock (BEGIN IMMEDIATE; its DDL is transactional), or a
        PostgreSQL advisory lock held until commit. The later process then finds every table made.
        Any later migration belongs inside the same lock.
        """
        with self.engine.connect() as conn:
            if self.engine.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif self.engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            Base.metadata.create_all(conn)
            conn.commit()

    def _ensure_counter(self) -> None:
        """Create the rollout seq counter; a store written before it existed starts at max(seq)."""
        with self._session() as s:
            if s.get(Counter, ROLLOUT_SEQ) is not None:
                return
        try:
            with self._session.begin() as s:
                start = s.scalar(select(func.max(RolloutRow.seq))) or 0
                s.add(Counter(name=ROLLOUT_SEQ, value=start))
        except IntegrityError:
            pass  # another process created it first

    @classmethod
    def open(cls, workdir: Path, url: str | None = None) -> Store:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        protect(workdir)  # the workspace beside the store, whatever the url (sandbox/protected.py)
        return cls(url or f"sqlite:///{(workdir / 'store.db').resolve()}")

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs and rounds -------------------------------------------------------------------

    def get_or_create_run(self, name: str, domain: str, config: dict) -> int:
        with self._session.begin() as s:
            run = s.scalar(select(Run).where(Run.name == name))
            if run is None:
                run = Run(name=name, domain=domain, config=config, status="running")
                s.add(run)
            elif run.domain != domain:
                raise ValueError(f"run {name!r} exists for domain {run.domain!r}, not {domain!r}")
            else:
                run.config = config
            s.flush()
            return run.id

    def run_id(self, name: str) -> int | None:
        with self._session() as s:
            return s.scalar(select(Run.id).where(Run.name == name))

    def run_domain(self, run_id: int) -> str | None:
        with self._session() as s:
            return s.scalar(select(Run.domain).where(Run.id == run_id))

    def set_run_status(self, run_id: int, status: str) -> None:
        with self._session.begin() as s:
            self._get(s, Run, run_id).status = status

    def start_round(self, run_id: int, index: int, harness_version: str, model_version: str) -> int:
        with self._session.begin() as s:
            existing = s.scalar(select(Round.id).where(Round.run_id == run_id, Round.index == index))
            if existing is not None:
                return existing  # resuming a round that was started before a crash
            rnd = Round(run_id=run_id, index=index, harness_version=harness_version,
                        model_version=model_version)
            s.add(rnd)
            s.flush()
            return rnd.id

    def begin_round(self, run_id: int, index: int, harness_version: str, model_version: str) -> int:
        """Start round `index` of a run for training, or start it over after a crash.

        A round that was started but never finished holds the rollouts (and perhaps evals) of
        an attempt that died. Training starts the round again from its first step, so that
        attempt is set aside in the same transaction: its rows move to a round of the sibling
        run `<name>~abandoned` (kept, marked with where they came from, and never read as this
        run's), and the round starts empty. Every stage then reads each round's rollouts once.
        """
        with self._session.begin() as s:
            rnd = s.scalar(select(Round).where(Round.run_id == run_id, Round.index == index))
            if rnd is None:
                rnd = Round(run_id=run_id, index=index, harness_version=harness_version,
                            model_version=model_version)
                s.add(rnd)
                s.flush()
                return rnd.id
            if rnd.finished_at is not None:
                raise ValueError(f"round {index} of run {run_id} is finished: it cannot start again")
            self._set_aside(s, rnd)
            rnd.harness_version, rnd.model_version, rnd.started_at = harness_version, model_version, utcnow()
            return rnd.id

    def _set_aside(self, s: Session, rnd: Round) -> None:
        stored = s.scalar(select(func.count()).select_from(RolloutRow).where(RolloutRow.round_id == rnd.id))
        evals = s.scalar(select(func.count()).select_from(Eval).where(Eval.round_id == rnd.id))
        if not stored and not evals:
            return
        run = self._get(s, Run, rnd.run_id)
        name = f"{run.name}{ABANDONED_SUFFIX}"
        aside = s.scalar(select(Run).where(Run.name == name))
        if aside is None:
            aside = Run(name=name, domain=run.domain, config={}, status="abandoned")
            s.add(aside)
            s.flush()
        attempt = (s.scalar(select(func.max(Round.index)).where(Round.run_id == aside.id)) or 0) + 1
        home = Round(run_id=aside.id, index=attempt, harness_version=rnd.harness_version,
                     model_version=rnd.model_version, started_at=rnd.started_at, finished_at=utcnow(),
                     metrics={"abandoned": {"run": run.name, "round": rnd.index,
                                            "rollouts": stored, "evals": evals}})
        s.add(home)
        s.flush()
        s.execute(update(RolloutRow).where(RolloutRow.round_id == rnd.id).values(run_id=aside.id, round_id=home.id))
        s.execute(update(Eval).where(Eval.round_id == rnd.id).values(run_id=aside.id, round_id=home.id))

    def finish_round(self, round_id: int, metrics: dict, adapter_path: str | None) -> None:
        with self._session.begin() as s:
            rnd = self._get(s, Round, round_id)
            rnd.finished_at, rnd.metrics, rnd.adapter_path = utcnow(), metrics, adapter_path

    def merge_round_metrics(self, round_id: int, extra: dict) -> None:
        """Add keys to a round's metrics (the outer loop's stage costs, after training wrote its own)."""
        with self._session.begin() as s:
            rnd = self._get(s, Round, round_id)
            rnd.metrics = {**(rnd.metrics or {}), **extra}

    def last_finished_round(self, run_id: int) -> tuple[int, str | None] | None:
        with self._session() as s:
            row = s.execute(
                select(Round.index, Round.adapter_path)
                .where(Round.run_id == run_id, Round.finished_at.is_not(None))
                .order_by(Round.index.desc()).limit(1)
            ).first()
            return (row[0], row[1]) if row else None

    def rounds(self, run_id: int) -> list[dict[str, Any]]:
        """A run's rounds, by index."""
        return self._rounds(select(Round).where(Round.run_id == run_id).order_by(Round.index))

    def all_rounds(self) -> list[dict[str, Any]]:
        """Every run's rounds, by run id then index."""
        return self._rounds(select(Round).order_by(Round.run_id, Round.index))

    def _rounds(self, query: Select) -> list[dict[str, Any]]:
        with self._session() as s:
            return [
                {"id": r.id, "run_id": r.run_id, "index": r.index, "harness_version": r.harness_version,
                 "model_version": r.model_version, "started_at": r.started_at.isoformat(),
                 "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                 "metrics": r.metrics, "adapter_path": r.adapter_path}
                for r in s.scalars(query)
            ]

    # -- tasks ------------------------------------------------------------------------------

    def upsert_tasks(self, domain: str, tasks: Iterable[dict]) -> None:
        with self._session.begin() as s:
            for chunk in chunks(tasks):
                by_id = {t["task_id"]: t for t in chunk}  # a later duplicate wins
                existing = {
                    t.task_id: t for t in s.scalars(
                        select(Task).where(Task.domain == domain, Task.task_id.in_(list(by_id))))
                }
                for task_id, t in by_id.items():
                    row = existing.get(task_id) or Task(domain=domain, task_id=task_id)
                    row.split, row.level = t["split"], int(t.get("level", 0))
                    row.prompt, row.answer = t["prompt"], t["answer"]
                    row.meta = dict(t.get("meta") or {})
                    if task_id not in existing:
                        s.add(row)

    def tasks(self, domain: str) -> list[dict[str, Any]]:
        """Every stored task of the domain (both splits), by task id, as upsert_tasks takes them."""
        query = select(Task).where(Task.domain == domain).order_by(Task.task_id)
        with self._session() as s:
            return [{"task_id": t.task_id, "split": t.split, "level": t.level, "prompt": t.prompt,
                     "answer": t.answer, "meta": t.meta or {}} for t in s.scalars(query)]

    def task_stats(self, domain: str, run_id: int | None = None, before_round: int | None = None) -> list[TaskStats]:
        """Attempts and verified successes per task, for every task stored or attempted; with
        `before_round`, only from that run's rounds of a lower index.

        Known tasks that were never attempted are included with zero attempts, so a curriculum
        can see them. meta carries `level` and `split` from the task table when the task is known.
        """
        successes = func.sum(case((RolloutRow.outcome_success, 1), else_=0))
        query = (select(RolloutRow.task_id, func.count(), successes)
                 .where(RolloutRow.domain == domain).group_by(RolloutRow.task_id))
        if run_id is not None:
            query = query.where(RolloutRow.run_id == run_id)
        if before_round is not None:
            earlier = select(Round.id).where(Round.index < before_round)
            if run_id is not None:
                earlier = earlier.where(Round.run_id == run_id)
            query = query.where(RolloutRow.round_id.in_(earlier))
        with self._session() as s:
            counts = {tid: (n, int(k or 0)) for tid, n, k in s.execute(query)}
            known = {t.task_id: {"level": t.level, "split": t.split}
                     for t in s.execute(select(Task.task_id, Task.level, Task.split)
                                        .where(Task.domain == domain))}
        return [
            TaskStats(tid, *counts.get(tid, (0, 0)), meta=known.get(tid, {}))
            for tid in sorted(set(counts) | set(known))
        ]

    def round_counts(self, run_id: int, round_index: int, domain: str | None = None) -> dict[str, tuple[int, int]]:
        """{task_id: (attempts, verified successes)} over one round's rollouts of a run."""
        successes = func.sum(case((RolloutRow.outcome_success, 1), else_=0))
        query = RolloutScope(run_id, round_index, domain).where(select(RolloutRow.task_id, func.count(), successes))
        with self._session() as s:
            return {tid: (n, int(k or 0)) for tid, n, k in s.execute(query.group_by(RolloutRow.task_id))}

    # -- rollouts ---------------------------------------------------------------------------

    def add_rollouts(self, rows: Iterable[StoredRollout], batch_size: int = 1000) -> int:
        """Insert rollouts in one transaction, committed before returning; returns the count.

        Accepts any iterable, so a large import streams through in batches yet stays atomic.
        """
        n = 0
        with self._session.begin() as s:
            for batch in chunks(rows, batch_size):
                objs = [_to_row(sr) for sr in batch]
                first = _draw_seqs(s, len(objs))
                for offset, row in enumerate(objs):
                    row.seq = first + offset
                s.add_all(objs)
                s.flush()
                s.expunge_all()  # keep memory bounded on big imports
                n += len(objs)
        return n

    def get_rollout(self, rollout_id: str) -> StoredRollout | None:
        """The rollout with this id, or with this unique id prefix; ValueError if ambiguous."""
        with self._session() as s:
            row = by_id_or_prefix(s, RolloutRow, rollout_id, "rollout")
            return _from_row(row) if row else None

    def existing_ids(self, ids: Iterable[str]) -> set[str]:
        found: set[str] = set()
        with self._session() as s:
            for chunk in chunks(ids):
                found.update(s.scalars(select(RolloutRow.id).where(RolloutRow.id.in_(chunk))))
        return found

    def iter_rollouts(self, *, run_id: int | None = None, round_index: int | None = None,
                      domain: str | None = None, ids: Iterable[str] | None = None,
                      kind: str | None = None, limit: int | None = None,
                      chunk_size: int = 2000) -> Iterator[StoredRollout]:
        """Stream matching rollouts in insert order, one short session per page.

        Pages by keyset on `seq` (not OFFSET), so memory stays at one page and late pages cost
        the same as early ones. With `ids`, their seqs are looked up first in bounded IN chunks.
        """
        scope = RolloutScope(run_id, round_index, domain, kind)
        base = scope.where(select(RolloutRow))
        seq_pages = (self._seq_pages(ids, scope, chunk_size)
                     if ids is not None else None)
        remaining, last = limit, 0
        while remaining is None or remaining > 0:
            size = chunk_size if remaining is None else min(chunk_size, remaining)
            query = base.where(RolloutRow.seq > last).order_by(RolloutRow.seq).limit(size)
            if seq_pages is not None:
                page = next(seq_pages, None)
                if page is None:
                    return
                query = query.where(RolloutRow.seq.in_(page))
            with self._session() as s:
                rows = s.scalars(query).all()
                batch = [_from_row(r) for r in rows]
            if rows:
                last = rows[-1].seq
            yield from batch  # outside the session: a slow consumer holds no transaction open
            if remaining is not None:
                remaining -= len(batch)
            if seq_pages is None and len(rows) < size:
                return

    def count_rollouts(self, *, run_id: int | None = None, round_index: int | None = None,
                       domain: str | None = None, ids: Iterable[str] | None = None,
                       kind: str | None = None) -> int:
        return self.count_in(RolloutScope(run_id, round_index, domain, kind), ids)

    def count_in(self, scope: RolloutScope, ids: Iterable[str] | None = None) -> int:
        """Rollouts in the scope (and, with `ids`, among those ids)."""
        query = scope.where(select(func.count()).select_from(RolloutRow))
        with self._session() as s:
            if ids is None:
                return s.scalar(query) or 0
            return sum(s.scalar(query.where(RolloutRow.id.in_(chunk))) or 0
                       for chunk in chunks(dict.fromkeys(ids)))

    def _seq_pages(self, ids: Iterable[str], scope: RolloutScope, chunk_size: int) -> Iterator[list[int]]:
        seqs: list[int] = []
        query = scope.where(select(RolloutRow.seq))
        with self._session() as s:
            for chunk in chunks(dict.fromkeys(ids)):
                seqs.extend(s.scalars(query.where(RolloutRow.id.in_(chunk))))
        seqs.sort()
        yield from chunks(seqs, min(chunk_size, IN_CHUNK))

    # -- evals ------------------------------------------------------------------------------

    def add_eval(self, run_id: int, round_id: int | None, split: str, adapter: str | None,
                 seed: int, n: int, successes: int, details: dict) -> int:
        with self._session.begin() as s:
            ev = Eval(run_id=run_id, round_id=round_id, split=split, adapter=adapter, seed=seed,
                      n=n, successes=successes, success_rate=successes / n if n else 0.0,
                      details=details)
            s.add(ev)
            s.flush()
            return ev.id

    def evals(self, run_id: int) -> list[dict[str, Any]]:
        query = (select(Eval, Round.index).outerjoin(Round, Eval.round_id == Round.id)
                 .where(Eval.run_id == run_id).order_by(Eval.id))
        with self._session() as s:
            return [
                {"id": e.id, "run_id": e.run_id, "round_id": e.round_id, "round_index": idx,
                 "split": e.split, "adapter": e.adapter, "seed": e.seed, "n": e.n,
                 "successes": e.successes, "success_rate": e.success_rate,
                 "created_at": e.created_at.isoformat(), "details": e.details}
                for e, idx in s.execute(query)
            ]

    # -- backtests --------------------------------------------------------------------------

    def add_backtest(self, report: dict[str, Any], path: str | None = None) -> None:
        """Index one backtest report (see evotrainer.backtest.report)."""
        with self._session.begin() as s:
            s.add(Backtest(id=report["id"], base=report["base"], candidate=report["candidate"],
                           candidate_rev=report.get("candidate_rev"), decision=report["decision"],
                           target=report.get("target"), n_rollouts=report["n_rollouts"], path=path,
                           report=report))

    def backtests(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Newest first, without the full reports."""
        query = select(Backtest).order_by(Backtest.created_at.desc(), Backtest.id.desc()).limit(limit)
        with self._session() as s:
            return [{"id": b.id, "created_at": b.created_at.isoformat(), "base": b.base,
                     "candidate": b.candidate, "candidate_rev": b.candidate_rev,
                     "decision": b.decision, "target": b.target, "n_rollouts": b.n_rollouts,
                     "path": b.path} for b in s.scalars(query)]

    def get_backtest(self, backtest_id: str) -> dict[str, Any] | None:
        """The full report of a backtest, by id or unique id prefix; ValueError if ambiguous."""
        with self._session() as s:
            row = by_id_or_prefix(s, Backtest, backtest_id, "backtest")
            return dict(row.report) if row else None

    @staticmethod
    def _get(s: Session, model: type[Base], pk: int) -> Any:
        obj = s.get(model, pk)
        if obj is None:
            raise KeyError(f"no {model.__tablename__} row with id {pk}")
        return obj
