"""The trusted parent reads a chunk's rows and splits them: frozen plain data for a worker, facts it keeps.

Only the parent opens the store. What a worker gets is plain JSON-able data (one list per
rollout, JSON columns left as text so each worker parses its own copy); what decides (the
verified outcome, the flags, the token count) stays here, in `Fact`s that no harness code can
reach, and is joined with the worker's raw values in scoring.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from evotrainer.backtest.metrics import is_flagged
from evotrainer.harness.calls import SCORED_LATER, scored_meta
from evotrainer.store import RolloutScope, Store

# The order of the fields in a frozen rollout (replay_worker.py builds api objects from it).
COLUMNS = ("seq", "id", "task_id", "group_id", "domain", "prompt", "completion", "turns",
           "outcome_success", "outcome_score", "outcome_kind", "outcome_flags", "num_tokens",
           "truncated", "meta")


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


_LATER = tuple(f'"{key}"' for key in SCORED_LATER)


def _as_scored(meta: str | None) -> str:
    """The meta text without what training added after the harness scored the rollout
    (harness/calls.py, SCORED_LATER): a replay shows the harness what training showed it."""
    if not meta:
        return "{}"
    if not any(key in meta for key in _LATER):  # most rows: no parse
        return meta
    return json.dumps(scored_meta(json.loads(meta)))


class ChunkReader:
    """Reads chunks (selector.plan_chunks) from the store, whole groups only."""

    def __init__(self, store: Store, scope: RolloutScope | None):
        self.store, self.scope = store, scope

    def read(self, chunk: tuple) -> tuple[list[list[list]], list[list[Fact]]]:
        """(frozen groups for a worker, the same groups as facts), groups in the order of their
        first row, rollouts in store order."""
        rows = self._rows(chunk)
        frozen: dict[str, list[list]] = {}
        facts: dict[str, list[Fact]] = {}
        flagged: dict[tuple, bool] = {}  # (kind, flags text): a handful of distinct ones per chunk
        for row in rows:
            (_seq, rid, task_id, group_id, domain, prompt, completion, turns, success, score, kind,
             flags, tokens, truncated, meta) = row
            frozen.setdefault(group_id, []).append(
                [rid, task_id, group_id, domain, prompt, completion, turns or "[]", bool(success),
                 float(score), kind, flags or "[]", int(tokens), bool(truncated), _as_scored(meta)])
            hack = flagged.get((kind, flags))
            if hack is None:
                hack = flagged[kind, flags] = is_flagged(kind, tuple(_loads_list(flags)))
            facts.setdefault(group_id, []).append(Fact(rid, group_id, task_id, bool(success), hack, int(tokens)))
        return list(frozen.values()), list(facts.values())

    def _rows(self, chunk: tuple) -> Sequence:
        # JSON columns (turns, flags, meta) stay text: each worker parses its own copy.
        if chunk[0] == "seqs":
            return self.store.rows_at(chunk[1], COLUMNS, raw_json=True)
        _, lo, hi = chunk
        assert self.scope is not None  # range chunks come only from a scoped selection (plan_chunks)
        return self.store.group_rows(self.scope, lo, hi, COLUMNS, raw_json=True)


__all__ = ["COLUMNS", "ChunkReader", "Fact"]
