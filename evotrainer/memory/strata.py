"""Difficulty strata over per-task pass rates, smooth forgetting, anchors, and the stratified
sampling weights a curriculum returns.

Pure Python over `evotrainer.api` and the standard library only: `memory/curriculum.py` inlines
this file's source into a harness's curriculum.py, where harness code may import nothing else.

A task's difficulty is a belief about its current pass rate: a normal in logit space, mean and
variance. The replay memory supplies it in TaskStats.meta (`logit`, `logit_var`: a per-task
filter that already predicts the model's drift since the task was last seen); otherwise it comes
from the counts (the recent window `recent_attempts`/`recent_successes` when present, else all
attempts) with a Jeffreys prior. Strata, by the belief's pass rate:
  new       fewer than `min_attempts` attempts in all (and no prior): not enough evidence to place it
  unsolved  pass rate 0
  hard      above 0, below the band
  mid       inside the band [lo, hi], or outside it while the belief still puts at least
            `mid_chance` of its mass inside (a belief centred outside holds at most about half,
            so only a `mid_chance` below 0.5 widens mid): the frontier, where groups have variance
  easy      above the band, below `mastered_at`
  mastered  at or above `mastered_at`
Within mid, a task weighs by its chance of lying in the band, so confident frontier tasks are
drawn first. Smooth forgetting evicts mastered tasks (once they have `evict_mastered_after`
attempts) and tasks never solved in `give_up_after` attempts; the hard and easy strata (the
band's boundary cases) stay. When new tasks need room, the placed task farthest outside the band
goes first, so boundary cases are the last to leave. The first `anchor_share` of the capacity,
in admission order, are anchors: never evicted and always sampled with `anchor_mass` of the
weight, against collapse onto a moving frontier.
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
    # An out-of-band task whose belief puts at least this much mass in the band counts as mid.
    mid_chance: float = 0.5
    frontier: int = 64  # mid tasks the memory aims to hold; while short, it admits unseen tasks

    def __post_init__(self) -> None:
        if not 0.0 <= self.lo <= self.hi < self.mastered_at <= 1.0:
            raise ValueError(f"need 0 <= lo <= hi < mastered_at <= 1, got lo {self.lo}, hi {self.hi}, "
                             f"mastered_at {self.mastered_at}")
        if self.capacity < 1 or self.min_attempts < 1 or self.min_members < 1 or self.frontier < 0:
            raise ValueError("capacity, min_attempts and min_members must be >= 1, frontier >= 0")
        if not 0.0 < self.mid_chance <= 1.0:
            raise ValueError(f"mid_chance must be in (0, 1], got {self.mid_chance}")
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


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def observed(n: float, k: float) -> Tuple[float, float]:
    """k successes of n attempts as a belief (mean, variance) in logit space: the Jeffreys
    posterior mean and its delta-method variance, finite even at 0 or n successes."""
    p = (k + 0.5) / (n + 1.0)
    return logit(p), 1.0 / ((n + 1.0) * p * (1.0 - p))


def belief(stats: TaskStats) -> Optional[Tuple[float, float]]:
    """The current pass rate as (mean, variance) in logit space; None without evidence."""
    mean, var = _num(stats.meta.get("logit")), _num(stats.meta.get("logit_var"))
    if mean is not None and var is not None and var > 0:
        return mean, var
    recent, won = _num(stats.meta.get("recent_attempts")), _num(stats.meta.get("recent_successes"))
    if recent is not None and recent > 0 and won is not None:
        return observed(recent, min(recent, max(0.0, won)))
    return observed(stats.attempts, stats.successes) if stats.attempts else None


def evidence(stats: TaskStats) -> Tuple[int, Optional[float]]:
    """(attempts in all, pass rate): the memory's belief when it supplies one, else the
    recent-window rate from meta when present, else successes / attempts; None without attempts."""
    b = _num(stats.meta.get("logit"))
    if b is not None and belief(stats) is not None:
        return stats.attempts, sigmoid(b)
    recent, won = _num(stats.meta.get("recent_attempts")), _num(stats.meta.get("recent_successes"))
    if recent is not None and recent > 0 and won is not None:
        return stats.attempts, min(1.0, max(0.0, won / recent))
    return stats.attempts, (stats.successes / stats.attempts if stats.attempts else None)


def band_chance(stats: TaskStats, policy: "StrataPolicy") -> float:
    """The belief's probability that the current pass rate lies in [lo, hi] (0 without evidence)."""
    b = belief(stats)
    if b is None:
        return 0.0
    mean, sd = b[0], math.sqrt(b[1])

    def below(p: float) -> float:  # P(pass rate <= p)
        return 0.5 * (1.0 + math.erf((logit(min(max(p, 1e-9), 1.0 - 1e-9)) - mean) / (sd * math.sqrt(2.0))))

    return max(0.0, below(policy.hi) - below(policy.lo))


def stratum(attempts: int, rate: Optional[float], policy: StrataPolicy, chance: float = 0.0) -> str:
    """The stratum of a task; `chance` is its belief's mass in the band (see band_chance)."""
    if attempts < policy.min_attempts or rate is None:
        return "new"
    if chance >= policy.mid_chance:
        return "mid"
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


def place(stats: TaskStats, policy: StrataPolicy) -> Tuple[str, float]:
    """(stratum, chance of lying in the band). A task never solved stays "unsolved" until its
    belief (which may have drifted up since it was last seen) reaches `mid_chance`. A task whose
    belief is a prior (meta `prior`: a variant starting from its parent's belief) is placed by
    that belief before any attempt."""
    attempts, rate = evidence(stats)
    chance = band_chance(stats, policy)
    if stats.meta.get("prior") is True and belief(stats) is not None:
        return stratum(max(attempts, policy.min_attempts), rate, policy, chance), chance
    if stats.successes <= 0 and attempts >= policy.min_attempts and chance < policy.mid_chance:
        return "unsolved", chance
    return stratum(attempts, rate, policy, chance), chance


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

    Each stratum's target share is split among its members in memory, evenly except in mid,
    where members weigh by their chance of lying in the band. A stratum with
    fewer than `min_members` members keeps only that fraction of its share; the rest, and the
    share of empty strata, goes to "new" tasks when there are any (to place them), else to the
    present strata in proportion to their shares. The weights always sum to 1.
    """
    placed: List[Tuple[TaskStats, str, Optional[str]]] = []
    chance: Dict[str, float] = {}
    for s in task_stats:
        st, chance[s.task_id] = place(s, policy)
        placed.append((s, st, forgettable(s, policy)))
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
        # Mid members weigh by their chance of lying in the band (floored, so none starves).
        pull = {tid: max(0.05, chance[tid]) if st == "mid" else 1.0 for tid in ids}
        norm = sum(pull.values())
        for tid in ids:
            weights[tid] = free_mass * present[st] / total * pull[tid] / norm
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
