"""A small real workspace for report tests and the report bench, made without training: real
rollout rows in a real SQLite store, and the outer loop's own stages (diagnose, propose,
backtest, promote, verify) run over them for three rounds, so the harness repo, backtest
reports, diagnostics and skills are what a co-evolution run writes. Round 1's held-out result
falls (its promotion is reverted); round 2's holds (validated). One multi-turn SWE trajectory
from the real agent loop, graded by the real grader, is imported without a round."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from clamp_task import FIX, clamp_repo, clamp_row  # tests/ is on sys.path wherever this module is used
from factories import make_rollout, make_stored

from evotrainer.coevolve import Coevolution, RunState
from evotrainer.config import load_config
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store, StoredRollout

HELDOUT = {0: (128, 70), 1: (128, 30), 2: (128, 34)}  # round -> (n, successes): a fall, then a hold


def _rows(run_id: int, round_id: int, k: int, harness: str) -> list[StoredRollout]:
    """8 groups of 8: six all-failing (dead), two live; ids unique per round."""
    rows = []
    for g in range(8):
        for j in range(8):
            success = g >= 6 and j <= k
            truncated = not success and j % 2 == 0
            text = "Answer: 4" if success else ("Answer: 5" if j % 2 else "Let me think about this for a")
            kind = "ok" if success else ("truncated" if truncated else "wrong")
            r = make_rollout(f"r{k}-{g}-{j:02d}", task_id=f"t-{g}", group_id=f"k{k}g{g}", completion=text,
                             success=success, kind=kind, num_tokens=12 + j, truncated=truncated, meta={"level": 0})
            rows.append(make_stored(r, reward=float(success), advantage=0.0, kept=j != 7, model_version=f"lora-{k}",
                                    seed=j, harness_version=harness, run_id=run_id, round_id=round_id, step=g))
    return rows


def plain_config(tmp: Path):
    plain = tmp / "plain-seed"
    shutil.copytree(HARNESSES_DIR / "math", plain)
    spec = plain / "harness.yaml"
    spec.write_text(spec.read_text().replace("format: 0.1", "format: 0.0"))
    # The rounds below are written, not trained, so there is no adapter to pilot from: with
    # pilot_steps 0 the gate rejects dynamics changes (longer-completions) instead.
    return load_config(CONFIGS_DIR / "math-tiny.yaml", [f"harness={plain}", "coevolve.max_proposals=3",
                                                        "coevolve.pilot_steps=0"])


def build_workspace(tmp: Path, rounds: int = 3) -> Path:
    loop = Coevolution(plain_config(tmp), tmp / "work")
    ws = loop.ws.root
    state = RunState(run="tiny", domain="math")
    state.save(loop.state_path)
    with Store.open(ws) as store:
        run_id = store.get_or_create_run("tiny", "math", {})
        store.add_eval(run_id, None, "heldout", None, 0, 128, 34, {})
        for k in range(rounds):
            round_id = store.start_round(run_id, k, loop.repo.resolve("main"), f"lora-{k}")
            store.add_rollouts(_rows(run_id, round_id, k, loop.repo.resolve("main")))
            n, ok = HELDOUT[k % 3]
            store.add_eval(run_id, round_id, "heldout", f"adapters/round-{k}", 0, n, ok, {})
            store.finish_round(round_id, {"heldout_success": ok / n, "train_reward": 0.1 + 0.05 * k,
                                          "train_success": 0.1 + 0.05 * k, "step_time": 2.0 - 0.1 * k},
                               f"adapters/round-{k}")
            state.stage = "verify"
            for stage in (loop.stage_verify, loop.stage_diagnose, loop.stage_propose, loop.stage_backtest,
                          loop.stage_promote):
                stage(state)
            loop._finish_round(state)
        store.add_rollouts([swe_trajectory(tmp)])
    agent_session(ws, rounds - 1)
    return ws


def agent_session(ws: Path, round_index: int) -> None:
    """A short scripted tool session on the last round, as a tool-using agent would start one:
    its transcript is what the report's agent page shows (one call fails on purpose)."""
    from evotrainer.tools import Toolbox

    with Toolbox(ws, "tiny", round_index, max_calls=10) as tools:
        listed = tools.call("list_rollouts", {"success": False, "limit": 3})
        first = listed["result"]["rollouts"][0]["id"]
        tools.call("show_rollout", {"id": first})
        tools.call("read_harness_file", {"name": "reward.py"})
        tools.call("read_harness_file", {"name": "../store.db"})  # refused: outside the harness repo


def swe_trajectory(tmp: Path) -> StoredRollout:
    """A real multi-turn agent run (scripted policy) on a tiny repo; the trusted check keeps the
    grader's per-test results in meta.per_test."""
    from evotrainer.grade import task_from_dict
    from evotrainer.scaffold.agent import ScriptedPolicy, run_agent, to_rollout

    root = clamp_repo(tmp / "swe" / "repo")
    row = clamp_row(root)
    task = task_from_dict(row, base=root.parent)
    policy = ScriptedPolicy(['{"tool": "view", "path": "shapes.py", "start": 1, "end": 6}', FIX,
                             '{"tool": "run_tests", "tests": ["test_shapes.py"]}', '{"tool": "submit"}'])
    result = run_agent(task, policy, max_steps=6)
    rollout = to_rollout(task, result, group_id="swe-g0", num_tokens=120)
    return make_stored(rollout, reward=float(rollout.outcome.success))


if __name__ == "__main__":  # python tests/report_workspace.py DIR: build one to look at
    import sys

    out = build_workspace(Path(sys.argv[1]))
    print(json.dumps({"workspace": str(out)}))
