"""Per-rollout model-state statistics of a GRPO generation batch, for the model_state probes.

TRL logs `entropy` and `kl` only as batch means, from inside the loss (GRPOTrainer._compute_loss),
and the recorder stores each rollout before the loss runs. So right after generation one no-grad
forward pass of the policy over the batch, through TRL's own `_get_per_token_logps_and_entropies`
(the fused LM head at the sampling temperature), gives every rollout its means over the tokens
the loss counts (completion_mask, times tool_mask for agent traces):

    mean_logprob  log-probability of the sampled tokens
    entropy       entropy of the next-token distribution
    kl            TRL's k3 estimate of KL(policy || reference), the estimator of its KL term

The reference log-probs are TRL's own when beta > 0 (it computed them for the loss); with beta 0
TRL has none, and one more pass with the LoRA adapter switched off gives the base model's. With
the parameters unchanged between this pass and the first loss pass, the token-weighted mean of
`entropy` over a step is the `entropy` TRL logs for it. Cost: one or two forward passes per
generation batch, no backward. A row without loss tokens (mask_truncated_completions) gets none.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch

# Model inputs TRL's forward takes besides the ids (images, for a vision model); passed through.
_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def sample_stats(trainer, output: dict[str, Any]) -> list[dict[str, float]]:
    """One dict per row of `output` (what GRPOTrainer._generate_and_score_completions returned)."""
    from trl.models.utils import disable_gradient_checkpointing

    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    width = output["completion_ids"].size(1)
    mask = output["completion_mask"]
    if output.get("tool_mask") is not None:
        mask = mask * output["tool_mask"]
    extra = {k: output[k] for k in _FORWARD_KEYS if k in output}
    batch = trainer.args.per_device_train_batch_size

    def logps(**kwargs):
        return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width,
                                                          batch_size=batch, **extra, **kwargs)

    # fork_rng: a dropout layer in this pass must not move the random stream training goes on with
    with torch.no_grad(), _fork_rng(ids.device), \
            disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        policy, entropies, _ = logps(compute_entropy=True)
        ref = output.get("ref_per_token_logps")
        if ref is None:
            with _reference(trainer) as found:
                ref = logps()[0] if found else None
    columns = {"mean_logprob": policy, "entropy": entropies}
    if ref is not None:
        delta = ref - policy
        columns["kl"] = torch.exp(delta) - delta - 1
    weights = mask.float()
    count = weights.sum(dim=1)
    means = {key: ((value.float() * weights).sum(dim=1) / count.clamp(min=1)).tolist()
             for key, value in columns.items()}
    rows = []
    for i, n in enumerate(count.tolist()):
        row = {key: float(values[i]) for key, values in means.items()} if n > 0 else {}
        rows.append({key: value for key, value in row.items() if math.isfinite(value)})
    return rows


def _fork_rng(device: torch.device):
    if device.type == "cuda":
        return torch.random.fork_rng(devices=[device.index if device.index is not None else torch.cuda.current_device()])
    return torch.random.fork_rng(devices=[])


@contextmanager
def _reference(trainer):
    """trainer.model as the reference TRL would use; yields False where there is none (a full
    fine-tune without a reference model)."""
    from accelerate.utils import is_peft_model
    from trl.trainer.utils import use_adapter

    model = trainer.accelerator.unwrap_model(trainer.model)
    if not is_peft_model(model):
        yield False
        return
    # as TRL's own reference: a "ref" adapter when it loaded one, else the adapters switched off
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        yield True
