"""`evotrainer domains`: the domains `--domain` accepts, where each comes from, and its seed harness."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from evotrainer.console import make_console


def domains_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON on stdout."),
):
    """List the installed domains: the built-in ones and every entry point in the group
    `evotrainer.domains`. Any package.module:factory path works too (docs/domains.md).
    A domain whose plugin fails to import is listed with its error."""
    from evotrainer.domains import DomainError, available, resolve
    from evotrainer.paths import HARNESSES_DIR

    rows = []
    for name in available():
        try:
            entry = resolve(name)
        except DomainError as exc:
            rows.append({"name": name, "kind": "entry point", "target": "", "seed_harness": "",
                         "summary": "", "error": str(exc)})
            continue
        seed = entry.seed_harness()
        shown = seed.name if seed.parent == HARNESSES_DIR else str(seed)
        rows.append({"name": name, "kind": entry.kind, "target": entry.target, "seed_harness": shown,
                     "summary": entry.summary, "error": None})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="domains (--domain NAME, or package.module:factory)")
    for col in ("name", "from", "factory", "seed harness", "what it is"):
        table.add_column(col)
    for r in rows:
        what = f"[red]cannot load: {r['error']}[/red]" if r["error"] else r["summary"]
        table.add_row(r["name"], r["kind"], r["target"], r["seed_harness"], what)
    make_console().print(table)
