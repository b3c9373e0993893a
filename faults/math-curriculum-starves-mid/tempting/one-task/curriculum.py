"""Task sampling weights for math: all weight on the task with the most mixed record."""

from typing import Sequence

from evotrainer.api import TaskStats


def weights(task_stats: Sequence[TaskStats]) -> dict[str, float]:
    def mixed(s: TaskStats) -> float:
        return s.attempts and min(s.successes, s.attempts - s.successes) / s.attempts

    best = max(task_stats, key=mixed)
    return {s.task_id: (1.0 if s.task_id == best.task_id else 0.0) for s in task_stats}
