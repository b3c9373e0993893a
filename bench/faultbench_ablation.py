"""Ablation: the harness-fault benchmark without the loop changes it led to (issue 16): no
verified-tier-reward, no keep-verified-successes, and passing candidates promoted by margins
only (the trusted false_drop_rate probe stays).

    python bench/faultbench_ablation.py     # prints the Markdown table; compare with docs/results.md's

It hides the two skills by loading the library from a copy without them and restores the old
ordering of passing candidates, all in this process.
"""

import shutil
import tempfile
from pathlib import Path

import evotrainer.faultbench.run as run
from evotrainer.faultbench import load_cases, run_cases, summary
from evotrainer.paths import FAULT_CASES_DIR, SKILLS_DIR
from evotrainer.propose import get_agent
from evotrainer.skills.library import SkillLibrary

tmp = Path(tempfile.mkdtemp())
for p in SKILLS_DIR.iterdir():
    if p.is_dir() and p.name not in ("verified-tier-reward", "keep-verified-successes"):
        shutil.copytree(p, tmp / p.name)
SkillLibrary.load.__func__.__defaults__ = (None, tmp)
run.passing_best_first = lambda cs: sorted((c for c in cs if c.decision == "promote"),
                                           key=lambda c: c.gain or 0.0, reverse=True)
results = run_cases(load_cases(FAULT_CASES_DIR), get_agent("rules"))
print(summary.markdown(results, "rules, ablated"))
