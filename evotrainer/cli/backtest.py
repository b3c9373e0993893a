"""`evotrainer backtest REV` and `evotrainer backtests list|show|replay`: the gate, from the shell."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from evotrainer.cli.common import ConfigOpt, OverridesArg, UserErrorGroup, WorkdirOpt, resolve_workdir
from evotrainer.config import load_config
from evotrainer.console import make_console
from evotrainer.errors import UserError

app = typer.Typer(name="backtests", help="List, show and replay backtest reports.", no_args_is_help=True,
                  cls=UserErrorGroup)
err = make_console(stderr=True)
STORE_URL_ENV = "EVOTRAINER_STORE_URL"
PROGRESS_MIN_ROWS = 5000  # below this a progress bar is only flicker


def _workspace(workdir: Path | None):
    from evotrainer.workspace import Workspace

    ws = Workspace(resolve_workdir(workdir))
    if not ws.exists():
        raise UserError(f"no harness repo at {ws.harnesses} (run `evotrainer init --domain D --workdir {ws.root}`)")
    return ws


def _store(ws: Any, url: str | None = None):
    from evotrainer.store import Store

    url = os.environ.get(STORE_URL_ENV) or url
    if not url and not ws.store_path.exists():
        raise UserError(f"no store at {ws.store_path}: nothing to backtest on (train first, or "
                        "`evotrainer rollouts import`)")
    return Store(url) if url else Store.open(ws.root)


class _Bar:
    """A rich progress bar on stderr, shown only for long runs; usable as on_progress."""

    def __init__(self, label: str):
        self.label, self.progress, self.task = label, None, None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            if total < PROGRESS_MIN_ROWS:
                return
            self.progress = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("rollouts"), TimeRemainingColumn(), console=err, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total)
        self.progress.update(self.task, completed=done)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def _delta_text(name: str, delta: float | None) -> Text:
    from evotrainer.backtest.report import helps

    if delta is None:
        return Text("n/a", style="dim")
    style = {True: "green", False: "red", None: "dim"}[helps(name, delta)]
    return Text(f"{delta:+.4f}", style=style)


def metrics_table(report: dict[str, Any]) -> Table | None:
    from evotrainer.backtest.metrics import COUNTS, LOWER_IS_BETTER, METRICS
    from evotrainer.backtest.report import fmt

    base, cand = report["metrics"]["base"], report["metrics"]["candidate"]
    if not base or not cand:
        return None
    table = Table(title_justify="left")
    for col, justify in (("metric", "left"), ("base", "right"), ("candidate", "right"), ("delta", "right")):
        table.add_column(col, justify=justify)
    target = report.get("target")
    for name in (*METRICS, *COUNTS):
        arrow = ("  (lower is better)" if LOWER_IS_BETTER[name] else "  (higher is better)") if name in LOWER_IS_BETTER else ""
        label = Text(name, style="bold" if name == target else "")
        label.append(arrow, style="dim")
        delta = _delta_text(name, report["deltas"].get(name)) if name in LOWER_IS_BETTER else Text("")
        table.add_row(label, fmt(base.get(name)), fmt(cand.get(name)), delta)  # older reports lack newer metrics
    return table


def print_report(report: dict[str, Any]) -> None:
    out = make_console()
    good = report["decision"] == "promote"
    out.print(Text.assemble(
        ("backtest ", "bold"), (report["id"], "bold cyan"), "  ",
        (f"{report['candidate_rev']} ({report['candidate'][:7]})", "yellow"), " vs ",
        (f"{report['base_rev']} ({report['base'][:7]})", "yellow"),
        f"  on {report['n_rollouts']} rollouts"))
    if report.get("source_reported"):
        from evotrainer.backtest.report import source_reported_note

        out.print(Text(source_reported_note(report), style="yellow"))
    table = metrics_table(report)
    if table is not None:
        out.print(table)
    out.print(Text.assemble(("decision: ", "bold"), (report["decision"].upper(), "bold green" if good else "bold red"),
                            (f"  (target {report['target']})" if report.get("target") else "", "dim")))
    for reason in report["reasons"]:
        out.print(Text.assemble(("  ✓ " if good else "  ✗ ", "green" if good else "red"), reason))
    t = report.get("timings", {})
    out.print(Text(f"{t.get('wall_s', 0):.1f} s on {t.get('workers', 0)} worker(s)"
                   + (f", {t['rollouts_per_s']:.0f} rollouts/s" if t.get("rollouts_per_s") else ""), style="dim"))


def backtest_cmd(
    rev: str = typer.Argument(..., help="Harness revision to test: a candidate/* branch, a sha, main~1..."),
    base: str = typer.Option("main", "--base", help="Revision to compare against."),
    rollouts: str | None = typer.Option(
        None, "--rollouts", "-r", metavar="SELECTOR",
        help="Which stored rollouts: run=NAME,round=K,domain=D,limit=N, or ids=@FILE (one id a line). "
             "Default: all."),
    workdir: Path | None = WorkdirOpt,
    workers: int | None = typer.Option(None, "--workers", help="Worker processes (default: config executor.workers, else all cores)."),
    config: Path | None = ConfigOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    overrides: list[str] | None = OverridesArg,
):
    """Replay REV and BASE over the same stored rollouts, apply the gate, and write the report
    to WORKDIR/backtests/ID.json (+ .md). Gate settings: config `gate.*` (e.g. gate.margin=0.05)."""
    from evotrainer.backtest import Selector, backtest

    ws = _workspace(workdir)
    cfg = load_config(config, overrides or [], domain=ws.domain or "math")
    try:
        selector = Selector.parse(rollouts)
    except ValueError as exc:
        raise UserError(f"--rollouts: {exc}") from None
    store = _store(ws, cfg.store.url)
    try:
        with _Bar("backtest") as bar:
            report = backtest(ws.root, rev, base=base, selector=selector, gate=cfg.gate, store=store,
                              workers=workers or cfg.executor.workers, on_progress=bar,
                              executor=cfg.executor.kind)
    except ValueError as exc:  # an unknown revision, a selector that matches nothing
        raise UserError(str(exc)) from None
    finally:
        store.close()
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
        err.print(f"[dim]report: {ws.backtests / (report['id'] + '.json')}[/dim]")


@app.command("list")
def list_cmd(
    workdir: Path | None = WorkdirOpt,
    limit: int = typer.Option(20, "--limit", "-n", help="Show the N newest."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array."),
):
    """The backtests indexed in the store, newest first."""
    ws = _workspace(workdir)
    with _store(ws) as store:
        rows = store.backtests(limit)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} backtest(s), newest first", title_justify="left")
    # The id and the decision never wrap; the free-text columns come last and fold.
    table.add_column("id", no_wrap=True, min_width=23)
    table.add_column("decision", no_wrap=True, min_width=8)
    table.add_column("rollouts", justify="right")
    table.add_column("target", overflow="fold")
    table.add_column("candidate vs base", overflow="fold")
    for r in rows:
        good = r["decision"] == "promote"
        table.add_row(r["id"], Text(r["decision"], style="green" if good else "red"), str(r["n_rollouts"]),
                      r["target"] or "-",
                      f"{r['candidate_rev'] or ''} {r['candidate'][:7]} vs {r['base'][:7]}".strip())
    make_console().print(table)


def _load(ws: Any, store: Any, backtest_id: str) -> dict[str, Any]:
    from evotrainer.backtest import load_report

    try:
        return load_report(ws.backtests, backtest_id, store)
    except (KeyError, ValueError) as exc:
        raise UserError(str(exc).strip('"')) from None


@app.command("show")
def show_cmd(
    backtest_id: str = typer.Argument(..., metavar="ID", help="Backtest id (or a unique prefix)."),
    workdir: Path | None = WorkdirOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the full report as JSON."),
):
    """One backtest: metrics side by side with deltas, the decision and its reasons."""
    ws = _workspace(workdir)
    with _store(ws) as store:
        report = _load(ws, store, backtest_id)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


@app.command("replay")
def replay_cmd(
    backtest_id: str = typer.Argument(..., metavar="ID", help="Backtest id (or a unique prefix)."),
    workdir: Path | None = WorkdirOpt,
    workers: int | None = typer.Option(None, "--workers", help="Worker processes (default: all cores)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
):
    """Re-run a backtest on the same commits, rollouts and gate; exit 1 unless all reproduces."""
    from evotrainer.backtest import replay

    ws = _workspace(workdir)
    with _store(ws) as store:
        report = _load(ws, store, backtest_id)
        try:
            with _Bar("replay") as bar:
                result = replay(ws.root, report["id"], store=store, workers=workers, on_progress=bar)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        out = make_console()
        if result["reproduced"]:
            out.print(Text.assemble(("reproduced ", "bold green"), result["id"],
                                    f": {result['n_rollouts']} rollouts, every metric and the decision "
                                    f"({result['decision']['replayed']}) identical"))
        else:
            out.print(Text.assemble(("NOT reproduced ", "bold red"), result["id"]))
            for line in result["mismatches"]:
                out.print(f"  {line}")
    if not result["reproduced"]:
        raise typer.Exit(1)
