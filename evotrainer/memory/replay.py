"""A replay memory of tasks with a capacity: admission as the frontier needs it, per-task
pass-rate beliefs that follow the model's drift, smooth forgetting, anchors, and
difficulty-stratified sampling (strata.py places and weighs).

Why a filter rather than a plain pass rate: the model learns on what it samples, so a task's
pass rate measured a few rounds ago is already too low when the task is drawn again. Per task
the memory keeps a belief (mean, variance) in logit space, updated from each round's results
like a Kalman filter: between observations the mean moves by the memory's estimate of the
model's drift per round and the variance grows by `noise` per round; an observation of k of n
pulls the mean toward it by the usual gain. The drift itself is fitted to every re-observed
task's result by binomial likelihood (_learn_drift). It also keeps decayed attempt counts
(`decay`) for reports. The memory is plain data
(to_json / from_json) so a run can keep it in its workdir between rounds.

A synthesized variant (evotrainer/frontier) is admitted with its parent's belief as a prior,
widened by `variant_var`: the synthesizer chose the parent because it sat in the band, and a
variant is near its parent, so the memory places it there at once instead of spending a group of
rollouts to find out. The first observation updates the prior like any other; it is not taken
as evidence of drift.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.api import TaskStats
from evotrainer.jsonfile import write_json
from evotrainer.memory.strata import STRATA, Plan, StrataPolicy, distance, evidence, observed, plan, sigmoid


@dataclass
class Entry:
    task_id: str
    admitted: int  # the round it entered the memory; order of admission decides anchors
    recent_attempts: float = 0.0  # decayed each round
    recent_successes: float = 0.0
    attempts: int = 0  # all time
    successes: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    logit: float | None = None  # belief about the pass rate when last seen, logit space
    logit_var: float = 0.0
    seen: int = -1  # observation round that last updated the belief
    trained: bool = False  # its last observation had mixed outcomes, so the model learnt on it
    prior: bool = False  # the belief is still the parent's prior (a variant not yet observed)


class ReplayMemory:
    """Tasks the curriculum may draw, at most `policy.capacity` of them."""

    def __init__(self, policy: StrataPolicy | None = None, decay: float = 0.5, noise: float = 0.1,
                 drift_rate: float = 0.5, variant_var: float = 1.0) -> None:
        if not 0.0 <= decay <= 1.0 or not 0.0 < drift_rate <= 1.0 or noise < 0.0 or variant_var < 0.0:
            raise ValueError(f"need decay in [0, 1], drift_rate in (0, 1], noise >= 0, variant_var >= 0; "
                             f"got {decay}, {drift_rate}, {noise}, {variant_var}")
        self.policy = policy or StrataPolicy()
        self.decay = decay
        self.noise = noise  # variance added to a belief per round unseen
        self.drift_rate = drift_rate  # how far one round's innovations move the drift estimate
        self.variant_var = variant_var  # logit variance a variant adds to its parent's belief
        self.drift = 0.0  # the model's estimated logit gain per round, on every task
        self.lift = 0.0  # the extra gain of a task the model just learnt on (mixed outcomes)
        self.rounds = 0  # observations so far
        self.entries: dict[str, Entry] = {}  # insertion order is admission order
        self.forgotten: dict[str, str] = {}  # task_id -> why, for reports

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.entries

    def admit(self, task_ids: Iterable[str], round_index: int, meta: Mapping[str, Mapping] | None = None,
              parents: Mapping[str, str] | None = None) -> list[str]:
        """Admit new tasks while there is room; returns the ids admitted. Room is made by
        forgetting (mastered, unsolvable), then by evicting placed non-anchor tasks outside the
        band, farthest first; a mid task is never pushed out. A task forgotten before may come
        back (its history restarts). `parents` maps a synthesized variant to the task it was
        made from: when the memory holds a belief about that parent, the variant starts from it
        (see the module doc)."""
        parents = parents or {}
        admitted: list[str] = []
        outside: list[str] | None = None  # eviction order, computed once the memory is full
        for tid in task_ids:
            if tid in self.entries:
                continue
            if len(self.entries) >= self.policy.capacity:
                if outside is None:
                    self.forget()
                    outside = self._outside_band()
                while len(self.entries) >= self.policy.capacity and outside:
                    gone = outside.pop(0)
                    if self.entries.pop(gone, None) is not None:
                        self.forgotten[gone] = "outside band"
                if len(self.entries) >= self.policy.capacity:
                    break
            self.entries[tid] = Entry(tid, round_index, meta=dict((meta or {}).get(tid, {})))
            self._inherit(self.entries[tid], parents.get(tid))
            self.forgotten.pop(tid, None)
            admitted.append(tid)
        return admitted

    def _inherit(self, child: Entry, parent_id: str | None) -> None:
        """Start a variant from its parent's belief, as predicted now, widened by variant_var."""
        parent = self.entries.get(parent_id) if parent_id else None
        if parent is None or parent.logit is None:
            return
        mean, var = self._predict(parent, self.rounds)
        child.logit, child.logit_var = mean, var + self.variant_var
        child.seen, child.prior = self.rounds, True

    def _outside_band(self) -> list[str]:
        """Placed non-anchor tasks outside the band, in eviction order: those above it first
        (the model keeps improving, so they only move farther out), then those below it; each
        side farthest first. A hard task is the frontier of a later round."""
        p = self.plan()
        anchors = set(p.anchors)
        scored = []
        for s in self.stats():
            if s.task_id in anchors or p.strata[s.task_id] in ("new", "mid"):
                continue
            rate = evidence(s)[1]  # the belief's rate where there is one
            d = distance(rate, self.policy)
            if d > 0:
                scored.append((rate is not None and rate < self.policy.lo, -d, s.task_id))
        return [tid for _, _, tid in sorted(scored)]

    def wanted(self, limit: int) -> int:
        """How many unseen tasks to admit now, at most `limit`: what the frontier lacks of
        `policy.frontier` mid tasks, less the tasks already waiting to be placed."""
        counts = self.strata_counts()
        return max(0, min(limit, self.policy.frontier - counts["mid"] - counts["new"]))

    def observe(self, results: Mapping[str, tuple[int, int]]) -> None:
        """One round's verified results {task_id: (attempts, successes)}: each observed task's
        belief is moved forward to now and updated, then the drift estimate. Results for tasks
        not in memory are ignored."""
        now = self.rounds
        for e in self.entries.values():
            e.recent_attempts *= self.decay
            e.recent_successes *= self.decay
        seen: list[tuple[int, int, float, float, int, bool]] = []  # (n, k, mean, var, gap, trained)
        for tid, (n, k) in results.items():
            e = self.entries.get(tid)
            if e is None:
                continue
            if not 0 <= k <= n:
                raise ValueError(f"{tid}: {k} successes of {n} attempts")
            e.recent_attempts += n
            e.recent_successes += k
            e.attempts += n
            e.successes += k
            if n == 0:
                continue
            y, r = observed(n, k)
            if e.logit is None:
                e.logit, e.logit_var = y, r
            else:
                gap = now - e.seen
                if gap > 0 and not e.prior:  # a prior's error is the variant's, not drift
                    seen.append((n, k, e.logit, e.logit_var + self.noise * gap, gap, e.trained))
                mean, var = self._predict(e, now)
                gain = var / (var + r)
                e.logit, e.logit_var = mean + gain * (y - mean), var * (1.0 - gain)
            e.seen, e.trained, e.prior = now, 0 < k < n, False
        self._learn_drift(seen)
        self.rounds += 1

    def _learn_drift(self, seen: list[tuple[int, int, float, float, int, bool]]) -> None:
        """Move (drift, lift) toward their maximum-likelihood fit to this round's re-observed
        tasks: k of n solved, with the pass rate's logit = mean + drift * gap + lift * trained,
        where the belief's own variance flattens the curve (the probit approximation of the
        logistic-normal). Every group counts, saturated ones too: a task that went from mid to
        all solved is the clearest sign of drift, and leaving such groups out pulled the estimate
        toward 0 while the model kept improving. A ridge toward the current estimate keeps a
        one-sided round stable; a few Newton steps solve it."""
        if not seen:
            return
        ridge = 1.0
        d, lift = self.drift, self.lift
        for _ in range(20):
            gd, gl = -ridge * (d - self.drift), -ridge * (lift - self.lift)
            a = c = ridge  # the negative Hessian [[a, b], [b, c]]
            b = 0.0
            for n, k, mean, var, gap, trained in seen:
                t = 1.0 if trained else 0.0
                kappa = 1.0 / math.sqrt(1.0 + math.pi * var / 8.0)
                p = sigmoid(kappa * (mean + d * gap + lift * t))
                resid, w = (k - n * p) * kappa, n * p * (1.0 - p) * kappa * kappa
                gd, gl = gd + resid * gap, gl + resid * t
                a, b, c = a + w * gap * gap, b + w * gap * t, c + w * t * t
            det = a * c - b * b
            step_d, step_l = (c * gd - b * gl) / det, (a * gl - b * gd) / det
            d, lift = d + step_d, lift + step_l
            if abs(step_d) + abs(step_l) < 1e-9:
                break
        self.drift += self.drift_rate * (d - self.drift)
        self.lift += self.drift_rate * (lift - self.lift)

    def _predict(self, e: Entry, now: int) -> tuple[float, float]:
        """The belief moved forward from when it was last updated to observation round `now`."""
        gap = max(0, now - e.seen)
        lift = self.lift if e.trained and gap > 0 else 0.0
        return e.logit + self.drift * gap + lift, e.logit_var + self.noise * gap

    def stats(self) -> list[TaskStats]:
        """The memory as a curriculum sees it: TaskStats in admission order, recent window in meta."""
        out = []
        for e in self.entries.values():
            meta = {**e.meta, "recent_attempts": e.recent_attempts, "recent_successes": e.recent_successes,
                    "admitted": e.admitted}
            if e.logit is not None:
                meta["logit"], meta["logit_var"] = self._predict(e, self.rounds)
            if e.prior:
                meta["prior"] = True
            out.append(TaskStats(e.task_id, e.attempts, e.successes, meta))
        return out

    def plan(self) -> Plan:
        return plan(self.stats(), self.policy)

    def forget(self) -> dict[str, str]:
        """Evict what the plan evicts (mastered, unsolvable, over capacity); anchors stay."""
        gone = self.plan().evicted
        for tid, why in gone.items():
            self.entries.pop(tid, None)
            self.forgotten[tid] = why
        return gone

    def sample(self, n: int, rng: random.Random) -> list[str]:
        """n task ids drawn with the plan's stratified weights (with replacement)."""
        p = self.plan()
        ids = [tid for tid, w in p.weights.items() if w > 0]
        if not ids:
            return []
        return rng.choices(ids, weights=[p.weights[t] for t in ids], k=n)

    def strata_counts(self) -> dict[str, int]:
        counts = {s: 0 for s in STRATA}
        for st in self.plan().strata.values():
            counts[st] += 1
        return counts

    # -- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        pol = asdict(self.policy)
        pol["shares"] = dict(self.policy.shares)
        return {"policy": pol, "decay": self.decay, "noise": self.noise, "drift_rate": self.drift_rate,
                "variant_var": self.variant_var,
                "drift": self.drift, "lift": self.lift, "rounds": self.rounds, "entries": [asdict(e) for e in self.entries.values()],
                "forgotten": dict(self.forgotten)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayMemory:
        mem = cls(StrataPolicy(**data["policy"]), float(data["decay"]), float(data.get("noise", 0.1)),
                  float(data.get("drift_rate", 0.5)), float(data.get("variant_var", 1.0)))
        mem.drift, mem.lift = float(data.get("drift", 0.0)), float(data.get("lift", 0.0))
        mem.rounds = int(data.get("rounds", 0))
        for e in data["entries"]:
            mem.entries[e["task_id"]] = Entry(**e)
        mem.forgotten = dict(data.get("forgotten", {}))
        return mem

    def save(self, path: Path | str) -> None:
        write_json(path, self.to_json(), indent=1)

    @classmethod
    def load(cls, path: Path | str) -> ReplayMemory:
        return cls.from_json(json.loads(Path(path).read_text()))


def uniform_sample(task_ids: Sequence[str], n: int, rng: random.Random) -> list[str]:
    """The seed curriculum's sampling (every task alike), for comparisons."""
    return rng.choices(list(task_ids), k=n) if task_ids else []
