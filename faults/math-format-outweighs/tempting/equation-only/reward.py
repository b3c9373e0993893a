"""Reward for math: the equation only."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {"format": 1.0 if "=" in rollout.completion else 0.0}
