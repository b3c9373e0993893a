"""The harness-fault benchmark: does the outer loop find a documented harness fault in real
rollouts, repair it (judged on a held-out slice), and refuse the tempting wrong fixes?

    results = run_cases(load_cases(FAULT_CASES_DIR), get_agent("rules"))
    print(summary.to_json(results, "rules"))

`evotrainer bench harness` is the command; docs/faultbench.md documents the case format.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.config import GateConfig
from evotrainer.faultbench.case import CaseError, FaultCase, load_case, load_cases
from evotrainer.faultbench.run import CaseResult, CaseRun, Say


def run_cases(cases: Sequence[FaultCase], agent: Any, *, workdir: Path | None = None, live: bool = False,
              gate: GateConfig | None = None, max_proposals: int = 8, workers: int | None = None,
              say: Say | None = None, pilot_steps: int = 4) -> list[CaseResult]:
    """Each case in a workspace of its own: under `workdir/<case>` (kept, for `evotrainer harness
    log` and `backtests replay`), else in a temporary folder removed afterwards."""
    results = []
    for case in cases:
        keep = workdir is not None
        root = (workdir / case.name) if keep else Path(tempfile.mkdtemp(prefix=f"faultbench-{case.name}-"))
        if keep and root.exists():
            raise CaseError(f"{root}: exists; pick another --workdir or remove it")
        try:
            results.append(CaseRun(case, agent, root, gate=gate, max_proposals=max_proposals,
                                   workers=workers, say=say, pilot_steps=pilot_steps).run(live=live))
        finally:
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
    return results


__all__ = ["CaseError", "CaseResult", "FaultCase", "load_case", "load_cases", "run_cases"]
