"""Two training arms one after the other against the same two side by side (coevolve.parallel_arms).

A verifying round trains twice (the main round and its control arm) and a live pilot trains two
arms; coevolve/beside.py trains the second arm in a spawned process while this one trains the
first, each with half the cores. This bench trains the same pair of arms (the default math
config unless `--config`, `--steps` steps each from the base model, validation evaluated, as a
pilot's arms are) both ways in one run, alternating the order over `--repeats`, and prints the
wall times and the ratio sequential/parallel, with the arms' validation success so a reader can
see that both ways trained the same thing.

    python bench/parallel_arms.py [--steps 3] [--repeats 1] [--config configs/math.yaml] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from evotrainer.cli.main import quiet_libraries
from evotrainer.coevolve.beside import SideArm, beside
from evotrainer.coevolve.control import train_arm
from evotrainer.config import Config, load_config
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import CONFIGS_DIR
from evotrainer.store import Store
from evotrainer.workspace import ensure_workspace


def run_pair(config: Config, root: Path, tag: str, steps: int, console: Console) -> tuple[float, dict[str, float]]:
    """Train arms `<tag>-a` (beside) and `<tag>-b` (here); the wall seconds and each arm's
    validation success."""
    repo = HarnessRepo(root / "harnesses")
    side = SideArm(f"{tag}-a", "main", None, 0, f"{tag} arm a", steps, heldout=False)
    started = time.perf_counter()
    with beside(config, root, repo, side, console), repo.load("main") as harness:
        train_arm(config, root, f"{tag}-b", harness, None, 0, console, what=f"{tag} arm b", steps=steps,
                  heldout=False)
    seconds = time.perf_counter() - started
    with Store.open(root, config.store.url) as store:
        success = {}
        for run in (side.run_name, f"{tag}-b"):
            evals = [e for e in store.evals(store.run_id(run)) if e["split"] == "validation" and e["adapter"]]
            success[run] = sum(e["successes"] for e in evals) / max(1, sum(e["n"] for e in evals))
    return seconds, success


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="training steps per arm")
    ap.add_argument("--repeats", type=int, default=1, help="pairs trained each way (orders alternate)")
    ap.add_argument("--config", type=Path, default=CONFIGS_DIR / "math.yaml")
    ap.add_argument("--set", action="append", default=[], help="a config override (key=value)")
    args = ap.parse_args()
    quiet_libraries()
    console = Console(stderr=True)
    times: dict[str, list[float]] = {"sequential": [], "parallel": []}
    with tempfile.TemporaryDirectory(prefix="evotrainer-arms-") as tmp:
        root = ensure_workspace(Path(tmp) / "work", load_config(args.config, args.set).domain.name).root
        order = ["sequential", "parallel"]
        for i in range(args.repeats):
            for way in order if i % 2 == 0 else order[::-1]:
                config = load_config(args.config, [*args.set, f"coevolve.parallel_arms={way == 'parallel'}"])
                seconds, success = run_pair(config, root, f"{way}{i}", args.steps, console)
                times[way].append(seconds)
                scores = ", ".join(f"{run} {s:.3f}" for run, s in success.items())
                print(f"{way:>10}: {seconds:6.1f} s for two arms of {args.steps} steps (validation success: {scores})",
                      flush=True)
    seq, par = statistics.median(times["sequential"]), statistics.median(times["parallel"])
    print(f"sequential/parallel: {seq / par:.2f}x ({seq:.1f} s vs {par:.1f} s, median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
