"""A training run's replay memory: harness.yaml `memory` switches it on.

Before each round the loop asks `RunMemory.refill` which train tasks the curriculum may draw:
the memory first observes every finished round it has not seen yet (per-task verified results
from the store), forgets what the model has mastered or can never solve, and admits unseen
tasks while its frontier is short, frontier variants first (each with its parent, so it starts
from the parent's belief), then the run's other train tasks in a seeded order. The curriculum
then weighs only the memory's tasks, each with the memory's drift-aware belief in
TaskStats.meta (`logit`, `logit_var`), which the stratified curriculum (memory/curriculum.py)
reads. The memory lives in <workdir>/memory/<run>.json, written atomically after each change,
so an interrupted run resumes with it and never observes a round twice.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.api import TaskStats
from evotrainer.jsonfile import write_json
from evotrainer.memory.replay import ReplayMemory
from evotrainer.memory.strata import StrataPolicy


class RunMemory:
    def __init__(self, path: Path, memory: ReplayMemory, observed: Sequence[int] = ()) -> None:
        self.path, self.memory, self.observed = path, memory, sorted(set(observed))

    @classmethod
    def open(cls, workdir: Path, run_name: str, spec: dict[str, Any]) -> RunMemory:
        """The run's memory from disk, or a new one under the harness's `memory` settings. The
        settings of a new harness version apply to a memory already on disk too."""
        path = Path(workdir) / "memory" / f"{run_name}.json"
        policy = StrataPolicy(capacity=spec["capacity"], frontier=spec["frontier"])
        if not path.is_file():
            return cls(path, ReplayMemory(policy, variant_var=spec["variant_var"]))
        data = json.loads(path.read_text())
        memory = ReplayMemory.from_json(data["memory"])
        memory.policy, memory.variant_var = policy, spec["variant_var"]
        return cls(path, memory, data.get("observed", []))

    def catch_up(self, store, run_id: int, domain: str, finished: Sequence[int]) -> list[int]:
        """Observe each finished round index not observed yet, in order; returns those observed."""
        done = []
        for index in sorted(set(finished) - set(self.observed)):
            self.memory.observe(store.round_counts(run_id, index, domain))
            self.observed.append(index)
            done.append(index)
        if done:
            self.save()
        return done

    def refill(self, tasks: Sequence, round_index: int, admit: int, seed: int) -> list[str]:
        """Forget, then admit up to `memory.wanted(admit)` unseen tasks; returns those admitted.
        Frontier variants (meta `parent`) come first, in the order given; then the rest in a
        seeded shuffle. Tasks the memory forgot are not offered again."""
        self.memory.forget()
        want = self.memory.wanted(admit)
        fresh = [t for t in tasks if t.task_id not in self.memory and t.task_id not in self.memory.forgotten]
        variants = [t for t in fresh if t.meta.get("parent")]
        rest = [t for t in fresh if not t.meta.get("parent")]
        random.Random(f"memory:{seed}").shuffle(rest)
        offered = (variants + rest)[:want]
        parents = {t.task_id: str(t.meta["parent"]) for t in offered if t.meta.get("parent")}
        admitted = self.memory.admit([t.task_id for t in offered], round_index, parents=parents)
        self.save()
        return admitted

    def task_stats(self, tasks: Sequence) -> list[TaskStats]:
        """The memory's tasks as the curriculum sees them, with each task's level in meta."""
        level = {t.task_id: t.level for t in tasks}
        return [TaskStats(s.task_id, s.attempts, s.successes,
                          {**s.meta, "level": level.get(s.task_id, 0), "split": "train"})
                for s in self.memory.stats()]

    def save(self) -> None:
        write_json(self.path, {"memory": self.memory.to_json(), "observed": self.observed}, indent=1)
