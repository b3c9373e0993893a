"""The central claim, measured: does co-evolving the harness beat the static seed harness?

For each seed, trains twice with the same model, compute budget (rounds x steps x batch), seed
and held-out split: once with the seed harness held fixed (`evotrainer train`), once with
`evotrainer coevolve` (rules agent). Prints held-out verified success after the last round for
both, per seed, with the mean and the spread across seeds. Whichever way it comes out.

    python bench/coevolve_vs_static.py [--seeds 0,1] [--rounds 3] [--steps 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer.store import Store


def final_heldout(workdir: Path, run: str) -> tuple[float, list[float]]:
    with Store.open(workdir) as store:
        run_id = store.run_id(run)
        evals = [e for e in store.evals(run_id) if e["split"] == "heldout"]
    base = [e["success_rate"] for e in evals if e["round_index"] is None and e["adapter"] is None]
    last = max(e["round_index"] for e in evals if e["round_index"] is not None)
    final = [e["success_rate"] for e in evals if e["round_index"] == last]
    return statistics.fmean(final), base


def run(cmd: list[str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("w") as fh:
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps per round")
    ap.add_argument("--out", type=Path, default=None, help="keep the workspaces here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="evotrainer-cvs-"))
    out.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "evotrainer"]
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        common = [f"train.seed={seed}", f"train.steps_per_round={args.steps}", "run_name=bench"]
        static_wd, coevo_wd = out / f"static-{seed}", out / f"coevolve-{seed}"
        t_static = run(exe + ["train", "--domain", "math", "--rounds", str(args.rounds), "--workdir",
                              str(static_wd)] + common, out / f"static-{seed}.log")
        t_coevo = run(exe + ["coevolve", "--domain", "math", "--rounds", str(args.rounds), "--workdir",
                             str(coevo_wd)] + common, out / f"coevolve-{seed}.log")
        s_static, base = final_heldout(static_wd, "bench")
        s_coevo, _ = final_heldout(coevo_wd, "bench")
        state = json.loads((coevo_wd / "coevolve.json").read_text())
        promoted = [h["promoted"] for h in state["history"] if h.get("promoted")]
        rows.append({"seed": seed, "base": statistics.fmean(base), "static": s_static, "coevolve": s_coevo,
                     "static_s": t_static, "coevolve_s": t_coevo, "promoted": promoted})
        print(f"seed {seed}: base {rows[-1]['base']:.3f}  static {s_static:.3f}  coevolve {s_coevo:.3f}  "
              f"(time {t_static:.0f}s vs {t_coevo:.0f}s; promoted {promoted or 'nothing'})", flush=True)
    for side in ("static", "coevolve"):
        vals = [r[side] for r in rows]
        spread = statistics.pstdev(vals) if len(vals) > 1 else 0.0
        print(f"{side:9s}: mean held-out success {statistics.fmean(vals):.3f} ± {spread:.3f} "
              f"over seeds {[r['seed'] for r in rows]}")
    diff = [r["coevolve"] - r["static"] for r in rows]
    print(f"coevolve - static: {statistics.fmean(diff):+.3f} (per seed {', '.join(f'{d:+.3f}' for d in diff)})")
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"workspaces and logs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
