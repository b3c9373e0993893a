"""Reward components for math: correctness, and credit for showing the work as an equation."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if "=" in rollout.completion else 0.0,
    }
