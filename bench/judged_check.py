"""What the judged domain's check costs apart from the judge model: requests and milliseconds per
check against a loopback OpenAI-compatible server that answers at once (tests/llm_server.py), for
GRPO groups whose completions repeat (identical answers in a group are judged once).

    python bench/judged_check.py [--tasks 64] [--group 8] [--distinct 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from llm_server import ChatServer

from evotrainer.domains import get_domain


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--distinct", type=int, default=4)
    args = ap.parse_args()
    reply = json.dumps({"success": True, "quality": 4, "failure_reason": "", "suggestion": ""})
    with tempfile.TemporaryDirectory() as tmp, ChatServer(responder=lambda body: reply) as server:
        src = Path(tmp) / "tasks.jsonl"
        src.write_text("".join(json.dumps({"task_id": f"t{i}", "instruction": f"Explain idea {i}.",
                                           "eval_criteria": ["is correct", "is short"]}) + "\n"
                               for i in range(args.tasks)))
        domain = get_domain("judged", source=str(src), judge={"base_url": server.url, "model": "bench"})
        tasks = domain.all_tasks()
        started = time.perf_counter()
        outcomes = [domain.check(t, f"answer {j % args.distinct} to {t.task_id}", False)
                    for t in tasks for j in range(args.group)]
        seconds = time.perf_counter() - started
        requests = len(server.completions())
    checks = len(outcomes)
    print(json.dumps({"checks": checks, "requests": requests, "requests_per_check": requests / checks,
                      "ms_per_check": 1000 * seconds / checks, "roles": len(domain.config.roles),
                      "successes": sum(o.success for o in outcomes)}, indent=2))


if __name__ == "__main__":
    main()
