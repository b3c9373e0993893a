"""JSON state files written so that a kill never leaves half of one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_json(path: Path | str, data: Any, **dumps: Any) -> None:
    """Write `data` as JSON to a temp file beside `path`, then rename it over `path`.

    Each call has its own temp file, so processes writing one file at once (the ranks of a
    distributed launch) each leave a whole file and the last rename wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes it 0600; keep the mode a plain write gives
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, **dumps) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read {what}: {exc}") from None


def _lines(path: Path, text: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise ValueError(f"{where}: not valid JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        yield where, lineno, row


def iter_jsonl(path: Path | str, what: str = "JSONL") -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(`file:line`, line number, object) for each non-blank line of a JSONL file.

    The one JSONL reader: ValueError names the file and line of the first line that is not a
    JSON object, and a file that cannot be read."""
    path = Path(path)
    yield from _lines(path, _read(path, what))


def read_records(path: Path | str, what: str = "JSONL") -> list[tuple[str, dict[str, Any]]]:
    """The objects of a JSONL file, or of a file holding one JSON list, each with where it sits."""
    path = Path(path)
    text = _read(path, what)  # read once, whichever form it has
    if not text.lstrip().startswith("["):
        return [(where, row) for where, _, row in _lines(path, text)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
    rows = [(f"{path}[{i}]", r) for i, r in enumerate(data)]
    for where, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return rows
