"""Rollout and group filters for code: drop the wrong answers that pass most tests."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return not (rollout.outcome.kind == "wrong" and rollout.outcome.score >= 0.4)


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
