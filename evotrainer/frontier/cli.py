"""`evotrainer tasks frontier`: synthesize validated tasks near the policy's frontier from the
pass rates in a workspace's store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evotrainer.console import make_console
from evotrainer.errors import UserError

console = make_console(stderr=True)


def _band(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected LO,HI such as 0.2,0.8, got {text!r}", param_hint="--band") from None
    if not 0.0 <= lo <= hi <= 1.0:
        raise typer.BadParameter(f"need 0 <= LO <= HI <= 1, got {text!r}", param_hint="--band")
    return lo, hi


def frontier_cmd(
    workdir: Annotated[Path, typer.Option("--workdir", help="Workspace whose store holds the pass rates.")],
    domain: Annotated[str, typer.Option("--domain", help="math or code (swe: see --swe-out).")] = "math",
    band: Annotated[str, typer.Option("--band", help="Pass-rate band LO,HI of the parent tasks.")] = "0.2,0.8",
    n: Annotated[int, typer.Option("--n", min=1, help="Validated tasks to add at most.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the variant draws.")] = 0,
    run: Annotated[str | None, typer.Option("--run", help="Pass rates of this run only (default: all).")] = None,
    min_attempts: Annotated[int, typer.Option("--min-attempts", min=1, help="Attempts a parent needs.")] = 4,
):
    """Make variants of the train tasks whose pass rate lies in the band, keep those the trusted
    checker validates (math answers recomputed; code references pass their hidden tests in the
    sandbox) and that duplicate no known task, and add them to the store as train tasks. Writes
    WORKDIR/frontier/DOMAIN-seedSEED.json with every rejection and its reason."""
    from evotrainer.frontier import synthesize_frontier, write_report
    from evotrainer.store import Store

    lo_hi = _band(band)
    if domain not in ("math", "code"):
        raise UserError(f"domain {domain!r}: frontier variants exist for math and code "
                        "(SWE: evotrainer.frontier.swe.synthesize_swe_frontier)")
    if not (workdir / "store.db").is_file():
        raise UserError(f"{workdir}: no store.db (train first, or pass the workspace)")
    with Store.open(workdir) as store:
        run_id = store.run_id(run) if run else None
        if run and run_id is None:
            raise UserError(f"no run named {run!r} in {workdir}")
        with console.status("synthesizing and validating variants"):
            report = synthesize_frontier(store, domain, band=lo_hi, n=n, seed=seed, run_id=run_id,
                                         min_attempts=min_attempts)
    path = write_report(report, workdir / "frontier", f"{domain}-seed{seed}")
    table = Table(title=f"{len(report.accepted)} task(s) added from {len(report.parents)} parent(s) in {lo_hi}")
    for col in ("task", "parent", "prompt"):
        table.add_column(col)
    for t in report.accepted:
        table.add_row(t.task_id, str(t.meta.get("parent")), t.prompt[:70])
    make_console().print(table)
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(report.reasons().items())) or "none"
    console.print(f"rejected: {reasons}; report: {path}")
