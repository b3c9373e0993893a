"""train.decode_weights (train/decode_weights.py) on the embedded model with a real peft adapter:
the same function with the adapter merged and the weights laid out (in, out), every weight given
back bit for bit, the copies a cache keeps, and the adapters it leaves unmerged."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from evotrainer.train.decode_weights import decoding_weights, lora_layers

PROMPT = "What is 17 + 25? Reply with the number only."


@pytest.fixture(scope="module")
def base(embedded_model_dir):
    from evotrainer.policy import load_policy

    return load_policy(str(embedded_model_dir))


def _peft(base_model, **kw):
    torch.manual_seed(0)
    model = get_peft_model(base_model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                  task_type="CAUSAL_LM", **kw))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a fresh adapter's B is zero: give it something to merge
            p.data.normal_(0, 0.02)
    return model


@pytest.fixture
def adapted(base):
    model, tokenizer = base
    peft_model = _peft(model)
    yield peft_model, tokenizer
    peft_model.unload()  # the base model's own layers again, for the next test


def _logits(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits


def _snapshot(model):
    return {n: (p.data_ptr(), p.stride(), p.detach().clone()) for n, p in model.named_parameters()}


def _unchanged(model, before) -> bool:
    return all((p.data_ptr(), p.stride()) == before[n][:2] and torch.equal(p, before[n][2])
               for n, p in model.named_parameters())


def _base_linears(model):
    parts = {id(x) for m in lora_layers(model) for d in (m.lora_A, m.lora_B) for x in d.values()}
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m) not in parts]


def test_decoding_weights_are_the_same_function_and_are_given_back(adapted):
    model, tokenizer = adapted
    model.train()
    before = _snapshot(model)
    plain = _logits(model, tokenizer)
    with decoding_weights(model) as merged:
        assert merged
        inside = _logits(model, tokenizer)
        assert all(m.disable_adapters for m in lora_layers(model))
        linears = _base_linears(model)
        assert len(linears) > 200 and all(m.weight.stride() == (1, m.weight.shape[0]) for m in linears)
        assert not _unchanged(model, before)  # the merged, laid-out weights are what runs
    assert _unchanged(model, before)
    assert not any(m.disable_adapters for m in lora_layers(model))
    assert torch.allclose(inside, plain, atol=2e-4, rtol=0)
    with model.disable_adapter():  # the adapter matters here, so the check above has teeth
        assert not torch.allclose(_logits(model, tokenizer), plain, atol=2e-4, rtol=0)


def test_an_error_inside_gives_the_weights_back(adapted):
    model, _ = adapted
    before = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom"), decoding_weights(model):
        raise RuntimeError("boom")
    assert _unchanged(model, before)
    assert not any(m.disable_adapters for m in lora_layers(model))


def test_the_gradient_after_decoding_is_the_plain_one(adapted):
    model, tokenizer = adapted
    model.train()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids

    def grads():
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain = grads()
    with decoding_weights(model):
        _logits(model, tokenizer)
    after = grads()
    assert plain.keys() == after.keys() and all(torch.equal(plain[n], after[n]) for n in plain)


def test_a_cache_keeps_the_copies_and_follows_the_adapter(adapted):
    """The base weights' (in, out) copies are made once per cache; a merged weight follows the
    adapter as it trains, and a base weight changed in place gets a fresh copy."""
    model, tokenizer = adapted
    model.eval()
    cache: dict = {}
    with decoding_weights(model, cache=cache):
        first = _logits(model, tokenizer)
    copies = {k: v.data_ptr() for k, v in cache.items()}
    assert len(copies) == len(_base_linears(model))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(3.0)  # an optimizer step, in effect
    with decoding_weights(model, cache=cache):
        stepped = _logits(model, tokenizer)
    assert {k: v.data_ptr() for k, v in cache.items()} == copies  # the same copies, no new ones
    assert torch.allclose(stepped, _logits(model, tokenizer), atol=2e-4, rtol=0)
    assert not torch.allclose(stepped, first, atol=2e-4, rtol=0)
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.mul_(1.5)  # also the tied input embedding
    try:
        with decoding_weights(model, cache=cache):
            scaled = _logits(model, tokenizer)
        assert torch.allclose(scaled, _logits(model, tokenizer), atol=2e-4, rtol=0)
        assert len(cache) == len(copies) + 1
    finally:
        with torch.no_grad():
            head.weight.div_(1.5)


@pytest.mark.parametrize("kw, training", [({"use_dora": True}, False), ({"lora_dropout": 0.1}, True)])
def test_what_it_cannot_merge_runs_unmerged_on_laid_out_weights(base, kw, training):
    model, tokenizer = base
    peft_model = _peft(model, **kw)
    try:
        peft_model.train(training)
        before = _snapshot(peft_model)
        plain = _logits(peft_model.eval(), tokenizer) if not training else None
        with decoding_weights(peft_model) as merged:
            assert not merged
            assert not any(m.disable_adapters for m in lora_layers(peft_model))
            assert all(m.weight.stride() == (1, m.weight.shape[0]) for m in _base_linears(peft_model))
            if plain is not None:
                assert torch.allclose(_logits(peft_model, tokenizer), plain, atol=2e-4, rtol=0)
        assert _unchanged(peft_model, before)
    finally:
        peft_model.unload()


def test_dropout_in_eval_mode_merges_and_switching_off_does_nothing(base):
    model, tokenizer = base
    peft_model = _peft(model, lora_dropout=0.1)
    try:
        peft_model.eval()
        with decoding_weights(peft_model) as merged:
            assert merged
        before = _snapshot(peft_model)
        with decoding_weights(peft_model, enabled=False) as merged:
            assert not merged
            assert _unchanged(peft_model, before)
    finally:
        peft_model.unload()
    plain = _logits(model, tokenizer)
    with decoding_weights(model) as merged:  # no adapter: only the layout
        assert not merged
        assert torch.allclose(_logits(model, tokenizer), plain, atol=2e-4, rtol=0)
