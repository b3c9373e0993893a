"""Report build time: a 3-round math workspace, and the same workspace with 100k more rollouts.

    python bench/report_speed.py                      # builds a 3-round workspace (no training)
    python bench/report_speed.py --workdir WORK        # or times a real one (copied, never touched)
    python bench/report_speed.py --extra 100000

The small workspace is made by tests/report_workspace.py: the outer loop's own stages over real
stored rollouts (see there). The large case adds a round of synthetic math rollouts (groups of 8,
realistic outcome mix, from bench/backtest_throughput.py) by bulk insert, then builds again.
Targets (issue 6): < 10 s for the 3-round workspace; rollouts are paginated, so 100k stays fast.
The 'distributions' stage is near zero when the backtests stored their reward histograms; a
workspace whose backtests predate that (e.g. an old run) replays harnesses there instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]


def add_round(workdir: Path, n: int) -> None:
    """A finished round of n synthetic rollouts after the workspace's last round."""
    from backtest_throughput import synthetic_rows
    from sqlalchemy import func, select

    from evotrainer.store import Store
    from evotrainer.store.models import RolloutRow, Round, Run

    with Store.open(workdir) as store:
        with store.engine.connect() as conn:
            run_id = conn.scalar(select(func.min(Run.id)))
            last = conn.scalar(select(func.max(Round.index)).where(Round.run_id == run_id))
            seq0 = conn.scalar(select(func.max(RolloutRow.seq))) or 0
        if run_id is None:
            run_id = store.get_or_create_run("bench", "math", {})
        round_id = store.start_round(run_id, (last if last is not None else -1) + 1, "bench", "bench")
        with store.engine.begin() as conn:
            rows = synthetic_rows(n)
            while batch := list(islice(rows, 20_000)):
                for r in batch:
                    r.update(id=f"x{r['id']}", seq=seq0 + r["seq"], run_id=run_id, round_id=round_id,
                             reward=float(r["outcome_success"]), advantage=0.5 if r["outcome_success"] else -0.5)
                conn.execute(RolloutRow.__table__.insert(), batch)
        store.finish_round(round_id, {"heldout_success": 0.3, "train_reward": 0.3, "step_time": 1.0}, None)


def timed(workdir: Path, out: Path) -> tuple[float, float, object]:
    """Wall seconds, CPU seconds of this process plus its finished children (the sandbox
    worker that replays harnesses for the backtest charts), and the summary."""
    from evotrainer.report import build_report

    def cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    start, cpu0 = time.perf_counter(), cpu()
    summary = build_report(workdir, out)
    return time.perf_counter() - start, cpu() - cpu0, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, help="a real workspace to time (copied first)")
    ap.add_argument("--extra", type=int, default=100_000, help="rollouts to add for the large case")
    ap.add_argument("--keep", type=Path, help="keep the built sites here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="evotrainer-report-bench-"))
    os.environ.setdefault("EVOTRAINER_SWE_CACHE", str(tmp / "swe-cache"))
    try:
        if args.workdir:
            work = tmp / "work"
            shutil.copytree(args.workdir, work, ignore=shutil.ignore_patterns("adapters", "trainer", "report"))
            source = f"copy of {args.workdir}"
        else:
            from report_workspace import build_workspace

            t = time.perf_counter()
            work = build_workspace(tmp / "built")
            source = f"built by tests/report_workspace.py in {time.perf_counter() - t:.1f} s"
        sites = args.keep or tmp
        small, cpu1, s1 = timed(work, sites / "site-small")
        print(f"3-round workspace ({source}): {s1.rollouts} rollouts, {s1.pages} pages, "
              f"{small:.2f} s wall, {cpu1:.2f} s CPU  (stages, wall: {s1.timings})")
        t = time.perf_counter()
        add_round(work, args.extra)
        print(f"added {args.extra} rollouts in {time.perf_counter() - t:.1f} s")
        large, cpu2, s2 = timed(work, sites / "site-large")
        size = sum(f.stat().st_size for f in (sites / "site-large").rglob("*") if f.is_file())
        biggest = max(f.stat().st_size for f in (sites / "site-large").rglob("*.html"))
        print(f"with {s2.rollouts} rollouts: {s2.pages} pages, {large:.2f} s wall, {cpu2:.2f} s CPU "
              f"({s2.rollouts / max(1e-9, s2.timings.get('rollouts', large)):.0f} rollouts/s in the rollout pages), "
              f"{size / 2**20:.0f} MiB on disk, largest page {biggest / 2**10:.0f} KiB  (stages: {s2.timings})")
        print(f"target: 3-round < 10 s -> {'met' if small < 10 else 'MISSED'} on wall time; "
              f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall time grows with it)")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
