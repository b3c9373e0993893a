"""Replay a base and a candidate harness over the same stored rollouts, each in sandboxed workers of its own.

The trusted parent alone opens the store. For each side it streams the selection in chunks of
whole groups (selector.py), reads each chunk's rows (rows.py), keeps the verified facts and sends
the worker frozen rollouts as plain data. A worker holds exactly one harness version
(replay_worker.py) and returns raw values per rollout; the parent checks them and computes every
metric itself (scoring.py). Base and candidate run side by side (passes.py), each in a pool of
fresh worker processes of its own, so no process ever holds both and none is reused across
versions.

`recheck` reruns the candidate in a second pool of fresh workers, over every selected rollout,
in chunks of half the size and in reverse order: a promotion needs the very same raw values
(scoring.Fingerprint). Memory: a page of keys and the chunks in flight, whatever the store size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evotrainer.backtest.metrics import reward_histogram
from evotrainer.backtest.passes import SideRun, replay
from evotrainer.backtest.scoring import Side
from evotrainer.backtest.selector import (
    Selection,
    Selector,
    history,
    ids_sha256,
    plan_chunks,
    resolve,
)
from evotrainer.config import GateConfig
from evotrainer.dist import usable_cpus
from evotrainer.harness.loader import HARNESS_FILES
from evotrainer.harness.sandbox import CandidateFailure, SandboxPool
from evotrainer.store import Store

DEFAULT_CHUNK = 4096
LABELS = ("base", "candidate")


@dataclass(frozen=True)
class HarnessVersion:
    """One side of a backtest: a commit sha (or any label) and its harness files."""

    sha: str
    sources: Mapping[str, str]


@dataclass
class BacktestRun:
    """What a backtest measured, before the gate."""

    selection: Selection
    metrics: dict[str, dict[str, Any]] | None
    failure: CandidateFailure | None
    timings: dict[str, float] = field(default_factory=dict)
    workers: int = 0
    # Training reward of verified successes and failures per side (metrics.reward_histogram),
    # from the same exact tallies as the metrics: the report draws it without replaying harnesses.
    distribution: dict[str, Any] | None = None
    # Per side: scoring.Fingerprint of its raw values, and its curriculum's task shares (for recheck).
    fingerprints: dict[str, str] = field(default_factory=dict)
    shares: dict[str, dict[str, float] | None] = field(default_factory=dict)
    chunk_size: int = DEFAULT_CHUNK


def chunk_pool(executor: str) -> Callable[..., Any]:
    """The pool class that runs backtest chunks for an executor name (config `executor.kind`)."""
    if executor == "local":
        return SandboxPool
    if executor == "ray":
        from evotrainer.sandbox.ray_executor import RaySandboxPool

        return RaySandboxPool
    raise ValueError(f"unknown executor {executor!r}; known: local, ray")


def run_backtest(store: Store, base: HarnessVersion, candidate: HarnessVersion, selector: Selector,
                 gate: GateConfig | None = None, *, workers: int | None = None,
                 chunk_size: int = DEFAULT_CHUNK,
                 on_progress: Callable[[int, int], None] | None = None,
                 executor: str = "local") -> BacktestRun:
    """Score the selected rollouts under both harnesses. A harness fault is returned as
    `failure` (metrics None), never raised; a bad selector raises ValueError.

    `executor`: "local" (sandbox worker processes here) or "ray" (the same sandbox workers,
    each inside a Ray actor; see evotrainer.sandbox.ray_executor)."""
    pool_class = chunk_pool(executor)
    gate = gate or GateConfig()
    selection = resolve(store, selector)
    if not selection.count:
        raise ValueError(f"selector {selector.describe()!r} matches no stored rollouts")
    workers = max(1, workers or usable_cpus())
    # Enough chunks to keep every worker busy on small selections.
    chunk_size = max(1, min(chunk_size, max(256, math.ceil(selection.count / (4 * workers)))))
    workers = min(workers, math.ceil(selection.count / chunk_size))
    hist = history(store, selector)
    start = time.perf_counter()
    runs: list[SideRun] = []
    done = {label: 0 for label in LABELS}
    failure = None

    def progress(label: str, n: int) -> None:
        done[label] += n
        if on_progress:
            on_progress((done["base"] + done["candidate"]) // 2, selection.count)

    try:
        for label, version in zip(LABELS, (base, candidate)):
            missing = [f for f in HARNESS_FILES if f not in version.sources]
            if missing:
                raise CandidateFailure(f"{', '.join(missing)}: not found at {version.sha[:12]}", label)
        runs = [SideRun(Side.parse(label, v.sources), v.sources) for label, v in zip(LABELS, (base, candidate))]
        replay(store, selection, runs, plan_chunks(store, selection, chunk_size), gate, pool_class, workers,
               hist, on_rollouts=progress)
    except CandidateFailure as exc:
        failure = exc
        if not selection.ids_sha256:  # still fix the set in the report: hash the rest of the ids
            selection.ids_sha256 = ids_sha256(store, selection)
    if failure is None and any(n != selection.count for n in done.values()):
        raise RuntimeError(f"scored {done} rollouts but the selection has {selection.count}: "
                           "did the store change during the backtest?")
    wall = time.perf_counter() - start
    timings = {"wall_s": round(wall, 3), "base_s": 0.0, "candidate_s": 0.0}
    timings.update({f"{r.side.label}_s": round(r.seconds, 3) for r in runs})
    if failure is not None:
        return BacktestRun(selection, None, failure, timings, workers, chunk_size=chunk_size)
    timings["startup_s"] = round(max(r.startup for r in runs), 3)
    timings["rollouts_per_s"] = round(selection.count / wall, 1) if wall else 0.0
    metrics = {r.side.label: r.tally.metrics() for r in runs}
    distribution = reward_histogram({r.side.label: r.tally.auc for r in runs})
    return BacktestRun(selection, metrics, None, timings, workers, distribution,
                       fingerprints={r.side.label: r.fingerprint.hexdigest() for r in runs},
                       shares={r.side.label: r.shares for r in runs}, chunk_size=chunk_size)


def recheck(store: Store, candidate: HarnessVersion, run: BacktestRun, gate: GateConfig | None = None, *,
            executor: str = "local") -> str | None:
    """Replay the candidate again in a second pool of fresh workers, over every rollout of the
    run's selection, in chunks of half the size and in reverse order. None when its
    raw values are identical to the run's; otherwise why not (a nondeterministic candidate)."""
    gate = gate or GateConfig()
    selection = run.selection
    # Other chunk boundaries and order: a harness that counts its calls, or keys on where a
    # rollout sits in a message, sees a different sequence.
    chunk_size = max(1, run.chunk_size // 2)
    chunks = list(plan_chunks(store, selection, chunk_size))[::-1]
    workers = max(1, min(run.workers, len(chunks)))
    hist = history(store, selection.selector)
    again = SideRun(Side.parse("candidate", candidate.sources), candidate.sources)
    try:
        replay(store, selection, [again], chunks, gate, chunk_pool(executor), workers, hist,
               base_shares=run.shares.get("base"), budget=None)
    except CandidateFailure as exc:
        return f"nondeterministic: the rerun in a fresh worker failed where the first run did not: {exc.reason}"
    if again.fingerprint.hexdigest() != run.fingerprints.get("candidate"):
        return ("nondeterministic: a second, fresh worker gave different raw values (rewards, keep "
                f"flags, stop cuts or curriculum weights) for the same {selection.count} rollouts")
    return None


__all__ = ["BacktestRun", "DEFAULT_CHUNK", "HarnessVersion", "LABELS", "Selection", "Selector",
           "chunk_pool", "ids_sha256", "plan_chunks", "recheck", "resolve", "run_backtest"]
