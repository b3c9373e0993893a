"""Generation backends for evaluation: one Protocol, a name registry, and the checks that say
plainly why a backend cannot run on this machine.

Three backends: `hf` (transformers generate, the CPU default), `vllm` (a vllm.LLM engine with the
round's LoRA adapter as a LoRARequest) and `openai` (any OpenAI-compatible server, e.g.
`vllm serve --enable-lora` with runtime adapter loading). All decode greedily, so a held-out
score depends on the weights, not on the backend's sampling.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from evotrainer.policy.embedded import PolicyError


class BackendUnavailable(PolicyError):
    """The configured backend cannot run here (no CUDA, package missing, no server URL)."""


class Generation(NamedTuple):
    text: str
    truncated: bool  # stopped at max_new_tokens, not at end-of-turn
    num_tokens: int


class GenerationBackend(Protocol):
    """Greedy completions of single-turn chat prompts (the user message text), in order."""

    name: str

    def use_adapter(self, adapter: str | Path | None) -> None:
        """Generate with this LoRA adapter (PEFT folder) from now on; None: the base model."""

    def generate(self, prompts: Sequence[str], max_new_tokens: int,
                 on_batch: Callable[[int], None] | None = None) -> list[Generation]:
        ...


# name -> "module:Class"; imported on use, so `hf` never imports vllm and `vllm` never needs a server
BACKENDS: dict[str, str] = {
    "hf": "evotrainer.policy.hf_backend:HFBackend",
    "vllm": "evotrainer.policy.vllm_backend:VLLMBackend",
    "openai": "evotrainer.policy.openai_backend:OpenAIBackend",
}


def get_backend(name: str, **kwargs) -> GenerationBackend:
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown generation backend {name!r}; known: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)


def require_vllm(what: str = "policy.backend=vllm") -> None:
    """vLLM needs an NVIDIA GPU and the `gpu` extra; say which one is missing."""
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"{what} needs a CUDA GPU and torch sees none on this machine; "
            "use policy.backend=hf (the CPU default) or run on a GPU machine")
    if importlib.util.find_spec("vllm") is None:
        raise BackendUnavailable(
            f"{what} needs vLLM: pip install 'evotrainer[gpu]' (pins vLLM to the range TRL supports)")


# vLLM allocates LoRA slots for a fixed set of ranks; an adapter's rank must fit under one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as max_lora_rank that holds an adapter of `rank`."""
    for r in VLLM_LORA_RANKS:
        if rank <= r:
            return r
    raise BackendUnavailable(f"LoRA rank {rank} exceeds vLLM's largest supported rank {VLLM_LORA_RANKS[-1]}")
