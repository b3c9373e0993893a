"""Reward for code: all hidden tests pass, nothing else."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {"correct": 1.0 if rollout.outcome.success else 0.0}
