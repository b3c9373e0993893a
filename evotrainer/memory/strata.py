"""Difficulty strata over per-task pass rates, smooth forgetting, anchors, and the stratified
sampling weights a curriculum returns.

Pure Python over `evotrainer.api` and the standard library only: `memory/curriculum.py` inlines
this file's source into a harness's curriculum.py, where harness code may import nothing else.

Strata, by a task's pass rate (recency-weighted when the caller supplies `recent_attempts` and
`recent_successes` in TaskStats.meta, so it follows the current model; else over all attempts):
  new       fewer than `min_attempts` attempts in all: not enough evidence to place it
  unsolved  pass rate 0
  hard      above 0, below the band
  mid       inside the band [lo, hi]: the frontier, where GRPO groups have reward variance
  easy      above the band, below `mastered_at`
  mastered  at or above `mastered_at`
Smooth forgetting evicts mastered tasks (once they have `evict_mastered_after` attempts) and
tasks never solved in `give_up_after` attempts; the hard and easy strata (the band's boundary
cases) stay. When new tasks need room, the placed task farthest outside the band goes first, so
boundary cases are the last to leave. The first `anchor_share` of the capacity, in admission
order, are anchors: never evicted and always sampled with `anchor_mass` of the weight, against
collapse onto a moving frontier.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from evotrainer.api import TaskStats

STRATA = ("new", "unsolved", "hard", "mid", "easy", "mastered")
# Sampling preference inside the capacity cut: the frontier first, then its two boundaries.
KEEP_ORDER = ("mid", "hard", "easy", "new", "unsolved", "mastered")


def _default_shares() -> Dict[str, float]:
    return {"mid": 0.6, "hard": 0.12, "easy": 0.12, "new": 0.12, "unsolved": 0.02, "mastered": 0.02}


@dataclass(frozen=True)
class StrataPolicy:
    """How to place tasks in strata, what to forget, and the sampling share of each stratum."""

    lo: float = 0.2  # the mid band, inclusive
    hi: float = 0.8
    mastered_at: float = 0.95  # a pass rate at or above this is "mastered"
    min_attempts: int = 4  # fewer attempts: stratum "new"
    give_up_after: int = 32  # never solved in this many attempts (all time): "unsolvable", evicted
    evict_mastered_after: int = 8  # every recent attempt solved, at least this many: evicted
    capacity: int = 256  # tasks in memory (weight > 0) at most
    anchor_share: float = 0.1  # share of the capacity kept as anchors, in admission order
    anchor_mass: float = 0.1  # share of the sampling weight that goes to anchors
    shares: Mapping[str, float] = field(default_factory=_default_shares)  # target sampling shares
    # A stratum with fewer members gets that fraction of its share; the rest goes to placing
    # new tasks, so a thin frontier makes the memory look for more rather than overdraw a few.
    min_members: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.lo <= self.hi < self.mastered_at <= 1.0:
            raise ValueError(f"need 0 <= lo <= hi < mastered_at <= 1, got lo {self.lo}, hi {self.hi}, "
                             f"mastered_at {self.mastered_at}")
        if self.capacity < 1 or self.min_attempts < 1 or self.min_members < 1:
            raise ValueError("capacity, min_attempts and min_members must be >= 1")
        if not 0.0 <= self.anchor_share <= 1.0 or not 0.0 <= self.anchor_mass < 1.0:
            raise ValueError("anchor_share must be in [0, 1] and anchor_mass in [0, 1)")
        unknown = sorted(set(self.shares) - set(STRATA))
        if unknown or any(v < 0 or not math.isfinite(v) for v in self.shares.values()):
            raise ValueError(f"shares: strata are {', '.join(STRATA)} with finite shares >= 0; got {dict(self.shares)}")
        if sum(self.shares.values()) <= 0:
            raise ValueError("shares must not all be 0")

    @property
    def n_anchors(self) -> int:
        return int(round(self.anchor_share * self.capacity))


def _num(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def evidence(stats: TaskStats) -> Tuple[int, Optional[float]]:
    """(attempts in all, pass rate): the recency-weighted rate from meta when present, else
    successes / attempts; None without attempts."""
    recent, won = _num(stats.meta.get("recent_attempts")), _num(stats.meta.get("recent_successes"))
    if recent is not None and recent > 0 and won is not None:
        return stats.attempts, min(1.0, max(0.0, won / recent))
    return stats.attempts, (stats.successes / stats.attempts if stats.attempts else None)


def stratum(attempts: int, rate: Optional[float], policy: StrataPolicy) -> str:
    if attempts < policy.min_attempts or rate is None:
        return "new"
    if rate <= 0.0:
        return "unsolved"
    if rate >= policy.mastered_at:
        return "mastered"
    if rate < policy.lo:
        return "hard"
    if rate > policy.hi:
        return "easy"
    return "mid"


def distance(rate: Optional[float], policy: StrataPolicy) -> float:
    """How far a pass rate lies outside the band (0 inside it, or when unknown)."""
    if rate is None:
        return 0.0
    return max(policy.lo - rate, rate - policy.hi, 0.0)


def forgettable(stats: TaskStats, policy: StrataPolicy) -> Optional[str]:
    """Why the current model no longer needs this task, or None: "mastered" (rate at or above
    `mastered_at` over at least `evict_mastered_after` attempts) or "unsolvable" (never solved
    in `give_up_after` attempts, all time)."""
    attempts, rate = evidence(stats)
    if rate is not None and rate >= policy.mastered_at and attempts >= policy.evict_mastered_after:
        return "mastered"
    if stats.successes <= 0 and attempts >= policy.give_up_after:
        return "unsolvable"
    return None


@dataclass(frozen=True)
class Plan:
    """What the memory holds and how to sample from it."""

    weights: Dict[str, float]  # task_id -> sampling weight (0: not in memory)
    strata: Dict[str, str]  # task_id -> stratum
    anchors: Tuple[str, ...]
    evicted: Dict[str, str]  # task_id -> why ("mastered", "unsolvable", "capacity")

    def mass(self) -> Dict[str, float]:
        """Share of the sampling weight per stratum (anchors counted in their own strata)."""
        total = sum(self.weights.values()) or 1.0
        out = {s: 0.0 for s in STRATA}
        for tid, w in self.weights.items():
            out[self.strata[tid]] += w / total
        return out


def plan(task_stats: Sequence[TaskStats], policy: StrataPolicy) -> Plan:
    """Place every task (given in admission order) in a stratum, forget, cut to capacity, weigh.

    Each stratum's target share is split evenly among its members in memory. A stratum with
    fewer than `min_members` members keeps only that fraction of its share; the rest, and the
    share of empty strata, goes to "new" tasks when there are any (to place them), else to the
    present strata in proportion to their shares. The weights always sum to 1.
    """
    placed: List[Tuple[TaskStats, str, Optional[str]]] = []
    for s in task_stats:
        placed.append((s, stratum(*evidence(s), policy), forgettable(s, policy)))
    anchors = tuple(s.task_id for s, _, _ in placed[: policy.n_anchors])
    anchor_set = set(anchors)
    evicted: Dict[str, str] = {}
    candidates: List[Tuple[int, int, str]] = []
    for order, (s, st, why) in enumerate(placed):
        if s.task_id in anchor_set:
            continue
        if why is not None:
            evicted[s.task_id] = why
        else:
            candidates.append((KEEP_ORDER.index(st), order, s.task_id))
    room = max(0, policy.capacity - len(anchors))
    candidates.sort()
    kept = {tid for _, _, tid in candidates[:room]}
    for _, _, tid in candidates[room:]:
        evicted[tid] = "capacity"
    strata = {s.task_id: st for s, st, _ in placed}
    members: Dict[str, List[str]] = {}
    for s, st, _ in placed:
        if s.task_id in kept:
            members.setdefault(st, []).append(s.task_id)
    present = {st: policy.shares.get(st, 0.0) * min(1.0, len(ids) / policy.min_members)
               for st, ids in members.items()}
    if "new" in present:
        present["new"] += sum(policy.shares.values()) - sum(present.values())
    if sum(present.values()) <= 0:  # only strata with share 0 remain: sample them alike
        present = {st: 1.0 for st in members}
    total = sum(present.values())
    free_mass = 1.0 - (policy.anchor_mass if anchors else 0.0)
    weights = {s.task_id: 0.0 for s, _, _ in placed}
    for st, ids in members.items():
        for tid in ids:
            weights[tid] = free_mass * present[st] / total / len(ids)
    if anchors:
        mass = policy.anchor_mass if members else 1.0
        for tid in anchors:
            weights[tid] += mass / len(anchors)
    return Plan(weights, strata, anchors, evicted)


def stratified_weights(task_stats: Sequence[TaskStats], policy: Optional[StrataPolicy] = None,
                       **overrides: Any) -> Dict[str, float]:
    """The curriculum.py contract: task_stats -> {task_id: weight}, per `plan`. When forgetting
    and the capacity cut leave nothing to sample, every task weighs the same."""
    policy = policy or StrataPolicy(**overrides)
    weights = plan(task_stats, policy).weights
    if task_stats and not any(weights.values()):
        return {s.task_id: 1.0 for s in task_stats}
    return weights
