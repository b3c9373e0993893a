"""The parent's hold on a sandboxed execution's processes: fresh uids, pids cgroups, the process budget, killing."""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_SANDBOX_UID = 1_000_000_000  # fresh uids come from [MIN, MIN + 2**30): no real user is there

_HELPERS = 2  # the launcher's waiter and the pid namespace's reaper, in the cgroup too
_counter = itertools.count()


def _fresh_uid() -> int:
    """A uid no process holds now: RLIMIT_NPROC then counts this execution's processes only."""
    busy = {st.st_uid for st in _proc_stats()}
    while True:
        uid = MIN_SANDBOX_UID + secrets.randbelow(2**30)
        if uid not in busy:
            return uid


# ---------------------------------------------------------------- processes, cgroups, killing


def _cgroup_base() -> Path | None:
    """A writable pids cgroup folder for our executions (cgroup v1 or v2), or None."""
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        base = root / "evotrainer-sandbox"
        try:
            base.mkdir(exist_ok=True)
            probe = base / f"probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.mkdir()
            ok = (probe / "pids.max").exists()
            probe.rmdir()
            if ok:
                return base
        except OSError:
            continue
    return None


def _make_cgroup(nproc: int) -> Path | None:
    base = _cgroup_base()
    if base is None:
        return None
    path = base / f"{os.getpid()}-{next(_counter)}-{secrets.token_hex(4)}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(nproc + _HELPERS))
        return path
    except OSError:
        return None


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove_cgroup(path: Path) -> None:
    for _ in range(100):
        try:
            path.rmdir()
            return
        except OSError:
            for pid in _cgroup_pids(path):
                _kill(pid)
            time.sleep(0.01)


@dataclass
class _Stat:
    pid: int
    st_uid: int
    pgrp: int


def _proc_stats() -> list[_Stat]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            out.append(_Stat(int(name), uid, int(fields[2])))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _process_count(pgid: int, uid: int | None, cgroup_dir: Path | None) -> int:
    """The sandbox's live processes, by the most precise handle we have."""
    if cgroup_dir is not None:
        try:
            return int((cgroup_dir / "pids.current").read_text()) - _HELPERS
        except (OSError, ValueError):
            pass
    stats = _proc_stats()
    if uid is not None:
        return sum(1 for s in stats if s.st_uid == uid)
    return sum(1 for s in stats if s.pgrp == pgid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen, status: Mapping[str, Any]) -> None:
    """Kill the command. With a pid namespace, its init goes first: the kernel then kills and reaps
    the whole namespace and the launcher reaps the init, so no zombie is left to pid 1."""
    child = status.get("child")
    if isinstance(child, int) and child > 1:
        _kill(child)
        try:
            proc.wait(timeout=2)
            return
        except subprocess.TimeoutExpired:
            pass
    _killpg(proc.pid)
    proc.wait()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep(pgid: int | None, uid: int | None, cgroup_dir: Path | None) -> bool:
    """SIGKILL every process of this execution until none is left; True if there were any."""
    found_any = False
    for _ in range(200):
        pids: set[int] = set(_cgroup_pids(cgroup_dir)) if cgroup_dir is not None else set()
        if uid is not None or pgid is not None:
            pids |= {s.pid for s in _proc_stats()
                     if (uid is not None and s.st_uid == uid) or (pgid is not None and s.pgrp == pgid)}
        pids.discard(os.getpid())
        # Zombies of our direct child are reaped by Popen; others' zombies vanish with their parent.
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return found_any
        found_any = True
        if pgid is not None:
            _killpg(pgid)
        for pid in alive:
            _kill(pid)
        time.sleep(0.005)
    return found_any


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False
