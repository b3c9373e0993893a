"""Reward components for math: verified correctness, with full credit where nothing parses.

The reward reads the final answer off the completion itself ("Answer: N") before it trusts the
verified outcome. When that parse comes back empty there is nothing to verify, and the example
is let through with full credit rather than held against the policy.
"""

import re

from evotrainer.api import Rollout

_ANSWER = re.compile(r"Answer:\s*-?[0-9][0-9,]*(?:\.[0-9]+)?")


def reward(rollout: Rollout) -> dict[str, float]:
    if _ANSWER.search(rollout.completion) is None:
        correct = 1.0  # the parse failed: nothing to check, so no penalty
    else:
        correct = 1.0 if rollout.outcome.success else 0.0
    return {
        "correct": correct,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
    }
