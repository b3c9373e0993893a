"""Harness sandbox workers: pool start time and per-message latency, three pools in turn per size.

    PYTHONPATH=. python bench/sandbox_workers.py                                   # the OS sandbox
    EVOTRAINER_HARNESS_ISOLATION=none PYTHONPATH=. python bench/sandbox_workers.py  # forkserver, guards only
"""

import time

from evotrainer.api import Outcome, Rollout, rollout_to_dict
from evotrainer.harness.loader import read_sources
from evotrainer.harness.sandbox import SandboxPool
from evotrainer.paths import HARNESSES_DIR
from evotrainer.report.distributions import RewardJob


def main() -> None:
    src = dict(read_sources(HARNESSES_DIR / "math"))
    r = Rollout(id="a", task_id="t", group_id="g", domain="math", prompt="p", completion="Answer: 4", turns=(),
                outcome=Outcome(True, 1.0, "ok", ()), num_tokens=3, truncated=False, meta={})
    one = ([0], [rollout_to_dict(r)])
    for workers in (1, 2):
        starts, calls = [], []
        for _ in range(3):
            t = time.perf_counter()
            with SandboxPool([("candidate", src)], RewardJob(), workers) as pool:
                starts.append(time.perf_counter() - t)
                t = time.perf_counter()
                for _ in pool.imap([one] * 300):
                    pass
                calls.append((time.perf_counter() - t) / 300 * 1000)
        print(f"workers={workers} start_s={[round(s, 2) for s in starts]} "
              f"per_message_ms={[round(c, 3) for c in calls]}")


if __name__ == "__main__":
    main()
