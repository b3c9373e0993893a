"""Rollout and group filters for reasoning_gym: the seed keeps everything."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return True


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
