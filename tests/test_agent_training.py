"""The `agent` scaffold in GRPO training: terminal states counted and stored with their turns (fast,
scripted policy, real recorder and SQLite store), and one real GRPO step of the embedded model
through TRL's rollout_func on a tiny real repo task (slow): rollouts stored with their turns,
environment tokens out of the loss mask the trainer used, a finite loss and changed LoRA weights."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

from evotrainer.api import Turn
from evotrainer.domains.swe import SweDomain, split_of
from evotrainer.grade import make_patch
from evotrainer.harness.loader import load_harness
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.scaffold.agent import EXIT_STATUSES, ContextLimit, ScriptedPolicy, run_agent, to_rollout
from evotrainer.store import Store
from evotrainer.train.recorder import RolloutRecorder, RoundContext
from tests.clamp_task import BUGGY, CLEAN, FIX, TESTS, clamp_repo, clamp_row  # noqa: F401

NAMED_ENDINGS = set(EXIT_STATUSES)
OUTCOME_KINDS = {"ok", "wrong", "format_error", "empty", "truncated", "timeout", "patch_failed", "tampering", "error"}


pytestmark = pytest.mark.usefixtures("isolated_swe_cache")


def _instance_ids() -> list[str]:
    """Two ids of the same bug, one in each split (the split is a hash of the id)."""
    found: dict[str, str] = {}
    n = 0
    while len(found) < 2:
        iid = f"shapes-{n}"
        found.setdefault(split_of(iid, 0.2), iid)
        n += 1
    return [found["train"], found["heldout"]]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory) -> Path:
    """A SWE-bench-format task file over a real tiny repo with a real test suite."""
    root = clamp_repo(tmp_path_factory.mktemp("agent-train") / "repo")
    rows = [clamp_row(root, iid) for iid in _instance_ids()]
    path = root.parent / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class _FullContext:
    """A policy whose context is full before its second reply."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages):
        self.calls += 1
        if self.calls > 1:
            raise ContextLimit("full")
        return '{"tool": "view", "path": "shapes.py"}'


def test_every_ending_is_a_named_stored_outcome(task_file, tmp_path):
    domain = SweDomain(levels=(0,), source=str(task_file), scaffold="agent")
    task = domain.tasks("train", 1, 0)[0]
    swe = domain.swe_task(task)
    episodes = {
        "submitted": run_agent(swe, ScriptedPolicy([FIX, '{"tool": "submit"}']), max_steps=4),
        "format_error": run_agent(swe, ScriptedPolicy(["I would look at clamp."]), max_steps=4, max_format_errors=2),
        "step_limit": run_agent(swe, ScriptedPolicy(['{"tool": "view", "path": "shapes.py"}']), max_steps=2),
        "timeout": run_agent(swe, ScriptedPolicy(['{"tool": "submit"}']), time_limit_s=0.0),
        "context_limit": run_agent(swe, _FullContext(), max_steps=4),
    }
    expected = {"submitted": ("ok", False), "format_error": ("format_error", False),
                "step_limit": ("truncated", True), "timeout": ("timeout", True),
                "context_limit": ("truncated", True)}
    rollouts = []
    for status, result in episodes.items():
        assert result.exit_status == status
        r = to_rollout(swe, result, num_tokens=7, meta={"split": task.split})
        assert (r.outcome.kind, r.truncated) == expected[status], status
        assert r.meta["exit_status"] == status and r.meta["split"] == "train" and r.meta["scaffold"] == "agent"
        rollouts.append(r)
    assert episodes["submitted"].outcome.success and "submitted" in episodes["submitted"].outcome.flags
    assert "step_limit" in episodes["step_limit"].outcome.flags
    assert "context_limit" in episodes["context_limit"].outcome.flags

    # The recorder takes the episodes as they are (turns, trusted outcome) through the harness reward.
    store = Store.open(tmp_path)
    harness = load_harness(HARNESSES_DIR / "swe")
    run_id = store.get_or_create_run("agent-endings", "swe", {})
    round_id = store.start_round(run_id, 0, harness.version, "base")
    recorder = RolloutRecorder(domain, {task.task_id: task}, harness, store,
                               RoundContext(run_id, round_id, "base", harness.version, 0), stop_token_ids=[0],
                               group_size=5)
    rewards = recorder(prompts=[[{"role": "user", "content": task.prompt}]] * 5, completions=[""] * 5,
                       completion_ids=[[1]] * 5, task_id=[task.task_id] * 5, agent_rollout=rollouts)
    assert rewards[0] == 1.0 and rewards[1:] == [0.0] * 4
    recorder.finalize([0.8, -0.2, -0.2, -0.2, -0.2], group_size=5)
    recorder.commit()  # the trainer commits once its loss pass has measured the batch
    stored = {row.rollout.meta["exit_status"]: row for row in store.iter_rollouts()}
    assert set(stored) == set(expected)
    for status, row in stored.items():
        assert row.rollout.outcome.kind == expected[status][0]
        assert row.rollout.turns and all(isinstance(t, Turn) for t in row.rollout.turns)
        assert [t.role for t in row.rollout.turns[:2]] == ["system", "user"]
        assert row.rollout.num_tokens == 7
    assert stored["submitted"].rollout.completion == make_patch({"shapes.py": (BUGGY, CLEAN)})
    assert sum(t.role == "assistant" for t in stored["submitted"].rollout.turns) == 2


def test_agent_scaffold_is_swe_only():
    from evotrainer.config import ConfigError, load_config

    cfg = load_config(CONFIGS_DIR / "swe.yaml", ["domain.scaffold=agent", "domain.agent.max_turns=3"])
    assert cfg.domain.scaffold == "agent" and cfg.domain.agent.max_turns == 3
    assert load_config(CONFIGS_DIR / "swe.yaml").domain.scaffold == "line"
    with pytest.raises(ConfigError, match="scaffold 'agent' is for the swe domain"):
        load_config(CONFIGS_DIR / "math.yaml", ["domain.scaffold=agent"])


# ---------------------------------------------------------------- a real GRPO step


def _test_harness(folder: Path) -> Path:
    """The seed swe harness with two generations and a reward that differs between two different
    trajectories (so a group of failures still carries a GRPO signal and the step moves the LoRA)."""
    shutil.copytree(HARNESSES_DIR / "swe", folder)
    spec = yaml.safe_load((folder / "harness.yaml").read_text())
    spec["grpo"]["num_generations"] = 2
    spec["reward_weights"]["text_probe"] = 1.0
    (folder / "harness.yaml").write_text(yaml.safe_dump(spec))
    reward = (folder / "reward.py").read_text()
    reward = reward.replace('        "edit_then_test": edit_then_test(rollout),\n',
                            '        "edit_then_test": edit_then_test(rollout),\n'
                            '        "text_probe": (sum(map(ord, "".join(_actions(rollout)))) % 997) / 997,\n')
    (folder / "reward.py").write_text(reward)
    return folder


@pytest.mark.slow(seconds=125)
def test_one_grpo_step_with_the_agent_scaffold(task_file, tmp_path, embedded_model_dir):
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback

    from evotrainer.config import load_config
    from evotrainer.policy import load_policy
    from evotrainer.train.grpo import HarnessGRPOTrainer
    from evotrainer.train.loop import build_peft, evaluate_heldout, grpo_args, open_session
    from evotrainer.train.rollout import AgentRollout, agent_rows

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    cfg = load_config(CONFIGS_DIR / "swe.yaml", [
        f"domain.source={task_file}", "domain.levels=[0]", "domain.options.heldout_fraction=0.2",  # _instance_ids
        "domain.train_size=1", "domain.heldout_size=1", "train.prompts_per_step=1",  # one train task
        "domain.scaffold=agent", "domain.agent.max_turns=2", "domain.agent.max_new_tokens=8",
        f"harness={_test_harness(tmp_path / 'harness')}", "run_name=agent-step"])
    session = open_session(cfg, tmp_path / "work")
    assert session.grpo["num_generations"] == 2
    model, tokenizer = load_policy(cfg.policy.model, None, trainable=True)
    model = build_peft(model, session.grpo)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    round_id = session.store.start_round(session.run_id, 0, session.harness.version, "base")
    tasks = {t.task_id: t for t in session.train_tasks}
    rollout_func = AgentRollout(session.domain, tasks, session.harness, cfg.domain.agent, tokenizer)
    recorder = RolloutRecorder(session.domain, tasks, session.harness, session.store,
                               RoundContext(session.run_id, round_id, "base", session.harness.version, 0),
                               stop_token_ids=[tokenizer.eos_token_id])
    trainer = HarnessGRPOTrainer(model=model, args=grpo_args(session, 1, 0, tmp_path / "trainer"),
                                 train_dataset=Dataset.from_list(agent_rows(session.train_tasks)),
                                 processing_class=tokenizer, recorder=recorder, rollout_func=rollout_func)
    trainer.remove_callback(PrinterCallback)
    trainer.train()

    # Rollouts stored with every turn, each ending a named terminal state.
    rows = list(session.store.iter_rollouts(run_id=session.run_id))
    assert len(rows) == 2
    for row in rows:
        r = row.rollout
        assert r.meta["exit_status"] in NAMED_ENDINGS and r.outcome.kind in OUTCOME_KINDS
        assert [t.role for t in r.turns[:2]] == ["system", "user"]
        assert 1 <= sum(t.role == "assistant" for t in r.turns) == r.meta["steps"] <= 2
        assert "text_probe" in row.reward_components and row.advantage is not None
    episodes = rollout_func.last_batch
    assert sorted(e.rollout.num_tokens for e in episodes) == sorted(r.rollout.num_tokens for r in rows)
    stored = {row.rollout.id: row for row in rows}
    for e in episodes:  # model state over the model's own tokens (train/sample_stats.py)
        row = stored[e.rollout.id]
        meta = row.rollout.meta
        assert ("entropy" in meta) == (any(e.env_mask) and row.kept) and "kl" not in meta  # beta 0
        assert all(math.isfinite(meta[k]) for k in ("mean_logprob", "entropy") if k in meta)

    # The batch the loss used: environment tokens are in the completion but out of the loss mask.
    batch = trainer._buffered_inputs[0]
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    env = batch["completion_mask"] * (1 - batch["tool_mask"])
    trained = sorted(tuple(ids[m.bool()].tolist()) for ids, m in zip(batch["completion_ids"], loss_mask))
    sampled = sorted(tuple(i for i, m in zip(e.completion_ids, e.env_mask) if m) for e in episodes)
    assert trained == sampled  # exactly the sampled tokens train
    multi = [e for e in episodes if e.rollout.meta["steps"] == 2]
    assert len(multi) == int((env.sum(dim=1) > 0).sum())  # a second turn brings environment tokens
    for ids, m in zip(batch["completion_ids"], env):
        if m.any():
            text = tokenizer.decode(ids[m.bool()].tolist())
            assert "<|im_start|>user" in text and "<|im_start|>assistant" in text
    for e in multi:  # the observation the model saw is in the masked-out part of its trace
        observation = e.rollout.turns[3].content
        masked = tokenizer.decode([i for i, m in zip(e.completion_ids, e.env_mask) if not m])
        assert observation.strip() in masked

    logged = trainer.state.log_history[0]
    assert math.isfinite(logged["loss"])
    assert sum(logged[f"agent/{s}"] for s in EXIT_STATUSES) == pytest.approx(1.0)
    after = dict(model.named_parameters())
    assert any(not torch.equal(before[n], after[n].detach()) for n in before), "the LoRA weights did not move"

    # Held-out evaluation runs the same episodes greedily and stores its outcome kinds.
    results = evaluate_heldout(session, model, tokenizer, round_id, None)
    assert [r.n for r in results] == [1] and set(results[0].kinds) <= OUTCOME_KINDS
