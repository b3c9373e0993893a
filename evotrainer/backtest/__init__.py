"""Backtests: replay a candidate harness next to its base over stored rollouts, then apply the gate.

    report = backtest(workdir, "candidate/3-format-credit")   # writes backtests/<id>.json + .md
    check = replay(workdir, report["id"])                     # same rollouts, same numbers?

Both harness versions are read from commits of `<workdir>/harnesses` and run only inside sandboxed
worker processes (evotrainer.harness.sandbox), each version in workers of its own that return raw
values; the gate's margins and limits come from config. A promotion also needs the candidate's
rerun in fresh workers to give the very same values (engine.recheck).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import git

from evotrainer.backtest.engine import (
    DEFAULT_CHUNK,
    BacktestRun,
    HarnessVersion,
    Selector,
    recheck,
    run_backtest,
)
from evotrainer.backtest.gate import Check, GateDecision, decide, target_from_trailer
from evotrainer.backtest.metrics import LOWER_IS_BETTER, METRICS, SAFETY_METRICS, Tally, group_advantages
from evotrainer.backtest.report import build_report, find_report, load_report, new_id, render_markdown, write_report
from evotrainer.backtest.selector import ids_sha256, resolve
from evotrainer.config import GateConfig
from evotrainer.harness.repo import CANDIDATE_PREFIX, MAIN, HarnessRepo, HarnessRepoError
from evotrainer.harness.sandbox import CandidateFailure
from evotrainer.store import Store
from evotrainer.workspace import Workspace

Progress = Callable[[int, int], None]


def _versions(repo: HarnessRepo, base: str, candidate: str) -> tuple[HarnessVersion, HarnessVersion]:
    return cast("tuple[HarnessVersion, HarnessVersion]",
                tuple(HarnessVersion(sha, repo.sources(sha)) for sha in (repo.resolve(base), repo.resolve(candidate))))


def _run_and_decide(store: Store, base: HarnessVersion, candidate: HarnessVersion, selector: Selector,
                    gate: GateConfig, declared: str | None, **kwargs: Any) -> tuple[BacktestRun, GateDecision]:
    run = run_backtest(store, base, candidate, selector, gate, **kwargs)
    metrics = run.metrics or {}
    decision = decide(metrics.get("base"), metrics.get("candidate"), gate, declared_target=declared,
                      failure=run.failure, candidate_seconds=run.timings.get("candidate_s", 0.0))
    if decision.decision == "promote":  # only a promotion pays for the rerun in fresh workers
        why_not = recheck(store, candidate, run, gate, executor=kwargs.get("executor", "local"))
        if why_not is not None:
            check = Check("deterministic", False, why_not)
            return run, GateDecision("reject", decision.target, [why_not], [*decision.checks, check])
        check = Check("deterministic", True, f"a second, fresh worker gave the candidate's very same raw "
                      f"values for all {run.selection.count} rollouts")
        decision = GateDecision("promote", decision.target, [*decision.reasons, check.detail],
                                [*decision.checks, check])
    return run, decision


def backtest(workdir: Path | str, rev: str, *, base: str = MAIN, selector: Selector | None = None,
             gate: GateConfig | None = None, store: Store | None = None, workers: int | None = None,
             chunk_size: int = DEFAULT_CHUNK, on_progress: Progress | None = None,
             record: bool = True, executor: str = "local", reuse: bool = False) -> dict[str, Any]:
    """Backtest harness revision `rev` against `base`, write and index the report, and return it.

    A harness fault never raises: it is a "reject" report with the reason. With `record`, a
    candidate branch gets a `Backtest: <id>` trailer (HarnessRepo.record_backtest). With `reuse`,
    a report already indexed for the same base, candidate tree and selection is returned instead
    of a new run (a resumed `coevolve` whose kill came after the report was written).
    """
    ws = Workspace(workdir)
    repo = HarnessRepo(ws.harnesses)
    gate = gate or GateConfig()
    base_v, cand_v = _versions(repo, base, rev)
    trailer = repo.log(rev=cand_v.sha, limit=1)[0].trailers.get("Targets")
    declared = target_from_trailer(trailer)
    own_store = store is None
    store = store or Store.open(ws.root)
    try:
        report = _earlier_report(repo, store, base_v, cand_v, rev, selector or Selector()) if reuse else None
        if report is not None:
            if not (ws.backtests / f"{report['id']}.json").is_file():  # the kill came before its file did
                write_report(ws.backtests, report)
            _record(repo, rev, report["id"], record)
            return report
        run, decision = _run_and_decide(store, base_v, cand_v, selector or Selector(), gate, declared,
                                        workers=workers, chunk_size=chunk_size, on_progress=on_progress,
                                        executor=executor)
        report = build_report(new_id(), base_rev=base, base_sha=base_v.sha, candidate_rev=rev,
                              candidate_sha=cand_v.sha, run=run, decision=decision, gate=gate,
                              declared_target=declared)
        report["targets_trailer"] = trailer
        report["judges"] = _judge_agreement(store, run)
        report["source_reported"] = _source_reported(store, run)
        write_report(ws.backtests, report, store)
    finally:
        if own_store:
            store.close()
    _record(repo, rev, report["id"], record)
    return report


def _source_reported(store: Store, run: BacktestRun) -> int:
    """How many of the replayed rollouts carry an outcome another engine reported (imported with
    --outcome-field, api.SOURCE_REPORTED), not one our check verified: the report says so."""
    from evotrainer.api import SOURCE_REPORTED

    selection = run.selection
    return sum(store.flagged_counts(SOURCE_REPORTED, selection.scope, selection.selector.ids).values())


def _record(repo: HarnessRepo, rev: str, backtest_id: str, record: bool) -> None:
    if record and rev.startswith(CANDIDATE_PREFIX) and rev in repo.candidates():
        try:
            repo.record_backtest(rev, backtest_id)
        except HarnessRepoError:
            pass  # e.g. already promoted: the report still names the commit it tested


def _earlier_report(repo: HarnessRepo, store: Store, base_v, cand_v, rev: str, selector: Selector):
    tree = repo.repo.commit(cand_v.sha).tree.hexsha

    def same_tree(sha: str) -> bool:
        try:
            return repo.repo.commit(sha).tree.hexsha == tree
        except (ValueError, git.BadName):  # a commit this repo does not have
            return False

    selection = resolve(store, selector)
    return find_report(store, base_sha=base_v.sha, candidate_rev=rev, same_candidate=same_tree,
                       rollout_ids_sha256=ids_sha256(store, selection))


def _judge_agreement(store: Store, run: BacktestRun) -> dict[str, Any]:
    """Each stored judge's AUC and accuracy against the verified outcomes of the same rollouts
    (the same for base and candidate: judges score rollouts, not harnesses)."""
    from evotrainer.judge.agreement import agreement, selection_ids

    return agreement(store, selection_ids(store, run.selection))


def replay(workdir: Path | str, backtest_id: str, *, store: Store | None = None,
           workers: int | None = None, on_progress: Progress | None = None,
           executor: str = "local") -> dict[str, Any]:
    """Re-run a stored backtest on the same commits, rollouts and gate; say what reproduced."""
    ws = Workspace(workdir)
    own_store = store is None
    store = store or Store.open(ws.root)
    try:
        old = load_report(ws.backtests, backtest_id, store)
        base_v, cand_v = _versions(HarnessRepo(ws.harnesses), old["base"], old["candidate"])
        run, decision = _run_and_decide(store, base_v, cand_v, Selector.from_json(old["selector"]),
                                        GateConfig(**old["gate"]), old.get("declared_target"),
                                        workers=workers, on_progress=on_progress, executor=executor)
    finally:
        if own_store:
            store.close()
    new_metrics = run.metrics if run.metrics else {"base": None, "candidate": None}
    mismatches = []
    for side in ("base", "candidate"):
        before, after = old["metrics"][side] or {}, new_metrics[side] or {}
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                mismatches.append(f"{side}.{name}: {before.get(name)!r} -> {after.get(name)!r}")
    same_rollouts = (old["n_rollouts"] == run.selection.count
                     and old["rollout_ids_sha256"] == run.selection.ids_sha256)
    if not same_rollouts:
        mismatches.insert(0, f"rollouts: {old['n_rollouts']} ({old['rollout_ids_sha256'][:12]}) -> "
                             f"{run.selection.count} ({run.selection.ids_sha256[:12]})")
    if old.get("reward_distribution") is not None and old["reward_distribution"] != run.distribution:
        mismatches.append("reward_distribution: the per-class reward histogram differs")
    for key, now in (("decision", decision.decision), ("target", decision.target)):
        if old[key] != now:
            mismatches.append(f"{key}: {old[key]!r} -> {now!r}")
    return {
        "id": old["id"],
        "reproduced": not mismatches,
        "same_rollouts": same_rollouts,
        "mismatches": mismatches,
        "n_rollouts": run.selection.count,
        "decision": {"stored": old["decision"], "replayed": decision.decision},
        "metrics": {"stored": old["metrics"], "replayed": new_metrics},
        "failure": ({"harness": run.failure.harness, "reason": run.failure.reason}
                    if run.failure is not None else None),
        "timings": run.timings,
    }


__all__ = ["BacktestRun", "CandidateFailure", "GateDecision", "HarnessVersion", "LOWER_IS_BETTER",
           "METRICS", "SAFETY_METRICS", "Selector", "Tally", "backtest", "build_report", "decide",
           "group_advantages", "load_report", "new_id", "render_markdown", "replay", "run_backtest",
           "target_from_trailer", "write_report"]
