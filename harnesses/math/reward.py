"""Reward components for math: verified correctness plus a small bonus for a clean finish.

`format` pays for a completion that stops on its own with an answer the checker can read
(outcome kind ok or wrong), whatever its style. An earlier seed paid only for the literal
"Answer:" marker; on SmolLM2-135M that pulled one training seed from "96 + 24 = 120" to a bare
"Answer: 26" and held-out success fell from 0.27 to 0.15 (LOG.md).
"""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
    }
