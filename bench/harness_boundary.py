"""The sandbox boundary's cost per GRPO step: the math seed's rewards and filters for one step's
rollouts (2 prompts x 8 completions, as configs/math.yaml trains), called in process and through
an IsolatedHarness (one request for the rewards, one for the filters). Compare with a step's
time (bench/inner_overhead.py: seconds).

    python bench/harness_boundary.py [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from evotrainer.api import Outcome, Rollout
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import Harness, read_sources
from evotrainer.paths import HARNESSES_DIR

PROMPTS, GENERATIONS = 2, 8


def step_rollouts() -> list[Rollout]:
    out = []
    for g in range(PROMPTS):
        for j in range(GENERATIONS):
            ok = j == 0
            out.append(Rollout(f"r{g}-{j}", f"t{g}", f"g{g}", "math", "What is 2 + 2?",
                               "Answer: 4" if ok else "Answer: 5", (), Outcome(ok, float(ok), "ok" if ok else "wrong", ()),
                               12, False, {"level": 0}))
    return out


def one_step(harness, rollouts: list[Rollout]) -> None:
    rewards = [harness.training_reward(c) for c in harness.rewards(rollouts)]
    harness.filters([(rollouts[i:i + GENERATIONS], rewards[i:i + GENERATIONS])
                     for i in range(0, len(rollouts), GENERATIONS)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    seed = HARNESSES_DIR / "math"
    sources, rollouts = read_sources(seed), step_rollouts()
    for name, harness in (("in process", Harness(sources, seed)), ("sandbox worker", IsolatedHarness(sources, seed))):
        one_step(harness, rollouts)  # the worker starts here
        times = []
        for _ in range(args.steps):
            started = time.perf_counter()
            one_step(harness, rollouts)
            times.append(time.perf_counter() - started)
        times.sort()
        print(f"{name:15s} median {statistics.median(times) * 1e3:.2f} ms/step, "
              f"p90 {times[int(0.9 * len(times))] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
