"""The agent transcript: every tool call and its result, one JSON line each, appended as it happens.

`<workdir>/agent/<run>/round-<k>.jsonl`. Each line is written, flushed and fsynced before the
result goes back to the agent, so a process that dies mid-round leaves every call it answered on
disk. A long value is cut to its first MAX_CHARS characters of JSON and marked, so one huge
rollout or report cannot swell the file; the agent itself still got the whole value.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

MAX_CHARS = 20_000


def transcript_path(workdir: Path | str, run: str, round_index: int) -> Path:
    return Path(workdir) / "agent" / run / f"round-{round_index}.jsonl"


def clip(value: Any, limit: int = MAX_CHARS) -> Any:
    """`value` if its JSON fits in `limit` characters, else a marker holding the JSON's head."""
    text = json.dumps(value, default=str)
    if len(text) <= limit:
        return value
    return {"truncated": True, "chars": len(text), "head": text[:limit]}


class Transcript:
    """Appends one record per call to a round's transcript file."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time": round(time.time(), 3), **record}, default=str)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
