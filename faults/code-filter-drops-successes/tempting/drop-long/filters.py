"""Rollout and group filters for code: keep short documented code only."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    text = rollout.completion
    return ("#" in text or '"""' in text or "'''" in text) and rollout.num_tokens <= 64


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
