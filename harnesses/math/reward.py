"""Reward components for math: verified correctness plus a small bonus for the answer marker."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if "answer_marker" in rollout.outcome.flags else 0.0,
    }
