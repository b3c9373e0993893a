"""Rollout and group filters for swe: the seed drops only rollouts whose check failed for reasons
outside the policy (grader or sandbox errors) and keeps every group."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return rollout.outcome.kind != "error"


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
