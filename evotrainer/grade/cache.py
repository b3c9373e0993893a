"""Grade each (task, patch) pair once: an in-memory LRU in front of an optional SQLite file.

The key is the task's fingerprint (instance id, repo snapshot, tests, grader version) plus the
SHA-256 of the patch. The SQLite file is shared by worker processes (each opens its own
connection). Results of kind `error` (the grader or machine failed, not the patch) are never
stored, so a rerun retries them.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evotrainer.sqlite_file import SQLiteFile


def patch_digest(patch: str) -> str:
    return hashlib.sha256(patch.encode("utf-8", "surrogatepass")).hexdigest()


class GradeCache:
    """get/put of JSON-able results by key; `path` is a folder for `grades.sqlite` (None: memory only)."""

    def __init__(self, path: Path | str | None = None, maxsize: int = 4096) -> None:
        self.maxsize = maxsize
        self.path = Path(path) / "grades.sqlite" if path is not None else None
        self._mem: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = SQLiteFile(self.path, "CREATE TABLE IF NOT EXISTS grades "
                                               "(key TEXT PRIMARY KEY, result TEXT NOT NULL)")
            self._db()

    @staticmethod
    def key(task_fingerprint: str, patch: str) -> str:
        return f"{task_fingerprint}:{patch_digest(patch)}"

    def _db(self) -> sqlite3.Connection:
        return self._file.conn()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            if key in self._mem:
                self._mem.move_to_end(key)
                self.hits += 1
                return self._mem[key]
            if self.path is not None:
                row = self._db().execute("SELECT result FROM grades WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    value = json.loads(row[0])
                    self._remember(key, value)
                    self.hits += 1
                    return value
            self.misses += 1
            return None

    def put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._remember(key, value)
            if self.path is not None:
                db = self._db()
                db.execute("INSERT OR REPLACE INTO grades (key, result) VALUES (?, ?)", (key, json.dumps(value)))
                db.commit()

    def _remember(self, key: str, value: dict[str, Any]) -> None:
        self._mem[key] = value
        self._mem.move_to_end(key)
        while len(self._mem) > self.maxsize:
            self._mem.popitem(last=False)

    def get_or_compute(self, key: str, compute: Callable[[], dict[str, Any]],
                       storable: Callable[[dict[str, Any]], bool] = lambda v: True) -> tuple[dict[str, Any], bool]:
        """(value, was_cached)."""
        hit = self.get(key)
        if hit is not None:
            return hit, True
        value = compute()
        if storable(value):
            self.put(key, value)
        return value, False

    def close(self) -> None:
        if self.path is not None:
            self._file.close()
