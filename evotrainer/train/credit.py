"""Step-level credit (self-attributing): judge step labels -> per-token advantages for GRPO.

For one group, with GOOD = +1 and BAD = -1 per assistant step:

1. z-score the step labels of all the group's labelled rollouts together (population std; an
   all-equal group gives z = 0, so the labels add nothing where they cannot tell steps apart);
2. step reward r_t = alpha * z_t, and the outcome advantage A (TRL's group-normalised one) is added
   at the last step: r_T += A;
3. the advantage of step t is the suffix sum sum_{s >= t} r_s;
4. each step's advantage is broadcast to that step's tokens.

Steps inside one TRL completion are the runs of model tokens between tool results (`tool_mask`);
without tools a completion is one step. A rollout without labels, or whose label count does not
match its steps, keeps its sequence advantage on every token (plain GRPO). Simplifications against
AgentEvolver: no decay of alpha over training, no discount in the suffix sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evotrainer.harness.errors import HarnessError
from evotrainer.harness.spec import validate_spec

LABEL_VALUES = {"GOOD": 1.0, "BAD": -1.0}
EPS = 1e-8
SPEC_KEY = "step_credit"  # harness.yaml section


@dataclass(frozen=True)
class StepCreditSpec:
    """harness.yaml `step_credit: {enabled: false, alpha: 0.1}`."""

    enabled: bool = False
    alpha: float = 0.1

    @classmethod
    def from_raw(cls, raw: Any) -> StepCreditSpec:
        """A `step_credit` section validated as harness.yaml's loader does (ValueError if bad)."""
        try:
            return cls(**validate_spec({SPEC_KEY: raw}).step_credit)
        except HarnessError as exc:
            raise ValueError(str(exc)) from None


def label_values(labels: Any) -> list[float] | None:
    """GOOD/BAD strings (or +1/-1 numbers) as floats; None if any label is unreadable."""
    if not isinstance(labels, (list, tuple)) or not labels:
        return None
    out = []
    for v in labels:
        if isinstance(v, str) and v.strip().upper() in LABEL_VALUES:
            out.append(LABEL_VALUES[v.strip().upper()])
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(max(-1.0, min(1.0, float(v))))
        else:
            return None
    return out


def step_advantages(labels: Sequence[Sequence[float] | None], outcome: Sequence[float],
                    alpha: float) -> list[list[float]]:
    """Per-step advantages of one group (see the module docstring); unlabelled: [outcome]."""
    if len(labels) != len(outcome):
        raise ValueError(f"{len(labels)} label lists for {len(outcome)} outcome advantages")
    flat = [x for steps in labels if steps for x in steps]
    mean = sum(flat) / len(flat) if flat else 0.0
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / len(flat)) if flat else 0.0
    out = []
    for steps, adv in zip(labels, outcome):
        if not steps:
            out.append([float(adv)])
            continue
        rewards = [alpha * ((x - mean) / std if std > EPS else 0.0) for x in steps]
        rewards[-1] += float(adv)
        suffix, acc = [], 0.0
        for r in reversed(rewards):
            acc += r
            suffix.append(acc)
        out.append(suffix[::-1])
    return out


def step_spans(completion_mask: Sequence[int], tool_mask: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """[start, end) of each run of model tokens in the real (unpadded) part of a completion."""
    length = max((i + 1 for i, m in enumerate(completion_mask) if m), default=0)
    model = [1] * length if tool_mask is None else [int(tool_mask[i]) for i in range(length)]
    spans, start = [], None
    for i, m in enumerate(model):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, length))
    return spans


def broadcast(step_adv: Sequence[float], spans: Sequence[tuple[int, int]], width: int) -> list[float]:
    """One value per token: step k's advantage on span k; a single value on every token."""
    if len(step_adv) == 1:
        return [float(step_adv[0])] * width
    row = [0.0] * width  # tool-result and padding tokens are masked out of the loss anyway
    for adv, (start, end) in zip(step_adv, spans):
        row[start:end] = [float(adv)] * (end - start)
    return row


Labeller = Callable[[Any, list[str]], "list[str] | None"]  # (rollout, step texts) -> labels


class StepCredit:
    """The trainer-side hook: a (B, T) advantage tensor from a batch's step labels."""

    def __init__(self, spec: StepCreditSpec, labeller: Labeller | None = None) -> None:
        self.spec, self.labeller = spec, labeller
        self.last_stats: dict[str, int] = {}
        self.last_labels: dict[int, Any] = {}  # row -> labels the labeller gave this batch (to store)

    @classmethod
    def from_harness(cls, harness: Any, labeller: Labeller | None = None) -> StepCredit:
        return cls(StepCreditSpec(**harness.spec.step_credit), labeller)  # validated at load

    @property
    def enabled(self) -> bool:
        return self.spec.enabled

    def advantages(self, output: Mapping[str, Any], rollouts: Sequence[Any], group_size: int,
                   decode: Callable[[list[int]], str] | None = None):
        """`output` is TRL's batch dict (advantages (B,), completion_mask, optional tool_mask,
        completion_ids); `rollouts` the batch's api.Rollouts in the same order."""
        import torch

        adv = output["advantages"]
        cmask, tmask = output["completion_mask"].tolist(), output.get("tool_mask")
        tmask = tmask.tolist() if tmask is not None else None
        ids = output["completion_ids"].tolist()
        outcome = adv.tolist()
        spans, labels = [], []
        self.last_labels = {}
        for i, rollout in enumerate(rollouts):
            row_spans = step_spans(cmask[i], tmask[i] if tmask is not None else None)
            spans.append(row_spans)
            raw = rollout.meta.get("step_labels")
            if raw is None and self.labeller is not None and row_spans and decode is not None:
                raw = self.labeller(rollout, [decode(ids[i][s:e]) for s, e in row_spans])
                if raw is not None:
                    self.last_labels[i] = raw
            values = label_values(raw)
            labels.append(values if values is not None and len(values) == len(row_spans) else None)
        rows = []
        for start in range(0, len(outcome), group_size):
            group = step_advantages(labels[start:start + group_size], outcome[start:start + group_size],
                                    self.spec.alpha)
            rows += [broadcast(a, spans[start + j], len(cmask[start + j])) for j, a in enumerate(group)]
        self.last_stats = {"labelled": sum(x is not None for x in labels), "rollouts": len(labels)}
        return torch.tensor(rows, dtype=adv.dtype, device=adv.device)


__all__ = ["EPS", "LABEL_VALUES", "SPEC_KEY", "StepCredit", "StepCreditSpec", "broadcast", "label_values",
           "step_advantages", "step_spans"]
