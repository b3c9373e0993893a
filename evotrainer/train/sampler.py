"""Training rollouts' sampling with a batch that shrinks as its rows end (`train.shrink_batch`).

transformers' `generate` keeps every row of the batch in each forward pass until the last row
ends, feeding pad tokens to the rows that already have. On a CPU a decode step's cost grows with
the rows in it (the embedded model on 2 cores: 102 ms a step at 16 rows, 41 ms at 2), and a GRPO
batch's completions are mostly short with a long tail, so most of a step's decode passes ran 16
rows for the few still going. `shrinking_generate` drops a row from the batch, and from the KV
cache, once it has sampled an end token.

The distribution is transformers': the logits processors are built from the same
GenerationConfig fields, in transformers' order (repetition penalty, then temperature, top-k,
top-p, min-p), scores are float32, and a token is drawn from the softmax (argmax when `do_sample`
is false). The draw is by inverse CDF (`draw`): one uniform number a row, found in the running sum
of the row's probabilities. That is the distribution `torch.multinomial` samples, at a fraction of
its cost on a CPU: multinomial draws an exponential for each of the 49k vocabulary entries, 23 ms
a decode pass at 16 rows on 2 cores, an eighth of the pass. The random draws differ from
`generate`'s (other numbers, and each covers only the live rows), so the same seed samples other
completions than `generate` would. A config that asks for anything
else (beams, a minimum length, banned words, a static cache, ...) goes to `generate` unchanged.

The result is what `generate` returns: prompt and completion ids, each row filled with the pad id
after its end token, as wide as the longest row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# GenerationConfig fields (as `to_diff_dict` lists them) this sampler reproduces
_HANDLED = {"max_new_tokens", "do_sample", "pad_token_id", "bos_token_id", "eos_token_id", "temperature", "top_p",
            "top_k", "min_p", "repetition_penalty", "disable_compile", "cache_implementation", "transformers_version",
            "use_cache", "num_beams", "num_return_sequences"}


def handles(config) -> bool:
    """Whether `shrinking_generate` reproduces `config` (else it defers to `generate`)."""
    diff = config.to_diff_dict()
    return (set(diff) <= _HANDLED and config.cache_implementation is None and config.use_cache is not False
            and (config.num_beams or 1) == 1 and (config.num_return_sequences or 1) == 1
            and config.max_new_tokens is not None and config.eos_token_id is not None)


def processors(config) -> list:
    """The logits processors `generate` would apply for `config` (sampling, one beam)."""
    from transformers.generation import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out: list = []
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(penalty=config.repetition_penalty))
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            out.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            out.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
        if config.min_p is not None:
            out.append(MinPLogitsWarper(min_p=config.min_p, min_tokens_to_keep=1))
    return out


def shrinking_generate(model, input_ids, attention_mask, generation_config, sizes: list[int] | None = None):
    """Prompt and completion ids for a left-padded batch, as `model.generate` returns them; each
    decode pass runs only the rows that have not ended. `sizes` gets each pass's row count."""
    import torch

    config = generation_config
    eos = config.eos_token_id
    stop = torch.tensor(eos if isinstance(eos, list) else [eos], device=input_ids.device)
    pad = config.pad_token_id if config.pad_token_id is not None else int(stop[0])
    steps = processors(config)
    rows, width = input_ids.shape
    out = torch.full((rows, width + config.max_new_tokens), pad, dtype=input_ids.dtype, device=input_ids.device)
    out[:, :width] = input_ids
    live = torch.arange(rows, device=input_ids.device)  # the batch's rows, as rows of `out`
    ids, mask = input_ids, attention_mask
    position = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        longest = _decode(model, ids, mask, position, out, live, width, config, steps, stop, sizes)
    return out[:, :width + longest]


def _decode(model, ids, mask, position, out, live, width: int, config, steps: list, stop,
            sizes: list[int] | None) -> int:
    """shrinking_generate's loop: fills `out` and returns the longest completion's length."""
    import torch
    from transformers import DynamicCache

    from evotrainer.train.batcher import cache_kwarg

    cache = DynamicCache()
    longest = 0
    for step in range(config.max_new_tokens):
        if sizes is not None:
            sizes.append(len(live))
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True,
                       logits_to_keep=1, **{cache_kwarg(): cache}).logits
        scores = logits[:, -1].to(dtype=torch.float32)
        if steps:  # what generate's processors see: prompt (with pads) and completion
            seen = out[live, :width + step]
            for p in steps:
                scores = p(seen, scores)
        if config.do_sample:
            new = draw(torch.softmax(scores, dim=-1))
        else:
            new = scores.argmax(dim=-1)
        out[live, width + step] = new
        longest = step + 1
        going = ~torch.isin(new, stop)
        if not going.any():
            break
        if not going.all():  # drop the rows that ended, here and in the cache
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            live, new, mask, position = live[keep], new[keep], mask[keep], position[keep]
        ids = new.unsqueeze(1)
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
        position = position[:, -1:] + 1
    return longest


def draw(probs):
    """One index per row of `probs` (rows of non-negative weights, each with a positive sum), row i
    drawn with probability probs[i, j] / sum(probs[i]): a uniform number scaled to the row's sum,
    searched in its running sum. A zero-weight entry is never drawn (its interval is empty, and the
    search takes the first sum strictly above the number, which stays below the row's total)."""
    import torch

    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # rounding may reach the total
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


@contextlib.contextmanager
def shrinking(model, sizes: list[int] | None = None) -> Iterator[None]:
    """Within it, `model.generate(input_ids=..., attention_mask=..., generation_config=...)` (the
    call TRL's transformers path makes) runs `shrinking_generate` when the config allows it;
    any other call goes to the model's own `generate`."""
    own, had = model.generate, "generate" in vars(model)

    def generate(*args: Any, **kwargs: Any):
        config = kwargs.get("generation_config")
        if args or set(kwargs) != {"input_ids", "attention_mask", "generation_config"} or not handles(config):
            return own(*args, **kwargs)
        return shrinking_generate(model, kwargs["input_ids"], kwargs["attention_mask"], config, sizes)

    model.generate = generate
    try:
        yield
    finally:
        if had:
            model.generate = own
        else:
            del model.generate  # the class's method again


__all__ = ["draw", "handles", "processors", "shrinking", "shrinking_generate"]
