"""Grade existing model outputs for any domain with the domain's own trusted check.

Predictions are JSONL (or a JSON list) of `{"task_id", "completion"}` with an optional
`"truncated": true` for an output that hit its length limit. The tasks are the domain's: every
task of a finite domain (`all_tasks()`), else the train and held-out tasks the config draws.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotrainer.api import JUDGE_VERIFIED
from evotrainer.domains.base import Domain, Task
from evotrainer.jsonfile import read_records


@dataclass(frozen=True)
class Prediction:
    task_id: str
    completion: str
    truncated: bool


def load_outputs(path: Path | str) -> list[Prediction]:
    """The predictions in `path`; ValueError names the line of a bad or repeated one."""
    out: list[Prediction] = []
    seen: dict[str, str] = {}
    for where, row in read_records(path, "predictions"):
        task_id, completion = row.get("task_id"), row.get("completion")
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"{where}: expected a non-empty string 'task_id'")
        if not isinstance(completion, str):
            raise ValueError(f"{where}: 'completion' must be a string (the model's output)")
        truncated = row.get("truncated", False)
        if not isinstance(truncated, bool):
            raise ValueError(f"{where}: 'truncated' must be true or false")
        if task_id in seen:
            raise ValueError(f"{where}: task {task_id!r} already has a prediction at {seen[task_id]}")
        seen[task_id] = where
        out.append(Prediction(task_id, completion, truncated))
    if not out:
        raise ValueError(f"{path}: no predictions")
    return out


def domain_tasks(domain: Domain, train_size: int, heldout_size: int, seeds: list[int]) -> dict[str, Task]:
    """Every task a prediction may name, by id."""
    all_tasks = getattr(domain, "all_tasks", None)
    finite = all_tasks() if callable(all_tasks) else None
    if finite is not None:
        tasks = list(finite)
    else:
        tasks = domain.tasks("train", train_size, seeds[0])
        for seed in seeds:
            tasks += domain.tasks("heldout", heldout_size, seed)
    return {t.task_id: t for t in tasks}


def grade_outputs(domain: Domain, tasks: dict[str, Task], predictions: list[Prediction],
                  on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Each prediction's verified outcome, in prediction order. ValueError, before any check
    runs, when a prediction names a task the domain does not have."""
    unknown = [p.task_id for p in predictions if p.task_id not in tasks]
    if unknown:
        raise ValueError(f"{len(unknown)} prediction(s) name no task of domain {domain.name!r}: "
                         f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
    results = []
    for p in predictions:
        task = tasks[p.task_id]
        outcome = domain.check(task, p.completion, p.truncated)
        result = {"task_id": p.task_id, "split": task.split, "level": task.level,
                  "outcome": {"success": outcome.success, "score": outcome.score, "kind": outcome.kind,
                              "flags": list(outcome.flags)}}
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def summarize_outputs(results: list[dict[str, Any]], n_tasks: int) -> dict[str, Any]:
    n = len(results)
    successes = sum(r["outcome"]["success"] for r in results)
    by_split: dict[str, dict[str, Any]] = {}
    for split in sorted({r["split"] for r in results}):
        rows = [r for r in results if r["split"] == split]
        won = sum(r["outcome"]["success"] for r in rows)
        by_split[split] = {"n": len(rows), "successes": won, "success_rate": won / len(rows)}
    judged = sum(JUDGE_VERIFIED in r["outcome"]["flags"] for r in results)
    # A judge panel's verdict is not a verified one: the summary says which kind it counts.
    verification = "judge-verified" if judged == n and n else ("verified" if not judged else "mixed")
    return {"verification": verification, "n": n, "successes": successes, "success_rate": successes / n if n else 0.0,
            "mean_score": sum(r["outcome"]["score"] for r in results) / n if n else 0.0,
            "kinds": dict(Counter(r["outcome"]["kind"] for r in results)), "by_split": by_split,
            "tasks_without_prediction": n_tasks - n}
