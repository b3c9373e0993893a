"""Backtest throughput: rollouts/s, the 1 -> 2 worker speed-up, and peak RSS as the store grows.

    python bench/backtest_throughput.py                           # 200k rollouts, 1 and 2 workers
    python bench/backtest_throughput.py --sizes 200000,1000000    # is memory flat in store size?

Fills a SQLite store (in a child process, by bulk insert) with synthetic math rollouts in groups
of 8 with a realistic outcome mix, then backtests the seed math harness against a candidate that
adds a length bonus. Peak RSS is sampled from /proc every 50 ms over the parent and all of its
descendants together (fork server and workers), so it is the memory the backtest holds at once;
the parent's own getrusage maximum is printed beside it.
Targets (issue 3): >= 20,000 rollouts/s on 2 cores, >= 1.7x from 1 to 2 workers, < 1 GiB.
It also measures how much 2 processes of plain Python gain on the machine right then, and the
CPU seconds the backtest got (cores used = CPU s / wall s): on a shared VM those bound any speed-up.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path

from evotrainer.backtest.engine import DEFAULT_CHUNK, HarnessVersion, Selector, run_backtest
from evotrainer.harness.loader import read_sources
from evotrainer.paths import HARNESSES_DIR

GROUP = 8
FAILURES = (("wrong", 0.45), ("format_error", 0.30), ("truncated", 0.17), ("empty", 0.08))


def synthetic_rows(n: int, seed: int = 0):
    """Rows for the rollouts table: per-task difficulty, so some groups are all-fail or all-pass."""
    rng = random.Random(seed)
    kinds, weights = zip(*FAILURES)
    for g in range(n // GROUP):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        level = rng.randint(0, 2)
        p_ok = rng.random() ** (1 + level)
        prompt = f"What is {a} + {b}?\nGive the final answer after \"Answer:\"."
        for k in range(GROUP):
            kind = "ok" if rng.random() < p_ok else rng.choices(kinds, weights)[0]
            guess = a + b if kind == "ok" else a + b + rng.randint(1, 9)
            completion = {
                "ok": f"{a} plus {b} is {a + b}. Answer: {a + b}",
                "wrong": f"{a} plus {b} is {guess}. Answer: {guess}",
                "format_error": f"Let me add {a} and {b} step by step",
                "truncated": f"First, {a} + {b}: carry the one, then " * 2,
                "empty": "",
            }[kind]
            tokens = {"ok": rng.randint(8, 28), "wrong": rng.randint(8, 32), "format_error": rng.randint(5, 32),
                      "truncated": 32, "empty": rng.randint(0, 1)}[kind]
            yield {
                "id": f"r{g:07d}-{k}", "seq": g * GROUP + k + 1, "task_id": f"add-{a}-{b}", "group_id": f"g{g:07d}",
                "domain": "math", "prompt": prompt, "completion": completion, "turns": [],
                "outcome_success": kind == "ok", "outcome_score": float(kind == "ok"), "outcome_kind": kind,
                "outcome_flags": ["answer_marker"] if kind in ("ok", "wrong") else [],
                "num_tokens": tokens, "truncated": kind == "truncated",
                "meta": {"level": level, "answer": str(a + b), "split": "train"},
                "reward_components": {}, "kept": True, "model_version": "bench", "seed": 0,
            }


def fill(db: str, n: int) -> None:
    """Bulk insert with SQLAlchemy Core, one transaction (runs in a child process)."""
    from itertools import islice

    from evotrainer.store import Store
    from evotrainer.store.models import RolloutRow

    with Store(f"sqlite:///{db}") as store, store.engine.begin() as conn:
        rows = synthetic_rows(n)
        while batch := list(islice(rows, 20_000)):
            conn.execute(RolloutRow.__table__.insert(), batch)


class ProcSampler:
    """Peak resident memory of (parent + all descendants) together, and the CPU time the
    descendants used, sampled from /proc. Workers are forked from multiprocessing's fork server,
    a child of ours: they are our grandchildren, so getrusage(RUSAGE_CHILDREN) never sees them."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak_kb = interval, 0
        self._ticks: dict[int, int] = {}  # descendant pid -> last seen utime + stime
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss_kb(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
        return 0

    @staticmethod
    def _cpu_ticks(pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime, stime
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            return None

    @staticmethod
    def _children(pid: int) -> list[int]:
        kids = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
        return kids

    def _sample(self) -> None:
        me = os.getpid()
        tree, frontier = [me], [me]
        while frontier:  # the parent and every descendant (fork server, workers)
            frontier = [kid for pid in frontier for kid in self._children(pid)]
            tree += frontier
        self.peak_kb = max(self.peak_kb, sum(self._rss_kb(pid) for pid in tree))
        for pid in tree[1:]:
            ticks = self._cpu_ticks(pid)
            if ticks is not None:
                self._ticks[pid] = max(ticks, self._ticks.get(pid, 0))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    @property
    def descendants_cpu_s(self) -> float:
        return sum(self._ticks.values()) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> ProcSampler:
        self._sample()
        self._base = dict(self._ticks)  # a fork server that is already running started earlier
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for pid, ticks in self._base.items():
            self._ticks[pid] -= ticks


def _burn(n: int) -> float:
    start, x = time.perf_counter(), 0
    for i in range(n):
        x += i * i % 7
    return time.perf_counter() - start


def machine_scaling(ctx, n: int = 8_000_000) -> float:
    """How much faster two processes of plain Python finish twice the work, right now. On a
    shared or SMT-backed VM this is well under 2, and no backtest can scale past it."""
    one = _burn(n)
    with ctx.Pool(2) as pool:
        pool.map(_burn, [1, 1], chunksize=1)  # both workers started and warm
        start = time.perf_counter()
        pool.map(_burn, [n, n], chunksize=1)
        two = time.perf_counter() - start
    return 2 * one / two


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def harnesses() -> tuple[HarnessVersion, HarnessVersion]:
    seed = read_sources(HARNESSES_DIR / "math")
    bonus = seed["reward.py"].replace(
        '"format":', '"length": 0.05 * rollout.num_tokens,  # the candidate: a length bonus\n        "format":')
    assert bonus != seed["reward.py"], "the seed reward.py changed: update the candidate edit"
    return HarnessVersion("seed", seed), HarnessVersion("length-bonus", {**seed, "reward.py": bonus})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200000", help="comma-separated store sizes (default 200000)")
    parser.add_argument("--workers", default="1,2", help="worker counts to run on the first size")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK)
    parser.add_argument("--dir", type=Path, default=None, help="where to put the stores (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bt-bench-", dir=args.dir))
    base, cand = harnesses()
    ctx = multiprocessing.get_context("spawn")
    print(f"backtest throughput: seed math harness vs length-bonus candidate, groups of {GROUP}, "
          f"{len(os.sched_getaffinity(0))} cores available, chunk {args.chunk_size}")
    scaling = machine_scaling(ctx)
    print(f"machine now: 2 processes of plain Python run {scaling:.2f}x as fast as 1 "
          f"(load average {os.getloadavg()[0]:.1f})")
    results = []
    from evotrainer.store import Store

    try:
        for i, size in enumerate(sizes):
            db = root / f"store-{size}.db"
            t = time.perf_counter()
            filler = ctx.Process(target=fill, args=(str(db), size))
            filler.start()
            filler.join()
            if filler.exitcode:
                raise SystemExit(f"filling the store failed (exit code {filler.exitcode})")
            fill_s = time.perf_counter() - t
            if i == 0:  # the first backtest of a process starts the fork server: not part of either run
                with Store(f"sqlite:///{db}") as store:
                    t = time.perf_counter()
                    run_backtest(store, base, cand, Selector(limit=GROUP), workers=max(worker_counts))
                print(f"cold start: the first backtest in a process took {time.perf_counter() - t:.2f} s "
                      "on 8 rollouts, mostly starting the fork server (not in the runs below)")
                print(f"{'rollouts':>10} {'fill s':>7} {'workers':>7} {'wall s':>7} {'rollouts/s':>11} "
                      f"{'cores used':>10} {'peak RSS MiB':>13} {'parent max MiB':>14}  metrics base->candidate")
            for workers in worker_counts if i == 0 else worker_counts[-1:]:
                cpu0 = _self_cpu_s()
                with Store(f"sqlite:///{db}") as store, ProcSampler() as proc:
                    out = run_backtest(store, base, cand, Selector(), workers=workers, chunk_size=args.chunk_size)
                cpu = _self_cpu_s() - cpu0 + proc.descendants_cpu_s
                if out.failure is not None:
                    raise SystemExit(f"backtest failed: {out.failure}")
                wall = out.timings["wall_s"]
                self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                m = out.metrics
                row = {"rollouts": size, "fill_s": round(fill_s, 1), "workers": out.workers, "wall_s": wall,
                       "rollouts_per_s": round(size / wall), "cpu_s": round(cpu, 2),
                       "cores_used": round(cpu / wall, 2), "peak_rss_mib": round(proc.peak_kb / 1024, 1),
                       "ru_maxrss_self_mib": round(self_kb / 1024, 1), "startup_s": out.timings["startup_s"],
                       "dead_group_ratio": (m["base"]["dead_group_ratio"], m["candidate"]["dead_group_ratio"]),
                       "ordering_violations": (m["base"]["ordering_violations"],
                                               m["candidate"]["ordering_violations"])}
                results.append(row)
                dead, bad = row["dead_group_ratio"], row["ordering_violations"]
                print(f"{size:>10,} {fill_s:>7.1f} {out.workers:>7} {wall:>7.2f} {row['rollouts_per_s']:>11,} "
                      f"{row['cores_used']:>10.2f} {row['peak_rss_mib']:>13.1f} {row['ru_maxrss_self_mib']:>14.1f}"
                      f"  dead groups {dead[0]:.3f}->{dead[1]:.3f}, ordering violations {bad[0]:.3f}->{bad[1]:.3f}")
            db.unlink()
            for extra in ("-wal", "-shm"):
                Path(str(db) + extra).unlink(missing_ok=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first = [r for r in results if r["rollouts"] == sizes[0]]
    by_workers = {r["workers"]: r for r in first}
    if 1 in by_workers and 2 in by_workers:
        print(f"speed-up 1 -> 2 workers at {sizes[0]:,}: "
              f"{by_workers[1]['wall_s'] / by_workers[2]['wall_s']:.2f}x (target >= 1.7x; "
              f"the machine offered {scaling:.2f}x to plain Python just before)")
    last = {r["rollouts"]: r for r in results if r["workers"] == results[-1]["workers"]}
    if len(last) > 1:
        print("peak RSS by store size at " + f"{results[-1]['workers']} workers: " +
              ", ".join(f"{n:,}: {r['peak_rss_mib']:.0f} MiB" for n, r in sorted(last.items())))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
