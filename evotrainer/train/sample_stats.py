"""Per-rollout model-state means for the model_state probes, from the forward pass TRL's loss makes anyway.

TRL logs `entropy` and `kl` only as batch means (GRPOTrainer._compute_loss). HarnessGRPOTrainer
keeps the per-token log-probs and entropies of that pass, on its first pass over each row (the
parameters the rollouts were sampled with), and `row_means` reduces them per row over the tokens
the loss counts (completion_mask x tool_mask):

    mean_logprob  log-probability of the sampled tokens (at the sampling temperature)
    entropy       entropy of the next-token distribution
    kl            TRL's k3 estimate of KL(policy || reference); only with beta > 0, where TRL
                  has reference log-probs (a separate pass over the base model would cost as
                  much as the loss's forward pass again)

No extra forward pass: the token-weighted mean over a step is the `entropy` (and `kl`) TRL logs
for it. The prompt is the one the loss sees (experience lessons already stripped). A row out of
the loss (dropped by a harness filter, or truncated under mask_truncated_completions) gets none.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def row_means(logps: torch.Tensor, entropies: torch.Tensor, inputs: dict[str, Any]) -> list[dict[str, float]]:
    """One dict per row of the loss batch `inputs`, from the (B, T) per-token values of its pass."""
    mask = inputs["completion_mask"]
    if inputs.get("tool_mask") is not None:
        mask = mask * inputs["tool_mask"]
    columns = {"mean_logprob": logps, "entropy": entropies}
    ref = inputs.get("ref_per_token_logps")
    if ref is not None:
        delta = ref - logps
        columns["kl"] = torch.exp(delta) - delta - 1
    weights = mask.float()
    count = weights.sum(dim=1)
    means = {key: ((value.detach().float() * weights).sum(dim=1) / count.clamp(min=1)).tolist()
             for key, value in columns.items()}
    rows = []
    for i, n in enumerate(count.tolist()):
        values = {key: float(column[i]) for key, column in means.items()} if n > 0 else {}
        rows.append({key: v for key, v in values.items() if math.isfinite(v)})
    return rows
