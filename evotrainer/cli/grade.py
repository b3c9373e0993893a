"""`evotrainer grade`: grade SWE-bench-format predictions against SWE-bench-format tasks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from evotrainer.console import make_console

err = make_console(stderr=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(Text.assemble(("error: ", "bold red"), message))
    return typer.Exit(code)


def _grade_job(job: tuple[Any, str, float, Optional[str]]) -> dict[str, Any]:
    """One (task, patch) in a worker process; module-level so a process pool can pickle it."""
    from evotrainer.grade import grade

    task, patch, timeout_s, cache_dir = job
    return grade(task, patch, timeout_s=timeout_s, cache_dir=cache_dir).to_dict()


def grade_cmd(
    tasks: Path = typer.Option(..., "--tasks", help="SWE-bench-format task JSONL."),
    predictions: Path = typer.Option(..., "--predictions", help="JSONL (or JSON list) of {instance_id, model_patch}."),
    workers: int = typer.Option(1, "--workers", "-j", min=1, help="Grading processes (or Ray tasks at once)."),
    executor_name: str = typer.Option("local", "--executor", help="local: a process pool here; ray: Ray tasks "
                                      "(a private instance, or the cluster at $RAY_ADDRESS)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds for one test run."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Keep grades in DIR/grades.sqlite across runs."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="Write each grade's log to DIR/<instance_id>.log."),
    as_json: bool = typer.Option(False, "--json", help="Print summary and per-instance results as JSON on stdout."),
):
    """Grade predictions: apply each patch to a clean copy, restore the tests, run FAIL_TO_PASS +
    PASS_TO_PASS in the sandbox, and resolve only on explicit pass evidence. Identical (task,
    patch) pairs are graded once."""
    from evotrainer.grade import load_predictions, load_tasks, patch_digest
    from evotrainer.sandbox import get_executor, isolation_support

    try:
        by_id = {t.instance_id: t for t in load_tasks(tasks)}
        preds = load_predictions(predictions)
    except (OSError, ValueError) as exc:
        raise _fail(str(exc))
    unknown = sorted({p["instance_id"] for p in preds} - set(by_id))
    if unknown:
        raise _fail(f"{len(unknown)} prediction(s) name no task in {tasks}: {', '.join(unknown[:5])}")
    # One job per distinct (instance, patch): repeats share the result.
    keys = [(p["instance_id"], patch_digest(p["model_patch"])) for p in preds]
    jobs: dict[tuple[str, str], tuple] = {}
    for p, key in zip(preds, keys):
        jobs.setdefault(key, (by_id[p["instance_id"]], p["model_patch"], timeout, str(cache_dir) if cache_dir else None))
    support = isolation_support()
    if not support["netns"]:
        err.print("[yellow]warning:[/yellow] no network namespace here: graded code can reach the network")

    done: dict[tuple[str, str], dict[str, Any]] = {}
    if executor_name not in ("local", "ray"):
        raise _fail(f"--executor: expected local or ray, got {executor_name!r}")
    try:
        executor = get_executor(executor_name, workers=workers)
    except ImportError:
        raise _fail("--executor ray needs Ray: pip install 'evotrainer[ray]'")
    try:
        with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[last]}"), console=err, transient=as_json) as progress:
            bar = progress.add_task("grade", total=len(jobs), last="")
            for key, result in zip(jobs, executor.map(_grade_job, list(jobs.values()))):
                done[key] = result
                progress.update(bar, advance=1, last=f"{result['instance_id']}: {result['outcome']['kind']}")
    finally:
        executor.close()

    results = [done[key] for key in keys]
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        for r in results:
            (log_dir / f"{r['instance_id']}.log").write_text(r["log"], encoding="utf-8")
    kinds = Counter(r["outcome"]["kind"] for r in results)
    resolved = sum(r["outcome"]["success"] for r in results)
    summary = {"predictions": len(results), "graded": len(jobs), "resolved": resolved,
               "resolved_rate": resolved / len(results) if results else 0.0, "kinds": dict(sorted(kinds.items())),
               "isolation": support}
    if as_json:
        print(json.dumps({"summary": summary,
                          "results": [{k: v for k, v in r.items() if k != "log"} for r in results]}, indent=2))
        return
    out = make_console()
    if len(results) <= 50:
        table = Table(title=f"grades ({tasks.name})")
        for col in ("instance", "resolved", "kind", "score", "flags", "s"):
            table.add_column(col)
        for r in results:
            o = r["outcome"]
            table.add_row(r["instance_id"], "yes" if o["success"] else "no", o["kind"], f"{o['score']:.2f}",
                          ", ".join(o["flags"]), f"{r['duration_s']:.1f}")
        out.print(table)
    table = Table(title="summary", show_header=False)
    table.add_row("resolved", f"{resolved}/{len(results)} ({summary['resolved_rate']:.1%})")
    table.add_row("graded", f"{len(jobs)} distinct (task, patch) pair(s), {workers} worker(s)")
    table.add_row("outcome kinds", ", ".join(f"{k}={v}" for k, v in summary["kinds"].items()))
    table.add_row("isolation", ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in support.items()
                                         if k not in ("probe_error", "root")))
    out.print(table)
