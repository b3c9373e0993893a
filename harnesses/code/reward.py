"""Reward components for code: all hidden tests pass, a parsable code answer, and (off) the share
of hidden tests passed."""

from evotrainer.api import Rollout

NO_CODE = ("empty", "format_error", "truncated")


def reward(rollout: Rollout) -> dict[str, float]:
    outcome = rollout.outcome
    return {
        "correct": 1.0 if outcome.success else 0.0,
        "format": 0.0 if outcome.kind in NO_CODE or "syntax_error" in outcome.flags else 1.0,
        "partial": outcome.score if outcome.kind in ("ok", "wrong") else 0.0,
    }
