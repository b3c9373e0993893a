"""A small SQLite file beside the store (the grade and rollout caches): one connection per process."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


class SQLiteFile:
    """Opened on first use in WAL mode with its schema; a forked worker gets its own connection,
    since a SQLite connection must not cross a fork."""

    def __init__(self, path: Path, schema: str) -> None:
        self.path, self.schema = Path(path), schema
        self._conn: sqlite3.Connection | None = None
        self._pid = -1

    def conn(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self._conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(self.schema)
            self._conn.commit()
            self._pid = os.getpid()
        return self._conn

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None
