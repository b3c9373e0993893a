"""Held-out evaluation: greedy decoding, fixed seeds, the trusted check, nothing from the harness
but the prompt template and the completion length."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from evotrainer.domains.base import Domain, Task
from evotrainer.harness.loader import Harness


@dataclass
class EvalResult:
    seed: int
    n: int
    successes: int
    kinds: Counter = field(default_factory=Counter)

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0


def chat_prompt(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def generate_greedy(model, tokenizer, prompts: Sequence[str], max_new_tokens: int,
                    batch_size: int, on_batch: Callable[[int], None] | None = None):
    """Return [(text, truncated, num_tokens)] for chat-formatted prompts, greedy decoded."""
    import torch

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
    out: list[tuple[str, bool, int]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            enc = tokenizer(list(chunk), return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     use_cache=True, pad_token_id=tokenizer.pad_token_id)
            for row in ids[:, enc["input_ids"].shape[1]:].tolist():
                end = next((i for i, t in enumerate(row) if t in eos_ids), None)
                body = row if end is None else row[:end]
                text = tokenizer.decode(body, skip_special_tokens=True)
                out.append((text, end is None, len(body) + (0 if end is None else 1)))
            if on_batch:
                on_batch(len(chunk))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
        if checkpointing:
            base.gradient_checkpointing_enable()
    return out


def evaluate(model, tokenizer, domain: Domain, harness: Harness, tasks: Sequence[Task], *,
             seed: int, max_new_tokens: int, batch_size: int,
             on_batch: Callable[[int], None] | None = None) -> EvalResult:
    import torch

    torch.manual_seed(seed)
    prompts = [chat_prompt(tokenizer, harness.render_prompt(question=t.prompt)) for t in tasks]
    result = EvalResult(seed=seed, n=len(tasks), successes=0)
    for task, (text, truncated, _) in zip(
        tasks, generate_greedy(model, tokenizer, prompts, max_new_tokens, batch_size, on_batch)
    ):
        outcome = domain.check(task, text, truncated)
        result.successes += int(outcome.success)
        result.kinds[outcome.kind] += 1
    return result
