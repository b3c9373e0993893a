"""A real `coevolve` run killed with SIGKILL on its process group at several points, resumed
each time, ends with the same rounds, backtests, lineage and skills as the same run left alone.

The kills come from crash points (evotrainer/crashpoints.py), so each lands exactly where it is
meant to: after a backtest report was indexed, right after a promotion's merge, between two steps
and in the middle of a step of the verified round, and in the middle of a control-arm step.
Live pilots are off (`coevolve.pilot_steps=0`): a resumed pilot is tests/test_pilot.py's,
and here round 0's two pilots took four of the run's five minutes, in both runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store

TINY = CONFIGS_DIR / "math-tiny.yaml"

# Each kill happens in the process the previous kill's resume started, in run order. The control
# arm trains beside round 1 and starts later (a spawned process), so the main arm may finish its two
# steps before the control arm reaches its second: the control arm's kill comes last, where the
# stage waits for it whatever the timing.
KILLS = [
    "backtest.indexed@1",          # round 0, the first candidate's report indexed, state not saved
    "coevolve.promoted",           # round 0, main merged, state not saved
    "train.step_end:tiny@1",       # round 1 (the verified one), between its two steps
    "train.mid_step:tiny@2",       # round 1 again, inside its second step
    "train.mid_step:tiny~control@2",  # round 1's control arm, inside its second step
]


def _seed(tmp_path: Path) -> Path:
    """The math seed with its format weight at 0: round 0's dead groups are left for a skill
    to fix, so round 0 promotes a change and round 1 verifies it against a control arm."""
    seed = tmp_path / "seed"
    shutil.copytree(HARNESSES_DIR / "math", seed)
    y = seed / "harness.yaml"
    y.write_text(y.read_text().replace("format: 0.1", "format: 0.0"))
    return seed


def _coevolve(workdir: Path, seed: Path, *, resume: bool, crash_at: str | None) -> int:
    cmd = [sys.executable, "-m", "evotrainer", "coevolve", "--config", str(TINY), "--rounds", "2",
           "--workdir", str(workdir), *(["--resume"] if resume else []), f"harness={seed}",
           "coevolve.pilot_steps=0"]
    env = {k: v for k, v in os.environ.items() if k != "EVOTRAINER_CRASH_AT"}
    if crash_at:
        env["EVOTRAINER_CRASH_AT"] = crash_at
    log = open(workdir.parent / f"{workdir.name}.log", "a")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _rounds(store: Store, run: str) -> dict[int, list[tuple]]:
    run_id = store.run_id(run)
    out: dict[int, list[tuple]] = {}
    for r in store.rounds(run_id):
        rows = store.iter_rollouts(run_id=run_id, round_index=r["index"])
        out[r["index"]] = sorted(json.dumps([sr.step, sr.rollout.task_id, sr.rollout.completion,
                                              sr.reward, sr.kept, sr.rollout.outcome.kind]) for sr in rows)
    return out


def _evals(store: Store, run: str) -> list[tuple]:
    return sorted((-1 if e["round_index"] is None else e["round_index"], e["seed"], e["n"], e["successes"])
                  for e in store.evals(store.run_id(run)))


def _backtests(store: Store) -> list[tuple]:
    out = []
    for row in store.backtests():
        report = store.get_backtest(row["id"])
        out.append((report["candidate_rev"], report["decision"], json.dumps(report["metrics"], sort_keys=True)))
    return sorted(out)


def _lineage(workdir: Path) -> list[tuple[str, str]]:
    repo = HarnessRepo(workdir / "harnesses")
    return [(c.subject, repo.repo.commit(c.sha).tree.hexsha) for c in repo.log(first_parent=True)]


def _skills(workdir: Path) -> dict[str, tuple]:
    out = {}
    for f in sorted((workdir / "skills").glob("*/skill.yaml")):
        data = yaml.safe_load(f.read_text())
        evidence = [(e.get("run"), e.get("round"), e.get("note"), json.dumps(e.get("params"), sort_keys=True))
                    for e in data.get("evidence") or ()]
        out[f.parent.name] = (data.get("status"), evidence)
    return out


def _history(workdir: Path) -> list[dict]:
    state = json.loads((workdir / "coevolve.json").read_text())
    for h in state["history"]:
        h.pop("harness")  # main's sha when the round trained: commit times differ, trees are in _lineage
        h.pop("stage_seconds")  # wall time; a killed attempt's seconds are not carried over
        h.pop("beside_seconds")  # the same, for the control arm trained beside the round
        for c in h["candidates"]:
            c.pop("backtest")  # ids carry the time they were made
            c["reasons"] = [r for r in c["reasons"] if "of its" not in r]  # "took 0.5 s of its 600 s budget"
    return state["history"]


def _everything(workdir: Path) -> dict:
    with Store.open(workdir) as store:
        return {"main": _rounds(store, "tiny"), "control": _rounds(store, "tiny~control"),
                "evals": (_evals(store, "tiny"), _evals(store, "tiny~control")),
                "backtests": _backtests(store), "lineage": _lineage(workdir), "skills": _skills(workdir),
                "history": _history(workdir)}


@pytest.mark.slow(seconds=745)
def test_coevolve_killed_at_five_points_resumes_to_the_uninterrupted_run(tmp_path, embedded_model_dir):
    seed = _seed(tmp_path)
    alone, crashed = tmp_path / "alone", tmp_path / "crashed"
    assert _coevolve(alone, seed, resume=False, crash_at=None) == 0, (tmp_path / "alone.log").read_text()[-3000:]
    reference = _everything(alone)
    assert reference["control"], "round 0 promoted nothing, so no control arm ran: the kills below miss it"

    for i, point in enumerate(KILLS):
        code = _coevolve(crashed, seed, resume=i > 0, crash_at=point)
        assert code == -signal.SIGKILL, f"{point}: exit {code}\n" + (tmp_path / "crashed.log").read_text()[-3000:]
    assert _coevolve(crashed, seed, resume=True, crash_at=None) == 0, (tmp_path / "crashed.log").read_text()[-3000:]

    with Store.open(crashed) as store:  # the killed attempts' rollouts are kept, set aside
        assert store.count_rollouts(run_id=store.run_id("tiny~abandoned")) > 0
        assert store.count_rollouts(run_id=store.run_id("tiny~control~abandoned")) > 0
    got = _everything(crashed)
    for key in reference:
        assert got[key] == reference[key], key
