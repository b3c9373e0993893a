"""The inner loop with the real embedded model: a 2-step GRPO round, resume, and kill safety."""

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from evotrainer.config import load_config
from evotrainer.diagnose import health_report
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store

pytestmark = pytest.mark.slow

TINY = CONFIGS_DIR / "math-tiny.yaml"


def test_two_step_round_stores_complete_rollouts_and_resumes(tmp_path, embedded_model_dir):
    check_round_and_resume(tmp_path)


def check_round_and_resume(tmp_path, overrides=()):
    """A 2-step round stores complete rollouts; a second run resumes. `overrides` (e.g.
    store.url=...) lets tests/test_store_postgres.py run the same check on another store."""
    from evotrainer.train.loop import open_session, run_training

    cfg = load_config(TINY, list(overrides))
    session = open_session(cfg, tmp_path)
    result = run_training(session)
    assert len(result["rounds"]) == 1
    store = Store.open(tmp_path, cfg.store.url)
    rows = list(store.iter_rollouts(run_id=session.run_id))
    g = session.grpo["num_generations"]
    assert len(rows) == 2 * cfg.train.prompts_per_step * g
    for row in rows:
        r = row.rollout
        assert r.prompt and r.task_id.startswith("math-") and r.group_id and r.domain == "math"
        assert r.num_tokens > 0
        assert r.outcome.kind in {"ok", "wrong", "format_error", "truncated", "empty"}
        assert set(row.reward_components) == {"correct", "format"}
        assert row.reward == pytest.approx(row.reward_components["correct"]
                                           + 0.1 * row.reward_components["format"])
        assert row.advantage is not None and row.kept is True
        assert row.model_version.startswith("base+s") and row.seed == cfg.train.seed
        assert row.harness_version == session.harness.version
        assert row.run_id == session.run_id and row.round_id is not None and row.step in (0, 1)
        assert r.meta["answer"] and r.meta["split"] == "train"
        # model state for the probes, from the loss's forward pass (train/sample_stats.py); the
        # seed's beta is 0, so there is no reference to measure a KL against
        assert r.meta["mean_logprob"] <= 0 and r.meta["entropy"] >= 0 and "kl" not in r.meta
        assert math.isfinite(r.meta["mean_logprob"]) and math.isfinite(r.meta["entropy"])
    report = health_report(session.harness, rows)
    model_state = [p for p in report.probes if p.dimension == "model_state"]
    assert {p.name for p in model_state} == {"mean_logprob", "mean_entropy", "entropy_fall"}
    values = {p.name: p.value for p in model_state}
    assert values["mean_logprob"] is not None and values["mean_entropy"] is not None
    # entropy_fall needs four measured steps; a 2-step round has two
    assert values["entropy_fall"] is None
    # GRPO advantages are centred within each group.
    groups = {}
    for row in rows:
        groups.setdefault(row.rollout.group_id, []).append(row.advantage)
    assert len(groups) == 2 * cfg.train.prompts_per_step
    for adv in groups.values():
        assert len(adv) == g and abs(sum(adv)) < 1e-3
    adapter = Path(result["rounds"][0].adapter)
    assert (adapter / "adapter_config.json").is_file()
    # the round's cost by part: the steps, then saving and evaluating the adapter
    [metrics] = [r["metrics"] for r in store.rounds(session.run_id)]
    assert metrics["train_seconds"] > 0 and metrics["eval_seconds"] > 0
    assert metrics["train_seconds"] == pytest.approx(2 * metrics["step_time"])
    evals = store.evals(session.run_id)
    assert {e["round_id"] is None for e in evals} == {True, False}  # base + round 0
    # each on the validation split (carved from the train pool, never trained on) and held-out
    assert sorted((e["round_id"] is None, e["split"], e["n"]) for e in evals) == [
        (False, "heldout", 8), (False, "validation", 4), (True, "heldout", 8), (True, "validation", 4)]
    validation = {t.task_id for t in session.validation}
    assert len(validation) == 4 and not validation & {row.rollout.task_id for row in rows}

    # Evaluating round 0's adapter again (as `evotrainer eval` does) reuses the held-out
    # generations training made under that adapter: the rollout cache (eval.cache) hits them all.
    from evotrainer.policy import load_policy
    from evotrainer.train.loop import evaluate_heldout

    cache = session.rollout_cache
    misses = cache.misses
    model, tokenizer = load_policy(cfg.policy.model, adapter)
    again = evaluate_heldout(session, model, tokenizer, None, str(adapter))
    n_heldout = sum(len(t) for t in session.heldout.values())
    assert cache.misses == misses and cache.hits >= n_heldout
    trained = [e for e in evals if e["round_id"] is not None and e["split"] == "heldout"]
    assert [r.successes for r in again] == [e["successes"] for e in trained]

    # A second run in the same workdir resumes: round 1, from round 0's adapter.
    session2 = open_session(cfg, tmp_path)
    result2 = run_training(session2, steps=1)
    assert [s.index for s in result2["rounds"]] == [1]
    assert result2["base"] is None  # the base model is not evaluated twice
    later = list(Store.open(tmp_path, cfg.store.url).iter_rollouts(round_index=1))
    assert later and all(r.model_version.startswith("lora-") for r in later)


def test_kill_mid_round_loses_no_scored_rollout(tmp_path, embedded_model_dir):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "evotrainer", "train", "--config", str(TINY), "--workdir",
           str(tmp_path), "--steps", "6"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    db = tmp_path / "store.db"
    deadline = time.time() + 240
    seen = 0
    try:
        while time.time() < deadline:
            if db.exists():
                with Store(f"sqlite:///{db}") as s:
                    seen = s.count_rollouts()
                if seen >= 8:
                    break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert seen >= 8, "no step was stored before the deadline"
    with Store(f"sqlite:///{db}") as s:
        after_kill = s.count_rollouts()
        assert after_kill >= seen and after_kill % 8 == 0  # whole steps, nothing half-written
        assert s.last_finished_round(s.run_id("tiny")) is None


def test_model_state_meta_matches_what_trl_logs(tmp_path, embedded_model_dir):
    """Two real GRPO steps with a KL term (beta > 0): each stored rollout's entropy and KL,
    weighted by its tokens, average to the `entropy` and `kl` TRL logs for its step (they come
    from the same forward pass of the loss)."""
    from datasets import Dataset
    from transformers import PrinterCallback

    from evotrainer.policy import load_policy
    from evotrainer.train.grpo import HarnessGRPOTrainer
    from evotrainer.train.loop import build_peft, grpo_args, open_session
    from evotrainer.train.recorder import RolloutRecorder, RoundContext

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    harness = tmp_path / "harness"
    shutil.copytree(HARNESSES_DIR / "math", harness)
    spec = yaml.safe_load((harness / "harness.yaml").read_text())
    spec["grpo"].update(beta=0.04, num_generations=4, max_completion_length=16, learning_rate=1e-3)
    (harness / "harness.yaml").write_text(yaml.safe_dump(spec))
    session = open_session(load_config(TINY, [f"harness={harness}", "run_name=model-state"]), tmp_path / "work")
    model, tokenizer = load_policy(session.config.policy.model, None, trainable=True)
    model = build_peft(model, session.grpo)
    round_id = session.store.start_round(session.run_id, 0, session.harness.version, "base")
    tasks = session.train_tasks[:2]
    recorder = RolloutRecorder(session.domain, {t.task_id: t for t in tasks}, session.harness, session.store,
                               RoundContext(session.run_id, round_id, "base", session.harness.version, 0),
                               stop_token_ids=[tokenizer.eos_token_id, tokenizer.pad_token_id])
    prompts = session.harness.render_prompts([t.prompt for t in tasks])
    rows = [{"prompt": [{"role": "user", "content": p}], "task_id": t.task_id} for t, p in zip(tasks, prompts)]
    trainer = HarnessGRPOTrainer(model=model, args=grpo_args(session, 2, 0, tmp_path / "trainer"),
                                 train_dataset=Dataset.from_list(rows), processing_class=tokenizer, recorder=recorder)
    trainer.remove_callback(PrinterCallback)
    trainer.train()

    stored = list(session.store.iter_rollouts(run_id=session.run_id))
    assert len(stored) == 2 * 4
    for step, logged in enumerate(trainer.state.log_history[:2]):
        batch = [row.rollout for row in stored if row.step == step]
        tokens = sum(r.num_tokens for r in batch)  # single-turn: every sampled token is a loss token
        for key in ("entropy", "kl"):
            ours = sum(r.meta[key] * r.num_tokens for r in batch) / tokens
            assert ours == pytest.approx(logged[key], rel=1e-4, abs=1e-7), (step, key)
        assert all(r.meta["mean_logprob"] < 0 for r in batch)
    assert trainer.state.log_history[1]["kl"] > 0  # the first step moved the policy off its reference
