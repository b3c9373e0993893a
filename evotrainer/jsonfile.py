"""JSON state files written so that a kill never leaves half of one."""

from __future__ import annotations

import json
import os
import tempfile
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
