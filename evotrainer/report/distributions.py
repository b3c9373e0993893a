"""The fallback for backtest reports written before backtests kept their reward distribution
(report key `reward_distribution`, see backtest.metrics.reward_histogram): recompute it by
replaying both harness versions over a sample of the same stored rollouts.

Harness code is untrusted, so it runs in the sandboxed worker pool the backtest engine uses; a
harness that fails there only leaves its chart out. Newer reports never come here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from evotrainer.api import Rollout, rollout_from_dict, rollout_to_dict
from evotrainer.backtest.engine import Selector
from evotrainer.backtest.metrics import reward_histogram
from evotrainer.harness.redact import redact
from evotrainer.harness.repo import HarnessRepo, HarnessRepoError
from evotrainer.harness.sandbox import CandidateFailure, SandboxError, SandboxLimits, SandboxPool
from evotrainer.store import Store

SAMPLE = 2000  # rollouts per backtest: enough to see the shape, cheap at any store size
BATCH = 250


@dataclass(frozen=True)
class RewardJob:
    """In a worker: the training reward of every rollout of a batch under the harnesses at the
    given slots (their order in the pool). Slots, not labels: inside a worker the harnesses go by
    names that say nothing of the job (harness/sandbox_pool.py inner_labels)."""

    def open(self, trusted_io: Callable[[], AbstractContextManager[None]]) -> None:
        return None

    def run(self, state: None, harnesses: Mapping[str, Any], message: tuple) -> list[list[float]]:
        slots, dicts = message
        held = list(harnesses.values())
        rollouts = [rollout_from_dict(d) for d in dicts]
        return [[float(held[s].training_reward(held[s].reward(r))) for r in rollouts] for s in slots]


def _sample(store: Store, selector: dict) -> list[Rollout]:
    sel = Selector.from_json(selector)
    run_id = store.run_id(sel.run) if sel.run is not None else None
    if sel.run is not None and run_id is None:
        return []
    limit = min(SAMPLE, sel.limit) if sel.limit else SAMPLE
    return [sr.rollout for sr in store.iter_rollouts(run_id=run_id, round_index=sel.round, domain=sel.domain,
                                                     ids=sel.ids, limit=limit)]


def _score(repo: HarnessRepo, shas: list[str], work: list[tuple[list[str], list[Rollout]]]) -> list[dict]:
    sides = [(sha, repo.sources(sha)) for sha in shas]
    slot = {sha: i for i, sha in enumerate(shas)}
    messages = [([slot[label] for label in labels], [rollout_to_dict(r) for r in rollouts[i:i + BATCH]])
                for labels, rollouts in work for i in range(0, len(rollouts), BATCH)]
    replies: list[Any] = [None] * len(messages)
    with SandboxPool(sides, RewardJob(), 1, SandboxLimits(load_timeout_s=30.0, message_timeout_s=120.0)) as pool:
        for i, reply in pool.imap(messages):
            replies[i] = reply
    # Stitch batches back into one result per work item.
    out, k = [], 0
    for labels, rollouts in work:
        merged: dict[str, list[float]] = {label: [] for label in labels}
        for _ in range(0, len(rollouts), BATCH):
            for j, label in enumerate(labels):
                merged[label] += [float(x) for x in replies[k][j]]
            k += 1
        out.append(merged)
    return out


def reward_distributions(store: Store, repo: HarnessRepo, reports: list[dict]) -> dict[str, dict]:
    """backtest id -> {"n": sample size, **reward_histogram(...)} (or {"error": why}). All harness versions share one sandbox pool; if one
    of them cannot even load there, each backtest is retried in a pool of its own."""
    samples: dict[str, list[Rollout]] = {}
    work: list[tuple[dict, list[str], list[Rollout]]] = []
    out: dict[str, dict] = {}
    for bt in reports:
        if not (bt.get("metrics") or {}).get("base"):
            continue  # the candidate failed in its backtest: nothing to draw
        key = json.dumps({k: v for k, v in bt["selector"].items() if k != "until_seq"}, sort_keys=True)
        if key not in samples:
            samples[key] = _sample(store, bt["selector"])
        try:
            shas = [repo.resolve(bt["base"]), repo.resolve(bt["candidate"])]
        except HarnessRepoError as exc:
            out[bt["id"]] = {"error": str(exc)}
            continue
        if samples[key]:
            work.append((bt, shas, samples[key]))
    if not work:
        return out
    every = sorted({sha for _, shas, _ in work for sha in shas})
    try:
        results = _score(repo, every, [(shas, rollouts) for _, shas, rollouts in work])
    except (CandidateFailure, SandboxError):
        results = []
        for _, shas, rollouts in work:
            try:
                results.append(_score(repo, sorted(set(shas)), [(shas, rollouts)])[0])
            except (CandidateFailure, SandboxError) as exc:
                results.append({"error": redact(exc)})  # a worker's traceback or a harness's words
    for (bt, shas, rollouts), rewards in zip(work, results):
        if "error" in rewards:
            out[bt["id"]] = rewards
            continue
        sides: dict[str, dict[float, list[int]]] = {}
        for side, sha in zip(("base", "candidate"), shas):
            counts = sides[side] = {}
            for r, v in zip(rollouts, rewards[sha]):
                counts.setdefault(v, [0, 0])[0 if r.outcome.success else 1] += 1
        out[bt["id"]] = {"n": len(rollouts), **reward_histogram(sides)}
    return out
