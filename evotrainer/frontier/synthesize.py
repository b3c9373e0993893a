"""Self-questioning for math and code: variants of the tasks whose pass rate sits in a band,
each validated by the trusted checker and deduplicated before it joins the train split.

    report = synthesize_frontier(store, "math", band=(0.2, 0.8), n=20, seed=0)
    report.accepted   # tasks now in the store (split train, meta origin=frontier, parent=...)
    report.rejected   # (parent, variant id or "", reason) for every variant that was dropped

Parents are train tasks only: a variant of a held-out task would leak it into training, and a
variant whose key hashes to the held-out split is rejected like any invalid task.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.api import TaskStats
from evotrainer.domains.base import Task
from evotrainer.frontier.validate import Deduper, check_task
from evotrainer.frontier.variants import NoVariant, variant
from evotrainer.memory.strata import evidence
from evotrainer.store import Store

ORIGIN = "frontier"


@dataclass
class FrontierReport:
    domain: str
    band: tuple[float, float]
    parents: list[str] = field(default_factory=list)
    accepted: list[Task] = field(default_factory=list)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (parent, variant id, reason)

    def to_json(self) -> dict:
        return {"domain": self.domain, "band": list(self.band), "parents": self.parents,
                "accepted": [{"task_id": t.task_id, "parent": t.meta.get("parent"), "prompt": t.prompt,
                              "answer": t.answer, "key": t.meta.get("key")} for t in self.accepted],
                "rejected": [{"parent": p, "task_id": v, "reason": r} for p, v, r in self.rejected]}

    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, _, r in self.rejected:
            name = r.split(":", 1)[0]
            out[name] = out.get(name, 0) + 1
        return out


def in_band(stats: Sequence[TaskStats], band: tuple[float, float], min_attempts: int = 4) -> list[TaskStats]:
    """Train tasks with enough attempts whose pass rate lies in [lo, hi], closest to the middle
    first. The pass rate is the replay memory's current belief where the stats carry one (meta
    `logit`, memory/run.py), else successes over attempts."""
    lo, hi = band
    rate = {s.task_id: evidence(s)[1] for s in stats}
    picked = [s for s in stats if s.meta.get("split") == "train" and s.attempts >= min_attempts
              and lo <= rate[s.task_id] <= hi]
    mid = (lo + hi) / 2
    return sorted(picked, key=lambda s: (abs(rate[s.task_id] - mid), s.task_id))



def stored_tasks(store: Store, domain: str) -> list[Task]:
    """Every task of the domain in the store's task table (both splits)."""
    return [Task(t["task_id"], domain, t["split"], t["level"], t["prompt"], t["answer"], t["meta"])
            for t in store.tasks(domain)]


def synthesize_frontier(store: Store, domain: str, *, band: tuple[float, float] = (0.2, 0.8), n: int = 20,
                        seed: int = 0, run_id: int | None = None, min_attempts: int = 4,
                        heldout_fraction: float = 0.2, tries_per_task: int = 8,
                        known: Sequence[Task] = (), stats: Sequence[TaskStats] | None = None) -> FrontierReport:
    """Up to n validated variants of the band's tasks, stored as train tasks; see module doc.
    `known`: tasks to deduplicate against besides the store's (e.g. the whole held-out split).
    `stats`: the per-task evidence to pick parents by (default: the run's counts in the store)."""
    if not 0.0 <= band[0] <= band[1] <= 1.0:
        raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got {band}")
    report = FrontierReport(domain, band)
    by_id = {t.task_id: t for t in stored_tasks(store, domain)}
    stats = store.task_stats(domain, run_id) if stats is None else stats
    parents = [by_id[s.task_id] for s in in_band(stats, band, min_attempts) if s.task_id in by_id]
    report.parents = [p.task_id for p in parents]
    dedupe = Deduper([*by_id.values(), *known])
    rng = random.Random(f"frontier:{domain}:{seed}")
    budget = n * tries_per_task
    while parents and len(report.accepted) < n and budget > 0:
        for parent in list(parents):
            if len(report.accepted) >= n or budget <= 0:
                break
            budget -= 1
            try:
                child = variant(parent, rng, heldout_fraction)
            except NoVariant as exc:
                report.rejected.append((parent.task_id, "", f"no_generator: {exc}"))
                parents.remove(parent)
                continue
            twin = dedupe.seen(child)
            if twin is not None:
                report.rejected.append((parent.task_id, child.task_id, f"duplicate: of {twin}"))
                continue
            verdict = check_task(child)
            dedupe.add(child)  # a rejected variant is not retried either
            if not verdict.ok:
                report.rejected.append((parent.task_id, child.task_id, verdict.reason))
                continue
            report.accepted.append(Task(child.task_id, child.domain, child.split, child.level, child.prompt,
                                        child.answer, {**child.meta, "origin": ORIGIN, "parent": parent.task_id}))
    store.upsert_tasks(domain, [{"task_id": t.task_id, "split": t.split, "level": t.level, "prompt": t.prompt,
                                 "answer": t.answer, "meta": _jsonable(t.meta)} for t in report.accepted])
    return report


def _jsonable(meta) -> dict:
    return json.loads(json.dumps(dict(meta), default=list))


def frontier_tasks(store: Store, domain: str) -> list[Task]:
    """The synthesized train tasks in the store, re-validated (a training loop adds these)."""
    return [t for t in stored_tasks(store, domain)
            if t.meta.get("origin") == ORIGIN and t.split == "train" and check_task(t).ok]


def write_report(report: FrontierReport, folder: Path | str, name: str) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return path
