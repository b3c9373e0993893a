"""Run an untrusted command in a throwaway copy of a folder, with OS limits, and always clean up.

One call of `run_sandboxed` is one execution:

1. A fresh temp folder `<work>/` holds `repo/` (a copy of `src` without `.git`/VCS history, plus
   `files`), `home/`, `tmp/`, `aux-<random>/` (read-only inputs such as a trusted pytest plugin)
   and `out-<random>/` (where the command may write results: listable only by us, and collected
   into `SandboxResult.outputs`). `{repo}`, `{aux}`, `{out}` and `{work}` in `cmd` and
   `env_extra` are replaced by those paths (plain text replacement: other braces stay).
2. A tiny trusted launcher (`_LAUNCHER` in launcher.py, run as `python -I -S -c`) is started in its own session
   (`start_new_session`, so its pid is the process-group id). Before it `exec`s the command it:
   joins a pids cgroup when one can be made, unshares a network namespace (loopback only), a
   mount namespace (private tmpfs on /tmp, /var/tmp, /dev/shm; `hide` paths covered) and a pid
   namespace (the command's orphans are reaped inside it, its /proc shows only its own
   processes, and killing its pid 1 kills everything it started), sets rlimits (CPU, address
   space, file size, processes, no core files), drops to a fresh unprivileged uid when we run as
   root, and sets `no_new_privs` and a parent-death signal. Not root: a user namespace owns the
   others. It reports what it managed on a pipe, so every result says which isolation was real
   (`SandboxResult.isolation`).
3. The parent waits with a wall-clock timeout and a process budget, kills the command (pid
   namespace first, then the process group) with SIGKILL on either, sweeps stragglers that left
   the group (`setsid`) through the cgroup and the sandbox uid, and removes the folder in
   `finally` (read-only files included). Folders and cgroups of a process killed outright are
   removed by the next process that starts a sandbox (their names carry the dead pid).

Why a launcher and not `preexec_fn`: `preexec_fn` is unsafe when the parent has threads (the CLI
draws a progress bar in one), and a failure in it cannot say what went wrong.

Fork bombs. RLIMIT_NPROC counts processes per *user* and is never enforced for uid 0, so as root
it does nothing. Three layers instead: a pids cgroup (`pids.max`) when the cgroup filesystem is
writable; RLIMIT_NPROC under the fresh uid, which is unique to this execution, so the count is
exactly the sandbox's; and the parent's budget check, which kills the run once it holds `nproc`
processes. What is real depends on the machine; `isolation_support()` says.

Without `root=` it is not a container: the command still reads every host file an unprivileged
user may read (except `hide`), shares the kernel, and where a namespace is unavailable it shares that resource (the
network, /tmp, the process list) with the host. No seccomp filter here: seccomp.py holds one for
Python workers that need no processes (the harness workers, evotrainer/harness/sandbox_launch.py,
which also run in the launcher's minimal-root mode instead of `hide`). With `root=` a Python
command gets that mode too: a fresh root with the interpreter and what it needs, and nothing else
of the host (python_root.py; code checks, user checks, the agent scaffold's and the SWE grader's
pytest runs use it).

Layout: this module is the runner (the copy, supervision, the result); launcher.py starts the
command inside its isolation; processes.py counts, contains and kills its processes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.errors import SandboxError
from evotrainer.sandbox.launcher import (
    PATH,
    _feed,
    _launcher_config,
    _limits,
    _scrubbed_env,
    _start,
)
from evotrainer.sandbox.processes import (
    MIN_SANDBOX_UID,
    _cgroup_base,
    _fresh_uid,
    _make_cgroup,
    _proc_stats,
    _process_count,
    _remove_cgroup,
    _stop,
    _sweep,
)
from evotrainer.sandbox.protected import protected
from evotrainer.sandbox.python_root import python_root

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".jj"})
OUTPUT_CAP = 64 * 1024  # bytes kept of stdout and of stderr (head and tail)
OUTPUT_FILE_CAP = 8 * 1024 * 1024  # bytes kept of one file in out-*/

_support: dict[str, Any] | None = None
_support_lock = threading.Lock()


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed execution did. `returncode` is negative for a signal (as in subprocess)."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed: bool  # we sent SIGKILL: timeout, process budget, or stragglers after exit
    duration_s: float
    network_isolated: bool
    isolation: Mapping[str, Any] = field(default_factory=dict)
    outputs: Mapping[str, bytes] = field(default_factory=dict)
    workdir_listing: tuple[str, ...] | None = None
    nproc_exceeded: bool = False
    launch_error: str | None = None  # the launcher could not start the command

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.launch_error is None


# ---------------------------------------------------------------- isolation support on this machine


def isolation_support() -> dict[str, Any]:
    """What this machine gives the sandbox, probed once per process by launching `true`-like code."""
    global _support
    with _support_lock:
        if _support is None:
            _remove_stale()
            base = _cgroup_base()
            probe = _launch_probe()
            _support = {
                "root": os.geteuid() == 0,
                "netns": bool(probe.get("netns")),
                "mountns": bool(probe.get("mountns")),
                "pidns": bool(probe.get("pidns")),
                "cgroup_pids": base is not None,
                "uid_drop": os.geteuid() == 0 and probe.get("uid") not in (None, 0),
                "probe_error": probe.get("error"),
            }
        return dict(_support)


def network_isolation_available() -> bool:
    """True when a sandboxed command gets its own network namespace (loopback only)."""
    return isolation_support()["netns"]


def _launch_probe() -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"evo-sbx-{os.getpid()}-probe-"))
    try:
        uid = _fresh_uid() if os.geteuid() == 0 else None
        os.chmod(tmp, 0o711)
        (tmp / "repo").mkdir()
        if uid is not None:
            os.chown(tmp / "repo", uid, uid)
        exe = sys.executable
        cfg = _launcher_config([exe, "-I", "-S", "-c", "pass"], tmp, tmp / "repo", {}, uid,
                               _limits(10, 1024, 16, 16), netns=True, mountns=True, pidns=True, cgroup=None,
                               hide=[], exe=exe)
        proc, status = _start(cfg, tmp)
        proc.communicate(timeout=30)
        if proc.returncode != 0:
            # The namespaces may be granted while the command cannot run under the fresh uid.
            status["uid"] = None
            status.setdefault("error", f"probe exited {proc.returncode}")
        return status
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        _rmtree(tmp)


# ---------------------------------------------------------------- the public entry point


def run_sandboxed(
    cmd: Sequence[str],
    *,
    src: Path | str | None = None,
    files: Mapping[str, str | bytes | None] | None = None,
    aux_files: Mapping[str, str | bytes] | None = None,
    timeout_s: float = 30.0,
    cpu_s: int | None = None,
    mem_mb: int = 1024,
    fsize_mb: int = 64,
    nproc: int = 32,
    env_extra: Mapping[str, str] | None = None,
    hide: Sequence[Path | str] = (),
    network: bool = False,
    list_workdir: bool = False,
    stdin: bytes | None = None,
    root: str | None = None,
) -> SandboxResult:
    """Run `cmd` in a fresh copy of `src` (+ `files`; None removes) under limits; see the module docstring.

    `cmd[0]` is resolved on the sandbox PATH (or is absolute). `cpu_s` defaults to the timeout.
    `hide` lists host paths the command must not see (the task's originals); the workspaces and
    stores this process opened are always hidden too (protected.py). `network=True`
    skips the network namespace. `stdin` is fed to the command (then closed): inputs passed this
    way never exist as files the command could find. `root` ("stdlib" or "packages", a Python
    `cmd` only): the command runs chrooted in a fresh root that holds the interpreter and what it
    needs, its own folder, and nothing else of the host (python_root.py). Raises SandboxError only
    when the sandbox cannot be set up (a `root` without a mount namespace among those cases).
    """
    if not cmd:
        raise ValueError("cmd must not be empty")
    support = isolation_support()
    if root is not None and not support["mountns"]:
        raise SandboxError(f"a sandboxed run in its own root needs a mount namespace, and this machine gives none"
                           f"{' (' + support['probe_error'] + ')' if support.get('probe_error') else ''}")
    work = Path(tempfile.mkdtemp(prefix=f"evo-sbx-{os.getpid()}-"))
    mountpoint: Path | None = None
    cgroup_dir: Path | None = None
    uid = _fresh_uid() if support["uid_drop"] else None
    start = time.monotonic()
    try:
        os.chmod(work, 0o711)  # traversable, not listable: the out-/aux- names stay unguessable
        repo, home, tmp = work / "repo", work / "home", work / "tmp"
        aux, out = work / f"aux-{secrets.token_hex(8)}", work / f"out-{secrets.token_hex(8)}"
        _copy_tree(src, repo)
        for rel, content in (files or {}).items():
            if content is None:
                _remove_inside(repo, rel)
            else:
                _write_inside(repo, rel, content)
        for d in (home, tmp, aux, out):
            d.mkdir()
        for rel, content in (aux_files or {}).items():
            _write_inside(aux, rel, content)
        if uid is not None:
            for d in (repo, home, tmp):
                _chown_tree(d, uid)
            os.chmod(aux, 0o755)
            os.chmod(out, 0o733)  # the uid may create files here but not list them
        paths = {"repo": str(repo), "aux": str(aux), "out": str(out), "work": str(work)}
        argv = [_fill(a, paths) for a in cmd]
        env = _scrubbed_env(home, tmp, {k: _fill(v, paths) for k, v in (env_extra or {}).items()})
        exe = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0], path=env["PATH"])
        if exe is None:
            raise SandboxError(f"command not found on the sandbox PATH: {argv[0]}")
        hidden = _hideable([*hide, *protected()], work, exe)
        chroot = None
        if root is not None:
            # the mount point lies outside `work`, which is bound into the root itself
            mountpoint = Path(tempfile.mkdtemp(prefix=f"evo-sbx-{os.getpid()}-root-"))
            exe, binds = python_root(exe, root, str(work), hidden)
            argv[0] = exe
            chroot, hidden = {"dir": str(mountpoint), "binds": binds}, []
        cgroup_dir = _make_cgroup(nproc) if support["cgroup_pids"] else None
        # RLIMIT_NPROC counts every process of the real uid: under our own (non-root) uid the
        # ones already running count too, so the sandbox gets nproc on top of them.
        own = 0 if uid is not None or os.geteuid() == 0 else sum(1 for st in _proc_stats() if st.st_uid == os.getuid())
        cfg = _launcher_config(
            argv, work, repo, env, uid, _limits(cpu_s or max(1, int(timeout_s) + 1), mem_mb, fsize_mb, nproc + own),
            netns=not network and support["netns"], mountns=support["mountns"], pidns=support["pidns"],
            cgroup=str(cgroup_dir / "cgroup.procs") if cgroup_dir else None,
            hide=hidden, exe=exe, root=chroot)
        return _supervise(cfg, work, out, uid, cgroup_dir, nproc, timeout_s, start, list_workdir, stdin)
    finally:
        _sweep(None, uid, cgroup_dir)
        if cgroup_dir is not None:
            _remove_cgroup(cgroup_dir)
        _rmtree(work)
        if mountpoint is not None:
            _rmtree(mountpoint)


def _hideable(hide: Sequence[Path | str], work: Path, exe: str) -> list[str]:
    """Paths to cover, minus any that hold what the command needs (the copy, the interpreter)."""
    needed = [str(work), os.path.realpath(exe), os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)]
    out = []
    for h in hide:
        p = os.path.realpath(h)
        if os.path.exists(p) and not any(n == p or n.startswith(p.rstrip("/") + "/") for n in needed):
            out.append(p)
    return out


def _fill(text: str, paths: Mapping[str, str]) -> str:
    """Replace the {repo}/{aux}/{out}/{work} placeholders, and nothing else (code has braces)."""
    for name, value in paths.items():
        text = text.replace("{" + name + "}", value)
    return text


def _supervise(cfg, work: Path, out: Path, uid, cgroup_dir, nproc: int, timeout_s: float,
               start: float, list_workdir: bool, stdin: bytes | None) -> SandboxResult:
    proc, status = _start(cfg, work, stdin is not None)
    stdout, stderr = _Capped(proc.stdout), _Capped(proc.stderr)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    timed_out = over_budget = killed = False
    deadline = start + timeout_s
    try:
        while True:
            try:
                proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                timed_out = True
            elif _process_count(proc.pid, uid, cgroup_dir) >= nproc:
                over_budget = True
            if timed_out or over_budget:
                killed = True
                _stop(proc, status)
                break
    finally:
        if proc.returncode is None:
            _stop(proc, status)
        # Anything still alive (daemonized children, setsid escapers) dies before we read on.
        killed |= _sweep(proc.pid, uid, cgroup_dir)
    stdout.join(), stderr.join()
    listing = tuple(sorted(str(p.relative_to(work / "repo")) for p in (work / "repo").rglob("*"))) \
        if list_workdir else None
    return SandboxResult(
        returncode=proc.returncode,
        stdout=stdout.text(),
        stderr=stderr.text(),
        timed_out=timed_out,
        killed=killed,
        duration_s=time.monotonic() - start,
        network_isolated=bool(status.get("netns")),
        isolation={k: v for k, v in status.items() if k != "error"} | {"cgroup_pids": cgroup_dir is not None},
        outputs=_collect(out),
        workdir_listing=listing,
        nproc_exceeded=over_budget,
        launch_error=status.get("error"),
    )


# ---------------------------------------------------------------- copying and cleaning up


def _copy_tree(src: Path | str | None, dst: Path) -> None:
    if src is None:
        dst.mkdir()
        return
    src = Path(src)
    if not src.is_dir():
        raise SandboxError(f"sandbox src is not a folder: {src}")
    # symlinks=True: a link to /etc/passwd stays a link, it is not copied in as content.
    shutil.copytree(src, dst, symlinks=True, ignore=lambda d, names: [n for n in names if n in VCS_DIRS])


def _write_inside(root: Path, rel: str, content: str | bytes) -> None:
    target = (root / rel)
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not _inside(root, target.parent):
        raise SandboxError(f"file path escapes the sandbox: {rel}")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    data = content.encode() if isinstance(content, str) else content
    target.write_bytes(data)


def _remove_inside(root: Path, rel: str) -> None:
    target = root / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not _inside(root, target.parent):
        raise SandboxError(f"file path escapes the sandbox: {rel}")
    if target.is_symlink() or target.is_file():
        target.unlink()


def _inside(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _chown_tree(root: Path, uid: int) -> None:
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def _rmtree(path: Path) -> None:
    """Remove a tree whatever the command did to it (chmod 000, read-only files).

    Only modes inside the tree are changed: when the top itself cannot be removed, its parent
    (/tmp for a sandbox's work folder) keeps its mode. Making /tmp 0700 once locked every other
    user out of it (the test PostgreSQL server's initdb among them)."""
    top = os.path.abspath(path)

    def fix(func, p, exc_info):
        try:
            parent = os.path.dirname(os.path.abspath(p))
            if parent == top or parent.startswith(top + os.sep):
                os.chmod(parent, 0o700)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    if path.exists():
        shutil.rmtree(path, onerror=fix)
        if path.exists():  # a last pass for trees made unreadable below the top
            shutil.rmtree(path, ignore_errors=True)


def _collect(out: Path) -> dict[str, bytes]:
    """Regular files the command left in out-*/ (no links followed, each capped)."""
    found: dict[str, bytes] = {}
    for entry in os.scandir(out):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                found[entry.name] = f.read(OUTPUT_FILE_CAP)
    return found


class _Capped:
    """Drain a pipe on a thread, keeping the head and tail so a flood cannot fill memory."""

    def __init__(self, stream) -> None:
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream) -> None:
        half = OUTPUT_CAP // 2
        with stream:
            for chunk in iter(lambda: stream.read1(65536), b""):
                room = half - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                self.tail += chunk
                if len(self.tail) > half:
                    self.dropped += len(self.tail) - half
                    del self.tail[:-half]

    def join(self) -> None:
        self._thread.join(timeout=5)

    def text(self) -> str:
        mid = f"\n[... {self.dropped} bytes dropped ...]\n".encode() if self.dropped else b""
        return (bytes(self.head) + mid + bytes(self.tail)).decode("utf-8", "replace")


# ---------------------------------------------------------------- leftovers of killed processes


def _remove_stale() -> None:
    """Copies and cgroups left by a process that was killed outright (no `finally` ran): both
    names start with the pid of the process that made them, and that process is gone."""
    def dead(name: str) -> bool:
        pid = name.split("-", 1)[0]
        return pid.isdigit() and not os.path.exists(f"/proc/{pid}")

    for d in Path(tempfile.gettempdir()).glob("evo-sbx-*"):
        if dead(d.name[len("evo-sbx-"):]) and d.is_dir() and not d.is_symlink():
            _rmtree(d)
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        base = root / "evotrainer-sandbox"
        if base.is_dir():
            for d in base.iterdir():
                if d.is_dir() and dead(d.name):
                    _remove_cgroup(d)


# MIN_SANDBOX_UID and PATH live in processes.py and launcher.py; they stay importable from here.
__all__ = ["MIN_SANDBOX_UID", "OUTPUT_CAP", "OUTPUT_FILE_CAP", "PATH", "VCS_DIRS", "SandboxError", "SandboxResult",
           "isolation_support", "network_isolation_available", "run_sandboxed"]
