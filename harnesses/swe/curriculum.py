"""Task sampling weights for swe: a curriculum by level. Level 0 (file, function and line named)
is drawn most, level 2 (symptom only) least; unknown levels count as level 2."""

from typing import Sequence

from evotrainer.api import TaskStats

LEVEL_WEIGHTS = {0: 3.0, 1: 2.0, 2: 1.0}


def weights(task_stats: Sequence[TaskStats]) -> dict:
    return {s.task_id: LEVEL_WEIGHTS.get(s.meta.get("level"), 1.0) for s in task_stats}
