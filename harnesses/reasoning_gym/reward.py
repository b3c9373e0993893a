"""Reward components for reasoning_gym: the trusted check's verdict, and a small bonus for a
completion the check could read (outcome kind ok or wrong) rather than a format error, an empty
reply or a cut-off one."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
    }
