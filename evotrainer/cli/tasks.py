"""`evotrainer tasks`: synthesize SWE tasks from a repo, import SWE-bench JSONL, fetch a pack's sources,
list a task file."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evotrainer.cli.common import UserErrorGroup
from evotrainer.console import make_console
from evotrainer.errors import UserError
from evotrainer.frontier.cli import frontier_cmd  # self-questioning lives in evotrainer.frontier

app = typer.Typer(name="tasks", help="Build SWE task sets: synthesize bugs in a repo, or import SWE-bench JSONL.",
                  no_args_is_help=True, cls=UserErrorGroup)
console = make_console(stderr=True)


def _hook(spec: str | None):
    """'package.module:function' -> the function (an optional LLM statement writer)."""
    if not spec:
        return None
    module, _, name = spec.partition(":")
    if not name:
        raise typer.BadParameter("expected package.module:function", param_hint="--statement-hook")
    return getattr(importlib.import_module(module), name)


@app.command("synth")
def synth_cmd(
    repo: Annotated[Path, typer.Option("--repo", help="A Python repo with a pytest test suite.")],
    out: Annotated[Path, typer.Option("--out", help="Task file to write (SWE-bench JSONL).")],
    n: Annotated[int, typer.Option("--n", min=1, help="Tasks to keep.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the mutation order.")] = 0,
    snapshot: Annotated[Path | None, typer.Option(
        "--snapshot", help="Copy the repo's source (no .git) into DIR/<name>-<hash>/ and point `repo` there, "
        "relative to the task file. Default: `repo` is the given path.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Repo name in ids (default: folder name).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Parallel test runs.")] = 1,
    levels: Annotated[str, typer.Option("--levels", help="Difficulty levels to cycle through, e.g. 0,1,2.")] = "0,1,2",
    include: Annotated[list[str] | None, typer.Option(
        "--include", help="Glob of source files to mutate (repeatable; default all non-test .py files).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds for one mutated test run.")] = 60.0,
    max_candidates: Annotated[int, typer.Option("--max-candidates", help="Mutation sites to try at most.")] = 400,
    per_function: Annotated[int, typer.Option("--per-function", min=1, help="Tasks per function at most.")] = 1,
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", help="Grade gold (must resolve) and empty (must not) with the real grader.")] = True,
    statement_hook: Annotated[str | None, typer.Option(
        "--statement-hook", help="module:function that writes the problem statement from the template "
        "context (e.g. an LLM); the template is the fallback.")] = None,
):
    """Inject seeded AST bugs into REPO and keep those its tests catch (>= 1 FAIL_TO_PASS and
    >= 1 PASS_TO_PASS); write SWE-bench JSONL with `level` and `bug_patch` (the bug, as a diff on
    the clean repo)."""
    from evotrainer.tasks.synth import SynthOptions, synthesize

    try:
        lv = tuple(int(x) for x in levels.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"not a list of integers: {levels!r}", param_hint="--levels") from None
    if not lv or any(x not in (0, 1, 2) for x in lv):
        raise typer.BadParameter("levels are 0, 1 and 2", param_hint="--levels")
    opts = SynthOptions(n=n, seed=seed, levels=lv, workers=workers, timeout_s=timeout,
                        max_candidates=max_candidates, max_per_function=per_function,
                        include=tuple(include or ()), verify=verify, statement_hook=_hook(statement_hook),
                        progress=lambda msg: console.print(msg, markup=False, highlight=False))
    try:
        records = synthesize(repo, out, opts, snapshot=snapshot, name=name)
    except ValueError as exc:  # no sources or tests in REPO (a SynthError, about its test run, is a UserError)
        raise UserError(str(exc)) from None
    console.print(f"wrote {len(records)} task(s) to {out}")
    if len(records) < n:
        console.print(f"[yellow]asked for {n}; raise --max-candidates or widen --include for more")


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="SWE-bench-format JSONL (repos as local folders).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the validated task file.")],
    repo_root: Annotated[Path | None, typer.Option(
        "--repo-root", help="Folder holding the repos, for lines whose `repo` is an 'owner/name' id.")] = None,
    level: Annotated[int | None, typer.Option("--level", help="Level for lines without one (default 2).")] = None,
):
    """Validate SWE-bench JSONL with the grader's loader and write it with `repo` paths that
    resolve from OUT's folder."""
    from evotrainer.tasks.importer import import_tasks

    try:
        tasks = import_tasks(file, out, repo_root=repo_root, default_level=level)
    except ValueError as exc:  # the message names the file, line and field
        raise UserError(str(exc)) from None
    console.print(f"imported {len(tasks)} task(s) to {out}")


@app.command("fetch")
def fetch_cmd(
    pack: Annotated[str, typer.Option("--pack", help="A pack name (bundled) or a pack folder (with sources.json).")]
    = "bundled",
    sdist_dir: Annotated[Path | None, typer.Option(
        "--sdist-dir", help="Take the source archives from this folder instead of downloading them with pip "
        "(for machines without access to the package index).")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Re-hash snapshots already fetched; rebuild any that changed.")] = False,
):
    """Get the library sources a task pack was built on: pip-download each pinned sdist, check its
    sha256, extract it and check the snapshot's content hash, into $EVOTRAINER_HOME/swe/snapshots.
    Already fetched libraries are skipped."""
    from rich.progress import BarColumn, Progress, TextColumn

    from evotrainer.tasks import resolve_pack
    from evotrainer.tasks.sources import fetch_one, load_sources, snapshot_store

    try:
        folder = resolve_pack(pack)
        libraries = load_sources(folder)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if sdist_dir is not None and not sdist_dir.is_dir():
        raise UserError(f"--sdist-dir {sdist_dir} is not a folder")
    store = snapshot_store()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=console, transient=True) as progress:
        bar = progress.add_task("fetching", total=len(libraries))
        for src in libraries:
            progress.update(bar, description=f"fetching {src.requirement}")
            path, status = fetch_one(src, store, sdist_dir=sdist_dir, verify=verify)  # FetchError: a UserError
            progress.console.print(f"{src.requirement} ({src.license}): {status} -> {path}", markup=False,
                                   highlight=False)
            progress.advance(bar)
    console.print(f"{len(libraries)} librar{'y' if len(libraries) == 1 else 'ies'} ready in {store}")


@app.command("list")
def list_cmd(file: Annotated[Path, typer.Argument(help="A task file (default: the bundled pack).")] = None):
    """One line per task: id, level, tests, the mutated function."""
    from evotrainer.grade import load_tasks
    from evotrainer.tasks import pack_files

    files = [file] if file else pack_files()
    table = Table()
    for col in ("instance_id", "level", "F2P", "P2P", "where"):
        table.add_column(col)
    for f in files:
        try:
            tasks = load_tasks(f)
        except ValueError as exc:  # the message names the file and line
            raise UserError(str(exc)) from None
        for t in tasks:
            m = t.extra.get("mutation") or {}
            where = f"{m.get('path', '')}:{m.get('function', '')}" if m else t.repo
            table.add_row(t.instance_id, str(t.level), str(len(t.FAIL_TO_PASS)), str(len(t.PASS_TO_PASS)), where)
    make_console().print(table)


app.command("frontier")(frontier_cmd)


def main() -> None:  # `python -m evotrainer.cli.tasks`, until the main CLI registers the sub-app
    app()


if __name__ == "__main__":
    main()
