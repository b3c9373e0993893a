"""Health probes for swe: the standard table (evotrainer.api.probes.STANDARD) with what this seed
changes, plus the SWE ones: empty-patch, timeout and partial-credit rates.

Thresholds with a source: dead data > 50% is critical, average turns < 5 is critical (agent
scaffold), echo traps are > 60 turns without success. The rest are starting points the outer
agent may revise (pass `name=(warn, critical)` to standard()). mean_tokens is measured against
this seed's max_completion_length of 128.
"""

from typing import Sequence

from evotrainer.api import Rollout
from evotrainer.api.probes import probe, share, standard


def empty_patch_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Share of SWE rollouts whose edits changed nothing (or that wrote nothing)."""
    swe = [r for r in rollouts if r.domain == "swe"]
    if not swe:
        return None
    return share(swe, lambda r: r.outcome.kind == "empty")


def timeout_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    """Share of rollouts whose tests (or trajectory) ran out of time."""
    return share(rollouts, lambda r: r.outcome.kind == "timeout" or "timeout" in r.outcome.flags)


def partial_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Share of SWE rollouts that made some failing tests pass without resolving the task."""
    swe = [r for r in rollouts if r.domain == "swe"]
    if not swe:
        return None
    return share(swe, lambda r: not r.outcome.success
                 and ("f2p_partial" in r.outcome.flags or "f2p_all" in r.outcome.flags))


PROBES = standard(mean_tokens=(100.0, 120.0)) + [
    probe("timeout_rate", "efficiency", timeout_rate, 0.05, 0.2, "above"),
    probe("empty_patch_rate", "test_structure", empty_patch_rate, 0.1, 0.3, "above"),
    probe("partial_rate", "result", partial_rate, 0.5, 0.8, "above"),
]
