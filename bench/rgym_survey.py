"""Vet every reasoning-gym generator as the reasoning_gym domain would, and list the refused ones.

Each generator runs in its own process (a timeout per generator; some are slow or hang) under
PYTHONHASHSEED=1: evotrainer.domains.rgym.vet with its default config, plus a digest of the
vetted entries. A second pass under PYTHONHASHSEED=2 compares the digests: a generator whose
entries differ between processes is not seed-deterministic across runs (in-process vetting
cannot see that). Prints a markdown table (generator, verdict, why, noted leniencies, partial-credit probes, seconds)
and writes the rows as JSON.

    python bench/rgym_survey.py [--samples 8] [--timeout 90] [--workers 2] [--out /tmp/rgym_survey.json] [names...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "RGYM-SURVEY-ROW "


def one(name: str, samples: int) -> dict:
    """Run in the child: vet one generator and digest its entries."""
    from evotrainer.domains import rgym

    rgym.CROSS_PROCESS_UNSTABLE.clear()  # that list is this survey's output: measure afresh
    spec = rgym.GeneratorSpec(name)
    start = time.perf_counter()
    try:
        v = rgym.vet(spec, samples)
        problems, partial, notes = v.problems, v.partial_wrong, sorted(v.notes)
    except Exception as exc:
        problems, partial, notes = [f"{type(exc).__name__}: {str(exc)[:160]}"], 0, []
    seconds = time.perf_counter() - start
    try:
        ds = rgym.make_dataset(spec, 1234, samples)
        digest = rgym._digest("".join(rgym._entry_digest(ds[i]) for i in range(samples)))
    except Exception as exc:
        digest = f"error: {type(exc).__name__}"
    return {"name": name, "problems": problems, "notes": notes, "partial_wrong": partial,
            "seconds": round(seconds, 2), "digest": digest}


def child(name: str, samples: int, hashseed: int, timeout: float) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": str(hashseed), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--child", name, "--samples", str(samples)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "problems": [f"timed out after {timeout:.0f} s"], "notes": [], "partial_wrong": 0,
                "seconds": timeout, "digest": "timeout"}
    at = done.stdout.rfind(MARK)
    if done.returncode != 0 or at < 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {"name": name, "problems": [f"crashed: {tail}"], "notes": [], "partial_wrong": 0, "seconds": 0.0,
                "digest": "crash"}
    return json.loads(done.stdout[at + len(MARK):].splitlines()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="/tmp/rgym_survey.json")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(MARK + json.dumps(one(args.child, args.samples)))  # bf's generator prints to stdout too
        return
    from reasoning_gym.factory import DATASETS

    names = args.names or sorted(n for n in DATASETS if n != "composite")  # composite mixes the others
    with ThreadPoolExecutor(args.workers) as pool:
        first = list(pool.map(lambda n: child(n, args.samples, 1, args.timeout), names))
        second = list(pool.map(lambda n: child(n, args.samples, 2, args.timeout), names))
    rows = []
    for a, b in zip(first, second):
        problems = list(a["problems"])
        if a["digest"] != b["digest"] and not a["digest"].startswith(("error", "timeout", "crash")):
            problems.append("entries differ between processes (PYTHONHASHSEED 1 vs 2)")
        rows.append({**a, "problems": problems})
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print("| generator | verdict | why (measured) | noted | partial-credit wrong probes | s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        verdict = "refused" if r["problems"] else "ok"
        print(f"| {r['name']} | {verdict} | {'; '.join(r['problems'])} | {'; '.join(r['notes'])} "
              f"| {r['partial_wrong']} | {r['seconds']} |")
    refused = sum(1 for r in rows if r["problems"])
    print(f"\n{len(rows)} generators, {len(rows) - refused} ok, {refused} refused; rows in {args.out}")


if __name__ == "__main__":
    main()
