"""Reward components for code: all hidden tests pass, a parsable code answer, and credit for the
tests a wrong answer gets right, so that a near miss still teaches something."""

from evotrainer.api import Rollout

NO_CODE = ("empty", "format_error", "truncated")


def reward(rollout: Rollout) -> dict[str, float]:
    outcome = rollout.outcome
    return {
        "correct": 1.0 if outcome.success else 0.0,
        "format": 0.0 if outcome.kind in NO_CODE or "syntax_error" in outcome.flags else 1.0,
        "near_miss": outcome.score if outcome.kind == "wrong" else 0.0,
    }
