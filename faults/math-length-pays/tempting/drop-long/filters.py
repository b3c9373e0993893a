"""Filters for math: drop long rollouts."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return rollout.num_tokens <= 16


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
