"""The `hf` generation backend: greedy decoding on the in-memory policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from evotrainer.policy.backends import Generation


def chat_prompt(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def generate_greedy(model, tokenizer, prompts: Sequence[str], max_new_tokens: int,
                    batch_size: int, on_batch: Callable[[int], None] | None = None,
                    decode_weights: bool = True) -> list[Generation]:
    """Return [(text, truncated, num_tokens)] for chat-formatted prompts, greedy decoded; `decode_weights`:
    with generation's own view of the weights (train/decode_weights.py)."""
    import torch

    from evotrainer.train.decode_weights import decoding_weights

    eos_ids = {tokenizer.eos_token_id}
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    # A model fresh from the trainer may have gradient checkpointing on, which turns the KV
    # cache off: generation then recomputes the whole prefix for every new token.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = getattr(base, "is_gradient_checkpointing", False)
    if checkpointing:
        base.gradient_checkpointing_disable()
    device = next(model.parameters()).device
    out: list[Generation] = []
    try:
        with decoding_weights(model, decode_weights):
            for start in range(0, len(prompts), batch_size):
                chunk = prompts[start:start + batch_size]
                enc = tokenizer(list(chunk), return_tensors="pt", padding=True, add_special_tokens=False)
                enc = {k: v.to(device) for k, v in enc.items()}
                with torch.no_grad():
                    ids = _greedy(model, enc, max_new_tokens, tokenizer.pad_token_id)
                for row in ids[:, enc["input_ids"].shape[1]:].tolist():
                    end = next((i for i, t in enumerate(row) if t in eos_ids), None)
                    body = row if end is None else row[:end]
                    text = tokenizer.decode(body, skip_special_tokens=True)
                    out.append(Generation(text, end is None, len(body) + (0 if end is None else 1)))
                if on_batch:
                    on_batch(len(chunk))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
        if checkpointing:
            base.gradient_checkpointing_enable()
    return out


def _greedy(model, enc: dict, max_new_tokens: int, pad_token_id: int):
    """`model.generate` greedy, token for token, with a batch that drops each row once it ends
    (train/sampler.py): a held-out batch's answers end at very different lengths."""
    import copy

    from evotrainer.train.sampler import handles, shrinking_generate

    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=max_new_tokens, do_sample=False, use_cache=True, pad_token_id=pad_token_id)
    for knob in ("temperature", "top_p", "top_k", "min_p"):  # sampling knobs: greedy ignores them
        setattr(config, knob, None)
    if set(enc) != {"input_ids", "attention_mask"} or not handles(config):
        return model.generate(**enc, generation_config=config)
    return shrinking_generate(model, enc["input_ids"], enc["attention_mask"], config)


class HFBackend:
    """Generates with the model object it is given. An adapter is evaluated by loading it into
    that object (the trainer's PeftModel, or load_policy(..., adapter)), so `use_adapter` has
    nothing to switch."""

    name = "hf"

    def __init__(self, model, tokenizer, batch_size: int = 32, decode_weights: bool = True):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.decode_weights = decode_weights  # train.decode_weights (train/decode_weights.py)

    def use_adapter(self, adapter: str | Path | None) -> None:
        pass

    def generate(self, prompts: Sequence[str], max_new_tokens: int,
                 on_batch: Callable[[int], None] | None = None) -> list[Generation]:
        texts = [chat_prompt(self.tokenizer, p) for p in prompts]
        return generate_greedy(self.model, self.tokenizer, texts, max_new_tokens, self.batch_size, on_batch,
                               decode_weights=self.decode_weights)
