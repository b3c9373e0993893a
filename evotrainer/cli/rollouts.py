"""`evotrainer rollouts`: list, show, export and import the rollouts in a workspace's store."""

from __future__ import annotations

import enum
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from evotrainer.api import OUTCOME_KINDS
from evotrainer.cli.common import UserErrorGroup
from evotrainer.console import make_console
from evotrainer.errors import UserError
from evotrainer.report.rollout_pages import looks_like_patch, per_test
from evotrainer.store import ImportErrors, ImportRefused, Store, StoredRollout, export_jsonl, import_jsonl
from evotrainer.store.jsonl import to_export_dict

app = typer.Typer(
    name="rollouts",
    help="Inspect, export and import the rollouts stored in a workspace.",
    no_args_is_help=True,
    cls=UserErrorGroup,
)

WORKDIR_ENV, STORE_URL_ENV = "EVOTRAINER_WORKDIR", "EVOTRAINER_STORE_URL"

Workdir = Annotated[Path, typer.Option(
    "--workdir", "-w", envvar=WORKDIR_ENV,
    help=f"Workspace holding store.db (env {STORE_URL_ENV} picks any SQLAlchemy URL instead).")]
RunOpt = Annotated[str | None, typer.Option("--run", help="Only rollouts of the run with this name.")]
RoundOpt = Annotated[int | None, typer.Option("--round", help="Only rollouts of round K (of --run, or of any run).")]
DomainOpt = Annotated[str | None, typer.Option("--domain", help="Only rollouts of this domain (math, code, swe, ...).")]
# An Enum so --help lists the kinds and typer rejects unknown ones.
Kind = enum.Enum("Kind", {k: k for k in OUTCOME_KINDS}, type=str)
KindOpt = Annotated[Kind | None, typer.Option(
    "--kind", help="Only rollouts whose verified outcome has this kind.")]
DEFAULT_WORKDIR = Path("evotrainer-work")
# Below this many rows a progress bar is only flicker.
PROGRESS_MIN_ROWS = 1000


def _err() -> Console:
    return make_console(stderr=True)


def _open(workdir: Path, must_exist: bool = True) -> Store:
    url = os.environ.get(STORE_URL_ENV)
    if not url and must_exist and not (workdir / "store.db").exists():
        raise UserError(f"no store at {workdir / 'store.db'} (set --workdir or {WORKDIR_ENV})")
    return Store(url) if url else Store.open(workdir)


def _filters(store: Store, run: str | None, round_: int | None, domain: str | None,
             kind: Kind | None) -> dict[str, Any]:
    run_id = None
    if run is not None:
        run_id = store.run_id(run)
        if run_id is None:
            raise UserError(f"no run named {run!r}")
    return {"run_id": run_id, "round_index": round_, "domain": domain,
            "kind": kind.value if kind is not None else None}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _flag(value: bool | None) -> Text:
    if value is None:
        return Text("-", style="dim")
    return Text("yes", style="green") if value else Text("no", style="red")


def _short(rollout_id: str, width: int = 12) -> str:
    return rollout_id if len(rollout_id) <= width else rollout_id[:width] + "…"


@app.command("ls")
def ls(
    workdir: Workdir = DEFAULT_WORKDIR,
    run: RunOpt = None,
    round_: RoundOpt = None,
    domain: DomainOpt = None,
    kind: KindOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Show at most N rollouts, oldest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array in the JSONL export shape.")] = False,
) -> None:
    """List stored rollouts, oldest first, one line each."""
    with _open(workdir) as store:
        rows = list(store.iter_rollouts(**_filters(store, run, round_, domain, kind), limit=limit))
    if as_json:
        typer.echo(json.dumps([to_export_dict(sr) for sr in rows], ensure_ascii=False, indent=2))
        return
    table = Table(title=f"{len(rows)} rollout(s)", title_justify="left")
    for name, justify in [("id", "left"), ("task", "left"), ("kind", "left"), ("success", "left"),
                          ("reward", "right"), ("advantage", "right"), ("kept", "left"),
                          ("tokens", "right"), ("completion", "left")]:
        table.add_column(name, justify=justify, no_wrap=name != "completion",
                         overflow="ellipsis" if name == "completion" else "fold")
    for sr in rows:
        r = sr.rollout
        preview = " ".join((r.completion or (r.turns[-1].content if r.turns else "")).split())
        table.add_row(_short(r.id), r.task_id, r.outcome.kind, _flag(r.outcome.success),
                      _num(sr.reward), _num(sr.advantage), _flag(sr.kept), str(r.num_tokens),
                      Text(preview[:80]))
    make_console().print(table)


def _render(sr: StoredRollout) -> Group:
    r, o = sr.rollout, sr.rollout.outcome
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for key, value in [
        ("task", r.task_id), ("group", r.group_id), ("domain", r.domain),
        ("outcome", Text.assemble((o.kind, "bold"), "  success ", _flag(o.success),
                                  f"  score {o.score:g}")),
        ("flags", ", ".join(o.flags) or "-"),
        ("tokens", f"{r.num_tokens}" + ("  (truncated)" if r.truncated else "")),
        ("reward", _num(sr.reward)), ("advantage", _num(sr.advantage)), ("kept", _flag(sr.kept)),
        ("model", sr.model_version or "-"), ("harness", sr.harness_version or "-"),
        ("seed", "-" if sr.seed is None else str(sr.seed)),
        ("run/round/step", " / ".join("-" if v is None else str(v)
                                      for v in (sr.run_id, sr.round_id, sr.step))),
    ]:
        head.add_row(key, value if isinstance(value, Text) else Text(value))
    parts: list[Any] = [Panel(head, title=Text(f"rollout {r.id}"), title_align="left")]
    if sr.reward_components:
        comps = Table(title="reward components", title_justify="left")
        comps.add_column("component")
        comps.add_column("value", justify="right")
        for name, value in sorted(sr.reward_components.items()):
            comps.add_row(Text(name), f"{value:+.4f}")
        parts.append(comps)
    # Text(), never markup: completions are full of [brackets] that rich would eat.
    parts.append(Panel(Text(r.prompt), title="prompt", title_align="left", border_style="blue"))
    styles = {"assistant": "magenta", "user": "blue", "system": "dim", "tool": "cyan"}
    for i, turn in enumerate(r.turns):  # a multi-turn trajectory reads turn by turn
        parts.append(Panel(Text(turn.content), title=Text(f"turn {i + 1} · {turn.role}"),
                           title_align="left", border_style=styles.get(turn.role, "magenta")))
    if r.completion and looks_like_patch(r.completion):
        from rich.syntax import Syntax

        parts.append(Panel(Syntax(r.completion, "diff", word_wrap=True), title="patch", title_align="left",
                           border_style="green" if o.success else "red"))
    elif r.completion or not r.turns:
        parts.append(Panel(Text(r.completion), title="completion", title_align="left",
                           border_style="green" if o.success else "red"))
    tests = per_test(dict(r.meta))
    if tests:
        graded = Table(title="grader, per test", title_justify="left")
        graded.add_column("test")
        graded.add_column("result")
        for name, status in tests:
            graded.add_row(Text(name), Text(status, style="green" if status == "passed" else "red"))
        parts.append(graded)
    meta = {k: v for k, v in r.meta.items() if k not in ("per_test", "tests") or not tests}
    if meta:
        parts.append(Panel(Text(json.dumps(meta, indent=2, sort_keys=True,
                                           ensure_ascii=False, default=str)),
                           title="meta", title_align="left", border_style="dim"))
    return Group(*parts)


@app.command("show")
def show(
    rollout_id: Annotated[str, typer.Argument(metavar="ID", help="Rollout id, or a unique prefix of one.")],
    workdir: Workdir = DEFAULT_WORKDIR,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rollout as JSON (export shape).")] = False,
) -> None:
    """Show one rollout: outcome, reward components, prompt, completion and turns."""
    with _open(workdir) as store:
        try:
            sr = store.get_rollout(rollout_id)
        except ValueError as exc:  # an ambiguous prefix
            raise UserError(str(exc)) from None
    if sr is None:
        raise UserError(f"no rollout with id or id prefix {rollout_id!r}")
    if as_json:
        typer.echo(json.dumps(to_export_dict(sr), ensure_ascii=False, indent=2, sort_keys=True))
        return
    make_console().print(_render(sr))


@app.command("export")
def export(
    out: Annotated[str, typer.Argument(metavar="OUT", help="JSONL file to write, or - for stdout.")],
    workdir: Workdir = DEFAULT_WORKDIR,
    run: RunOpt = None,
    round_: RoundOpt = None,
    domain: DomainOpt = None,
    kind: KindOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="Export at most N rollouts (default: all).")] = None,
) -> None:
    """Export rollouts as JSONL, one per line; training fields go in meta.train."""
    with _open(workdir) as store:
        filters = _filters(store, run, round_, domain, kind)
        total = store.count_rollouts(**filters)
        total = total if limit is None else min(total, limit)
        with Progress(console=_err(), transient=True, disable=total < PROGRESS_MIN_ROWS) as bar:
            task = bar.add_task("exporting", total=total)
            step = lambda: bar.advance(task)  # noqa: E731
            if out == "-":
                n = export_jsonl(store, sys.stdout, on_row=step, limit=limit, **filters)
                sys.stdout.flush()
            else:
                with open(out, "w", encoding="utf-8", newline="\n") as f:
                    n = export_jsonl(store, f, on_row=step, limit=limit, **filters)
    _err().print(f"exported {n} rollout(s) to {'stdout' if out == '-' else out}")


@app.command("import")
def import_(
    files: Annotated[list[str], typer.Argument(metavar="FILE...", help="JSONL file to read, or - for stdin; with "
                                               "--from, the engine's files or folders.")],
    workdir: Workdir = DEFAULT_WORKDIR,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Store the valid lines and report the bad ones, instead of storing nothing.")] = False,
    source: Annotated[str | None, typer.Option("--from", help="The engine that wrote the files: verl (its "
                                               "{step}.jsonl rollout dumps) or verifiers (vf-eval's results.jsonl). "
                                               "Default: our own JSONL export.")] = None,
    domain: Annotated[str | None, typer.Option("--domain", help="With --from: the domain whose trusted check "
                                               "rechecks every completion against its ground truth (math, code, "
                                               "...); it also names the workspace's domain.")] = None,
    outcome_field: Annotated[str | None, typer.Option("--outcome-field", help="With --from: take the outcome "
                                                      "from this field of the engine's records (e.g. verl's acc) "
                                                      "instead of rechecking; stored as source-reported, not "
                                                      "verified.")] = None,
    run: Annotated[str | None, typer.Option("--run", help="With --from: the run to import into (default: the "
                                            "engine's name).")] = None,
    round_: Annotated[int | None, typer.Option("--round", min=0, help="With --from: the round index (default: "
                                               "the run's next).")] = None,
) -> None:
    """Import rollouts from JSONL. Every line is validated first; any bad line stores nothing.

    Lines are at most 8 MiB and nest at most 100 levels; errors name the line and field,
    never what the line holds. The workspace folder must exist (a mistyped --workdir is
    an error, not a new empty workspace).

    With --from verl|verifiers, the files are another engine's own output, stored as one round of
    a run; the workspace (its harness repo for --domain) is made if missing. Each rollout keeps the
    engine's score as its reward; its outcome is the domain's recheck, or with --outcome-field the
    engine's own verdict, marked source-reported everywhere it is counted."""
    if source is not None:
        if skip_bad:
            raise UserError("--skip-bad goes with our own JSONL; an engine's files are imported whole or not at all")
        return _import_from(source, [Path(f) for f in files], workdir, domain, outcome_field, run, round_)
    for flag, value in (("--domain", domain), ("--outcome-field", outcome_field), ("--run", run), ("--round", round_)):
        if value is not None:
            raise UserError(f"{flag} goes with --from (an engine's own files); our JSONL carries its own")
    if len(files) != 1:
        raise UserError("one JSONL file (or -) at a time; --from reads several")
    [file] = files
    if file != "-" and not Path(file).is_file():
        raise UserError(f"no such file: {file}")
    if not os.environ.get(STORE_URL_ENV) and not workdir.is_dir():
        raise UserError(f"no workspace folder {workdir} (create it first, or set --workdir or {WORKDIR_ENV})")
    err = _err()
    where = "<stdin>" if file == "-" else file
    with _open(workdir, must_exist=False) as store:
        try:
            summary = import_jsonl(store, sys.stdin.buffer if file == "-" else Path(file),
                                   skip_bad=skip_bad)
        except ImportErrors as exc:
            for line, message in exc.errors:
                err.print(Text.assemble((f"{where}:{line}: ", "bold red"), message), soft_wrap=True)
            raise UserError(f"{len(exc.errors)} bad line(s), nothing imported "
                            "(--skip-bad imports the valid lines)") from None
        except ImportRefused as exc:  # the transaction rolled back; say why without its SQL or values
            raise UserError(f"the store refused the import, nothing imported: {exc.kind}: {exc.message[:200]}") from None
    for line, message in summary.skipped:
        err.print(Text.assemble((f"{where}:{line}: ", "yellow"), message, " (skipped)"), soft_wrap=True)
    skipped = f", skipped {len(summary.skipped)} bad line(s)" if summary.skipped else ""
    typer.echo(f"imported {summary.imported} rollout(s){skipped}")


def _import_from(source: str, paths: list[Path], workdir: Path, domain: str | None, outcome_field: str | None,
                 run: str | None, round_: int | None) -> None:
    """`rollouts import --from ENGINE`: another engine's files as one round of a run."""
    from evotrainer.integrations import imported

    readers = {"verl": "evotrainer.integrations.verl", "verifiers": "evotrainer.integrations.verifiers"}
    if source not in readers:
        raise UserError(f"--from {source!r}: unknown engine; known: {', '.join(readers)} (TRL writes into the "
                        "store as it trains: evotrainer.integrations.trl.StoreRollouts)")
    if domain is None:
        raise UserError(f"--from {source} needs --domain (the domain whose check verifies the outcomes, and the "
                        "workspace's domain)")
    reader = importlib.import_module(readers[source])
    err = _err()

    def refuse(exc: imported.SourceErrors) -> UserError:
        for where, line, message in exc.errors:
            err.print(Text.assemble((f"{where}:{line}: ", "bold red"), message), soft_wrap=True)
        return UserError(f"{len(exc.errors)} bad record(s), nothing imported")

    try:  # every record checked before the workspace or its store is touched
        records, errors = reader.read_dumps(paths)
        converted = imported.convert_records(source, records, run=run or source,
                                             policy=imported.OutcomePolicy(domain, outcome_field), errors=errors)
    except imported.SourceErrors as exc:
        raise refuse(exc) from None
    if not os.environ.get(STORE_URL_ENV):
        from evotrainer.workspace import ensure_workspace

        ensure_workspace(workdir, domain)
    with _open(workdir, must_exist=False) as store:
        try:
            done = imported.store_converted(store, converted, round_)
        except imported.SourceErrors as exc:
            raise refuse(exc) from None
        except ImportRefused as exc:
            raise UserError(f"the store refused the import, nothing imported: {exc.kind}: {exc.message[:200]}") from None
    how = ("outcomes source-reported by the engine's field " + repr(outcome_field) + ", not verified by evotrainer"
           if outcome_field else f"outcomes verified by the {domain} domain's check")
    typer.echo(f"imported {done.rollouts} rollout(s) from {source} into run {done.run!r} round {done.round} ({how})")
