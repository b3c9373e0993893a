"""Filters for math: drop the completions that state no "Answer:", whose match is a guess."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return "Answer:" in rollout.completion


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
