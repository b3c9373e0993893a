"""The inner loop with the real embedded model: a 2-step GRPO round, resume, and kill safety."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evotrainer.config import load_config
from evotrainer.paths import CONFIGS_DIR
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
    # GRPO advantages are centred within each group.
    groups = {}
    for row in rows:
        groups.setdefault(row.rollout.group_id, []).append(row.advantage)
    assert len(groups) == 2 * cfg.train.prompts_per_step
    for adv in groups.values():
        assert len(adv) == g and abs(sum(adv)) < 1e-3
    adapter = Path(result["rounds"][0].adapter)
    assert (adapter / "adapter_config.json").is_file()
    evals = store.evals(session.run_id)
    assert {e["round_id"] is None for e in evals} == {True, False}  # base + round 0

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
    trained = [e for e in evals if e["round_id"] is not None]
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
