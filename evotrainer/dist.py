"""Who does what in a distributed launch (`accelerate launch -m evotrainer ...`): every rank
trains (DDP), rank 0 alone runs the outer loop and writes the store, the harness repo, adapters
and backtests; the other ranks wait for it and read what it wrote.

Rank and world size come from the launcher's environment (RANK, WORLD_SIZE), so a plain
single-process run needs no process group and never imports accelerate's state.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

T = TypeVar("T")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def distributed() -> bool:
    return world_size() > 1


def _group():
    """The launcher's process group, joined once per process (NCCL on GPUs, gloo on CPU).
    accelerate (inside the GRPOTrainer) finds it initialized and reuses it."""
    import torch
    import torch.distributed as td

    if not td.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        td.init_process_group(backend=backend)
    return td


def barrier() -> None:
    """Wait here until every rank arrives (no-op in a single process)."""
    if distributed():
        _group().barrier()


def share(value: T) -> T:
    """Rank 0's `value` on every rank: e.g. the id of a row only rank 0 may create."""
    if not distributed():
        return value
    box: list[Any] = [value if is_main() else None]
    _group().broadcast_object_list(box, src=0)
    return box[0]


def gather(items: list[T]) -> list[T]:
    """Every rank's `items`, concatenated in rank order, on every rank."""
    if not distributed():
        return list(items)
    td = _group()
    parts: list[Any] = [None] * td.get_world_size()
    td.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


class GatheredRollouts:
    """The recorder's store in a multi-rank run. Each rank scores its own slice of the batch;
    every rank's rows are gathered and rank 0 writes them, so each rollout is stored once and
    no rank but 0 writes. Reads go to the store unchanged."""

    def __init__(self, store):
        self._store = store

    def add_rollouts(self, rows: list) -> None:
        from dataclasses import replace

        from evotrainer.store.jsonl import from_export_dict, to_export_dict

        # Rollouts travel in their JSONL shape (api.Rollout's frozen meta does not pickle).
        wire = [(to_export_dict(r), r.run_id, r.round_id) for r in rows]
        wire = gather(wire)  # every rank calls this once per step, in lockstep with the trainer
        if is_main():
            self._store.add_rollouts([replace(from_export_dict(d), run_id=run, round_id=rnd)
                                      for d, run, rnd in wire])

    def __getattr__(self, name: str):
        return getattr(self._store, name)
