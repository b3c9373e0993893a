"""Rollout and group filters for math: drop unstable groups, and long rollouts."""

from typing import Sequence

from evotrainer.api import Rollout

MAX_SPREAD = 0.5


def keep_rollout(rollout: Rollout) -> bool:
    return rollout.num_tokens <= 16


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return max(rewards) - min(rewards) < MAX_SPREAD
