"""Rank gating for `accelerate launch -m evotrainer ...`: rank 0 alone writes the workspace and
the store; the other ranks get its ids and their rollouts reach the store once, through rank 0.
The slow test is a real two-process gloo launch on CPU (torch.distributed.run, the launcher
accelerate uses), not an imitation of one."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer import dist

ROOT = Path(__file__).resolve().parent


def test_single_process_defaults(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert (dist.rank(), dist.world_size(), dist.is_main(), dist.distributed()) == (0, 1, True, False)
    assert dist.share({"a": 1}) == {"a": 1} and dist.gather([1, 2]) == [1, 2]
    dist.barrier()  # no process group is needed, or made, in a single process


def test_rank_from_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (dist.rank(), dist.world_size(), dist.is_main(), dist.distributed()) == (1, 2, False, True)


def test_accelerate_config_for_one_node_is_valid():
    import yaml

    cfg = yaml.safe_load((ROOT.parent / "configs" / "accelerate" / "multi_gpu.yaml").read_text())
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["num_machines"] == 1
    assert cfg["num_processes"] >= 2 and cfg["machine_rank"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _each_rank(stderr: str, lines: int = 25) -> str:
    """The end of every rank's own output: the rank that failed first is rarely the last to print."""
    parts = []
    for rank in (0, 1):
        mine = [line for line in stderr.splitlines() if line.startswith(f"[default{rank}]")]
        parts.append(f"--- rank {rank}\n" + "\n".join(mine[-lines:]))
    return "\n".join(parts) + "\n--- launcher\n" + stderr[-1500:]


@pytest.mark.slow
def test_two_ranks_share_one_workspace_and_store_every_rollout_once(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--tee", "3",
         "--master_port", str(_free_port()), str(ROOT / "dist_probe.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=400, cwd=ROOT.parent)
    assert r.returncode == 0, _each_rank(r.stderr)
    seen = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [(s["rank"], s["world"], s["main"]) for s in seen] == [(0, 2, True), (1, 2, False)]
    # Rank 1 never created a run or a round: it holds rank 0's ids.
    assert seen[0]["run_id"] == seen[1]["run_id"] is not None
    assert seen[0]["round_id"] == seen[1]["round_id"] is not None
    # Rank 0 has 3 rollouts and rank 1 has 4; the store holds all 7, each once.
    expected = [f"rank0-{i}" for i in range(3)] + [f"rank1-{i}" for i in range(4)]
    assert seen[0]["ids"] == seen[1]["ids"] == expected
    assert seen[0]["gathered"] == seen[1]["gathered"] == [0, 1]
    assert (tmp_path / "work" / "harnesses" / ".git").is_dir()
