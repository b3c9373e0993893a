"""Live verification of a promotion: did held-out verified success regress beyond noise?

Noise is the binomial standard error of the baseline's held-out success over every eval task
(all eval seeds pooled), plus the spread between eval seeds when there are several. A drop of
more than `z` noise units reverts the promotion.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Verdict:
    baseline: float
    live: float
    noise: float
    regressed: bool

    @property
    def delta(self) -> float:
        return self.live - self.baseline

    def describe(self) -> str:
        word = "regressed" if self.regressed else "held"
        return (f"held-out success {self.baseline:.3f} -> {self.live:.3f} "
                f"({self.delta:+.3f}, noise {self.noise:.3f}): {word}")


def pooled(evals: Sequence[Mapping]) -> tuple[float, int, float]:
    """(success rate, n, spread across seeds) of one round's held-out evals."""
    n = sum(e["n"] for e in evals)
    rate = sum(e["successes"] for e in evals) / n if n else 0.0
    rates = [e["success_rate"] for e in evals]
    spread = statistics.pstdev(rates) if len(rates) > 1 else 0.0
    return rate, n, spread


def verify(baseline: Sequence[Mapping], live: Sequence[Mapping], z: float) -> Verdict:
    if not baseline or not live:
        raise ValueError("verification needs held-out evals for both rounds")
    p, n, spread = pooled(baseline)
    q, _, spread_live = pooled(live)
    se = math.sqrt(max(p * (1 - p), 1.0 / n) / n)
    noise = se + max(spread, spread_live)
    return Verdict(baseline=p, live=q, noise=noise, regressed=(p - q) > z * noise)
