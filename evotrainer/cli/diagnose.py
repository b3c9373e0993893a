"""`evotrainer diagnose`: the health report of stored rollouts under a harness version."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import typer
from rich.text import Text

from evotrainer.cli.common import WorkdirOpt, resolve_workdir
from evotrainer.console import make_console
from evotrainer.errors import UserError

STORE_URL_ENV = "EVOTRAINER_STORE_URL"
err = make_console(stderr=True)


def report_name(run: str | None, round_: int | None, domain: str | None) -> str:
    """File stem under diagnostics/: e.g. `default-round2`, `all-math`."""
    parts = [run or "all"] + ([f"round{round_}"] if round_ is not None else []) + ([domain] if domain else [])
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def diagnose_cmd(
    run: str | None = typer.Option(None, "--run", help="Only rollouts of this run (default: every stored rollout)."),
    round_: int | None = typer.Option(None, "--round", help="Only rollouts of round K."),
    workdir: Path | None = WorkdirOpt,
    rev: str = typer.Option("main", "--rev", help="Harness revision whose rewards and probes to use."),
    domain: str | None = typer.Option(None, "--domain", "-d",
                                         help="Only rollouts of this domain (default: the workspace's)."),
    name: str | None = typer.Option(None, "--name", help="File stem for diagnostics/NAME.md and .json."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
):
    """Run the harness's probes over stored rollouts: one table per dimension, then example
    rollouts for each alert. Writes `WORKDIR/diagnostics/NAME.md` and `.json`. Works on rollouts
    that came in through `rollouts import` (no training run needed)."""
    from evotrainer.diagnose import health_report, write_report
    from evotrainer.diagnose.render import alert_panels, dimension_tables, summary_line
    from evotrainer.harness.isolated import isolated_from_folder
    from evotrainer.harness.repo import HarnessRepo
    from evotrainer.paths import HARNESSES_DIR
    from evotrainer.store import Store
    from evotrainer.workspace import Workspace

    ws = Workspace(resolve_workdir(workdir))
    url = os.environ.get(STORE_URL_ENV)
    if not url and not ws.store_path.exists():
        raise UserError(f"no store at {ws.store_path} (train first, or `evotrainer rollouts import`)")
    with (Store(url) if url else Store.open(ws.root)) as store:
        run_id = None
        if run is not None:
            run_id = store.run_id(run)
            if run_id is None:
                raise UserError(f"no run named {run!r}")
        domain = domain or ws.domain
        if domain is None:  # no workspace: judge the rollouts by their own domain
            first = next(store.iter_rollouts(run_id=run_id, round_index=round_, limit=1), None)
            domain = first.rollout.domain if first is not None else None
        if domain is None:
            raise UserError("no rollouts match")
        if ws.exists():
            harness = HarnessRepo(ws.harnesses).load(rev)
            where = f"at {rev}"
        else:
            seed = HARNESSES_DIR / domain
            if rev != "main" or not seed.is_dir():
                raise UserError(f"no harness repo at {ws.harnesses} (run `evotrainer init --domain {domain} "
                                f"--workdir {ws.root}`)")
            harness = isolated_from_folder(seed)
            where = f"shipped {domain} seed"
            err.print(Text(f"no harness repo at {ws.harnesses}: using {where}", style="yellow"))
        scope = ", ".join(f"{k}={v}" for k, v in (("run", run), ("round", round_), ("domain", domain))
                          if v is not None)
        rows = store.iter_rollouts(run_id=run_id, round_index=round_, domain=domain)
        with harness:  # its code runs in a sandbox worker, stopped here
            report = health_report(harness, rows, scope=f"{scope}; harness {where}")
    if report.n_rollouts == 0:
        raise UserError(f"no rollouts match ({scope})")
    md, _ = write_report(report, ws.root / "diagnostics", name or report_name(run, round_, domain))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    out = make_console()
    out.print(summary_line(report))
    for table in dimension_tables(report):
        out.print(table)
    for panel in alert_panels(report):
        out.print(panel)
    err.print(Text(f"wrote {md} and .json", style="dim"))
