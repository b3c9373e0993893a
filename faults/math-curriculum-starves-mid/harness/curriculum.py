"""Task sampling weights for math: skip the tasks the policy has already partly learned."""

from typing import Sequence

from evotrainer.api import TaskStats


def weights(task_stats: Sequence[TaskStats]) -> dict[str, float]:
    out = {}
    for s in task_stats:
        partly = s.attempts >= 4 and 0 < s.successes < s.attempts
        out[s.task_id] = 0.0 if partly else 1.0
    if not any(out.values()):  # every task partly solved: sample alike
        return {t: 1.0 for t in out}
    return out
