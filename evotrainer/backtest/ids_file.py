"""`--rollouts ids=@FILE`: one rollout id a line, checked line by line without echoing the file.

A path typed by mistake (a key file, a config) must not be printed back in an error, so each
message names the file and line and says what is wrong, never what the line holds. Blank lines
and lines starting with `#` are skipped. The file is at most MAX_BYTES (64 MiB), a line 4 KiB.
"""

from __future__ import annotations

import re
from pathlib import Path

from evotrainer.store import ROLLOUT_ID_CHARS

MAX_BYTES = 64 * 2**20
_ID_CHARS = ROLLOUT_ID_CHARS
_LINE = 4096  # bytes: a line is read this far at most (an id, or a comment)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def read_ids(path: Path) -> tuple[str, ...]:
    """The ids listed in `path`; ValueError `PATH:LINE: what is wrong` for the first bad line."""
    if not path.is_file():
        raise ValueError(f"ids file not found: {path}")
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"{path}: over {MAX_BYTES // 2**20} MiB; an ids file holds one rollout id a line")
    ids, size = [], 0
    with open(path, "rb") as f:
        # Counted as read too: files under /proc report a size of 0 whatever they hold.
        for number, raw in enumerate(iter(lambda: f.readline(_LINE + 1), b""), 1):
            size += len(raw)
            if size > MAX_BYTES:
                raise ValueError(f"{path}: over {MAX_BYTES // 2**20} MiB; an ids file holds one rollout id a line")
            if len(raw) > _LINE:
                raise ValueError(f"{path}:{number}: over {_LINE} bytes, longer than any rollout id")
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{number}: not valid UTF-8 text") from None
            if not line or line.startswith("#"):
                continue
            if _CONTROL.search(line):
                raise ValueError(f"{path}:{number}: holds a control character, so it is not a rollout id")
            if len(line) > _ID_CHARS:
                raise ValueError(f"{path}:{number}: {len(line)} characters, longer than any rollout id "
                                 f"({_ID_CHARS})")
            ids.append(line)
    return tuple(ids)


__all__ = ["MAX_BYTES", "read_ids"]
