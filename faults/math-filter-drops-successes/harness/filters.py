"""Rollout and group filters for math: drop degenerate, too-short completions."""

from typing import Sequence

from evotrainer.api import Rollout

MIN_TOKENS = 12


def keep_rollout(rollout: Rollout) -> bool:
    return rollout.num_tokens >= MIN_TOKENS


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
