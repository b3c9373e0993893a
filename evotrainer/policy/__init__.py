"""The policy: the embedded default model, any HF model, and LoRA adapters."""

from evotrainer.policy.embedded import PolicyError, evotrainer_home, resolve_model
from evotrainer.policy.load import adapter_version, load_policy

__all__ = ["PolicyError", "adapter_version", "evotrainer_home", "load_policy", "resolve_model"]
