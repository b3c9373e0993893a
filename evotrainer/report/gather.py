"""Read what a workspace holds (store, harness git history, backtests, diagnostics, skills, loop
state) into plain dicts for the report's templates. Reads only; never writes to the workspace."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evotrainer.api import SOURCE_REPORTED
from evotrainer.backtest.metrics import COUNTS, LOWER_IS_BETTER, METRICS
from evotrainer.backtest.report import helps
from evotrainer.coevolve.state import RunState
from evotrainer.harness.repo import MAIN, HarnessRepo, HarnessRepoError
from evotrainer.store import Store
from evotrainer.workspace import Workspace

EPS = 1e-9
_ROUND_IN_TEXT = re.compile(r"\bround[- ]?(\d+)\b")


def load_state(root: Path) -> RunState | None:
    try:
        return RunState.load(Path(root) / "coevolve.json")
    except (ValueError, TypeError, KeyError):
        return None  # a hand-edited or older state file must not stop the report


def round_health(store: Store) -> dict[int, dict[str, float]]:
    """Per round id: dead-group ratio and effective-data ratio of what training stored.

    Computed from the stored training rewards and advantages (what the trainer saw), by group, in
    one aggregate query, so it costs the same whatever the rollouts' text sizes are.
    """
    out: dict[int, list[int]] = {}
    for round_id, _, lo, hi, n, live in store.group_reward_stats(EPS):
        acc = out.setdefault(round_id, [0, 0, 0, 0])  # groups, dead groups, rollouts, effective
        acc[0] += 1
        acc[1] += int(lo is None or hi is None or hi - lo <= EPS)
        acc[2] += n
        acc[3] += live
    return {rid: {"dead_group_ratio": a[1] / a[0] if a[0] else None,
                  "effective_data_ratio": a[3] / a[2] if a[2] else None, "n_rollouts": a[2]}
            for rid, a in out.items()}


def judged_rounds(store: Store) -> set[tuple[int, int | None]]:
    """(run id, round index; None: the base model) of the held-out evals that hold judge-verified
    outcomes (the judged domain: an LLM panel's verdict; train/evaluate.py counts them)."""
    return {(run_id, e["round_index"]) for run_id in store.run_names() for e in store.evals(run_id)
            if e["split"] == "heldout" and (e.get("details") or {}).get("judge_verified")}


def judge_agreement(root: Path) -> dict[str, Any] | None:
    """The judge panel against people on the human-labelled held-out set (domains/judged.py)."""
    try:
        data = json.loads((Path(root) / "judge_agreement.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = {"n", "unjudged", "judged", "accuracy", "kappa", "both_pass", "judge_pass_human_fail",
            "judge_fail_human_pass", "both_fail", "source"}
    if not isinstance(data, dict) or not keys <= set(data) or not isinstance(data.get("judge"), dict):
        return None  # a hand-edited or foreign file must not stop the report
    return {**data, "judge": {"model": "?", "roles": [], **data["judge"]}}


def rounds(store: Store, state: RunState | None) -> list[dict[str, Any]]:
    """One row per (run, round): metrics, health, the live harness commit and loop events."""
    health = round_health(store)
    judged = judged_rounds(store)
    reported = store.flagged_counts(SOURCE_REPORTED)  # outcomes another engine reported, by round id
    history = {h["round"]: h for h in (state.history if state else [])}
    runs = store.run_names()
    out = []
    for r in store.all_rounds():
        metrics, h = r["metrics"] or {}, health.get(r["id"], {})
        hist = history.get(r["index"]) if state and runs.get(r["run_id"]) == state.run else None
        out.append({
            "id": r["id"], "run": runs.get(r["run_id"], "?"), "index": r["index"],
            "harness": r["harness_version"] or "", "model": r["model_version"] or "",
            "finished": r["finished_at"] is not None,
            "heldout_success": metrics.get("heldout_success"), "train_reward": metrics.get("train_reward"),
            "judge_verified": (r["run_id"], r["index"]) in judged,
            "source_reported": reported.get(r["id"], 0),
            "train_success": metrics.get("train_success"), "step_time": metrics.get("step_time"),
            "dead_group_ratio": h.get("dead_group_ratio"), "effective_data_ratio": h.get("effective_data_ratio"),
            "n_rollouts": h.get("n_rollouts", 0),
            "promoted": (hist or {}).get("promoted"), "proposals": (hist or {}).get("proposals"),
            "passed": (hist or {}).get("passed"),
            "cost": _cost(metrics),
        })
    return out


def _cost(metrics: dict[str, Any]) -> str | None:
    """The round's wall time by part: the outer loop's stages for a co-evolution round, else the
    training steps and the evaluation a plain round timed."""
    from evotrainer.coevolve.state import describe_cost

    stages = metrics.get("stage_seconds")
    if not stages and metrics.get("train_seconds") is not None:
        stages = {"train": metrics["train_seconds"], "evaluation": metrics.get("eval_seconds") or 0.0}
    if not stages or not isinstance(stages, dict):
        return None
    beside = metrics.get("beside_seconds") if isinstance(metrics.get("beside_seconds"), dict) else {}
    return describe_cost({str(k): float(v) for k, v in stages.items()},
                         {str(k): float(v) for k, v in beside.items()}).removeprefix("round cost ")


def base_success(store: Store) -> dict[str, float]:
    """Held-out success of the base model per run (evals without an adapter)."""
    out: dict[str, list[float]] = {}
    for run_id, name in store.run_names().items():
        for e in store.evals(run_id):
            if e["split"] == "heldout" and not e["adapter"] and e["round_index"] is None:
                out.setdefault(name, []).append(e["success_rate"])
    return {k: sum(v) / len(v) for k, v in out.items() if v}


def judged_runs(store: Store) -> set[str]:
    """The runs whose held-out success is judge-verified."""
    names = store.run_names()
    return {names[run_id] for run_id, _ in judged_rounds(store) if run_id in names}


# ------------------------------------------------------------------ harness lineage

def _verification(sha: str, reverts: dict[str, dict], skills: list[dict], state: RunState | None) -> dict:
    if sha in reverts:
        r = reverts[sha]
        return {"status": "reverted", "text": r["trailers"].get("Reverted-Because", r["subject"]),
                "by": r["sha"]}
    for skill in skills:
        for ev in skill["evidence"]:
            if ev.get("commit") == sha:
                return {"status": skill["status"] if skill["status"] in ("validated", "failed") else "held",
                        "text": ev.get("note") or "", "skill": skill["name"]}
    if state and state.pending and state.pending.merge == sha:
        return {"status": "pending", "text": f"waits for live verification in round {state.pending.round + 1}"}
    return {"status": "unverified", "text": "no live verification recorded"}


def lineage(ws: Workspace, backtests_by_id: dict[str, dict], skills: list[dict],
            state: RunState | None) -> dict[str, Any]:
    """main's first-parent history (newest first) with diffs, and the candidates never promoted."""
    if not ws.exists():
        return {"commits": [], "rejected": [], "error": f"no harness repo at {ws.harnesses}"}
    repo = HarnessRepo(ws.harnesses)
    try:
        log = repo.log(first_parent=True, rev=MAIN)
    except HarnessRepoError as exc:
        return {"commits": [], "rejected": [], "error": str(exc)}
    commits = []
    for c in log:
        _, diff = repo.show(c.sha)
        kind = ("revert" if "Reverts" in c.trailers else "promotion" if "Candidate" in c.trailers
                else "seed" if not c.parents else "commit")
        commits.append({"sha": c.sha, "short": c.short, "subject": c.subject, "body": c.body,
                        "date": c.date.isoformat(timespec="minutes"), "author": c.author,
                        "trailers": c.trailers, "kind": kind, "diff": diff,
                        "round": _round_of(c.trailers.get("Candidate", "")) if kind == "promotion" else
                        _round_in(c.trailers.get("Reverted-Because", "")) if kind == "revert" else None})
    reverts = {c["trailers"]["Reverts"]: c for c in commits if c["kind"] == "revert"}
    for c in commits:
        if c["kind"] == "promotion":
            c["verification"] = _verification(c["sha"], reverts, skills, state)
            bt = c["trailers"].get("Backtest", "").split(",")[-1].strip()
            c["backtest"] = bt if bt in backtests_by_id else None
    decisions = _candidate_decisions(backtests_by_id, state)
    rejected = []
    for branch in repo.candidates():
        tip = repo.resolve(branch)
        if repo.is_promoted(tip):
            continue
        info = repo.log(rev=tip, limit=1)[0]
        found = decisions.get(branch, {})
        rejected.append({"branch": branch, "sha": tip, "short": tip[:7], "subject": info.subject,
                         "trailers": info.trailers, "decision": found.get("decision") or "not backtested",
                         "reasons": found.get("reasons") or [], "backtest": found.get("backtest"),
                         "diff": repo.diff(info.parents[0], tip) if info.parents else ""})
    return {"commits": commits, "rejected": rejected, "error": None}


def _round_of(branch: str) -> int | None:
    m = re.match(r"candidate/(\d+)-", branch)
    return int(m.group(1)) if m else None


def _round_in(text: str) -> int | None:
    m = _ROUND_IN_TEXT.search(text)
    return int(m.group(1)) if m else None


def _candidate_decisions(backtests_by_id: dict[str, dict], state: RunState | None) -> dict[str, dict]:
    """branch -> the latest decision, reasons and backtest id (the loop's own record wins)."""
    out: dict[str, dict] = {}
    for bt in sorted(backtests_by_id.values(), key=lambda b: b.get("created_at") or ""):
        out[bt.get("candidate_rev") or ""] = {"decision": bt["decision"], "reasons": bt.get("reasons", []),
                                             "backtest": bt["id"]}
    entries = [c for h in (state.history if state else []) for c in h.get("candidates", [])]
    entries += [asdict(c) for c in (state.candidates if state else [])]
    for c in entries:
        if c.get("decision"):
            out[c["branch"]] = {"decision": c["decision"], "reasons": c.get("reasons", []),
                                "backtest": c.get("backtest") if c.get("backtest") in backtests_by_id else None}
    return out


# ------------------------------------------------------------------ backtests

def backtests(ws: Workspace, store: Store | None) -> list[dict[str, Any]]:
    """Every report, from <workdir>/backtests/*.json and the store's index, oldest first."""
    found: dict[str, dict] = {}
    if ws.backtests.is_dir():
        for path in sorted(ws.backtests.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and "id" in data and "metrics" in data:
                found[data["id"]] = data
    if store is not None:
        for row in store.backtests():
            if row["id"] not in found:
                full = store.get_backtest(row["id"])
                if full:
                    found[row["id"]] = full
    out = sorted(found.values(), key=lambda b: (b.get("created_at") or "", b["id"]))
    for bt in out:
        bt["rows"] = metric_rows(bt)
    return out


def metric_rows(bt: dict) -> list[dict[str, Any]]:
    base, cand = (bt.get("metrics") or {}).get("base"), (bt.get("metrics") or {}).get("candidate")
    if not base or not cand:
        return []
    rows = []
    for name in (*METRICS, *COUNTS):
        delta = None if name in COUNTS else (bt.get("deltas") or {}).get(name)
        verdict = helps(name, delta)
        rows.append({"name": name, "base": base.get(name), "candidate": cand.get(name), "delta": delta,
                     "better": {True: "lower", False: "higher"}.get(LOWER_IS_BETTER.get(name)),
                     "effect": {True: "good", False: "bad", None: "neutral"}[verdict],
                     "target": name == bt.get("target")})
    return rows


# ------------------------------------------------------------------ diagnostics and skills

def diagnostics(ws: Workspace) -> list[dict[str, Any]]:
    """Health reports saved under <workdir>/diagnostics/, in round order."""
    from evotrainer.diagnose import HealthReport

    folder = ws.root / "diagnostics"
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            report = HealthReport.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append({"name": path.stem, "round": _round_in(path.stem.replace("round", "round ")),
                    "report": report, "alerts": report.alerts,
                    "critical": sum(p.level == "critical" for p in report.alerts)})
    out.sort(key=lambda d: (d["round"] if d["round"] is not None else 1 << 30, d["name"]))
    return out


def skills(ws: Workspace) -> list[dict[str, Any]]:
    from evotrainer.skills import SkillLibrary

    lib = SkillLibrary.load(ws.root)
    out = []
    for s in lib:
        out.append({"name": s.name, "summary": s.summary, "status": s.status, "source": s.source,
                    "triggers": [t.describe() for t in s.triggers], "domains": list(s.domains),
                    "grid": {k: list(v) for k, v in s.grid.items()}, "expected": dict(s.expected),
                    "targets": s.targets, "intervention": [asdict(e) for e in s.intervention],
                    "templates": dict(s.templates), "evidence": [dict(e) for e in s.evidence],
                    "readme": s.readme})
    order = {"validated": 0, "failed": 1, "seed": 2}
    out.sort(key=lambda s: (order.get(s["status"], 3), s["name"]))
    return out
