"""Generation's own view of the weights (`train.decode_weights`): LoRA merged, laid out for decoding.

Two things make a decode pass on a CPU slower than it has to be, and `decoding_weights` undoes
both for as long as it is entered (training rollouts, the agent's episodes, held-out evaluation):

- **The adapter runs beside every layer.** peft's LoRA layer runs the base layer, then two more
  matmuls, a scaling and an add, on each of the embedded model's 210 adapted layers. Inside, each
  adapted layer's base weight is W + scale * B @ A and the adapters are switched off: the same
  function with one matmul a layer.
- **MKL multiplies a few rows by an (out, in) weight slowly.** `F.linear` computes x @ W.T; with
  the 16 rows of a decode pass and W stored (out, in), MKL's sgemm reached 33 GFLOPS on a 2-core
  Xeon, and 165 with the same W stored (in, out), i.e. as the transpose of a contiguous tensor
  (`bench/step_profile.py` has the figures for a step). Inside, every linear weight on a CPU is
  such a view. A trainer's base weights are frozen for its round, so it passes a `cache` in which
  each weight's (in, out) copy is made once (about 0.5 GB for the embedded model); a merged weight
  is that copy plus the delta, one pass over the layer's weights a call. Without a cache (one
  evaluation) the copies are made on the way in.

The original tensors are kept aside, never changed: on the way out each weight gets its own
tensor back, bit for bit, so the loss and the optimizer see exactly the weights they would have.
The values inside differ from the unmerged computation by float rounding only; a sampled token
differs only where two candidates tie to within it.

An adapter this cannot merge exactly (DoRA and other variants, a LoRA bias, an embedding or
convolution adapter, dropout in training mode) is left running unmerged; the base weights are
still laid out. Off a CPU the context does nothing: cuBLAS takes either layout, and a merged copy
would double the adapted weights' memory on the card.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def lora_layers(model) -> list:
    """The model's LoRA layers (peft's LoraLayer), [] for a model without adapters."""
    try:
        from peft.tuners.lora.layer import LoraLayer
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def _mergeable(layer, training: bool) -> bool:
    import torch
    from peft.tuners.lora.layer import Linear

    if type(layer) is not Linear or layer.merged or getattr(layer, "disable_adapters", False) \
            or layer.fan_in_fan_out or not isinstance(layer.get_base_layer(), torch.nn.Linear):
        return False
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if name in getattr(layer, "lora_variant", {}) or layer.lora_bias.get(name):
            return False
        if training and not isinstance(layer.lora_dropout[name], torch.nn.Identity):
            return False
    return True


def _adapters(layers) -> dict:
    """id(base nn.Linear) -> [(A, B, scale)] of its active adapters: the delta is scale * B @ A."""
    out = {}
    for layer in layers:
        parts = [(layer.lora_A[n].weight, layer.lora_B[n].weight, layer.scaling[n])
                 for n in layer.active_adapters if n in layer.lora_A]
        if parts:
            out[id(layer.get_base_layer())] = parts
    return out


def _merged(weight, parts, cache: dict | None):
    """`weight` plus its adapters' deltas: the (in, out) copy plus each scale * A.T @ B.T, as its
    (out, in) view."""
    import torch

    laid = _input_major(weight, cache)
    for a, b, s in parts:
        laid = torch.addmm(laid, a.t().to(weight.dtype), b.t().to(weight.dtype), alpha=s)
    return laid.t()


def _input_major(weight, cache: dict | None):
    """The (in, out) contiguous copy of `weight`, from `cache` when it holds one of this tensor."""
    key = (id(weight), weight.data.data_ptr(), weight._version, tuple(weight.shape))
    if cache is not None and key in cache:
        return cache[key]
    copy = weight.data.t().contiguous()
    if cache is not None:
        cache[key] = copy
    return copy


@contextlib.contextmanager
def decoding_weights(model, enabled: bool = True, cache: dict | None = None) -> Iterator[bool]:
    """Within it the model computes with its active LoRA adapters merged into the base weights
    and every linear weight laid out (in, out); yields whether it merged an adapter. `enabled`
    false, or a model off the CPU: the model as it is. `cache`: a dict the caller keeps while the
    model's base weights stay as they are (a trainer, for its round), so their copies are made
    once."""
    import torch

    if not enabled or any(p.device.type != "cpu" for p in model.parameters()):
        yield False
        return
    layers = lora_layers(model)
    merge = bool(layers) and hasattr(model, "disable_adapter") and all(_mergeable(m, model.training) for m in layers)
    adapter_parts = {id(part) for layer in layers for parts in (layer.lora_A, layer.lora_B) for part in parts.values()}
    kept: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}  # id(weight) -> (weight, its own tensor)
    try:
        with torch.no_grad():
            adapters = _adapters(layers) if merge else {}
            for module in model.modules():
                if not isinstance(module, torch.nn.Linear) or id(module) in adapter_parts \
                        or id(module.weight) in kept:  # a weight two layers share is laid out once
                    continue
                weight, parts = module.weight, adapters.get(id(module), [])
                laid = _merged(weight, parts, cache) if parts else _input_major(weight, cache).t()
                kept[id(weight)] = (weight, weight.data)
                weight.data = laid
        with model.disable_adapter() if merge else contextlib.nullcontext():
            yield merge
    finally:
        for weight, original in kept.values():
            weight.data = original


__all__ = ["decoding_weights", "lora_layers"]
