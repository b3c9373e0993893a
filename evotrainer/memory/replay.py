"""A replay memory of tasks with a capacity: admission in order, recency-weighted pass rates,
smooth forgetting, anchors, and difficulty-stratified sampling (strata.py decides all of it).

The memory keeps, per task, attempts and successes that decay by `decay` each round, so the
strata follow the current model rather than its whole history. It is plain data (to_json /
from_json) so a run can keep it in its workdir between rounds.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from evotrainer.api import TaskStats
from evotrainer.memory.strata import STRATA, Plan, StrataPolicy, distance, evidence, plan


@dataclass
class Entry:
    task_id: str
    admitted: int  # the round it entered the memory; order of admission decides anchors
    recent_attempts: float = 0.0  # decayed each round
    recent_successes: float = 0.0
    attempts: int = 0  # all time
    successes: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class ReplayMemory:
    """Tasks the curriculum may draw, at most `policy.capacity` of them."""

    def __init__(self, policy: StrataPolicy | None = None, decay: float = 0.5) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        self.policy = policy or StrataPolicy()
        self.decay = decay
        self.entries: dict[str, Entry] = {}  # insertion order is admission order
        self.forgotten: dict[str, str] = {}  # task_id -> why, for reports

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.entries

    def admit(self, task_ids: Iterable[str], round_index: int, meta: Mapping[str, Mapping] | None = None) -> list[str]:
        """Admit new tasks while there is room; returns the ids admitted. Room is made by
        forgetting (mastered, unsolvable), then by evicting placed non-anchor tasks outside the
        band, farthest first; a mid task is never pushed out. A task forgotten before may come
        back (its history restarts)."""
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
            self.forgotten.pop(tid, None)
            admitted.append(tid)
        return admitted

    def _outside_band(self) -> list[str]:
        p = self.plan()
        anchors = set(p.anchors)
        scored = []
        for s in self.stats():
            if s.task_id in anchors or p.strata[s.task_id] in ("new", "mid"):
                continue
            d = distance(evidence(s)[1], self.policy)
            if d > 0:
                scored.append((-d, s.task_id))
        return [tid for _, tid in sorted(scored)]

    def observe(self, results: Mapping[str, tuple[int, int]]) -> None:
        """One round's verified results {task_id: (attempts, successes)}: older evidence decays
        first, then the round's is added. Results for tasks not in memory are ignored."""
        for e in self.entries.values():
            e.recent_attempts *= self.decay
            e.recent_successes *= self.decay
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

    def stats(self) -> list[TaskStats]:
        """The memory as a curriculum sees it: TaskStats in admission order, recent window in meta."""
        return [TaskStats(e.task_id, e.attempts, e.successes,
                          {**e.meta, "recent_attempts": e.recent_attempts, "recent_successes": e.recent_successes,
                           "admitted": e.admitted})
                for e in self.entries.values()]

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
        return {"policy": pol, "decay": self.decay, "entries": [asdict(e) for e in self.entries.values()],
                "forgotten": dict(self.forgotten)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ReplayMemory":
        mem = cls(StrataPolicy(**data["policy"]), float(data["decay"]))
        for e in data["entries"]:
            mem.entries[e["task_id"]] = Entry(**e)
        mem.forgotten = dict(data.get("forgotten", {}))
        return mem

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path | str) -> "ReplayMemory":
        return cls.from_json(json.loads(Path(path).read_text()))


def uniform_sample(task_ids: Sequence[str], n: int, rng: random.Random) -> list[str]:
    """The seed curriculum's sampling (every task alike), for comparisons."""
    return rng.choices(list(task_ids), k=n) if task_ids else []
