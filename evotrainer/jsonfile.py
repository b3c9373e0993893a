"""JSON state files written so that a kill never leaves half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path | str, data: Any, **dumps: Any) -> None:
    """Write `data` as JSON to a temp file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, **dumps) + "\n")
    os.replace(tmp, path)
