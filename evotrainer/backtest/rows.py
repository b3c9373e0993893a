"""The trusted parent reads a chunk's rows and splits them: frozen plain data for a worker, facts it keeps.

Only the parent opens the store. What a worker gets is plain JSON-able data (one list per
rollout, JSON columns left as text so each worker parses its own copy); what decides (the
verified outcome, the flags, the token count) stays here, in `Fact`s that no harness code can
reach, and is joined with the worker's raw values in scoring.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from sqlalchemy import Text, cast, func, select

from evotrainer.backtest.metrics import is_flagged
from evotrainer.backtest.selector import IN_BATCH, Scope
from evotrainer.store import Store
from evotrainer.store.models import RolloutRow

# The order of the fields in a frozen rollout (replay_worker.py builds api objects from it).
COLUMNS = ("seq", "id", "task_id", "group_id", "domain", "prompt", "completion", "turns",
           "outcome_success", "outcome_score", "outcome_kind", "outcome_flags", "num_tokens",
           "truncated", "meta")
_JSON_COLUMNS = ("turns", "outcome_flags", "meta")  # read as text: each worker parses its own copy


@dataclass(frozen=True)
class Fact:
    """What trusted code knows of one stored rollout, for the metrics: never sent, never returned."""

    id: str
    group_id: str
    task_id: str
    success: bool
    flagged: bool
    tokens: int


def _loads_list(text: str | None) -> list:
    return [] if not text or text == "[]" else json.loads(text)


class ChunkReader:
    """Reads chunks (selector.plan_chunks) from the store, whole groups only."""

    def __init__(self, store: Store, scope: Scope | None):
        self.store, self.scope = store, scope
        c = RolloutRow.__table__.c
        self.columns = [cast(c[n], Text) if n in _JSON_COLUMNS else c[n] for n in COLUMNS]

    def read(self, chunk: tuple) -> tuple[list[list[list]], list[list[Fact]]]:
        """(frozen groups for a worker, the same groups as facts), groups in the order of their
        first row, rollouts in store order."""
        with self.store.engine.connect() as conn:
            rows = self._rows(conn, chunk)
        frozen: dict[str, list[list]] = {}
        facts: dict[str, list[Fact]] = {}
        flagged: dict[tuple, bool] = {}  # (kind, flags text): a handful of distinct ones per chunk
        for row in rows:
            (_seq, rid, task_id, group_id, domain, prompt, completion, turns, success, score, kind,
             flags, tokens, truncated, meta) = row
            frozen.setdefault(group_id, []).append(
                [rid, task_id, group_id, domain, prompt, completion, turns or "[]", bool(success),
                 float(score), kind, flags or "[]", int(tokens), bool(truncated), meta or "{}"])
            hack = flagged.get((kind, flags))
            if hack is None:
                hack = flagged[kind, flags] = is_flagged(kind, tuple(_loads_list(flags)))
            facts.setdefault(group_id, []).append(Fact(rid, group_id, task_id, bool(success), hack, int(tokens)))
        return list(frozen.values()), list(facts.values())

    def _rows(self, conn: Any, chunk: tuple) -> Sequence:
        c = RolloutRow.__table__.c
        if chunk[0] == "seqs":
            seqs = chunk[1]
            rows = [r for i in range(0, len(seqs), IN_BATCH)
                    for r in conn.execute(select(*self.columns).where(c.seq.in_(seqs[i:i + IN_BATCH])))]
            return sorted(rows, key=lambda r: r[0])
        _, lo, hi = chunk
        scope = self.scope
        rows = conn.execute(scope.where(select(*self.columns)).where(c.seq >= lo, c.seq <= hi)
                            .order_by(c.seq)).all()
        local: dict[str, int] = {}
        for r in rows:
            local[r[3]] = local.get(r[3], 0) + 1
        split: dict[str, int] = {}  # group -> seq of its first selected row, if not all in [lo, hi]
        names = list(local)
        for i in range(0, len(names), IN_BATCH):
            query = (scope.where(select(c.group_id, func.count(), func.min(c.seq)))
                     .where(c.group_id.in_(names[i:i + IN_BATCH])).group_by(c.group_id))
            for group, total, first in conn.execute(query):
                if total != local[group]:
                    split[group] = first
        if not split:
            return rows
        out = [r for r in rows if r[3] not in split]
        for group, first in split.items():
            if lo <= first <= hi:  # this chunk holds the group's first row: read all of it
                out.extend(conn.execute(scope.where(select(*self.columns))
                                        .where(c.group_id == group).order_by(c.seq)))
        return out


__all__ = ["COLUMNS", "ChunkReader", "Fact"]
