"""The loss's log-prob pass with each distinct prompt run once (`train.shared_prefix`).

A GRPO batch repeats every prompt `num_generations` times (8 in the math seed harness, with two
prompts a step), and TRL's log-prob pass runs the whole `prompt + completion` sequence for every
row. Off a Triton device TRL's fused head also scores every position, prompt positions included,
against the 49k-token vocabulary, and masks the prompt's scores afterwards.

`shared_prefix_logps` runs the backbone over each distinct prompt once (the batch's rows grouped by
their prompt ids and mask), copies that prompt's key/value cache to its rows, runs the completions
on top of it, and scores only the completion positions with TRL's own chunked log-prob kernel. The
cache copies are differentiable, so every row's gradient reaches the prompt's pass and from there
the adapter: the result is the same function of the weights as TRL's pass, up to float rounding
(tests/test_shared_prefix.py compares log-probs, entropies and gradients). Positions are the ones
TRL's pass gives (0..L-1 whatever the padding), since the backbone counts on from the cache.

It declines (returns None, and TRL's pass runs) where the model's forward takes more than ids and a
mask (images, token types), has no key/value cache to continue from, or has a prompt padded on the
right (TRL pads prompts on the left).
"""

from __future__ import annotations

import torch


def shared_prefix_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        temperature: float, compute_entropy: bool):
    """Per-token log-probs (and entropies) of the last `logits_to_keep` tokens of each row, as TRL's
    `_get_per_token_logps_and_entropies` gives them: (B, logits_to_keep), zero where the mask is."""
    from trl.kernels import ChunkedLogProbFunction

    from evotrainer.train.batcher import cache_kwarg

    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(causal_lm, causal_lm.base_model_prefix, None)
    head = causal_lm.get_output_embeddings()
    if backbone is None or head is None or logits_to_keep >= input_ids.size(1):
        return None
    config = causal_lm.config.get_text_config()
    if any(getattr(config, name, None) not in (None, 1.0) for name in _SCALED_HEADS):
        return None  # heads that scale or cap their logits go through TRL's own pass

    split = input_ids.size(1) - logits_to_keep
    if not attention_mask[:, split - 1].all():
        return None  # a prompt padded on the right: its last hidden state would be a pad's
    prompts = torch.cat([input_ids[:, :split], attention_mask[:, :split]], dim=1)
    distinct, row_prompt = torch.unique(prompts, dim=0, return_inverse=True)
    prompt_out = backbone(input_ids=distinct[:, :split], attention_mask=distinct[:, split:], use_cache=True)
    cache = prompt_out.past_key_values
    if cache is None:
        return None
    cache.reorder_cache(row_prompt)  # each row gets its prompt's keys and values (index_select: differentiable)
    completion = input_ids[:, split:]
    completion_out = backbone(input_ids=completion, attention_mask=attention_mask, use_cache=True,
                              **{cache_kwarg(): cache})
    # token t is scored from the hidden state before it: the prompt's last one, then the completion's own
    hidden = torch.cat([prompt_out.last_hidden_state[row_prompt, -1:], completion_out.last_hidden_state[:, :-1]],
                       dim=1)
    scored = attention_mask[:, split:].bool()
    outputs = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
    log_probs, entropy, *_ = ChunkedLogProbFunction.apply(
        hidden[scored], head.weight, head.bias, completion[scored], temperature, _CHUNK, None, 1.0, outputs)
    logps = log_probs.new_zeros(scored.shape).masked_scatter(scored, log_probs)
    entropies = None if entropy is None else entropy.new_zeros(scored.shape).masked_scatter(scored, entropy)
    return logps, entropies


_SCALED_HEADS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                 "logits_scaling")
_CHUNK = 32768  # vocabulary columns a tile of the chunked kernel holds (TRL's own default)

__all__ = ["shared_prefix_logps"]
