"""Grade a batch of SWE-bench-format predictions: each distinct (task, patch) once, on an executor.

    batch = load_batch(tasks_jsonl, predictions_jsonl, timeout_s=60.0)
    results = grade_batch(batch, get_executor("local", workers=4))   # one per prediction
    summary = summarize(results, batch.graded, isolation_support())
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotrainer.grade.cache import patch_digest
from evotrainer.grade.grader import grade
from evotrainer.grade.swe_tasks import SweTask, load_predictions, load_tasks

Key = tuple[str, str]  # (instance_id, patch digest)
Job = tuple[SweTask, str, float, str | None]  # (task, patch, timeout_s, cache_dir)


@dataclass(frozen=True)
class Batch:
    """Predictions matched to their tasks. `keys` has one entry per prediction, in order; `jobs`
    has each distinct (instance, patch) once, so repeats share one grade."""

    keys: list[Key]
    jobs: dict[Key, Job]

    @property
    def graded(self) -> int:
        return len(self.jobs)


def load_batch(tasks: Path, predictions: Path, timeout_s: float, cache_dir: Path | None = None) -> Batch:
    """Read both files; OSError or ValueError (a prediction naming no task included) when they do not fit."""
    by_id = {t.instance_id: t for t in load_tasks(tasks)}
    preds = load_predictions(predictions)
    unknown = sorted({p["instance_id"] for p in preds} - set(by_id))
    if unknown:
        raise ValueError(f"{len(unknown)} prediction(s) name no task in {tasks}: {', '.join(unknown[:5])}")
    keys = [(p["instance_id"], patch_digest(p["model_patch"])) for p in preds]
    jobs: dict[Key, Job] = {}
    for p, key in zip(preds, keys):
        jobs.setdefault(key, (by_id[p["instance_id"]], p["model_patch"], timeout_s,
                              str(cache_dir) if cache_dir else None))
    return Batch(keys, jobs)


def grade_job(job: Job) -> dict[str, Any]:
    """One (task, patch) in a worker process; module-level so a process pool can pickle it."""
    task, patch, timeout_s, cache_dir = job
    return grade(task, patch, timeout_s=timeout_s, cache_dir=cache_dir).to_dict()


def grade_batch(batch: Batch, executor: Any, on_result: Callable[[dict[str, Any]], None] | None = None
                ) -> list[dict[str, Any]]:
    """Each prediction's grade (GradeResult.to_dict()), in prediction order; `on_result` sees each
    distinct job's grade as it arrives. The caller closes `executor`."""
    done: dict[Key, dict[str, Any]] = {}
    for key, result in zip(batch.jobs, executor.map(grade_job, list(batch.jobs.values()))):
        done[key] = result
        if on_result is not None:
            on_result(result)
    return [done[key] for key in batch.keys]


def write_logs(results: list[dict[str, Any]], log_dir: Path) -> None:
    """Each grade's log as `<log_dir>/<instance_id>.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for r in results:
        (log_dir / f"{r['instance_id']}.log").write_text(r["log"], encoding="utf-8")


def summarize(results: list[dict[str, Any]], graded: int, isolation: dict[str, Any]) -> dict[str, Any]:
    """Counts over the predictions: resolved, its rate, outcome kinds; plus the sandbox's isolation."""
    kinds = Counter(r["outcome"]["kind"] for r in results)
    resolved = sum(r["outcome"]["success"] for r in results)
    return {"predictions": len(results), "graded": graded, "resolved": resolved,
            "resolved_rate": resolved / len(results) if results else 0.0, "kinds": dict(sorted(kinds.items())),
            "isolation": isolation}


def without_logs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "log"} for r in results]
