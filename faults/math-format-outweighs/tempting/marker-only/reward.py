"""Reward for math: the answer marker."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {"format": 1.0 if "Answer:" in rollout.completion else 0.0}
