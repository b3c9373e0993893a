"""A rollout cache: one generation per (model, adapter version, task, seed, sampling parameters),
reused within one model version and never across versions.

The adapter version is a content hash of the LoRA weights (policy.adapter_version), so a new
round's adapter misses every entry of the last one by construction. Greedy decoding does not
depend on the seed, so a greedy key carries none: evaluating the same task under two eval seeds,
or the same adapter again from `evotrainer eval`, generates once. Stored in SQLite beside the
store (`<workdir>/cache/rollouts.sqlite`), or in memory only.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from evotrainer.sqlite_file import SQLiteFile


class Generation(NamedTuple):  # the shape every generation backend returns
    text: str
    truncated: bool
    num_tokens: int


def cache_key(model: str, adapter_version: str, task_id: str, prompt: str, seed: int | None,
              sampling: Mapping[str, Any]) -> str:
    """The key of one generation. The prompt is hashed in too: a harness that renders the same
    task differently generates anew. `seed` is dropped when sampling says do_sample=False."""
    greedy = not sampling.get("do_sample", False)
    payload = {"model": model, "adapter": adapter_version, "task": task_id,
               "prompt": hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest(),
               "seed": None if greedy else seed, "sampling": dict(sorted(sampling.items()))}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class RolloutCache:
    """get/put of generations by key, with the adapter version stored beside each entry."""

    def __init__(self, folder: Path | str | None = None) -> None:
        self.path = Path(folder) / "rollouts.sqlite" if folder is not None else None
        self._mem: dict[str, Generation] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = SQLiteFile(self.path, "CREATE TABLE IF NOT EXISTS generations (key TEXT PRIMARY KEY, "
                                    "adapter TEXT NOT NULL, text TEXT NOT NULL, truncated INTEGER NOT NULL, "
                                    "num_tokens INTEGER NOT NULL)")
            self._db()

    def _db(self) -> sqlite3.Connection:
        return self._file.conn()

    def get(self, key: str) -> Generation | None:
        with self._lock:
            found = self._mem.get(key)
            if found is None and self.path is not None:
                row = self._db().execute("SELECT text, truncated, num_tokens FROM generations WHERE key = ?",
                                         (key,)).fetchone()
                if row is not None:
                    found = Generation(row[0], bool(row[1]), int(row[2]))
                    self._mem[key] = found
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
            return found

    def put(self, key: str, adapter_version: str, gen: Generation) -> None:
        with self._lock:
            self._mem[key] = gen
            if self.path is not None:
                db = self._db()
                db.execute("INSERT OR REPLACE INTO generations VALUES (?, ?, ?, ?, ?)",
                           (key, adapter_version, gen.text, int(gen.truncated), gen.num_tokens))
                db.commit()

    def prune(self, keep_adapter_version: str) -> int:
        """Drop every entry of other model versions (they can never hit again); returns how many."""
        with self._lock:
            self._mem.clear()
            if self.path is None:
                return 0
            db = self._db()
            n = db.execute("DELETE FROM generations WHERE adapter != ?", (keep_adapter_version,)).rowcount
            db.commit()
            return n

    def __len__(self) -> int:
        if self.path is None:
            return len(self._mem)
        return self._db().execute("SELECT COUNT(*) FROM generations").fetchone()[0]

    def close(self) -> None:
        if self.path is not None:
            self._file.close()


class CachedBackend:
    """A generation backend (policy.backends protocol) with the cache in front: a prompt whose key
    is cached is not generated again. Keys carry the model, the adapter version (content hash of
    the adapter set by `use_adapter`), the prompt, the backend's name and max_new_tokens; decoding
    is greedy, so no seed."""

    def __init__(self, inner: Any, cache: RolloutCache, model: str) -> None:
        self.inner, self.cache, self.model = inner, cache, model
        self.name = f"cached-{inner.name}"
        self.version = "base"

    def use_adapter(self, adapter: str | Path | None) -> None:
        from evotrainer.policy import adapter_version

        self.version = adapter_version(adapter)
        self.inner.use_adapter(adapter)

    def generate(self, prompts: Sequence[str], max_new_tokens: int,
                 on_batch: Callable[[int], None] | None = None) -> list[Generation]:
        sampling = {"do_sample": False, "max_new_tokens": int(max_new_tokens), "backend": self.inner.name}
        keys = [cache_key(self.model, self.version, "", p, None, sampling) for p in prompts]
        out: list[Generation | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, g in enumerate(out) if g is None]
        if on_batch and len(missing) < len(prompts):
            on_batch(len(prompts) - len(missing))
        if missing:
            fresh = self.inner.generate([prompts[i] for i in missing], max_new_tokens, on_batch)
            if len(fresh) != len(missing):
                raise RuntimeError(f"{self.inner.name} backend returned {len(fresh)} completions for "
                                   f"{len(missing)} prompts")
            for i, g in zip(missing, fresh):
                gen = Generation(str(g[0]), bool(g[1]), int(g[2]))
                self.cache.put(keys[i], self.version, gen)
                out[i] = gen
        return [g for g in out if g is not None]
