"""Reward components for math: correctness, a clean finish, and a charge for lazy one-line replies."""

from evotrainer.api import Rollout

MIN_TOKENS = 12


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
        "terse": -1.0 if rollout.num_tokens < MIN_TOKENS else 0.0,
    }
