"""The backtest's bulk reads, part of Store: pin a selection, stream its keys, read chunks of whole groups.

Every read is by seq (the insert order): keyset pages for a scope, bounded IN lists for listed
rows, so a selection of any size costs a fixed number of queries per page or chunk, never one per
rollout. Rows come back as tuples of the columns asked for, in that order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from evotrainer.store.models import RolloutRow
from evotrainer.store.sql import RolloutScope, chunks, keyset_pages, rollout_columns

KEYS_PAGE = 10_000  # (seq, id, group_id) rows per keyset page


class ReplayReads:
    """Store's backtest reads (a mixin: it uses the Store's engine)."""

    engine: Engine

    def last_seq(self) -> int:
        """The seq of the newest stored rollout (0: none)."""
        with self.engine.connect() as conn:
            return conn.scalar(select(func.max(RolloutRow.seq))) or 0

    def pin(self, scope: RolloutScope, limit: int | None = None) -> tuple[RolloutScope, int]:
        """The scope pinned to what is stored now, and how many rollouts it then holds.

        `until_seq` becomes the newest seq unless it is set. With `limit`, the scope ends at its
        limit-th row instead, rounded up to the end of that row's group, so no group is cut.
        One transaction, so the count is of exactly the pinned rows.
        """
        c = RolloutRow.__table__.c
        with self.engine.connect() as conn:
            if scope.until_seq is None:
                scope = replace(scope, until_seq=conn.scalar(select(func.max(c.seq))) or 0)
            if limit is not None:
                nth = conn.execute(scope.where(select(c.seq, c.group_id)).order_by(c.seq)
                                   .offset(limit - 1).limit(1)).first()
                if nth is not None:
                    end = conn.scalar(scope.where(select(func.max(c.seq))).where(c.group_id == nth.group_id))
                    scope = replace(scope, until_seq=max(nth.seq, end or nth.seq))
            count = conn.scalar(scope.where(select(func.count()).select_from(RolloutRow.__table__)))
        return scope, count or 0

    def rollout_keys(self, scope: RolloutScope | None = None, ids: Sequence[str] | None = None,
                     page: int = KEYS_PAGE) -> Iterator[tuple[int, str, str]]:
        """(seq, id, group_id) of the scope's rollouts, or of the listed ids (those stored), in
        store order: keyset pages of `page` rows for a scope, IN lists for ids."""
        c = RolloutRow.__table__.c
        keys = select(c.seq, c.id, c.group_id)
        if ids is None:
            for rows in keyset_pages(self.engine.connect, (scope or RolloutScope()).where(keys), page):
                yield from rows
            return
        with self.engine.connect() as conn:
            found = sorted(tuple(r) for chunk in chunks(ids) for r in conn.execute(keys.where(c.id.in_(chunk))))
        yield from found

    def rows_at(self, seqs: Sequence[int], columns: Sequence[str], raw_json: bool = False) -> list[Any]:
        """The rollouts with these seqs, in store order (`columns` must hold "seq"); with
        `raw_json`, JSON columns as their text."""
        c = RolloutRow.__table__.c
        query = select(*rollout_columns(columns, raw_json))
        with self.engine.connect() as conn:
            rows = [r for chunk in chunks(seqs) for r in conn.execute(query.where(c.seq.in_(chunk)))]
        return sorted(rows, key=itemgetter(list(columns).index("seq")))

    def group_rows(self, scope: RolloutScope, lo: int, hi: int, columns: Sequence[str],
                   raw_json: bool = False) -> list[Any]:
        """The scope's rows of each group whose first row in the scope has a seq in [lo, hi]:
        whole groups, even where a group's rows are scattered past `hi` (interleaved writers).

        The rows in [lo, hi] of groups held whole come first, in store order; then each
        scattered group, in store order. `columns` must hold "group_id".
        """
        c = RolloutRow.__table__.c
        g = list(columns).index("group_id")
        query = scope.where(select(*rollout_columns(columns, raw_json)))
        with self.engine.connect() as conn:
            rows = cast("list[Any]", conn.execute(query.where(c.seq >= lo, c.seq <= hi).order_by(c.seq)).all())
            local: dict[str, int] = {}
            for r in rows:
                local[r[g]] = local.get(r[g], 0) + 1
            split: dict[str, int] = {}  # group -> seq of its first row in scope, if not all in [lo, hi]
            for names in chunks(local):
                counts = (scope.where(select(c.group_id, func.count(), func.min(c.seq)))
                          .where(c.group_id.in_(names)).group_by(c.group_id))
                for group, total, first in conn.execute(counts):
                    if total != local[group]:
                        split[group] = first
            if not split:
                return rows
            out = [r for r in rows if r[g] not in split]
            for group, first in split.items():
                if lo <= first <= hi:  # this chunk holds the group's first row: read all of it
                    out.extend(conn.execute(query.where(c.group_id == group).order_by(c.seq)))
        return out


__all__ = ["KEYS_PAGE", "ReplayReads"]
