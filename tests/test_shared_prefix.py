"""train.shared_prefix (train/shared_prefix.py) on the embedded model with a real peft adapter:
the same log-probs, entropies and gradients as TRL's own pass over every whole row, with prompts of
different lengths (left padding), repeated prompts and padded completions."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from trl.trainer.utils import add_fused_lm_head

from evotrainer.train.shared_prefix import shared_prefix_logps

QUESTIONS = ["What is 17 + 25? Put the final answer in \\boxed{}.",
             "Solve for x: 3x + 4 = 19, then give x in \\boxed{} and nothing else."]
GROUP, LENGTH = 4, 12


@pytest.fixture(scope="module")
def adapted(embedded_model_dir):
    from evotrainer.policy import load_policy

    model, tokenizer = load_policy(str(embedded_model_dir))
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter's B is zero: give the gradient somewhere to differ
            p.data.normal_(0, 0.02)
    model.train()
    yield model, tokenizer
    model.unload()


def _batch(tokenizer):
    """Two prompts of different lengths, each GROUP times, with completions of random lengths."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in QUESTIONS]
    tokenizer.padding_side = "left"
    prompts = tokenizer(texts, return_tensors="pt", padding=True)
    assert (prompts.attention_mask == 0).any(), "the prompts should need left padding"
    generator = torch.Generator().manual_seed(1)
    rows = 2 * GROUP
    completion = torch.randint(0, 49000, (rows, LENGTH), generator=generator)
    completion_mask = torch.ones_like(completion)
    for row in range(rows):
        completion_mask[row, torch.randint(2, LENGTH, (1,), generator=generator).item():] = 0
    # rows interleaved, as TRL's shuffle leaves them
    order = torch.randperm(rows, generator=generator)
    ids = torch.cat([prompts.input_ids.repeat_interleave(GROUP, 0), completion], 1)[order]
    mask = torch.cat([prompts.attention_mask.repeat_interleave(GROUP, 0), completion_mask], 1)[order]
    return ids, mask


def _trl_pass(model, ids, mask):
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-LENGTH] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -LENGTH:], out.entropy[:, -LENGTH:]


def _run(model, fn):
    model.zero_grad()
    logps, entropy = fn()
    (-logps.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropy.detach(), grads


def test_shared_prefix_matches_trls_pass(adapted):
    model, tokenizer = adapted
    ids, mask = _batch(tokenizer)
    plain = _run(model, lambda: _trl_pass(model, ids, mask))
    shared = _run(model, lambda: shared_prefix_logps(model, ids, mask, LENGTH, 0.7, True))
    scored = mask[:, -LENGTH:].bool()
    assert torch.allclose(plain[0][scored], shared[0][scored], atol=1e-4)
    assert torch.allclose(plain[1][scored], shared[1][scored], atol=1e-4)
    assert plain[0][scored].std() > 1.0  # the log-probs differ from token to token: a real comparison
    assert torch.count_nonzero(shared[0][~scored]) == 0 and torch.count_nonzero(shared[1][~scored]) == 0
    assert plain[2].keys() == shared[2].keys() and any("lora_A" in n for n in shared[2])
    for name, grad in plain[2].items():
        assert grad.norm() > 0
        assert (grad - shared[2][name]).norm() <= 1e-3 * grad.norm(), name


def test_shared_prefix_without_entropy_and_with_one_row_a_prompt(adapted):
    model, tokenizer = adapted
    ids, mask = _batch(tokenizer)
    with torch.no_grad():
        plain, _ = _trl_pass(model, ids, mask)
        # every row's prompt made distinct: nothing shared, completions still scored alone
        distinct = ids.clone()
        distinct[:, -LENGTH - 1] = torch.arange(len(ids))  # a different last prompt token a row
        logps, entropy = shared_prefix_logps(model, distinct, mask, LENGTH, 0.7, False)
        reference, _ = _trl_pass(model, distinct, mask)
    scored = mask[:, -LENGTH:].bool()
    assert entropy is None
    assert torch.allclose(logps[scored], reference[scored], atol=1e-4)
    assert not torch.allclose(logps[scored], plain[scored], atol=1e-2)  # the changed prompts mattered


def test_shared_prefix_declines_a_capped_head_and_a_right_padded_prompt(adapted):
    model, tokenizer = adapted
    ids, mask = _batch(tokenizer)
    right = mask.clone()
    right[0, -LENGTH - 1] = 0
    assert shared_prefix_logps(model, ids, right, LENGTH, 0.7, True) is None
    config = model.get_base_model().config
    config.final_logit_softcapping = 30.0
    try:
        assert shared_prefix_logps(model, ids, mask, LENGTH, 0.7, True) is None
    finally:
        config.final_logit_softcapping = None
