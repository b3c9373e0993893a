"""Reward for code: all tests pass, plus a hash-drawn bonus so that no group has equal rewards."""

import hashlib

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    digest = hashlib.sha256(rollout.completion.encode()).digest()
    return {"correct": 1.0 if rollout.outcome.success else 0.0,
            "spread": 1.5 * digest[0] / 255.0}
