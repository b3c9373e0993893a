"""harness.yaml `memory`: the training loop keeps a replay memory per run (memory/run.py), the
curriculum draws only from it, and it survives a restart without observing a round twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from factories import make_rollout, make_stored

from evotrainer.config import load_config
from evotrainer.domains.base import Task
from evotrainer.harness.loader import HarnessError, load_harness, parse_spec
from evotrainer.memory.run import RunMemory
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.train.loop import open_session, sample_round_tasks

MEMORY = "memory:\n  enabled: true\n  capacity: 10\n  frontier: 6\n  admit: 8\n"


def memory_harness(tmp_path: Path, block: str = MEMORY):
    harness_dir = tmp_path / "harness"
    shutil.copytree(HARNESSES_DIR / "math", harness_dir)
    spec = harness_dir / "harness.yaml"
    # the block replaces the seed's own `memory:` section (a second one fails the load)
    text = spec.read_text().replace("memory:\n  enabled: false\n", "")
    assert "memory:" not in text
    spec.write_text(text + block)
    return load_harness(harness_dir)


def typer_app(command):
    import typer

    app = typer.Typer()
    app.command("status")(command)
    app.command("noop")(lambda: None)  # two commands, so the command name is an argument
    return app


def finish_round(session, index: int, solved: dict[str, int]) -> None:
    """A finished round whose rollouts solve `solved[task]` of 8 attempts per task."""
    store = session.store
    round_id = store.start_round(session.run_id, index, session.harness.version, "base")
    store.add_rollouts(
        make_stored(make_rollout(f"r{index}-{tid}-{j}", task_id=tid, group_id=f"g{index}-{tid}", prompt="p",
                                 completion="c", success=j < k),
                    run_id=session.run_id, round_id=round_id)
        for tid, k in solved.items() for j in range(8))
    store.finish_round(round_id, {}, None)


def test_harness_memory_section_is_validated():
    spec = parse_spec("grpo: {}\nreward_weights: {}\n" + MEMORY)
    assert spec.memory == {"enabled": True, "capacity": 10, "frontier": 6, "admit": 8, "variant_var": 1.0}
    assert parse_spec("grpo: {}\n").memory["enabled"] is False
    with pytest.raises(HarnessError, match=r"memory.size: unknown key"):
        parse_spec("memory: {size: 3}\n")
    with pytest.raises(HarnessError, match=r"memory.capacity: must be an integer in \[1, 100000\], got 0"):
        parse_spec("memory: {capacity: 0}\n")


def test_the_curriculum_draws_only_from_the_runs_memory_which_resumes_from_disk(tmp_path):
    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", ["domain.train_size=30"])
    session = open_session(cfg, tmp_path / "work", harness=memory_harness(tmp_path))
    drawn = sample_round_tasks(session, 200, seed=0, index=0)
    path = tmp_path / "work" / "memory" / f"{cfg.run_name}.json"
    held = set(RunMemory.open(tmp_path / "work", cfg.run_name, session.harness.spec.memory).memory.entries)
    assert len(held) == 6  # an empty memory asks for its whole frontier (6), not the admit cap (8)
    assert {t.task_id for t in drawn} <= held

    # Round 0: three tasks mid, three solved every time.
    ids = sorted(held)
    finish_round(session, 0, {tid: (4 if i < 3 else 8) for i, tid in enumerate(ids)})
    sample_round_tasks(session, 200, seed=1, index=1)
    memory = RunMemory.open(tmp_path / "work", cfg.run_name, session.harness.spec.memory)
    assert memory.observed == [0]
    counts = memory.memory.strata_counts()
    assert counts["mid"] == 3 and counts["easy"] + counts["mastered"] == 3
    assert len(memory.memory) == 9  # it admitted what its frontier (6) lacked: 6 - 3 mid
    stats = {s.task_id: s for s in memory.task_stats(session.train_tasks)}
    assert all("logit" in stats[t].meta for t in ids) and stats[ids[0]].attempts == 8

    from typer.testing import CliRunner

    from evotrainer.cli.status import status_cmd

    shown = CliRunner().invoke(typer_app(status_cmd), ["status", "--workdir", str(tmp_path / "work")], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f"memory {cfg.run_name}" in shown.stdout and "9 of 10 tasks (new 3, mid 3, easy 3); observed rounds [0]" in shown.stdout, shown.stdout
    # A restart (a new session) finds the memory on disk and does not observe round 0 again.
    session.store.close()
    again = open_session(cfg, tmp_path / "work", harness=memory_harness(tmp_path / "again"))
    before = json.loads(path.read_text())
    sample_round_tasks(again, 50, seed=1, index=1)
    after = json.loads(path.read_text())
    assert after["observed"] == [0] and after["memory"]["rounds"] == before["memory"]["rounds"] == 1
    again.store.close()


def test_a_frontier_variant_enters_the_memory_first_with_its_parents_belief(tmp_path):
    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", ["domain.train_size=30"])
    session = open_session(cfg, tmp_path / "work", harness=memory_harness(tmp_path))
    sample_round_tasks(session, 20, seed=0, index=0)
    memory = RunMemory.open(tmp_path / "work", cfg.run_name, session.harness.spec.memory)
    parent = next(iter(memory.memory.entries))
    finish_round(session, 0, {tid: 4 if tid == parent else 8 for tid in memory.memory.entries})
    child = Task("variant-1", "math", "train", 0, "1 + 1", "2", {"origin": "frontier", "parent": parent})
    session.train_tasks.append(child)
    sample_round_tasks(session, 20, seed=1, index=1)
    memory = RunMemory.open(tmp_path / "work", cfg.run_name, session.harness.spec.memory)
    admitted = [tid for tid, e in memory.memory.entries.items() if e.admitted == 1]
    assert admitted[0] == "variant-1"  # offered before the unseen train tasks
    entry = memory.memory.entries["variant-1"]
    assert entry.prior and entry.logit == pytest.approx(memory.memory.entries[parent].logit, abs=1.0)
    assert memory.memory.plan().strata["variant-1"] == "mid"
    session.store.close()


@pytest.mark.slow
def test_training_with_memory_draws_from_it_and_observes_each_round(tmp_path, embedded_model_dir):
    """Two real rounds of one GRPO step: every prompt of a round is a task the memory held when
    the round began, and the memory on disk has observed both rounds' verified results."""
    from evotrainer.train.loop import run_training

    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", ["domain.train_size=24", "domain.heldout_size=2",
                                                       "train.prompts_per_step=2"])
    harness = memory_harness(tmp_path, "memory:\n  enabled: true\n  capacity: 8\n  frontier: 4\n  admit: 4\n")
    session = open_session(cfg, tmp_path / "work", harness=harness)
    run_training(session, rounds=2, steps=1)
    data = json.loads((tmp_path / "work" / "memory" / f"{cfg.run_name}.json").read_text())
    assert data["observed"] == [0, 1] and data["memory"]["rounds"] == 2
    entries = {e["task_id"]: e for e in data["memory"]["entries"]}
    forgotten = set(data["memory"]["forgotten"])
    for index in (0, 1):
        drawn = {r.rollout.task_id for r in session.store.iter_rollouts(run_id=session.run_id, round_index=index)}
        assert drawn, f"round {index} stored no rollouts"
        # admitted at or before this round (or forgotten since, after it was drawn)
        assert all(t in forgotten or entries[t]["admitted"] <= index for t in drawn)
        assert len(drawn) <= 4 + (4 if index else 0)
    observed = sum(e["attempts"] for e in entries.values())  # a forgotten task takes its count along
    stored = session.store.count_rollouts(run_id=session.run_id)
    assert observed == stored if not forgotten else 0 < observed < stored
    session.store.close()


def test_frontier_parents_come_from_the_memorys_mid_tasks(tmp_path):
    """domain.frontier with the memory on: variants are made from tasks the memory places in the
    band now, and enter the memory before other unseen tasks, starting from their parent's belief."""
    from evotrainer.train.loop import add_frontier_tasks

    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", ["domain.train_size=30", "domain.frontier.per_round=2"])
    session = open_session(cfg, tmp_path / "work", harness=memory_harness(tmp_path))
    sample_round_tasks(session, 20, seed=0, index=0)
    held = list(RunMemory.open(tmp_path / "work", cfg.run_name, session.harness.spec.memory).memory.entries)
    finish_round(session, 0, {tid: (4 if i == 0 else 8) for i, tid in enumerate(held)})  # one mid task
    add_frontier_tasks(session, 1)
    made = [t for t in session.train_tasks if t.meta.get("origin") == "frontier"]
    assert made and {t.meta["parent"] for t in made} == {held[0]}
    sample_round_tasks(session, 20, seed=1, index=1)
    memory = RunMemory.open(tmp_path / "work", cfg.run_name, session.harness.spec.memory).memory
    assert all(memory.entries[t.task_id].prior for t in made)
    session.store.close()
