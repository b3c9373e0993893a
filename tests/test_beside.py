"""Arms trained beside other work (coevolve/beside.py): when it is on, how the round's cost
counts it, a side arm that fails, and a side arm whose parent is killed alone.

The real arms, beside and one after the other, are trained in
tests/test_coevolve.py::test_control_arm_trains_the_verified_round_again_without_the_change."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from rich.console import Console

from evotrainer.coevolve.beside import SideArm, SideArmError, beside, parallel_arms
from evotrainer.coevolve.state import describe_cost
from evotrainer.config import ConfigError, load_config
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import CONFIGS_DIR
from evotrainer.store import Store
from evotrainer.workspace import ensure_workspace

TINY = CONFIGS_DIR / "math-tiny.yaml"


@pytest.mark.parametrize("mode, cuda, cpus, world, expected", [
    ("auto", False, 2, "1", True),
    ("auto", False, 1, "1", False),  # one core: nothing to share
    ("auto", True, 16, "1", False),  # a CUDA device: the arms would share one GPU
    ("auto", False, 16, "2", False),  # a distributed launch: every rank trains the main round
    ("true", True, 1, "1", True),
    ("false", False, 16, "1", False),
])
def test_parallel_arms_is_on_only_where_the_arms_share_nothing_but_idle_cores(monkeypatch, mode, cuda, cpus,
                                                                             world, expected):
    import torch

    import evotrainer.coevolve.beside as beside_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(beside_module, "usable_cpus", lambda: cpus)
    monkeypatch.setenv("WORLD_SIZE", world)
    assert parallel_arms(load_config(TINY, [f"coevolve.parallel_arms={mode}"])) is expected


def test_bad_parallel_arms_value_is_refused():
    with pytest.raises(ConfigError, match="parallel_arms"):
        load_config(TINY, ["coevolve.parallel_arms=sometimes"])


def test_the_cost_line_names_what_trained_beside_by_its_own_time():
    line = describe_cost({"train": 200.0, "control": 12.0, "evaluation": 30.0}, {"control": 190.0})
    assert line == "round cost 4m 02s: train 200s, evaluation 30s, control 12s; beside train: control 190s"
    assert describe_cost({"train": 60.0}) == "round cost 1m 00s: train 60s"


def test_a_failing_side_arm_fails_the_stage_with_its_log(tmp_path):
    """A real spawned side arm asked for a harness revision that does not exist: the block still
    ran, then the stage fails with the arm's error and the end of its log."""
    ws = ensure_workspace(tmp_path / "work", "math")
    config = load_config(TINY, ["coevolve.parallel_arms=true"])
    arm = SideArm("tiny~control", "no-such-revision", None, 1, "control arm")
    ran = []
    with pytest.raises(SideArmError, match="control arm failed") as err:
        with beside(config, ws.root, HarnessRepo(ws.harnesses), arm, Console(file=open(os.devnull, "w"))):
            ran.append(True)
    assert ran == [True]
    assert "no-such-revision" in str(err.value)
    assert "Traceback" in (ws.root / "logs" / "tiny~control-round-1.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads processes from /proc")
def test_a_side_arm_ends_when_its_parent_is_killed_alone(tmp_path, embedded_model_dir):
    """`kill -9` on the coevolve process only (not its group): the side arm must not live on as
    an orphan that a resume would race with. It ends within seconds, its round unfinished."""
    ws = ensure_workspace(tmp_path / "work", "math")
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from rich.console import Console
        from evotrainer.coevolve.beside import SideArm, beside
        from evotrainer.config import load_config
        from evotrainer.harness.repo import HarnessRepo

        def descendants(pid):
            parents = {{}}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = open(f"/proc/{{entry}}/stat").read()
                    except OSError:
                        continue
                    parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            out, todo = [], [pid]
            while todo:
                kids = parents.get(todo.pop(), [])
                out += kids
                todo += kids
            return out

        def started():
            from evotrainer.store import Store
            with Store.open(Path({str(ws.root)!r})) as store:
                run_id = store.run_id("tiny~side")
                return run_id is not None and store.count_rollouts(run_id=run_id) > 0

        if __name__ == "__main__":
            config = load_config({str(TINY)!r}, ["coevolve.parallel_arms=true"])
            arm = SideArm("tiny~side", "main", None, 0, "side arm")
            with beside(config, Path({str(ws.root)!r}), HarnessRepo({str(ws.harnesses)!r}), arm, Console(stderr=True)):
                # Until the side arm has stored rollouts (model loaded, training under way, its
                # sandbox workers up), however slow the machine: a fixed sleep once stood here.
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline and not started():
                    time.sleep(0.5)
                print(" ".join(map(str, descendants(os.getpid()))), flush=True)  # its sandbox workers too
                os.kill(os.getpid(), signal.SIGKILL)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    kids = [int(p) for p in proc.stdout.split()]
    assert kids, proc.stderr[-2000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in kids):
        time.sleep(0.5)
    alive = [pid for pid in kids if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the side arm outlived its parent"
    with Store.open(ws.root) as store:
        run_id = store.run_id("tiny~side")
        assert run_id is not None, "the side arm never started training: the kill proved nothing"
        assert not any(r["finished_at"] for r in store.rounds(run_id))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
