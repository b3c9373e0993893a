"""Host paths no sandboxed command may see: the workspaces and stores this process opened.

A workspace holds what a policy's code must never read or change: the store (task answers,
hidden tests, every reward), the harness repo and the reports. The store and the workspace
register themselves here when opened, and every `run_sandboxed` call covers them (an empty
tmpfs over a folder, /dev/null over a file) on top of its own `hide` list.

The list lives in an environment variable, not a module global, so the sandbox workers a
process pool spawns inherit it. It never reaches the sandboxed command: the sandbox's
environment is built from scratch (launcher.py `_scrubbed_env`).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "EVOTRAINER_SANDBOX_PROTECTED"
# The sandbox mounts a private tmpfs over these, so whatever lies under them is hidden already.
_PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")


def protect(*paths: Path | str) -> None:
    """Hide `paths` from every sandboxed command this process or its children start from now on."""
    known = protected()
    for path in paths:
        real = os.path.realpath(path)
        if real not in known and not _under_private(real):
            known.append(real)
    if known:
        os.environ[ENV] = os.pathsep.join(known)


def protected() -> list[str]:
    return [p for p in os.environ.get(ENV, "").split(os.pathsep) if p]


def _under_private(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in _PRIVATE)
