"""Live verification of a promotion: did verified success on the deciding split regress beyond noise?

The deciding split is the validation split (train/splits.py) when the run has one, so the
held-out split decides nothing; without one (domain.validation_size=0) it is the held-out split.
The evals say which: a Verdict names the split its evals came from.

Two baselines. Against the previous round (`verify`): noise is the binomial standard error of
the baseline's held-out success over every eval task (all eval seeds pooled), plus the spread
between eval seeds when there are several. That comparison also charges the policy's own drift
between rounds to the change. Against the control arm (`verify_paired`, coevolve/control.py):
the same round trained again from the same adapter, seed and task history under the parent
harness, so the change is the only difference; both arms answer the same held-out tasks, and
noise is the standard error of the per-task differences. Either way a drop of more than `z`
noise units reverts the promotion.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    baseline: float
    live: float
    noise: float
    regressed: bool
    against: str = "previous round"  # or "control arm"
    split: str = "heldout"  # or "validation": what the compared evals answered

    @property
    def delta(self) -> float:
        return self.live - self.baseline

    def describe(self) -> str:
        word = "regressed" if self.regressed else "held"
        what = "held-out" if self.split == "heldout" else self.split
        if self.against == "control arm":
            return (f"{what} success {self.live:.3f} with the change vs {self.baseline:.3f} in the control arm "
                    f"({self.delta:+.3f}, paired noise {self.noise:.3f}): {word}")
        return (f"{what} success {self.baseline:.3f} -> {self.live:.3f} "
                f"({self.delta:+.3f}, noise {self.noise:.3f}): {word}")


def pooled(evals: Sequence[Mapping]) -> tuple[float, int, float]:
    """(success rate, n, spread across seeds) of one round's evals."""
    n = sum(e["n"] for e in evals)
    rate = sum(e["successes"] for e in evals) / n if n else 0.0
    rates = [e["success_rate"] for e in evals]
    spread = statistics.pstdev(rates) if len(rates) > 1 else 0.0
    return rate, n, spread


def verify(baseline: Sequence[Mapping], live: Sequence[Mapping], z: float) -> Verdict:
    if not baseline or not live:
        raise ValueError("verification needs evals for both rounds")
    p, n, spread = pooled(baseline)
    q, _, spread_live = pooled(live)
    se = math.sqrt(max(p * (1 - p), 1.0 / n) / n)
    noise = se + max(spread, spread_live)
    return Verdict(baseline=p, live=q, noise=noise, regressed=(p - q) > z * noise, split=_split(live))


def _split(evals: Sequence[Mapping]) -> str:
    return str(evals[0].get("split", "heldout")) if evals else "heldout"


def verify_paired(control: Sequence[Mapping], live: Sequence[Mapping], z: float) -> Verdict:
    """Live against the control arm, task by task over the eval seeds both have. Evals without
    per-task results (`details["solved"]`, older stores) fall back to the unpaired test."""
    c = {e["seed"]: e for e in control}
    q = {e["seed"]: e for e in live}
    seeds = sorted(set(c) & set(q))
    if not seeds or any("solved" not in (c[s].get("details") or {}) or "solved" not in (q[s].get("details") or {})
                        or c[s]["n"] != q[s]["n"] for s in seeds):
        unpaired = verify(control, live, z)
        return Verdict(unpaired.baseline, unpaired.live, unpaired.noise, unpaired.regressed, "control arm",
                       unpaired.split)
    n = sum(c[s]["n"] for s in seeds)
    base = sum(c[s]["successes"] for s in seeds) / n
    now = sum(q[s]["successes"] for s in seeds) / n
    solved = {s: (set(c[s]["details"]["solved"]), set(q[s]["details"]["solved"])) for s in seeds}
    gained = sum(len(after - before) for before, after in solved.values())
    lost = sum(len(before - after) for before, after in solved.values())
    mean = (gained - lost) / n
    var = (gained + lost) / n - mean * mean  # of the per-task differences, each -1, 0 or 1
    noise = math.sqrt(max(var, 1.0 / n) / n)
    return Verdict(baseline=base, live=now, noise=noise, regressed=(base - now) > z * noise, against="control arm",
                   split=_split(live))
