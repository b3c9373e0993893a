"""The optimisation's own per-step statistics, kept with each round.

TRL's GRPOTrainer logs, every optimizer step, what the loss saw: token entropy, KL to the
reference (only where beta > 0), the share of tokens the PPO ratio clipped (low, high, either),
the gradient norm, and the share of groups whose rewards did not spread (frac_reward_zero_std).
Rollouts carry none of it, so a probe of the rollouts alone cannot see the optimiser: a
learning rate that collapses the policy shows first in entropy and clip ratios falling or
spiking step over step. `step_stats` keeps those numbers, one dict per logged step, for the
round's stored metrics (`metrics["steps"]`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

# The log keys kept: what TRL measures of the optimisation, and the reward it optimised.
STEP_KEYS = ("entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
             "grad_norm", "frac_reward_zero_std", "reward", "reward_std", "learning_rate")


def step_stats(logs: Iterable[Mapping]) -> list[dict[str, float]]:
    """One dict per logged training step: the STEP_KEYS it has as finite numbers. A key TRL did
    not log that step (kl with beta 0) is absent, never a made-up 0."""
    out = []
    for log in logs:
        row = {}
        for key in STEP_KEYS:
            value = log.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                row[key] = float(value)
        if row:
            out.append(row)
    return out
