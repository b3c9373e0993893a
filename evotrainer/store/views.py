"""What the report, the status view, the held-out guard and judge agreement read, part of Store:
names and labels, per-group and per-round aggregates, and one round's rows page by page.

Aggregates are one GROUP BY query each, so they cost the same whatever the rollouts' text
sizes are; row reads are keyset pages or bounded IN lists, never one query per rollout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import String, case, cast, func, select
from sqlalchemy.engine import Engine

from evotrainer.store.models import RolloutRow, Round, Run, Task
from evotrainer.store.sql import RolloutScope, chunks, keyset_pages, rollout_columns


class ViewReads:
    """Store's reads for views and checks (a mixin: it uses the Store's engine)."""

    engine: Engine

    def run_names(self) -> dict[int, str]:
        """run id -> run name, in name order."""
        with self.engine.connect() as conn:
            return dict(conn.execute(select(Run.id, Run.name).order_by(Run.name)).all())

    def round_labels(self) -> dict[int, tuple[str, int]]:
        """round id -> (run name, round index), for every round."""
        query = select(Round.id, Run.name, Round.index).join(Run, Run.id == Round.run_id)
        with self.engine.connect() as conn:
            return {rid: (run, index) for rid, run, index in conn.execute(query)}

    def outcome_counts(self) -> list[tuple[int | None, str, bool | None, int]]:
        """(round id, outcome kind, kept, rollouts) for each combination stored."""
        c = RolloutRow.__table__.c
        query = select(c.round_id, c.outcome_kind, c.kept, func.count()).group_by(c.round_id, c.outcome_kind, c.kept)
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query)]

    def flagged_counts(self, flag: str, scope: RolloutScope | None = None,
                       ids: Iterable[str] | None = None) -> dict[int | None, int]:
        """round id -> rollouts (in the scope, among `ids`) whose outcome carries `flag`, such as
        api.SOURCE_REPORTED; rounds without any are left out. Flags are a JSON list: matched as text."""
        c = RolloutRow.__table__.c
        query = (scope or RolloutScope()).where(
            select(c.round_id, func.count()).where(cast(c.outcome_flags, String).like(f'%"{flag}"%')))
        out: dict[int | None, int] = {}
        with self.engine.connect() as conn:
            if ids is None:
                return {round_id: n for round_id, n in conn.execute(query.group_by(c.round_id))}
            for chunk in chunks(dict.fromkeys(ids)):
                for round_id, n in conn.execute(query.where(c.id.in_(chunk)).group_by(c.round_id)):
                    out[round_id] = out.get(round_id, 0) + n
        return out

    def round_rows(self, round_id: int | None, columns: Sequence[str], page: int = 2000) -> Iterator[dict[str, Any]]:
        """One round's rollouts (None: those stored without a round) in store order, as dicts of
        `columns` (which must hold "seq"), read by keyset pages of `page` rows."""
        c = RolloutRow.__table__.c
        query = select(*rollout_columns(columns))
        query = query.where(c.round_id.is_(None) if round_id is None else c.round_id == round_id)
        for rows in keyset_pages(self.engine.connect, query, page):
            for row in rows:
                yield row._asdict()

    def group_reward_stats(self, eps: float) -> Iterator[tuple[int, str, float | None, float | None, int, int]]:
        """(round id, group id, min reward, max reward, rollouts, live rollouts) per group of the
        rollouts stored with a round, as training stored them: live is kept with |advantage| > eps."""
        c = RolloutRow.__table__.c
        live = case(((c.kept.is_(True)) & (func.abs(func.coalesce(c.advantage, 0.0)) > eps), 1), else_=0)
        query = (select(c.round_id, c.group_id, func.min(c.reward), func.max(c.reward), func.count(),
                        func.sum(live))
                 .where(c.round_id.is_not(None)).group_by(c.round_id, c.group_id))
        with self.engine.connect() as conn:
            for round_id, group, lo, hi, n, n_live in conn.execute(query):
                yield round_id, group, lo, hi, n, int(n_live or 0)

    def round_means(self, run_id: int) -> dict[int, tuple[float | None, float | None]]:
        """round index -> (mean stored training reward, verified success rate) of a run's rollouts."""
        c = RolloutRow.__table__.c
        # CASE, not CAST: PostgreSQL has no boolean -> float cast
        query = (select(Round.index, func.avg(c.reward), func.avg(case((c.outcome_success, 1.0), else_=0.0)))
                 .join(Round, Round.id == c.round_id).where(c.run_id == run_id).group_by(Round.index))
        with self.engine.connect() as conn:
            return {index: (reward, success) for index, reward, success in conn.execute(query)}

    def task_keys(self, split: str) -> set[tuple[str, str]]:
        """(domain, task id) of every stored task of the split."""
        with self.engine.connect() as conn:
            return {(d, t) for d, t in conn.execute(select(Task.domain, Task.task_id).where(Task.split == split))}

    def rollout_tasks(self, scope: RolloutScope, ids: Iterable[str] | None = None
                      ) -> Iterator[tuple[str, str, str, dict[str, Any] | None]]:
        """(rollout id, task id, domain, meta) of the scope's rollouts (with `ids`, of those among them)."""
        c = RolloutRow.__table__.c
        query = scope.where(select(c.id, c.task_id, c.domain, c.meta))
        with self.engine.connect() as conn:
            if ids is None:
                yield from conn.execute(query)
                return
            for chunk in chunks(dict.fromkeys(ids)):
                yield from conn.execute(query.where(c.id.in_(chunk)))

    def verified_success(self, ids: Iterable[str]) -> dict[str, bool]:
        """rollout id -> its verified outcome, for those of these ids that are stored."""
        c = RolloutRow.__table__.c
        found: dict[str, bool] = {}
        with self.engine.connect() as conn:
            for chunk in chunks(dict.fromkeys(ids)):
                found.update(conn.execute(select(c.id, c.outcome_success).where(c.id.in_(chunk))).all())
        return found


__all__ = ["ViewReads"]
