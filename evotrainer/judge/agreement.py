"""Judge agreement over stored rollouts: each judge's verdicts beside the verified outcomes and human labels."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from evotrainer.backtest.metrics import judge_agreement
from evotrainer.judge.records import JudgeRecords
from evotrainer.store import Store


def selection_ids(store: Store, selection: Any) -> list[str]:
    """The rollout ids of a resolved backtest selection (evotrainer.backtest.engine.Selection)."""
    if selection.scope is None:
        return list(selection.selector.ids or ())
    return [rid for _, rid, _ in store.rollout_keys(selection.scope)]


def agreement(store: Store, rollout_ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """judge_agreement() for the rollout-level verdicts stored for these rollouts (all: None).

    A judge is `role@model`. When a cache holds several verdicts of one judge for a rollout (an
    edited prompt), the newest counts."""
    records = JudgeRecords(store)
    if not records.has_verdicts():
        return {}  # the common case: no judge ran; skip the id lookups
    latest: dict[tuple[str, str], Any] = {}
    for v in records.verdicts(rollout_ids):
        latest[(f"{v.role}@{v.judge_model}", v.rollout_id)] = v
    if not latest:
        return {}
    ids = sorted({rid for _, rid in latest})
    verified = store.verified_success(ids)
    human = records.human_labels(ids)
    votes = []
    for (judge, rid), v in latest.items():
        if rid not in verified:
            continue  # a verdict on a rollout that is not in the store any more
        ok = v.verdict is not None and v.status == "ok"
        votes.append((judge, bool(v.verdict["success"]) if ok else None,
                      int(v.verdict["quality"]) if ok else None, bool(verified[rid]), human.get(rid)))
    return judge_agreement(votes)


__all__ = ["agreement", "selection_ids"]
