"""train.precision: which hardware gets bf16, and the loss's log-prob pass under it on the real model
(with train.shrink_batch's sampler, as the loop runs by default)."""

import os
import shutil

import pytest
import torch
import yaml

from evotrainer.config import load_config
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.train.precision import cpu_has_native_bf16, loss_dtype

TINY = CONFIGS_DIR / "math-tiny.yaml"


def cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: a cpu\nflags\t\t: fpu sse2 {flags}\n\n")
    return path


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    for name in "abc":
        (tmp_path / name).mkdir()
    assert cpu_has_native_bf16(cpuinfo(tmp_path / "a", "avx2 amx_bf16 amx_tile"))
    assert cpu_has_native_bf16(cpuinfo(tmp_path / "b", "avx512f avx512_bf16"))
    assert not cpu_has_native_bf16(cpuinfo(tmp_path / "c", "avx2 avx512f avx512_vnni"))  # bf16 emulated
    assert not cpu_has_native_bf16(tmp_path / "missing")


def test_precision_choices():
    assert loss_dtype("fp32", "cpu") is None
    assert loss_dtype("bf16", "cpu") is torch.bfloat16
    assert loss_dtype("auto", "cpu") is (torch.bfloat16 if cpu_has_native_bf16() else None)
    with pytest.raises(ValueError, match="precision"):
        load_config(TINY, ["train.precision=fp16"])


@pytest.mark.slow
def test_bf16_log_probs_are_float32_and_close_to_fp32(tmp_path, embedded_model_dir):
    """The same rows scored in both precisions: float32 out, within bf16's error of each other but
    not equal (the autocast took effect); then one bf16 step trains the adapter."""
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
    spec["grpo"].update(num_generations=4, max_completion_length=16, learning_rate=1e-3)
    (harness / "harness.yaml").write_text(yaml.safe_dump(spec))
    session = open_session(load_config(TINY, [f"harness={harness}", "run_name=bf16"]), tmp_path / "work")
    model, tokenizer = load_policy(session.config.policy.model, None, trainable=True)
    model = build_peft(model, session.grpo)
    round_id = session.store.start_round(session.run_id, 0, session.harness.version, "base")
    tasks = session.train_tasks[:1]
    recorder = RolloutRecorder(session.domain, {t.task_id: t for t in tasks}, session.harness, session.store,
                               RoundContext(session.run_id, round_id, "base", session.harness.version, 0),
                               stop_token_ids=[tokenizer.eos_token_id, tokenizer.pad_token_id])
    rows = [{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.task_id} for t in tasks]
    trainer = HarnessGRPOTrainer(model=model, args=grpo_args(session, 1, 0, tmp_path / "trainer"),
                                 train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                 recorder=recorder, loss_dtype=torch.bfloat16, shrink_batch=True)
    trainer.remove_callback(PrinterCallback)

    ids = tokenizer(["Q: what is 2 + 3? A: 5", "Q: what is 7 * 6? A: 42"], return_tensors="pt", padding=True)
    scored = {}
    for dtype in (None, torch.bfloat16):
        trainer.loss_dtype = dtype
        with torch.no_grad():
            scored[dtype] = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids["input_ids"], ids["attention_mask"], 4, compute_entropy=True)
    (fp32_logps, fp32_ent, _), (bf16_logps, bf16_ent, _) = scored[None], scored[torch.bfloat16]
    assert bf16_logps.dtype == bf16_ent.dtype == torch.float32
    assert not torch.equal(fp32_logps, bf16_logps)
    assert (fp32_logps - bf16_logps).abs().mean() < 0.1
    assert (fp32_ent - bf16_ent).abs().mean() < 0.1

    # the gradient reaches the float32 adapter through the bf16 pass
    logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids["input_ids"], ids["attention_mask"], 4)
    (-logps.mean()).backward()
    grads = [p.grad for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    trainer.model.zero_grad()

    trainer.train()  # and a whole bf16 step through TRL's loss, stored
    loss = trainer.state.log_history[0]["loss"]
    assert loss == loss  # not NaN
    stored = list(session.store.iter_rollouts(run_id=session.run_id))
    assert len(stored) == 4
    # sampled by train/sampler.py: one decode pass per token of the longest completion, 4 rows at first
    assert trainer.decode_sizes[0] == 4 and len(trainer.decode_sizes) >= max(r.rollout.num_tokens for r in stored)
