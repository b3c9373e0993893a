"""What the tasks domain's slow verifiers cost: math (math-verify worker) and a user function
(one sandbox job per check). `PYTHONPATH=$PWD python bench/tasks_verifiers.py`; figures are in
docs/domains-tasks.md."""

import json
import pathlib
import statistics
import tempfile
import time

from evotrainer.domains.tasks import TasksDomain

d = pathlib.Path(tempfile.mkdtemp())
rows = [{"task_id": f"t{i}", "prompt": f"{i}/{i + 1}?", "answer": f"\\frac{{{i}}}{{{i + 1}}}"} for i in range(1, 501)]
(d / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
t = time.time()
dom = TasksDomain(source=str(d / "m.jsonl"), verifier="math")
load = time.time() - t
lat = []
for i, task in enumerate(dom.all_tasks()[:100]):
    t = time.time()
    dom.check(task, f"Answer: {(i + 1) / (i + 2):.6f}" if i % 2 else "Answer: 0.25", False)
    lat.append(time.time() - t)
print(f"math: load+gold-parse 500 tasks {load:.2f}s; check median {statistics.median(lat) * 1000:.1f} ms, "
      f"max {max(lat) * 1000:.0f} ms")

(d / "c.py").write_text("def check(c, a, t):\n    return c.strip().endswith(a)\n")
rows = [{"task_id": f"u{i}", "prompt": "p", "answer": str(i)} for i in range(500)]
(d / "u.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
t = time.time()
dom = TasksDomain(source=str(d / "u.jsonl"), verifier="c.py:check")
load = time.time() - t
lat = []
for task in dom.all_tasks()[:20]:
    t = time.time()
    dom.check(task, "Answer: " + task.answer, False)
    lat.append(time.time() - t)
print(f"user fn: load+gold-check 500 tasks {load:.2f}s; check median {statistics.median(lat) * 1000:.0f} ms")
