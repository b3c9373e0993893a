"""Reward components for math: verified correctness, scored once per batch.

The batch here is a prompt's group: its completions arrive together. `correct` is computed once,
from the first completion of the prompt's task, and that one value is handed back for every
completion of it, as a batch reward function that returns a single number and lets the trainer
broadcast it would.
"""

from evotrainer.api import Rollout

_BATCH_SCORE: dict[str, float] = {}  # task id -> the score computed for its first completion


def reward(rollout: Rollout) -> dict[str, float]:
    score = _BATCH_SCORE.setdefault(rollout.task_id, 1.0 if rollout.outcome.success else 0.0)
    return {
        "correct": score,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
    }
