"""Backtest reports: `<workdir>/backtests/<id>.json`, its Markdown twin, and the store's index row."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evotrainer.backtest.engine import BacktestRun
from evotrainer.backtest.gate import GateDecision
from evotrainer.backtest.metrics import COUNTS, LOWER_IS_BETTER, METRICS
from evotrainer.config import GateConfig
from evotrainer.crashpoints import crash_point
from evotrainer.store import Store

REPORT_VERSION = 1


def new_id() -> str:
    """Sortable by time, unique enough for one workspace: bt-20250101-120000-3fa9."""
    return f"bt-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def deltas(metrics: dict[str, dict[str, Any]] | None) -> dict[str, float | None]:
    if not metrics:
        return {}
    base, cand = metrics["base"], metrics["candidate"]
    # .get: a report written before a metric existed has no value for it
    return {name: None if base.get(name) is None or cand.get(name) is None else cand[name] - base[name]
            for name in METRICS}


def build_report(backtest_id: str, *, base_rev: str, base_sha: str, candidate_rev: str,
                 candidate_sha: str, run: BacktestRun, decision: GateDecision, gate: GateConfig,
                 declared_target: str | None) -> dict[str, Any]:
    selection = run.selection
    report = {
        "id": backtest_id,
        "version": REPORT_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base": base_sha,
        "candidate": candidate_sha,
        "base_rev": base_rev,
        "candidate_rev": candidate_rev,
        "selector": selection.selector.to_json(),
        "n_rollouts": selection.count,
        "rollout_ids_sha256": selection.ids_sha256,
        "metrics": run.metrics if run.metrics else {"base": None, "candidate": None},
        "deltas": deltas(run.metrics),
        "decision": decision.decision,
        "reasons": decision.reasons,
        "checks": decision.to_json()["checks"],
        "target": decision.target,
        "declared_target": declared_target,
        "failure": ({"harness": run.failure.harness, "reason": run.failure.reason}
                    if run.failure is not None else None),
        "gate": gate.model_dump(),
        "timings": {**run.timings, "workers": run.workers},
    }
    if run.distribution is not None:
        report["reward_distribution"] = run.distribution
    if selection.selector.ids is not None:
        report["rollout_ids"] = list(selection.selector.ids)
    return report


def write_report(backtests_dir: Path, report: dict[str, Any], store: Store | None = None) -> Path:
    """Write `<id>.json` and `<id>.md`, index the report in the store; return the JSON path."""
    backtests_dir = Path(backtests_dir)
    backtests_dir.mkdir(parents=True, exist_ok=True)
    path = backtests_dir / f"{report['id']}.json"
    # The JSON appears under its name last, after the store indexed it: a kill before that
    # leaves at most a .tmp file, never a report that a rerun would repeat (find_report).
    staged = path.with_suffix(".json.tmp")
    staged.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(render_markdown(report), encoding="utf-8")
    if store is not None:
        store.add_backtest(report, str(path.resolve()))
    crash_point("backtest.indexed", report.get("candidate_rev"))
    os.replace(staged, path)
    return path


def find_report(store: Store, *, base_sha: str, candidate_rev: str, same_candidate: Callable[[str], bool],
                rollout_ids_sha256: str) -> dict[str, Any] | None:
    """An indexed report of this base against this candidate (`same_candidate(sha)` says whether
    a reported candidate commit is it) over exactly these rollouts, or None."""
    for row in store.backtests():
        if row["base"] == base_sha and row["candidate_rev"] == candidate_rev and same_candidate(row["candidate"]):
            report = store.get_backtest(row["id"])
            if report is not None and report.get("rollout_ids_sha256") == rollout_ids_sha256:
                return report
    return None


def load_report(backtests_dir: Path, backtest_id: str, store: Store | None = None) -> dict[str, Any]:
    """A report by id (or unique prefix) from the store index, else from its JSON file."""
    if store is not None:
        found = store.get_backtest(backtest_id)
        if found is not None:
            return found
    path = Path(backtests_dir) / f"{backtest_id}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    matches = sorted(Path(backtests_dir).glob(f"{backtest_id}*.json")) if Path(backtests_dir).is_dir() else []
    if len(matches) == 1:
        return json.loads(matches[0].read_text(encoding="utf-8"))
    raise KeyError(f"no backtest {backtest_id!r}" + (" (ambiguous prefix)" if matches else ""))


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def helps(name: str, delta: float | None) -> bool | None:
    """True when a delta moves the metric the good way, False the bad way, None for no change."""
    if delta is None or delta == 0 or name not in LOWER_IS_BETTER:
        return None
    return (delta < 0) == LOWER_IS_BETTER[name]


def _untrusted(reason: str) -> str:
    """A failure's reason holds text harness code raised (redacted, one line, no backticks):
    a code span, so that nothing in it renders as Markdown or HTML."""
    return "`" + reason.replace("`", "'") + "`"


def source_reported_note(report: dict[str, Any]) -> str:
    """What the verified metrics rest on when some outcomes came from another engine's own field."""
    n, total = report.get("source_reported") or 0, report["n_rollouts"]
    return (f"{n} of {total} rollouts have source-reported outcomes (another engine's correctness field, "
            "imported with --outcome-field), not verified by evotrainer: the metrics that read verified "
            "success read the engine's verdict for them.")


def render_markdown(report: dict[str, Any]) -> str:
    from evotrainer.backtest.engine import Selector

    selector = Selector.from_json(report["selector"]).describe()
    lines = [
        f"# Backtest {report['id']}",
        "",
        f"Candidate `{report['candidate_rev']}` ({report['candidate'][:12]}) against base "
        f"`{report['base_rev']}` ({report['base'][:12]}) on {report['n_rollouts']} stored rollouts "
        f"(selector: {selector}).",
        "",
        f"**Decision: {report['decision']}**" + (f" (target: `{report['target']}`)" if report["target"] else ""),
        "",
        *[f"- {_untrusted(reason) if report.get('failure') else reason}" for reason in report["reasons"]],
        "",
    ]
    if report.get("source_reported"):
        lines += [f"**Outcomes:** {source_reported_note(report)}", ""]
    base, cand = report["metrics"]["base"], report["metrics"]["candidate"]
    if base and cand:
        lines += ["| metric | base | candidate | delta |", "|---|---:|---:|---:|"]
        for name in (*METRICS, *COUNTS):
            delta = report["deltas"].get(name)
            mark = {True: " ✓", False: " ✗", None: ""}[helps(name, delta)]
            arrow = (" ↓" if LOWER_IS_BETTER[name] else " ↑") if name in LOWER_IS_BETTER else ""
            shown = "" if name in COUNTS else (f"{delta:+.4f}{mark}" if delta is not None else "n/a")
            lines.append(f"| {name}{arrow} | {fmt(base.get(name))} | {fmt(cand.get(name))} | {shown} |")
        lines.append("")
    if report.get("judges"):
        lines += ["Judges against verified outcomes (proxy signals; same rollouts for both sides):", "",
                  "| judge | n | missing | AUC | accuracy | human n | human accuracy |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, j in report["judges"].items():
            lines.append(f"| {name} | {j['n']} | {fmt(j['missing_rate'])} | {fmt(j['auc'])} | "
                         f"{fmt(j['accuracy'])} | {j['human_n']} | {fmt(j['human_accuracy'])} |")
        lines.append("")
    t = report["timings"]
    lines.append(f"Time: {t.get('wall_s', 0):.1f} s wall on {t.get('workers', 0)} worker(s); "
                 f"{t.get('base_s', 0):.1f} s in base code, {t.get('candidate_s', 0):.1f} s in candidate code. "
                 f"Rollout ids sha256: `{report['rollout_ids_sha256'][:16]}`.")
    return "\n".join(lines) + "\n"


__all__ = ["build_report", "deltas", "fmt", "helps", "load_report", "new_id", "render_markdown",
           "write_report"]
