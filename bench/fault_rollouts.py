"""Make (or remake) a harness-fault case's rollouts: a real run of the embedded model under the
case's faulty harness, exported round by round into <case>/rollouts/round-<k>.jsonl.gz.

    python bench/fault_rollouts.py math-length-pays [more cases] [--cases-dir faults] [--threads 1]

The run is `evotrainer train` with the config and overrides in the case's `generate:` block
(default: configs/<domain>.yaml, 1 round of 6 steps of 4 prompts, a held-out split of 8 for speed), the
case's harness as `harness=`, and the run's own seed. The files are gzip with no timestamp, so
the same run gives the same bytes. Rollouts are exported as `rollouts export` writes them.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer.faultbench.case import load_case
from evotrainer.paths import FAULT_CASES_DIR
from evotrainer.store import Store
from evotrainer.store.jsonl import dumps


def generate(case_dir: Path, threads: int) -> None:
    case = load_case(case_dir, rollouts=False)
    config, overrides = case.run_config()
    with tempfile.TemporaryDirectory(prefix=f"fault-rollouts-{case_dir.name}-") as tmp:
        harness = Path(tmp) / "harness"
        harness.mkdir()
        for name, text in case.harness.items():
            (harness / name).write_text(text, encoding="utf-8")
        work = Path(tmp) / "work"
        cmd = [sys.executable, "-m", "evotrainer", "train", "-c", config, "--workdir", str(work),
               f"harness={harness}", *overrides]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        out = case_dir / "rollouts"
        out.mkdir(exist_ok=True)
        for old in out.glob("round-*.jsonl*"):
            old.unlink()
        with Store.open(work) as store:
            run_id = store.run_id(_run_name(config, overrides))
            for rnd in store.rounds(run_id):
                lines = [dumps(sr) + "\n" for sr in store.iter_rollouts(run_id=run_id, round_index=rnd["index"])]
                with open(out / f"round-{rnd['index']}.jsonl.gz", "wb") as raw, \
                        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
                    fh.write("".join(lines).encode())
                print(f"{case_dir.name}: round {rnd['index']}: {len(lines)} rollouts")
        print(f"{case_dir.name}: {time.perf_counter() - start:.0f} s")


def _run_name(config: str, overrides: list[str]) -> str:
    from evotrainer.config import load_config

    return load_config(Path(config), overrides).run_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--cases-dir", type=Path, default=FAULT_CASES_DIR)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP_NUM_THREADS)")
    args = ap.parse_args()
    for name in args.cases:
        generate(args.cases_dir / name, args.threads)


if __name__ == "__main__":
    main()
