"""Task sampling weights for math: spend the batch on what is settled. A task the policy
half-solves gives noisy rewards, so it is sampled least; new, mastered and hopeless tasks alike."""

from typing import Sequence

from evotrainer.api import TaskStats


def weights(task_stats: Sequence[TaskStats]) -> dict[str, float]:
    out = {}
    for s in task_stats:
        mixed = s.attempts >= 4 and 0.0 < s.pass_rate < 1.0
        out[s.task_id] = 0.05 if mixed else 1.0
    return out
