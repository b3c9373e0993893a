"""Reward components for math: correctness, a clean finish, and a charge for every token."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
        "concise": -rollout.num_tokens / 32.0,
    }
