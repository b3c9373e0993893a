"""The outer agent's transcripts for the report: every tool call of every round, as it was logged.

`<workdir>/agent/<run>/round-<k>.jsonl` (tools/transcript.py) holds one JSON line per call: the
tool, its arguments, whether it worked and what came back (clipped by the Toolbox). A line
without a `tool` is an event an agent logged (its ending, say) and is shown as it is. A line
that is not JSON (a file cut by a kill) is counted and skipped, so the report still builds.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from evotrainer.workspace import Workspace

SHOWN_CHARS = 4000  # per argument or result cell; the file keeps more
_ROUND_FILE = re.compile(r"round-(\d+)\.jsonl")


def transcripts(ws: Workspace) -> list[dict[str, Any]]:
    """One entry per (run, round) transcript, by run then round."""
    base = ws.root / "agent"
    out = []
    for path in sorted(base.glob("*/round-*.jsonl")) if base.is_dir() else []:
        match = _ROUND_FILE.fullmatch(path.name)
        if match is None:
            continue
        out.append(_one(path, path.parent.name, int(match.group(1))))
    return sorted(out, key=lambda t: (t["run"], t["round"]))


def _one(path: Path, run: str, round_index: int) -> dict[str, Any]:
    calls, events, unreadable = [], [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            unreadable += 1
            continue
        if not isinstance(record, dict):
            unreadable += 1
        elif "tool" in record:
            calls.append(_call(record))
        else:
            events.append(_pretty(record))
    tools = Counter(c["tool"] for c in calls)
    submitted = path.with_name(f"round-{round_index}.submitted.json")
    return {"run": run, "round": round_index, "anchor": f"t-{re.sub(r'[^A-Za-z0-9_-]', '-', run)}-{round_index}",
            "calls": calls, "events": events, "unreadable": unreadable,
            "errors": sum(not c["ok"] for c in calls), "by_tool": tools.most_common(),
            "submitted": _submitted(submitted)}


def _call(record: dict[str, Any]) -> dict[str, Any]:
    ok = bool(record.get("ok"))
    error = record.get("error") if not ok else None
    return {"seq": record.get("seq"), "tool": str(record.get("tool")), "ok": ok,
            "args": _pretty(record.get("args")),
            "result": _pretty(record.get("result")) if ok else "",
            "error_kind": (error or {}).get("kind", "") if isinstance(error, dict) else "",
            "error": (error or {}).get("message", "") if isinstance(error, dict) else _pretty(error),
            "elapsed_s": record.get("elapsed_s")}


def _submitted(path: Path) -> list[str]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [str(c.get("branch", c)) for c in data.get("candidates", [])]
    except (json.JSONDecodeError, AttributeError, TypeError):
        return ["(unreadable submission file)"]


def _pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
    if len(text) > SHOWN_CHARS:
        text = text[:SHOWN_CHARS] + f"\n... ({len(text) - SHOWN_CHARS} more characters in the transcript file)"
    return text


__all__ = ["transcripts"]
