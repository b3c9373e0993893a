"""`evotrainer grade`: grade existing model outputs with a domain's trusted check.

SWE (the default) grades SWE-bench-format predictions against SWE-bench-format tasks; any other
domain grades `{task_id, completion}` lines against the domain's tasks (grade/outputs.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evotrainer.cli.common import ConfigOpt, OverridesArg
from evotrainer.console import make_console
from evotrainer.errors import UserError

err = make_console(stderr=True)


def grade_cmd(
    predictions: Path = typer.Option(..., "--predictions", help="JSONL (or JSON list): {instance_id, model_patch} "
                                     "for swe, {task_id, completion[, truncated]} for any other domain."),
    tasks: Path | None = typer.Option(None, "--tasks", help="swe: SWE-bench-format task JSONL (required). Other "
                                      "domains: the task file (sets domain.source); omit for a procedural domain."),
    domain: str = typer.Option("swe", "--domain", "-d", help="The domain whose trusted check grades: swe, math, "
                               "code, a name `evotrainer domains` lists, or package.module:factory."),
    config: Path | None = ConfigOpt,
    workers: int = typer.Option(1, "--workers", "-j", min=1, help="Grading processes (or Ray tasks at once)."),
    executor_name: str = typer.Option("local", "--executor", help="local: a process pool here; ray: Ray tasks "
                                      "(a private instance, or the cluster at $RAY_ADDRESS)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds for one test run."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Keep grades in DIR/grades.sqlite across runs."),
    log_dir: Path | None = typer.Option(None, "--log-dir", help="Write each grade's log to DIR/<instance_id>.log."),
    as_json: bool = typer.Option(False, "--json", help="Print summary and per-instance results as JSON on stdout."),
    overrides: list[str] | None = OverridesArg,
):
    """Grade existing model outputs with the same trusted checks as training.

    swe: apply each patch to a clean copy, restore the tests, run FAIL_TO_PASS + PASS_TO_PASS in
    the sandbox, and resolve only on explicit pass evidence; identical (task, patch) pairs are
    graded once. Any other domain: each completion is checked against the task it names (every
    task of a task file, or the train and held-out tasks the config draws for a procedural one).
    """
    if domain != "swe":
        _grade_outputs(domain, tasks, predictions, config, overrides or [], as_json)
        return
    if tasks is None:
        raise UserError("--tasks: swe grading needs the SWE-bench-format task file")
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


def _grade_outputs(domain: str, tasks: Path | None, predictions: Path, config: Path | None,
                   overrides: list[str], as_json: bool) -> None:
    from evotrainer.config import load_config
    from evotrainer.domains import build_domain
    from evotrainer.grade.outputs import domain_tasks, grade_outputs, load_outputs, summarize_outputs

    if tasks is not None:
        if not tasks.is_file():
            raise UserError(f"--tasks {tasks}: no such file")
        overrides = [*overrides, f"domain.source={tasks}"]
        if not any(o.split("=", 1)[0].strip() == "domain.levels" for o in overrides):
            # the file the user named is graded whole: a config's `levels` choose training tasks
            overrides.append("domain.levels=null")
    cfg = load_config(config, overrides, domain=domain)
    try:
        preds = load_outputs(predictions)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    d = cfg.domain
    built = build_domain(d, judge=cfg.judge)
    try:
        by_id = domain_tasks(built, d.train_size, d.heldout_size, cfg.eval.seeds)
        with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[last]}"), console=err, transient=as_json) as progress:
            bar = progress.add_task("grade", total=len(preds), last="")
            results = grade_outputs(built, by_id, preds, lambda r: progress.update(
                bar, advance=1, last=f"{r['task_id']}: {r['outcome']['kind']}"))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    summary = {"domain": domain, **summarize_outputs(results, len(by_id))}
    if as_json:
        print(json.dumps({"summary": summary, "results": results}, indent=2))
        return
    table = Table(title=f"{domain}: {summary['successes']}/{summary['n']} succeed ({summary['verification']}) "
                        f"({summary['success_rate']:.3f}), mean score {summary['mean_score']:.3f}")
    for col in ("split", "n", "success", "outcome kinds"):
        table.add_column(col)
    for split, row in summary["by_split"].items():
        kinds = Counter(r["outcome"]["kind"] for r in results if r["split"] == split)
        table.add_row(split, str(row["n"]), f"{row['success_rate']:.3f}",
                      ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    make_console().print(table)
    if summary["tasks_without_prediction"]:
        err.print(f"{summary['tasks_without_prediction']} task(s) of the domain have no prediction")
