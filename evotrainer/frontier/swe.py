"""Self-questioning for SWE: new bug injections in the modules where the policy fails.

The modules are the files of the tasks whose pass rate is at or below the band's top (the
policy fails them at least some of the time). tasks.synth injects seeded bugs there only
(`include`), keeps those its tests catch, and verifies each with the real grader (gold patch
resolves, empty patch does not); a bug identical to a known task's is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.api import TaskStats
from evotrainer.grade import SweTask


def failing_modules(stats: Sequence[TaskStats], tasks: dict[str, SweTask], hi: float = 0.8,
                    min_attempts: int = 4) -> dict[Path, list[str]]:
    """{repo snapshot: [module paths]} of train tasks attempted enough whose pass rate is <= hi."""
    out: dict[Path, list[str]] = {}
    for s in stats:
        task = tasks.get(s.task_id)
        if task is None or s.meta.get("split") != "train" or s.attempts < min_attempts or s.pass_rate > hi:
            continue
        m = task.extra.get("mutation")
        if isinstance(m, dict) and isinstance(m.get("path"), str):
            paths = out.setdefault(task.root, [])
            if m["path"] not in paths:
                paths.append(m["path"])
    return out


def synthesize_swe_frontier(stats: Sequence[TaskStats], tasks: dict[str, SweTask], out_dir: Path | str, *,
                            hi: float = 0.8, n: int = 5, seed: int = 0, min_attempts: int = 4,
                            progress=None) -> tuple[list[dict[str, Any]], list[str]]:
    """(task records kept, reasons for dropped ones): synthesis per failing repo, verified."""
    from evotrainer.tasks.synth import SynthOptions, synthesize, write_jsonl

    known = {t.extra.get("bug_patch") for t in tasks.values() if t.extra.get("bug_patch")}
    kept: list[dict[str, Any]] = []
    dropped: list[str] = []
    out_dir = Path(out_dir)
    for root, paths in failing_modules(stats, tasks, hi, min_attempts).items():
        opts = SynthOptions(n=n, seed=seed, include=tuple(paths), verify=True, progress=progress)
        records = synthesize(root, out_dir / f"{root.name}-frontier-seed{seed}.jsonl", opts)
        for r in records:
            if r["bug_patch"] in known:
                dropped.append(f"duplicate: {r['instance_id']} injects a known task's bug")
                continue
            known.add(r["bug_patch"])
            kept.append(r)
        write_jsonl(out_dir / f"{root.name}-frontier-seed{seed}.jsonl", [r for r in kept if r["repo"] == str(root)])
    return kept, dropped
