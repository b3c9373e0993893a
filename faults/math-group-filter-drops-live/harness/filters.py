"""Rollout and group filters for math: drop unstable groups, whose rewards spread so widely that
the task is more noise than signal."""

from typing import Sequence

from evotrainer.api import Rollout

MAX_SPREAD = 0.5


def keep_rollout(rollout: Rollout) -> bool:
    return True


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return max(rewards) - min(rewards) < MAX_SPREAD
