"""Health probes for math rollouts: each maps a batch (rollouts, training rewards) to one number."""

from collections import defaultdict
from typing import Sequence

from evotrainer.api import Rollout


def _share(rollouts: Sequence[Rollout], hit) -> float:
    return sum(1 for r in rollouts if hit(r)) / len(rollouts) if rollouts else 0.0


def success_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.outcome.success)


def dead_group_ratio(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    """Share of groups whose training rewards are all equal: GRPO gets no signal from them."""
    groups = defaultdict(list)
    for rollout, value in zip(rollouts, rewards):
        groups[rollout.group_id].append(value)
    if not groups:
        return 0.0
    dead = sum(1 for values in groups.values() if max(values) - min(values) < 1e-9)
    return dead / len(groups)


def format_error_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.outcome.kind == "format_error")


def truncation_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.truncated)


def mean_tokens(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return sum(r.num_tokens for r in rollouts) / len(rollouts) if rollouts else 0.0


PROBES = [
    {"name": "success_rate", "dimension": "result", "fn": success_rate,
     "warn": 0.2, "critical": 0.05, "direction": "below"},
    {"name": "dead_group_ratio", "dimension": "result", "fn": dead_group_ratio,
     "warn": 0.3, "critical": 0.5, "direction": "above"},
    {"name": "format_error_rate", "dimension": "behaviour", "fn": format_error_rate,
     "warn": 0.2, "critical": 0.5, "direction": "above"},
    {"name": "truncation_rate", "dimension": "efficiency", "fn": truncation_rate,
     "warn": 0.1, "critical": 0.3, "direction": "above"},
    {"name": "mean_tokens", "dimension": "efficiency", "fn": mean_tokens,
     "warn": 24.0, "critical": 30.0, "direction": "above"},
]
