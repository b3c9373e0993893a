"""Filters for math: drop the groups whose completions all earned the correctness pay, as solved."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return True


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return min(rewards) < 1.0
