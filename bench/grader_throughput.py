"""Grader throughput: tasks graded per second with 1 and 2 workers, and a cache hit against a fresh grade.

    python bench/grader_throughput.py                         # 8 synthetic tasks x (gold, wrong) patches
    python bench/grader_throughput.py --tasks-file evotrainer/tasks/packs/*.jsonl  # the bundled pack, gold
                                                              # (after `evotrainer tasks fetch`)
    python bench/grader_throughput.py --executor ray          # the same grades as Ray tasks

Synthetic tasks are small real repos (a module with an off-by-one and a 12-test suite) made in a
temp folder. Every grade is real: patch applied, tests restored, sandboxed pytest, junit read.
The same predictions are graded with 1 worker and then 2 (fresh caches, so nothing is reused);
wall time includes starting the worker processes. With `--executor ray` a private Ray instance
(every core) starts first and its workers are warmed up outside the timing, since a Ray cluster
is long-lived; `workers` then caps the tasks running at once. Then one pair is graded fresh, again from the
in-memory cache, and again from the SQLite cache by a new grader (another process's view).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from evotrainer.grade import GradeCache, Grader, load_tasks, make_patch
from evotrainer.sandbox import get_executor, isolation_support

MODULE = '''def window_sums(nums, k):
    """Sums of every window of k consecutive numbers."""
    return [sum(nums[i:i + k]) for i in range(len(nums) - k)]


def scale(nums, factor):
    return [x * factor for x in nums]
'''
FIXED = MODULE.replace("range(len(nums) - k)", "range(len(nums) - k + 1)")
WRONG = MODULE.replace("range(len(nums) - k)", "range(len(nums) - k - 1)")


def _tests(n: int) -> str:
    lines = ["from windows import scale, window_sums\n"]
    for i in range(6):
        nums = list(range(i, i + 5 + n % 3))
        lines.append(f"\ndef test_window_{i}():\n    assert window_sums({nums}, 2) == "
                     f"{[sum(nums[j:j + 2]) for j in range(len(nums) - 1)]}\n")
    for i in range(6):
        lines.append(f"\ndef test_scale_{i}():\n    assert scale([1, 2, {i}], {i + 2}) == {[x * (i + 2) for x in (1, 2, i)]}\n")
    return "".join(lines)


def synthetic_tasks(root: Path, n: int) -> Path:
    rows = []
    for t in range(n):
        repo = root / f"repo{t}"
        (repo / "tests").mkdir(parents=True)
        (repo / "windows.py").write_text(MODULE)
        (repo / "tests" / "test_windows.py").write_text(_tests(t))
        rows.append({"instance_id": f"windows-{t}", "repo": repo.name, "base_commit": "",
                     "patch": make_patch({"windows.py": (MODULE, FIXED)}), "test_patch": "",
                     "FAIL_TO_PASS": [f"tests/test_windows.py::test_window_{i}" for i in range(6)],
                     "PASS_TO_PASS": [f"tests/test_windows.py::test_scale_{i}" for i in range(6)],
                     "problem_statement": "window_sums drops the last window", "level": 0})
    path = root / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


_GRADER: Grader | None = None


def _job(pair):
    global _GRADER
    if _GRADER is None:
        _GRADER = Grader(cache=None)
    task, patch = pair
    result = _GRADER.grade(task, patch)
    return result.outcome.kind, result.outcome.success


def _warm(_):
    import evotrainer.grade  # noqa: F401

    return os.getpid()


def throughput(pairs, workers: int, kind: str = "local") -> tuple[float, list]:
    executor = get_executor(kind, workers=workers)
    if kind == "ray":  # start and import in every Ray worker first: the cluster outlives a grading run
        list(executor.map(_warm, range(4 * workers)))
    start = time.perf_counter()
    try:
        results = list(executor.map(_job, pairs))
    finally:
        executor.close()
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="synthetic tasks (each graded with gold and wrong)")
    parser.add_argument("--tasks-file", type=Path, nargs="+", help="grade these SWE-bench JSONL files' gold patches instead")
    parser.add_argument("--cache-reps", type=int, default=200)
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: a process pool; ray: Ray tasks on a private instance")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="grader-bench-") as tmp:
        if args.tasks_file:
            tasks = [t for f in args.tasks_file for t in load_tasks(f)]  # the grader applies any bug_patch
            pairs = [(t, t.patch) for t in tasks]
        else:
            tasks = load_tasks(synthetic_tasks(Path(tmp), args.tasks))
            wrong = make_patch({"windows.py": (MODULE, WRONG)})
            pairs = [(t, p) for t in tasks for p in (t.patch, wrong)]
        print(f"isolation: {isolation_support()}")
        print(f"executor: {args.executor}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
              f" on {len(os.sched_getaffinity(0))} cores")
        print(f"{len(pairs)} grades over {len(tasks)} task(s)\n")
        rows = []
        for workers in (1, 2):
            wall, results = throughput(pairs, workers, args.executor)
            rows.append((workers, wall, results))
        print(f"{'workers':>8} {'wall s':>8} {'grades/s':>9} {'speed-up':>9}   outcome kinds")
        for workers, wall, results in rows:
            kinds = {}
            for kind, _ in results:
                kinds[kind] = kinds.get(kind, 0) + 1
            print(f"{workers:>8} {wall:>8.2f} {len(pairs) / wall:>9.2f} {rows[0][1] / wall:>8.2f}x   "
                  + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
        assert rows[0][2] == rows[1][2], "1 and 2 workers disagree"
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        cache_dir = Path(tmp) / "cache"
        grader = Grader(cache=GradeCache(cache_dir))
        task, patch = pairs[0]
        start = time.perf_counter()
        fresh = grader.grade(task, patch)
        fresh_s = time.perf_counter() - start
        hits = []
        for _ in range(args.cache_reps):
            start = time.perf_counter()
            assert grader.grade(task, patch).cached
            hits.append(time.perf_counter() - start)
        disk = []
        for _ in range(20):
            other = Grader(cache=GradeCache(cache_dir))
            start = time.perf_counter()
            assert other.grade(task, patch).cached
            disk.append(time.perf_counter() - start)
            other.cache.close()
        mem_hit, disk_hit = statistics.median(hits), statistics.median(disk)
        print(f"\nfresh grade ({fresh.outcome.kind}): {fresh_s * 1000:9.1f} ms")
        print(f"cache hit, memory:     {mem_hit * 1000:9.3f} ms  ({fresh_s / mem_hit:,.0f}x cheaper)")
        print(f"cache hit, SQLite:     {disk_hit * 1000:9.3f} ms  ({fresh_s / disk_hit:,.0f}x cheaper; "
              "includes scanning the task repo for its fingerprint)")


if __name__ == "__main__":
    main()
