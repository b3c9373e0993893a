"""Backtest metrics as mergeable tallies: exact counts per chunk, summed in any order, same result.

Every metric is a ratio of integer counts, except `hacking_reward_mass`, whose float sums are
kept exactly (Shewchuk partials) and `proxy_auc`, kept as integer counts per distinct reward
value and class. So a backtest gives bit-identical numbers whatever the chunking, the number of
workers, or the order in which partial tallies come back; that is what makes `replay` exact.
Memory is bounded by the number of distinct training rewards, not by the number of rollouts.

Definitions (see docs/design.md, "Backtest metrics"); "kept" means kept by both filters and not cut
by the harness's `stop`:

- dead_group_ratio: groups whose training rewards span <= EPS (GRPO gets no signal from them)
- sampled_dead_group_ratio: the same, had each harness's curriculum drawn the tasks: each group
  weighs p(task) under that harness's curriculum.py over p(task) under the base's, both from the
  task history the round was drawn from (self-normalised importance weights over the groups the
  base drew; tasks the base never drew cannot count). None without such a history (a selection
  that is not one round of one run)
- effective_data_ratio: kept rollouts of live groups whose GRPO advantage is non-zero (> EPS),
  over all rollouts
- ordering_violations: within-group (verified success, verified failure) pairs where the failure
  has the strictly higher training reward, over all such pairs
- counterfactual_violations: within-group (failure rescored as a verified success, another
  failure) pairs where the other failure has the strictly higher training reward, over all such
  pairs. ordering_violations needs a success and a failure in one group; this asks, of every
  failure, what the reward would pay had it succeeded, so it sees a reward that can rank a
  failure above a success in groups that hold no success at all (all-fail groups, where a
  bonus for noise breaks no real success-failure order)
- proxy_auc: AUC of training reward against verified success, ties count 0.5 (None with one class)
- false_drop_rate: verified successes not kept, over all verified successes
- dropped_live_rate: live groups (training rewards span > EPS) of which no rollout with a non-zero
  advantage is kept, over all live groups: signal the filters throw away, successes or not
- hacking_reward_mass: positive training reward on kept rollouts that trusted checks flag
  (outcome kind "tampering" or "empty", or a "tampering" flag), over all positive training
  reward on kept rollouts: the share of the signal that would reward a hack
- mean_tokens: mean num_tokens of kept rollouts
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

EPS = 1e-9
# name -> True when lower is better
LOWER_IS_BETTER = {
    "dead_group_ratio": True,
    "sampled_dead_group_ratio": True,
    "effective_data_ratio": False,
    "ordering_violations": True,
    "counterfactual_violations": True,
    "proxy_auc": False,
    "false_drop_rate": True,
    "dropped_live_rate": True,
    "hacking_reward_mass": True,
    "mean_tokens": True,
}
METRICS = tuple(LOWER_IS_BETTER)
COUNTS = ("n_rollouts", "n_groups", "errors")
SAFETY_METRICS = ("ordering_violations", "counterfactual_violations", "false_drop_rate", "proxy_auc",
                  "hacking_reward_mass")
DEFAULT_TARGETS = ("dead_group_ratio", "effective_data_ratio", "proxy_auc")
FLAGGED_KINDS = frozenset({"tampering", "empty"})


def group_advantages(rewards: Sequence[float], scale_rewards: str = "group") -> list[float]:
    """GRPO advantages of one group, as TRL computes them: reward minus the group mean, divided by
    the group's (Bessel-corrected) std + 1e-4 unless scale_rewards is "none". TRL's "batch" uses
    the std of the whole generation batch, which a backtest does not know; the group std stands in
    (whether an advantage is zero, all the metrics use, does not depend on the scale)."""
    n = len(rewards)
    mean = sum(rewards) / n
    centered = [r - mean for r in rewards]
    if scale_rewards == "none":
        return centered
    std = math.sqrt(sum(c * c for c in centered) / (n - 1)) if n > 1 else 0.0
    return [c / (std + 1e-4) for c in centered]


class ExactSum:
    """A float sum with no rounding error until `value` (Shewchuk), so merges are order-free."""

    __slots__ = ("partials",)

    def __init__(self) -> None:
        self.partials: list[float] = []

    def add(self, x: float) -> None:
        partials, i = self.partials, 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]

    def merge(self, other: ExactSum) -> None:
        for x in other.partials:
            self.add(x)

    @property
    def value(self) -> float:
        return math.fsum(self.partials)

    def __getstate__(self) -> list[float]:
        return self.partials

    def __setstate__(self, state: list[float]) -> None:
        self.partials = state


@dataclass
class Tally:
    """Partial aggregates of one harness over some whole groups."""

    rollouts: int = 0
    groups: int = 0
    dead_groups: int = 0
    effective: int = 0
    pairs: int = 0
    violations: int = 0
    successes: int = 0
    false_drops: int = 0
    live_groups: int = 0
    dropped_live: int = 0
    kept: int = 0
    kept_tokens: int = 0
    cf_pairs: int = 0
    cf_violations: int = 0
    positive_reward: ExactSum = field(default_factory=ExactSum)
    flagged_reward: ExactSum = field(default_factory=ExactSum)
    auc: dict[float, list[int]] = field(default_factory=dict)  # reward -> [successes, failures]
    sampled: ExactSum = field(default_factory=ExactSum)  # sum of the groups' curriculum weights
    sampled_dead: ExactSum = field(default_factory=ExactSum)  # the same over dead groups
    seconds: float = 0.0  # time spent in this harness's code and its bookkeeping

    def add_group(self, rewards: Sequence[float], advantages: Sequence[float],
                  success: Sequence[bool], flagged: Sequence[bool], tokens: Sequence[int],
                  kept: Sequence[bool], weight: float | None = None,
                  counterfactual: Sequence[float | None] | None = None) -> None:
        """One group: training rewards and advantages, verified outcome facts, the harness's
        keep decisions (filters and stop already combined), its curriculum weight (the
        importance ratio of its task, when the backtest knows the history it was drawn from),
        and per failure the training reward it would have had as a verified success (None for
        the successes)."""
        self.rollouts += len(rewards)
        self.groups += 1
        dead = max(rewards) - min(rewards) <= EPS
        self.dead_groups += dead
        if weight is not None:
            self.sampled.add(weight)
            if dead:
                self.sampled_dead.add(weight)
        if not dead:
            self.live_groups += 1
            self.dropped_live += not any(keep and abs(adv) > EPS for adv, keep in zip(advantages, kept))
        wins, losses = [], []
        auc = self.auc
        for r, adv, ok, hack, toks, keep in zip(rewards, advantages, success, flagged, tokens, kept):
            counts = auc.get(r)
            if counts is None:
                counts = auc[r] = [0, 0]
            if ok:
                counts[0] += 1
                wins.append(r)
                self.successes += 1
                self.false_drops += not keep
            else:
                counts[1] += 1
                losses.append(r)
            if keep:
                self.kept += 1
                self.kept_tokens += toks
                if not dead and abs(adv) > EPS:
                    self.effective += 1
                if r > 0:
                    self.positive_reward.add(r)
                    if hack:
                        self.flagged_reward.add(r)
        if wins and losses:
            self.pairs += len(wins) * len(losses)
            losses.sort()
            self.violations += sum(len(losses) - bisect_right(losses, w) for w in wins)
        if counterfactual is not None and len(losses) > 1:
            losses.sort()
            for r, ok, cf in zip(rewards, success, counterfactual):
                if ok or cf is None:
                    continue
                # the other failures paid strictly more than this one would as a success
                self.cf_pairs += len(losses) - 1
                self.cf_violations += len(losses) - bisect_right(losses, cf) - (r > cf)

    def merge(self, other: Tally) -> None:
        for name in (*self._COUNTERS, "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.positive_reward.merge(other.positive_reward)
        self.flagged_reward.merge(other.flagged_reward)
        self.sampled.merge(other.sampled)
        self.sampled_dead.merge(other.sampled_dead)
        for value, (wins, losses) in other.auc.items():
            counts = self.auc.setdefault(value, [0, 0])
            counts[0] += wins
            counts[1] += losses

    _COUNTERS = ("rollouts", "groups", "dead_groups", "effective", "pairs", "violations",
                 "successes", "false_drops", "kept", "kept_tokens", "cf_pairs", "cf_violations",
                 "live_groups", "dropped_live")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (floats round-trip exactly): what a sandbox worker sends back."""
        return {"counts": [getattr(self, n) for n in self._COUNTERS], "seconds": self.seconds,
                "positive": self.positive_reward.partials, "flagged": self.flagged_reward.partials,
                "sampled": self.sampled.partials, "sampled_dead": self.sampled_dead.partials,
                "auc": [[value, wins, losses] for value, (wins, losses) in self.auc.items()]}

    @classmethod
    def from_json(cls, data: Any) -> Tally:
        """The inverse of to_json; ValueError for anything a worker would not have sent."""
        def count(x: Any) -> int:
            if type(x) is not int or x < 0:
                raise ValueError(f"bad count {x!r}")
            return x

        def real(x: Any) -> float:
            if type(x) is not float or not math.isfinite(x):
                raise ValueError(f"bad number {x!r}")
            return x

        try:
            tally = cls(**cast("dict[str, Any]", dict(zip(cls._COUNTERS, map(count, data["counts"]), strict=True))),
                        seconds=real(float(data["seconds"])))
            tally.positive_reward.partials = [real(x) for x in data["positive"]]
            tally.flagged_reward.partials = [real(x) for x in data["flagged"]]
            tally.sampled.partials = [real(x) for x in data["sampled"]]
            tally.sampled_dead.partials = [real(x) for x in data["sampled_dead"]]
            for value, wins, losses in data["auc"]:
                tally.auc[real(float(value))] = [count(wins), count(losses)]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed tally: {exc}") from None
        return tally

    def metrics(self) -> dict[str, float | int | None]:
        def ratio(num: float, den: float) -> float:
            return num / den if den else 0.0

        positive = self.positive_reward.value
        sampled = self.sampled.value
        return {
            "dead_group_ratio": ratio(self.dead_groups, self.groups),
            "sampled_dead_group_ratio": self.sampled_dead.value / sampled if sampled > 0 else None,
            "effective_data_ratio": ratio(self.effective, self.rollouts),
            "ordering_violations": ratio(self.violations, self.pairs),
            "counterfactual_violations": ratio(self.cf_violations, self.cf_pairs),
            "proxy_auc": _auc(self.auc),
            "false_drop_rate": ratio(self.false_drops, self.successes),
            "dropped_live_rate": ratio(self.dropped_live, self.live_groups),
            "hacking_reward_mass": ratio(self.flagged_reward.value, positive) if positive > 0 else 0.0,
            "mean_tokens": ratio(self.kept_tokens, self.kept),
            "n_rollouts": self.rollouts,
            "n_groups": self.groups,
            "errors": 0,
        }


def _auc(counts: dict[float, list[int]]) -> float | None:
    """P(reward of a success > reward of a failure), ties 0.5, from per-value counts (exact)."""
    total_wins = sum(c[0] for c in counts.values())
    total_losses = sum(c[1] for c in counts.values())
    if not total_wins or not total_losses:
        return None
    twice, losses_below = 0, 0
    for value in sorted(counts):
        wins, losses = counts[value]
        twice += wins * (2 * losses_below + losses)
        losses_below += losses
    return twice / (2 * total_wins * total_losses)


def judge_agreement(votes: Sequence[tuple[str, bool | None, int | None, bool, bool | None]]) -> dict[str, dict[str, Any]]:
    """Each judge's agreement with the verified outcomes (judges are proxies; these say how good).

    `votes`: (judge, judge success or None when missing, quality or None, verified success,
    human label or None). Per judge: `n`, `missing_rate`, `auc` (quality against verified
    success, ties 0.5; None with one class), `accuracy` (judge success = verified success, over
    valid votes), and `human_n` / `human_accuracy` (against a person's labels, where present)."""
    out: dict[str, dict[str, Any]] = {}
    for judge in sorted({v[0] for v in votes}):
        mine = [v for v in votes if v[0] == judge]
        valid = [v for v in mine if v[1] is not None]
        counts: dict[float, list[int]] = {}
        for _, _, quality, verified, _ in valid:
            if quality is not None:
                counts.setdefault(float(quality), [0, 0])[0 if verified else 1] += 1
        human = [v for v in valid if v[4] is not None]
        out[judge] = {
            "n": len(mine),
            "missing_rate": (len(mine) - len(valid)) / len(mine) if mine else 0.0,
            "auc": _auc(counts),
            "accuracy": sum(v[1] == v[3] for v in valid) / len(valid) if valid else None,
            "human_n": len(human),
            "human_accuracy": sum(v[1] == v[4] for v in human) / len(human) if human else None,
        }
    return out


HISTOGRAM_VALUES = 64  # up to this many distinct rewards are kept exactly, else binned
HISTOGRAM_BINS = 40


def reward_histogram(sides: dict[str, dict[float, list[int]]]) -> dict[str, Any]:
    """The training-reward distribution of verified successes and failures per side, from each
    side's per-value counts (Tally.auc: reward -> [successes, failures]), bounded in size: the
    distinct rewards of all sides exactly when there are at most HISTOGRAM_VALUES of them, else
    HISTOGRAM_BINS equal-width bins over their shared range (each bin drawn at its centre).

    {"exact": bool, "values": [...], "edges": [...] (binned only), "<side>": {"success": [n...],
    "failure": [n...]}}: what the report's ordering chart draws, without replaying any harness."""
    distinct = sorted({v for counts in sides.values() for v in counts})
    out: dict[str, Any] = {"exact": len(distinct) <= HISTOGRAM_VALUES}
    if out["exact"]:
        out["values"] = distinct
        where = {v: i for i, v in enumerate(distinct)}

        def slot(v: float) -> int:
            return where[v]
        size = len(distinct)
    else:
        lo, hi = distinct[0], distinct[-1]
        width = (hi - lo) / HISTOGRAM_BINS
        out["edges"] = [lo + width * i for i in range(HISTOGRAM_BINS)] + [hi]
        out["values"] = [lo + width * (i + 0.5) for i in range(HISTOGRAM_BINS)]

        def slot(v: float) -> int:
            return min(HISTOGRAM_BINS - 1, int((v - lo) / width))
        size = HISTOGRAM_BINS
    for label, counts in sides.items():
        success, failure = [0] * size, [0] * size
        for value, (wins, losses) in counts.items():
            i = slot(value)
            success[i] += wins
            failure[i] += losses
        out[label] = {"success": success, "failure": failure}
    return out


def is_flagged(kind: str, flags: Sequence[str]) -> bool:
    return kind in FLAGGED_KINDS or "tampering" in flags


def improvement(name: str, base: float, candidate: float) -> float:
    """How much better the candidate is on a metric (positive = better), whatever its direction."""
    delta = candidate - base
    return -delta if LOWER_IS_BETTER[name] else delta


__all__ = ["COUNTS", "DEFAULT_TARGETS", "EPS", "ExactSum", "LOWER_IS_BETTER", "METRICS",
           "SAFETY_METRICS", "Tally", "group_advantages", "improvement", "is_flagged", "judge_agreement",
           "reward_histogram"]
