"""The central claim, measured: does co-evolving the harness beat a static one?

For each starting harness and training seed, trains twice with the same model, seed, tasks and
training compute (rounds x steps x batch): once with the harness held fixed (`evotrainer
train`), once with `evotrainer coevolve` (rules agent). The starting harness is the domain's seed
(`--domain`), or a shipped fault case's faulty harness (`--case`, faults/<case>), where the
outer loop has something known to fix. Prints held-out verified success after the last round
for both arms, per case and seed, with the mean and the spread across seeds, whichever way it
comes out, and writes results.json (and `--markdown` a table) to `--out`.

Equal compute: coevolve runs with `coevolve.verify_against=previous`, so it trains no control
arm; both arms train exactly rounds x steps. Each run is pinned to one core (`--jobs` runs side
by side) with one torch thread.

    python bench/coevolve_vs_static.py --case math-length-pays --case math-format-outweighs \\
        --seeds 0,1,2 --rounds 2 --steps 10 --jobs 2 --out runs/cvs
    python bench/coevolve_vs_static.py --domain math --seeds 0,1 --rounds 3 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from evotrainer.faultbench.case import load_case
from evotrainer.paths import CONFIGS_DIR, FAULT_CASES_DIR
from evotrainer.store import Store

RUN = "bench"


@dataclass(frozen=True)
class Start:
    """Where both arms start: a domain's seed harness, or a fault case's faulty harness."""

    label: str
    domain: str
    harness: Path | None = None  # None: the domain's seed harness
    overrides: tuple[str, ...] = ()
    fault_metric: str | None = None  # the case's first repair metric, read off the live rollouts


@dataclass
class Arm:
    start: Start
    seed: int
    kind: str  # static | coevolve
    workdir: Path
    seconds: float = 0.0
    heldout: float | None = None
    base: float | None = None
    by_round: list[float] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)
    fault_value: float | None = None  # the fault's metric on the last round's rollouts
    error: str = ""


def case_start(name: str, scratch: Path) -> Start:
    case = load_case(FAULT_CASES_DIR / name, rollouts=False)
    folder = scratch / f"harness-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    for file, text in case.harness.items():
        (folder / file).write_text(text, encoding="utf-8")
    # The case's generate overrides that pick tasks (levels), not its rollout-making sizes.
    picked = tuple(o for o in case.spec.generate.get("overrides", []) if o.startswith("domain.levels="))
    return Start(name, case.spec.domain, folder, picked, case.spec.repair[0].metric)


def heldout_by_round(workdir: Path) -> tuple[float | None, list[float]]:
    with Store.open(workdir) as store:
        run_id = store.run_id(RUN)
        evals = [e for e in store.evals(run_id) if e["split"] == "heldout"]
    base = [e["success_rate"] for e in evals if e["round_index"] is None and e["adapter"] is None]
    rounds = sorted({e["round_index"] for e in evals if e["round_index"] is not None})
    by_round = [statistics.fmean(e["success_rate"] for e in evals if e["round_index"] == r) for r in rounds]
    return (statistics.fmean(base) if base else None), by_round


def live_fault_value(arm: Arm) -> float | None:
    """The case's repair metric on the arm's last training round, under the harness that round ran
    (so a fixed fault shows as a fixed number in the live rollouts, not only in a backtest)."""
    if arm.start.fault_metric is None:
        return None
    from evotrainer.backtest import Selector, backtest
    from evotrainer.harness.loader import harness_version
    from evotrainer.harness.repo import HarnessRepo
    from evotrainer.workspace import Workspace

    with Store.open(arm.workdir) as store:
        rounds = store.rounds(store.run_id(RUN))
    last = max(rounds, key=lambda r: r["index"])
    repo = HarnessRepo(Workspace(arm.workdir).harnesses)
    # A round records the commit it trained under (a harness loaded from the repo is versioned by
    # its sha); a content hash (harness_version) where the harness came from a folder.
    version = last["harness_version"]
    shas = [c.sha for c in repo.log(first_parent=False)]
    sha = next((s for s in shas if s == version), None) or next(
        (s for s in shas if harness_version(repo.sources(s)) == version), None)
    if sha is None:
        raise RuntimeError(f"no commit of {repo.path} holds round {last['index']}'s harness {version[:12]}")
    report = backtest(arm.workdir, sha, base=sha, selector=Selector(run=RUN, round=last["index"]), workers=1,
                      record=False)
    return ((report.get("metrics") or {}).get("base") or {}).get(arm.start.fault_metric)


def run_arm(arm: Arm, args: argparse.Namespace, core: int | None) -> Arm:
    exe = [sys.executable, "-m", "evotrainer"]
    if core is not None and hasattr(os, "sched_setaffinity"):
        exe = ["taskset", "-c", str(core), *exe]
    common = ["-c", str(CONFIGS_DIR / f"{arm.start.domain}.yaml"), "--rounds", str(args.rounds),
              "--workdir", str(arm.workdir), f"train.seed={arm.seed}", f"train.steps_per_round={args.steps}",
              f"run_name={RUN}", *arm.start.overrides, *args.override]
    if arm.start.harness is not None:
        common.append(f"harness={arm.start.harness}")
    cmd = exe + (["train", *common] if arm.kind == "static"
                 else ["coevolve", *common, "coevolve.verify_against=previous"])
    log = arm.workdir.with_suffix(".log")
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    arm.seconds = time.perf_counter() - start
    if proc.returncode != 0:
        arm.error = f"exit {proc.returncode}, see {log}"
        return arm
    arm.base, arm.by_round = heldout_by_round(arm.workdir)
    arm.heldout = arm.by_round[-1] if arm.by_round else None
    if arm.kind == "coevolve":
        state = json.loads((arm.workdir / "coevolve.json").read_text())
        arm.promoted = [h["promoted"] for h in state["history"] if h.get("promoted")]
    try:
        arm.fault_value = live_fault_value(arm)
    except Exception as exc:  # the comparison stands without it; say why it is missing
        arm.error = f"fault metric: {exc}"
    print(f"{arm.start.label} seed {arm.seed} {arm.kind}: held-out {arm.by_round} "
          f"({arm.seconds:.0f} s; promoted {arm.promoted or '-'})", flush=True)
    return arm


def _stat(vals: list[float]) -> str:
    if not vals:
        return "n/a"
    spread = statistics.pstdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.3f} ± {spread:.3f}"


def summarize(arms: list[Arm], starts: list[Start]) -> tuple[list[dict], str]:
    rows, lines = [], ["| start | seeds | base | static | co-evolved | co-evolved - static | fault metric static / co-evolved | promoted |",
                       "|---|---|---|---|---|---|---|---|"]
    for s in starts:
        mine = [a for a in arms if a.start == s]
        seeds = sorted({a.seed for a in mine})
        pair = {(a.seed, a.kind): a for a in mine}
        ok = [k for k in seeds if pair[(k, "static")].heldout is not None and pair[(k, "coevolve")].heldout is not None]
        static = [pair[(k, "static")].heldout for k in ok]
        coevo = [pair[(k, "coevolve")].heldout for k in ok]
        diff = [c - t for c, t in zip(coevo, static)]
        base = [pair[(k, "static")].base for k in ok if pair[(k, "static")].base is not None]
        spread = max(statistics.pstdev(static) if len(static) > 1 else 0.0,
                     statistics.pstdev(coevo) if len(coevo) > 1 else 0.0)
        fs = [pair[(k, "static")].fault_value for k in ok if pair[(k, "static")].fault_value is not None]
        fc = [pair[(k, "coevolve")].fault_value for k in ok if pair[(k, "coevolve")].fault_value is not None]
        promoted = sorted({p for k in ok for p in pair[(k, "coevolve")].promoted})
        beats = bool(diff) and statistics.fmean(diff) > spread
        rows.append({"start": s.label, "domain": s.domain, "seeds": ok, "static": static, "coevolve": coevo,
                     "diff": diff, "spread": spread, "beats_by_more_than_spread": beats, "base": base,
                     "fault_metric": s.fault_metric, "fault_static": fs, "fault_coevolve": fc,
                     "promoted": promoted, "failed": [f"{a.seed} {a.kind}: {a.error}" for a in mine if a.error]})
        fault = f"{s.fault_metric}: {_stat(fs)} / {_stat(fc)}" if s.fault_metric else "-"
        lines.append(f"| {s.label} | {len(ok)} | {_stat(base)} | {_stat(static)} | {_stat(coevo)} | "
                     f"{statistics.fmean(diff) if diff else float('nan'):+.3f}{' (beats spread)' if beats else ''} | "
                     f"{fault} | {', '.join(promoted) or '-'} |")
    return rows, "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", default=[], help="a fault case under faults/ (repeatable)")
    ap.add_argument("--domain", default=None, help="start from this domain's seed harness (default math, "
                    "when no --case is given)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps per round")
    ap.add_argument("--jobs", type=int, default=1, help="runs side by side, each pinned to its own core")
    ap.add_argument("--override", action="append", default=[], help="a config override for every run")
    ap.add_argument("--out", type=Path, default=None, help="keep the workspaces and logs here")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: a promotion in round k trains from round k+1")
    out = args.out or Path(tempfile.mkdtemp(prefix="evotrainer-cvs-"))
    out.mkdir(parents=True, exist_ok=True)
    starts = [case_start(c, out) for c in args.case]
    if args.domain or not starts:
        starts.append(Start(f"{args.domain or 'math'} seed harness", args.domain or "math"))
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [Arm(s, seed, kind, out / f"{s.label.replace(' ', '-')}-{seed}-{kind}")
            for s in starts for seed in seeds for kind in ("static", "coevolve")]
    for a in arms:
        if a.workdir.exists():
            ap.error(f"{a.workdir} exists: give a fresh --out")
    free: queue.Queue = queue.Queue()
    for core in (sorted(os.sched_getaffinity(0))[: args.jobs] if args.jobs > 1 else [None]):
        free.put(core)

    def on_a_free_core(arm: Arm) -> Arm:
        core = free.get()
        try:
            return run_arm(arm, args, core)
        finally:
            free.put(core)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = list(pool.map(on_a_free_core, arms))
    rows, table = summarize(done, starts)
    print(table)
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "results.md").write_text(table)
    print(f"workspaces and logs: {out}")
    return 0 if all(not a.error for a in done) else 1


if __name__ == "__main__":
    sys.exit(main())
