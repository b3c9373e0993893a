"""`evotrainer grade`: grade SWE-bench-format predictions against SWE-bench-format tasks."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from evotrainer.console import make_console
from evotrainer.errors import UserError

err = make_console(stderr=True)


def grade_cmd(
    tasks: Path = typer.Option(..., "--tasks", help="SWE-bench-format task JSONL."),
    predictions: Path = typer.Option(..., "--predictions", help="JSONL (or JSON list) of {instance_id, model_patch}."),
    workers: int = typer.Option(1, "--workers", "-j", min=1, help="Grading processes (or Ray tasks at once)."),
    executor_name: str = typer.Option("local", "--executor", help="local: a process pool here; ray: Ray tasks "
                                      "(a private instance, or the cluster at $RAY_ADDRESS)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds for one test run."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Keep grades in DIR/grades.sqlite across runs."),
    log_dir: Path | None = typer.Option(None, "--log-dir", help="Write each grade's log to DIR/<instance_id>.log."),
    as_json: bool = typer.Option(False, "--json", help="Print summary and per-instance results as JSON on stdout."),
):
    """Grade predictions: apply each patch to a clean copy, restore the tests, run FAIL_TO_PASS +
    PASS_TO_PASS in the sandbox, and resolve only on explicit pass evidence. Identical (task,
    patch) pairs are graded once."""
    from evotrainer.grade.batch import grade_batch, load_batch, summarize, without_logs, write_logs
    from evotrainer.grade.render import results_table, summary_table
    from evotrainer.sandbox import get_executor, isolation_support

    try:
        batch = load_batch(tasks, predictions, timeout, cache_dir)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None
    support = isolation_support()
    if not support["netns"]:
        err.print("[yellow]warning:[/yellow] no network namespace here: graded code can reach the network")

    if executor_name not in ("local", "ray"):
        raise UserError(f"--executor: expected local or ray, got {executor_name!r}")
    try:
        executor = get_executor(executor_name, workers=workers)
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'evotrainer[ray]'") from None
    try:
        with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[last]}"), console=err, transient=as_json) as progress:
            bar = progress.add_task("grade", total=batch.graded, last="")
            results = grade_batch(batch, executor, lambda r: progress.update(
                bar, advance=1, last=f"{r['instance_id']}: {r['outcome']['kind']}"))
    finally:
        executor.close()

    if log_dir is not None:
        write_logs(results, log_dir)
    summary = summarize(results, batch.graded, support)
    if as_json:
        print(json.dumps({"summary": summary, "results": without_logs(results)}, indent=2))
        return
    out = make_console()
    table = results_table(results, f"grades ({tasks.name})")
    if table is not None:
        out.print(table)
    out.print(summary_table(summary, workers))
