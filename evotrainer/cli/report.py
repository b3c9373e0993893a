"""`evotrainer report`: build the static HTML report of a workspace (and optionally open it)."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from evotrainer.cli.common import WorkdirOpt, resolve_workdir
from evotrainer.console import make_console

err = make_console(stderr=True)


def report_cmd(
    workdir: Path | None = WorkdirOpt,
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for the site (default: WORKDIR/report). "
                                       "An existing report there is replaced."),
    open_: bool = typer.Option(False, "--open", help="Open the overview page in the default browser."),
):
    """Write a static HTML report of the workspace: overview with curves, harness lineage with
    diffs, backtests, diagnostics, paginated rollouts and the skill library. It needs no network
    to view and loads no scripts or fonts."""
    from evotrainer.report import build_report

    wd = resolve_workdir(workdir)
    with Progress(TextColumn("[bold]rollout pages"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("rollouts", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        summary = build_report(wd, out, on_progress=progress)
    index = summary.out / "index.html"
    err.print(f"wrote {summary.pages} pages ({summary.rollouts} rollouts) to {summary.out} "
              f"in {summary.seconds:.1f} s")
    typer.echo(str(index.resolve()))
    if open_:
        webbrowser.open(index.resolve().as_uri())
