"""Which proposals a round tries and which passing candidate it promotes; shared by `coevolve`
and the harness-fault benchmark (evotrainer/faultbench), so the benchmark measures the loop's
own choices."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from evotrainer.backtest.gate import margins_gained, targets_from_trailer
from evotrainer.backtest.metrics import SAFETY_METRICS
from evotrainer.config import GateConfig
from evotrainer.diagnose.targets import is_safety

T = TypeVar("T")


def breadth_first(proposals: Sequence[T]) -> list[T]:
    """Answers to safety evidence first (diagnose/targets.py is_safety: their targets name a
    safety metric), whatever the agent's order, so a cap never cuts them for a louder efficiency
    alert; then every skill's first grid point before any skill's second: a cap on proposals
    should cut depth (more parameter values of one idea), not breadth (other ideas)."""
    rank: dict = {}
    keyed = []
    for i, p in enumerate(proposals):
        key = getattr(p, "skill", None) or getattr(p, "slug", i)
        rank[key] = rank.get(key, -1) + 1
        keyed.append((not is_safety(getattr(p, "targets", None)), rank[key], i, p))
    return [t[-1] for t in sorted(keyed, key=lambda t: t[:3])]


def gain(report: dict[str, Any], gate: GateConfig) -> float | None:
    """The backtest's gain on its target in margins (backtest/gate.py margins_gained): a token
    count and a ratio are never ranked against each other raw."""
    target = report.get("target")
    metrics = report.get("metrics") or {}
    base, cand = metrics.get("base") or {}, metrics.get("candidate") or {}
    if target is None or base.get(target) is None or cand.get(target) is None:
        return None
    return margins_gained(target, base[target], cand[target], gate)


def repairs_safety(candidate: Any) -> bool:
    """Whether the candidate targets a safety metric: where the training reward or the filters
    disagree with verified outcomes (ordering violations, false drops, proxy AUC, reward on
    flagged rollouts)."""
    return any(t in SAFETY_METRICS for t in targets_from_trailer(getattr(candidate, "targets", None)))


def passing_best_first(candidates: Iterable[T]) -> list[T]:
    """The candidates the gate passed (`decision == "promote"`), best first; the first is the one
    a round promotes. A change that makes the reward agree with verified outcomes comes before
    any that only saves tokens or revives groups, then the largest gain in margins. Seen in the
    harness-fault benchmark: on math-format-outweighs a token saving (6.7 margins) outranked
    the fix of the inverted tiers (3.5 margins), and the inversion stayed."""
    passing = [c for c in candidates if getattr(c, "decision", None) == "promote"]
    return sorted(passing, key=lambda c: (repairs_safety(c), getattr(c, "gain", None) or 0.0), reverse=True)


__all__ = ["breadth_first", "gain", "passing_best_first", "repairs_safety"]
