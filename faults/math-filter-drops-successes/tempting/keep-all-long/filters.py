"""Rollout and group filters for math: keep the mid-length completions only."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return 12 <= rollout.num_tokens <= 24


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
