"""Rollout and group filters for code: drop undocumented code (no comment, no docstring), which
is rarely what a careful programmer writes."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    text = rollout.completion
    return "#" in text or '"""' in text or "'''" in text


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
