"""Named crash points, so tests can kill a real run at an exact place and check that it resumes.

`EVOTRAINER_CRASH_AT=NAME[:QUALIFIER][@N]` kills the whole process group with SIGKILL (what
`kill -9 -PGID` does) the N-th time (default 1) this process passes the point NAME, or NAME with
that qualifier (a run name, a candidate branch). Unset, a crash point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "EVOTRAINER_CRASH_AT"
_passed: dict[str, int] = {}


def crash_point(name: str, qualifier: str | None = None) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    where, _, nth = spec.partition("@")
    if where not in (name, f"{name}:{qualifier}"):
        return
    _passed[where] = _passed.get(where, 0) + 1
    if _passed[where] == int(nth or 1):
        os.killpg(os.getpgrp(), signal.SIGKILL)
