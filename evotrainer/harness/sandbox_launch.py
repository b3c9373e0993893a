"""Start one harness worker inside the OS sandbox: own namespaces, a fresh uid, a minimal root, seccomp.

This is the boundary around harness code (the audit hook and import guard in sandbox_worker.py
are lint with clearer messages). Each worker is its own launch of evotrainer/sandbox/launcher.py:

- network, mount and pid namespaces: only its own loopback (the host's is unreachable), only its
  own processes;
- a fresh unprivileged uid when we run as root (else a user namespace owns the others and the
  seccomp filter is required), rlimits, no_new_privs, a parent-death signal;
- a root that holds only the system's libraries, the interpreter, site-packages and the
  `evotrainer` package, all read-only, a private /tmp and its own writable /sandbox folder: no
  workspace (store.db, harnesses/, backtests/, adapters/), no home, no EVOTRAINER_HOME, no
  repository checkout (no .git);
- a scrubbed environment (PATH, LANG, HOME=/sandbox, the fixed hash seed; no API keys);
- no descriptors but its message socket and the watchdog's shared page (fds 0-2 are /dev/null);
- then, in the worker, once our modules are imported and before any harness file runs, the
  seccomp filter of evotrainer/sandbox/seccomp.py: no fork, exec, ptrace, mount, non-AF_UNIX
  sockets or signals to other processes, even through ctypes or `_posixsubprocess`.

Where the machine cannot give this (no user namespaces), starting a worker fails with SandboxError,
unless `EVOTRAINER_HARNESS_ISOLATION=none` is set: then workers are forked from a local
forkserver with only the in-process guards, as before (for a machine that runs trusted harnesses
only; never for LLM-written ones).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import evotrainer
from evotrainer.harness.sandbox_failures import SandboxError
from evotrainer.sandbox.launcher import (
    _launcher_config,
    _scrubbed_env,
    _start,
    root_binds,
)
from evotrainer.sandbox.processes import _fresh_uid, _stop, _sweep
from evotrainer.sandbox.run import _rmtree, isolation_support

ISOLATION_ENV = "EVOTRAINER_HARNESS_ISOLATION"
INSIDE = "/sandbox"  # the worker's own writable tmpfs (its cwd, HOME and TMPDIR), inside its root
_WORKER_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "PYTHONSAFEPATH": "1"}
_CPU_S = 10**7  # workers are long-lived: the parent's watchdog bounds their time, not RLIMIT_CPU
_FSIZE_MB, _NPROC = 64, 64  # /sandbox and /tmp hold this much each; threads count towards RLIMIT_NPROC
_CHILD = ("import sys; from evotrainer.harness.sandbox_launch import child_main; "
          "child_main(int(sys.argv[1]), int(sys.argv[2]))")


def isolated() -> bool:
    """Whether harness workers run in the OS sandbox (the default); False only by the opt-out."""
    value = os.environ.get(ISOLATION_ENV, "os").strip().lower()
    if value in ("", "os"):
        return True
    if value == "none":
        return False
    raise SandboxError(f"{ISOLATION_ENV}={value!r}: expected 'os' (the default) or 'none'")


def check_support() -> dict[str, Any]:
    """The machine's isolation (evotrainer.sandbox.isolation_support), or SandboxError naming what
    is missing and the opt-out."""
    support = isolation_support()
    missing = [k for k in ("netns", "mountns", "pidns") if not support.get(k)]
    if support.get("root") and not support.get("uid_drop"):
        missing.append("uid_drop")
    if missing:
        detail = f" ({support['probe_error']})" if support.get("probe_error") else ""
        raise SandboxError(
            f"harness code runs only inside the OS sandbox, and this machine lacks {', '.join(missing)}"
            f"{detail}: enable unprivileged user namespaces, or set {ISOLATION_ENV}=none to run "
            "harness workers with only the in-process guards (unsafe for untrusted harnesses)")
    return support


def shared_marks() -> tuple[int, mmap.mmap, Any]:
    """The watchdog's three doubles on a memfd page both sides map: (fd, map, array view)."""
    fd = os.memfd_create("evotrainer-marks", os.MFD_CLOEXEC)
    os.ftruncate(fd, mmap.PAGESIZE)
    page = mmap.mmap(fd, mmap.PAGESIZE)
    return fd, page, (ctypes.c_double * 3).from_buffer(page)


class SandboxedProcess:
    """One worker as `multiprocessing.Process` looks to the pool: start, pid, sentinel, exitcode, kill."""

    name = "evotrainer-sandbox"

    def __init__(self, memory_limit_mb: int, require_seccomp: bool):
        self.support = check_support()
        # Only the mount point of its root lives here: /sandbox and /tmp are size-capped tmpfs,
        # so a worker cannot fill the host's disk.
        self.work = Path(tempfile.mkdtemp(prefix=f"evo-sbx-{os.getpid()}-hw-"))
        os.chmod(self.work, 0o711)
        (self.work / "root").mkdir()
        self.uid = _fresh_uid() if self.support["root"] else None
        self.memory_limit_mb, self.require_seccomp = memory_limit_mb, require_seccomp or self.uid is None
        self.proc: Any = None
        self.status: dict[str, Any] = {}
        self.sentinel = -1
        self.conn: Connection | None = None
        self.marks: Any = None
        self._page: mmap.mmap | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        marks_fd, self._page, self.marks = shared_marks()
        try:
            self.conn = Connection(ours.detach())
            child_fd = theirs.fileno()
            exe = sys.executable
            package_parent = str(Path(evotrainer.__file__).resolve().parent.parent)
            binds = root_binds(exe, read_only=[str(Path(package_parent) / "evotrainer")]) + [["", INSIDE, "tmp"]]
            env = _scrubbed_env(Path(INSIDE), Path(INSIDE), {**_WORKER_ENV, "PYTHONPATH": package_parent})
            mem = self.memory_limit_mb << 20 if self.memory_limit_mb else -1  # -1: RLIM_INFINITY
            limits = {"cpu_s": _CPU_S, "as": mem, "fsize": _FSIZE_MB << 20, "nproc": _NPROC}
            cfg = _launcher_config([exe, "-P", "-c", _CHILD, str(child_fd), str(marks_fd)], self.work,
                                   Path(INSIDE), env, self.uid, limits, netns=True, mountns=True, pidns=True,
                                   cgroup=None, hide=[], exe=exe,
                                   root={"dir": str(self.work / "root"), "binds": binds})
            self.proc, self.status = _start(cfg, self.work, pass_fds=(child_fd, marks_fd), capture=False)
        finally:
            theirs.close()
            os.close(marks_fd)
        self.sentinel = os.pidfd_open(self.proc.pid)
        lacking = [k for k in ("netns", "mountns", "pidns", "root", "no_new_privs") if not self.status.get(k)]
        if self.uid is not None and self.status.get("uid") != self.uid:
            lacking.append("uid")
        if self.status.get("error") or lacking:
            self.kill()
            raise SandboxError(f"the harness worker sandbox did not start: "
                               f"{self.status.get('error') or 'no ' + ', '.join(lacking)}")

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _stop(self.proc, self.status)
        _sweep(None, self.uid, None)

    def close(self) -> None:
        self.kill()
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1
        self.marks = None  # the view holds the map's buffer: release it first
        if self._page is not None:
            try:
                self._page.close()
            except BufferError:
                pass
        _rmtree(self.work)


# ---------------------------------------------------------------- inside the sandbox


def _close_other_fds(keep: set[int]) -> None:
    """Every descriptor but `keep` and 0-2 (/dev/null) goes, whatever the launcher let through."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, already closed


def child_main(conn_fd: int, marks_fd: int) -> None:
    """The worker's entry point, run by the launcher's exec inside the sandbox."""
    import traceback

    from evotrainer.harness.sandbox_worker import _send, _worker_main
    from evotrainer.sandbox import seccomp

    conn = Connection(conn_fd)
    page = mmap.mmap(marks_fd, mmap.PAGESIZE)
    os.close(marks_fd)
    marks = (ctypes.c_double * 3).from_buffer(page)
    try:
        boot = conn.recv()  # from the trusted parent: pickle is fine in this direction
        _close_other_fds({conn_fd})
        filtered = seccomp.install()
        if not filtered and boot.require_seccomp:
            _send(conn, ["error", "the kernel refused the seccomp filter (required without a fresh uid)"])
            return
    except Exception:
        _send(conn, ["error", traceback.format_exc()])
        return
    _worker_main(conn, marks, boot, {"seccomp": filtered, "uid": os.getuid()})
