"""Grader throughput: tasks graded per second with 1 and 2 workers, on the cold path (a fresh
sandboxed interpreter per grade) and the warm one (a fork of a warm pytest worker per grade,
evotrainer/sandbox/warm.py), side by side in one run with their ratio; and a cache hit against
a fresh grade.

    python bench/grader_throughput.py                         # 8 synthetic tasks x (gold, wrong) patches
    python bench/grader_throughput.py --tasks-file evotrainer/tasks/packs/*.jsonl  # the bundled pack, gold
                                                              # (after `evotrainer tasks fetch`)
    python bench/grader_throughput.py --pack-line             # the pack's line-scaffold answers: gold
                                                              # and bug line per task, as the SWE domain grades
    python bench/grader_throughput.py --pack-line --group 8 --limit 4   # 8 answers per task (a GRPO group)
    python bench/grader_throughput.py --executor ray          # the same grades as Ray tasks

The two paths alternate (cold 1, warm 1, cold 2, warm 2 workers, `--rounds` times) so that other
load on a shared machine falls on both; each row is the median round. A task's grades go to one
worker together, as a GRPO group's completions do (the warm path compiles a task's files once per
worker and task). The verdicts of the two
paths must agree grade by grade (checked). Warm workers start outside the timing, as a
long-lived grading process holds them (`--warm-start` reports what the first start costs).

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
from evotrainer.sandbox.warm import warm_available

MODULE = '''def window_sums(nums, k):
    """Sums of every window of k consecutive numbers."""
    return [sum(nums[i:i + k]) for i in range(len(nums) - k)]


def scale(nums, factor):
    return [x * factor for x in nums]
'''
FIXED = MODULE.replace("range(len(nums) - k)", "range(len(nums) - k + 1)")
WRONG = MODULE.replace("range(len(nums) - k)", "range(len(nums) - k - 1)")


def line_pairs(limit: int = 0, group: int = 2):
    """The bundled pack's tasks, each graded with `group` line-scaffold answers as the SWE domain
    makes them (the named line replaced): the gold line, and the buggy line left as it was with
    a comment, a different one per answer (wrong)."""
    from evotrainer.domains.swe import SweDomain, focus
    from evotrainer.scaffold.line import replace_line
    from evotrainer.tasks import repos

    domain = SweDomain(scaffold="line")
    tasks = sorted((domain.swe_task(t) for split in ("train", "heldout") for t in domain.tasks(split, 10**6, 0)),
                   key=lambda t: t.instance_id)
    if limit:
        tasks = tasks[:: max(1, len(tasks) // limit)][:limit]
    pairs = []
    for task in tasks:
        path, line = focus(task)
        buggy = repos.read_buggy(task, path)
        lines = buggy.splitlines()
        pairs.append((task, task.patch))
        for i in range(1, group):
            wrong = replace_line(buggy, line, [lines[line - 1].strip() + f"  # fixed {i}"])
            pairs.append((task, make_patch({path: (buggy, wrong)})))
    return tasks, pairs


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


_GRADERS: dict[bool, Grader] = {}


def _job(item):
    """One task's grades (as a GRPO group's completions reach one worker), in one worker."""
    warm, group = item
    if warm not in _GRADERS:
        _GRADERS[warm] = Grader(cache=None, warm=warm)
    out = []
    for task, patch in group:
        result = _GRADERS[warm].grade(task, patch)
        out.append((result.outcome.kind, result.outcome.success, result.outcome.score))
    return out


def _start(item):
    """Import the grader in a worker; on the warm path also start its warm worker."""
    warm, pairs = item
    if warm:
        from evotrainer.grade.grader import stdlib_imports
        from evotrainer.sandbox import warm as warm_pool

        python = Grader(cache=None).python
        warm_pool.release(warm_pool.acquire(python, sorted({m for t, _ in pairs for m in stdlib_imports(t.root)})))
    return os.getpid()


def throughput(pairs, workers: int, kind: str = "local", warm: bool = False) -> tuple[float, list]:
    executor = get_executor(kind, workers=workers)
    try:
        if kind == "ray" or warm:  # long-lived workers: started (and warm pools filled) outside the timing
            list(executor.map(_start, [(warm, pairs)] * (4 * workers if kind == "ray" else workers)))
        start = time.perf_counter()
        groups: dict[str, list] = {}
        for task, patch in pairs:
            groups.setdefault(task.instance_id, []).append((task, patch))
        results = [r for rs in executor.map(_job, [(warm, g) for g in groups.values()]) for r in rs]
        return time.perf_counter() - start, results
    finally:
        executor.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="synthetic tasks (each graded with gold and wrong)")
    parser.add_argument("--tasks-file", type=Path, nargs="+", help="grade these SWE-bench JSONL files' gold patches instead")
    parser.add_argument("--cache-reps", type=int, default=200)
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: a process pool; ray: Ray tasks on a private instance")
    parser.add_argument("--pack-line", action="store_true",
                        help="the bundled pack's tasks, each with its gold line and a wrong line (line scaffold)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating cold/warm rounds; rows are medians")
    parser.add_argument("--limit", type=int, default=0, help="with --pack-line: this many tasks, spread over the pack")
    parser.add_argument("--group", type=int, default=2,
                        help="with --pack-line: answers per task (gold and group-1 distinct wrong lines), as a GRPO group")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="grader-bench-") as tmp:
        if args.pack_line:
            tasks, pairs = line_pairs(args.limit, args.group)
        elif args.tasks_file:
            tasks = [t for f in args.tasks_file for t in load_tasks(f)]  # the grader applies any bug_patch
            pairs = [(t, t.patch) for t in tasks]
        else:
            tasks = load_tasks(synthetic_tasks(Path(tmp), args.tasks))
            wrong = make_patch({"windows.py": (MODULE, WRONG)})
            pairs = [(t, p) for t in tasks for p in (t.patch, wrong)]
        print(f"isolation: {isolation_support()}; warm path available: {warm_available()}")
        print(f"executor: {args.executor}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
              f" on {len(os.sched_getaffinity(0))} cores")
        print(f"{len(pairs)} grades over {len(tasks)} task(s), {args.rounds} round(s)\n")
        walls: dict[tuple[bool, int], list[float]] = {}
        verdicts: dict[bool, list] = {}
        for _ in range(args.rounds):
            for workers in (1, 2):
                for warm in (False, True):
                    wall, results = throughput(pairs, workers, args.executor, warm)
                    walls.setdefault((warm, workers), []).append(wall)
                    assert verdicts.setdefault(warm, results) == results, "two runs of one path disagree"
        print(f"{'path':>5} {'workers':>8} {'wall s':>8} {'grades/s':>9} {'vs cold':>8}   outcome kinds")
        for workers in (1, 2):
            for warm in (False, True):
                wall = statistics.median(walls[(warm, workers)])
                cold = statistics.median(walls[(False, workers)])
                kinds: dict[str, int] = {}
                for kind, _, _ in verdicts[warm]:
                    kinds[kind] = kinds.get(kind, 0) + 1
                print(f"{'warm' if warm else 'cold':>5} {workers:>8} {wall:>8.2f} {len(pairs) / wall:>9.2f} "
                      f"{cold / wall:>7.2f}x   " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
        same = sum(a == b for a, b in zip(verdicts[False], verdicts[True]))
        print(f"verdicts (kind, resolved, score) identical on both paths: {same}/{len(pairs)}")
        assert same == len(pairs), "the warm path's verdicts differ from the cold path's"
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
