"""TRL beside evotrainer: a real `GRPOTrainer` step on the embedded model (SmolLM2-135M), with
our callback in the user's own trainer, stores its rollouts; the harness as TRL reward functions."""

from __future__ import annotations

import math

import pytest

from evotrainer.integrations.trl import StoreRollouts, harness_rewards, neutralise
from evotrainer.store import Store

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


def contains_answer(prompts, completions, answer, **kwargs):
    """A user's own reward function: 1.0 when the answer appears anywhere in the completion."""
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def length_penalty(prompts, completions, **kwargs):
    return [-0.01 * len(c) for c in completions]


def grpo(model_dir, tmp_path, reward_funcs, callbacks=()):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    data = datasets.Dataset.from_list([{"prompt": "What is 2 + 3? Answer:", "answer": "5"},
                                       {"prompt": "What is 4 + 4? Answer:", "answer": "8"}])
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trainer"), max_steps=1, per_device_train_batch_size=4,
                          num_generations=2, max_completion_length=6, learning_rate=1e-5, logging_steps=1,
                          save_strategy="no", report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
                          seed=0, beta=0.0)
    return trl.GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=data,
                           processing_class=tokenizer, callbacks=list(callbacks))


@pytest.mark.slow
def test_a_grpo_step_with_our_callback_stores_its_rollouts(tmp_path, embedded_model_dir):
    work = tmp_path / "work"
    rec = StoreRollouts(work, domain="math")
    trainer = grpo(embedded_model_dir, tmp_path, rec.watch([contains_answer, length_penalty]), [rec])
    trainer.train()
    with Store.open(work) as store:
        rows = list(store.iter_rollouts())
        [rnd] = store.rounds(store.run_id("trl"))
    assert len(rows) == 4 and len({sr.step for sr in rows}) == 1
    for sr in rows:
        comps = sr.reward_components
        assert set(comps) == {"contains_answer", "length_penalty"}
        assert comps["length_penalty"] == pytest.approx(-0.01 * len(sr.rollout.completion), abs=1e-6)
        assert sr.reward == pytest.approx(comps["contains_answer"] + comps["length_penalty"], abs=1e-6)
        assert sr.rollout.meta["outcome_by"] == "domain:math" and sr.rollout.meta["answer"] in ("5", "8")
    prompts = [sr.rollout.prompt for sr in rows]
    assert sorted(prompts) == sorted(["What is 2 + 3? Answer:"] * 2 + ["What is 4 + 4? Answer:"] * 2)
    assert len({sr.rollout.group_id for sr in rows}) == 2  # the two generations of a prompt: one group
    logged = rnd["metrics"]["trl_log"]
    assert any("loss" in entry for entry in logged)  # TRL's own statistics, as it logged them
    assert any("rewards/contains_answer/mean" in entry for entry in logged)


@pytest.mark.slow
def test_harness_rewards_drive_a_grpo_step_and_log_each_component(tmp_path, embedded_model_dir):
    from evotrainer.workspace import ensure_workspace

    work = tmp_path / "work"
    ensure_workspace(work, "math")
    [reward] = harness_rewards(work, "main")
    assert reward.__name__ == f"harness_{reward.harness_commit[:12]}"
    direct = reward(["q", "q"], ["Answer: 5", "Answer: 7"], answer=["5", "5"])
    assert direct == pytest.approx([1.1, 0.1])  # the seed harness: correct + 0.1 * format
    rec = StoreRollouts(work, domain="math")
    trainer = grpo(embedded_model_dir, tmp_path, rec.watch([reward]), [rec])
    trainer.train()
    reward.scorer.close()
    with Store.open(work) as store:
        [rnd] = store.rounds(store.run_id("trl"))
        rows = list(store.iter_rollouts())
    assert len(rows) == 4 and all(set(sr.reward_components) == {reward.__name__} for sr in rows)
    logged = rnd["metrics"]["trl_log"]
    assert any("harness/correct" in entry and "harness/kept_fraction" in entry for entry in logged)


def test_a_dropped_rollout_gets_a_zero_advantage():
    rewards, groups = [1.0, 0.0, 3.0, 2.0, 5.0], ["a", "a", "a", "b", "b"]
    out = neutralise(rewards, [True, True, False, False, False], groups)
    assert out[:3] == [1.0, 0.0, 0.5] and out[3:] == [3.5, 3.5]
    mean = sum(out[:3]) / 3
    assert math.isclose(out[2] - mean, 0.0, abs_tol=1e-12)  # its group-relative advantage
    assert neutralise([0.0, 3.0], [True, False], ["g", "g"]) == [0.0, 0.0]
