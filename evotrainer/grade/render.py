"""Grades for people: a table of per-instance results and one of the batch's summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table

MAX_ROWS = 50  # past this many predictions only the summary is shown


def results_table(results: list[dict[str, Any]], title: str) -> Table | None:
    """One row per prediction, or None when there are too many to read."""
    if len(results) > MAX_ROWS:
        return None
    table = Table(title=title)
    for col in ("instance", "resolved", "kind", "score", "flags", "s"):
        table.add_column(col)
    for r in results:
        o = r["outcome"]
        table.add_row(r["instance_id"], "yes" if o["success"] else "no", o["kind"], f"{o['score']:.2f}",
                      ", ".join(o["flags"]), f"{r['duration_s']:.1f}")
    return table


def summary_table(summary: dict[str, Any], workers: int) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_row("resolved", f"{summary['resolved']}/{summary['predictions']} ({summary['resolved_rate']:.1%})")
    table.add_row("graded", f"{summary['graded']} distinct (task, patch) pair(s), {workers} worker(s)")
    table.add_row("outcome kinds", ", ".join(f"{k}={v}" for k, v in summary["kinds"].items()))
    table.add_row("isolation", ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in summary["isolation"].items()
                                         if k not in ("probe_error", "root")))
    return table
