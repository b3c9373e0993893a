"""Load a policy model and tokenizer, optionally with a LoRA adapter (PEFT format)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from evotrainer.policy.embedded import PolicyError, resolve_model


def load_policy(model_ref: str, adapter: str | Path | None = None, trainable: bool = False):
    """Return (model, tokenizer). With an adapter, the model is a PeftModel."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model_ref)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except OSError as exc:
        raise PolicyError(f"cannot load model {model_ref!r}: {exc}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if adapter is not None:
        from peft import PeftModel

        if not (Path(adapter) / "adapter_config.json").is_file():
            raise PolicyError(f"not a PEFT adapter folder: {adapter}")
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
    return model, tokenizer


def adapter_version(adapter: str | Path | None) -> str:
    """A short content hash that names the policy weights: 'base' without an adapter."""
    if adapter is None:
        return "base"
    digest = hashlib.sha256()
    for f in sorted(Path(adapter).glob("adapter_model.*")):
        digest.update(f.read_bytes())
    return "lora-" + digest.hexdigest()[:12]
