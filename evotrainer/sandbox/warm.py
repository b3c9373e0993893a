"""Warm pytest runs: `run_sandboxed` for `python -m pytest`, without paying for a fresh interpreter
and a fresh pytest import on every run.

A `WarmPytest` starts one zygote (zygote.py) through the launcher, in its own network, mount and
pid namespaces, and keeps it. Each `run` then costs a fork: the run
gets what `run_sandboxed` gives a command, made the same way here (a fresh copy of `src` plus
`files`, `home/`, `tmp/`, `aux-<random>/`, `out-<random>/`, a scrubbed environment, a pids cgroup
and a fresh uid) and in the zygote (new mount, pid and network namespaces of its own, private
/tmp, the run's `hide` paths and the protected ones covered, rlimits, the uid, no_new_privs; see
zygote.py). The zygote itself is chrooted in the root a cold `root=PACKAGES` run gets
(python_root.py: the interpreter and its packages, installed benchmarks covered, and the zygote's
own folder, which holds every run's files), so no run reads the host's other files. It returns the same `SandboxResult`, with `isolation["warm"]`. One zygote serves
every repository: what a run must not see is hidden in that run's own mount namespace.

Why the zygote stays root inside its namespaces: every run needs a uid of its own (so that
RLIMIT_NPROC counts exactly its processes, it cannot signal or trace the zygote or another run,
and it cannot write the zygote's files) and a pid namespace of its own (so that killing its init
kills whatever it left behind). Only root can give those per run. The zygote runs no untrusted
code: it imports pytest and the standard library, and the code under test only ever runs in a
fork that has dropped to the run's uid.

Available where the launcher can drop to a fresh uid with mount and pid namespaces (we run as
root, `isolation_support()["uid_drop"]`); `warm_available()` says. The pool (`acquire`/`release`)
keeps the idle zygotes of each interpreter, and starts another when all are busy (a process
grading from several threads).
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evotrainer.errors import SandboxError
from evotrainer.sandbox.launcher import _launcher_config, _limits, _python_paths, _scrubbed_env, _start
from evotrainer.sandbox.processes import _cgroup_base, _fresh_uid, _make_cgroup, _remove_cgroup, _sweep
from evotrainer.sandbox.protected import protected
from evotrainer.sandbox.python_root import PACKAGES, installed_benchmarks, python_root
from evotrainer.sandbox.run import (
    OUTPUT_CAP,
    SandboxResult,
    _Capped,
    _chown_tree,
    _collect,
    _copy_tree,
    _fill,
    _hideable,
    _remove_inside,
    _rmtree,
    _write_inside,
    isolation_support,
)

_ZYGOTE = Path(__file__).with_name("zygote.py").read_text(encoding="utf-8")
_START_TIMEOUT_S = 60.0
_REPLY_GRACE_S = 15.0  # the zygote's own supervisor enforces the timeout; this is for a stuck zygote


def warm_available() -> bool:
    """Whether this machine gives a warm run the isolation a cold one gets (see the module docstring)."""
    s = isolation_support()
    return bool(s["uid_drop"] and s["mountns"] and s["pidns"])


class WarmPytest:
    """One zygote: pytest imported once, each `run` in a fresh fork of it. One run at a time."""

    def __init__(self, python: str, preload: Iterable[str] = (), tmpfs_mb: int = 64) -> None:
        if not warm_available():
            raise SandboxError("warm pytest runs need root with mount and pid namespaces here")
        self.python = python
        self.tmpfs_mb = tmpfs_mb
        self._support = isolation_support()
        self.work = Path(tempfile.mkdtemp(prefix=f"evo-sbx-{os.getpid()}-warm-"))
        self._buf = b""
        self.mountpoint: Path | None = None
        try:
            os.chmod(self.work, 0o711)
            aux = self.work / f"aux-{secrets.token_hex(8)}"
            aux.mkdir(mode=0o755)
            (aux / "zygote.py").write_text(_ZYGOTE, encoding="utf-8")
            (self.work / "home").mkdir()
            self.fixed = self.work / "repo"  # where every run sees its own copy (zygote.py binds it there)
            self.fixed.mkdir(mode=0o755)
            (self.work / "tmp").mkdir()
            exe = python if os.path.isabs(python) else shutil.which(python)
            if exe is None:
                raise SandboxError(f"python not found: {python}")
            env = _scrubbed_env(self.work / "home", self.work / "tmp", {})
            # The zygote and every run live in the root a cold `root=PACKAGES` run gets: the
            # interpreter with its packages (installed benchmarks covered) and this folder (the
            # zygote's script, every job's copy, aux and out folders, the fixed path), with the
            # pids cgroups bound inside it at `cgroups/` (a run covers them, see zygote.py `supervise`).
            self._cgroup_base = _cgroup_base() if self._support["cgroup_pids"] else None
            self._cgroups = self.work / "cgroups"
            self.mountpoint = Path(tempfile.mkdtemp(prefix=f"evo-sbx-{os.getpid()}-warmroot-"))
            exe, binds = python_root(exe, PACKAGES, str(self.work),
                                     [*_hideable(protected(), self.work, exe), *installed_benchmarks()])
            if self._cgroup_base is not None:
                self._cgroups.mkdir(mode=0o700)
                binds.append([str(self._cgroup_base), str(self._cgroups), "rw"])
            cfg = _launcher_config(
                [exe, "-s", str(aux / "zygote.py")], self.work, self.work, env, None, _limits(10**7, 1 << 16, 64, 1 << 16),
                netns=self._support["netns"], mountns=True, pidns=True, cgroup=None,
                hide=[], exe=exe, root={"dir": str(self.mountpoint), "binds": binds})
            # The runs drop to a fresh uid: like a cold run's, they must reach the interpreter.
            self._expose = _python_paths(exe)
            self._exe = exe
            self.proc, status = _start(cfg, self.work, with_stdin=True)
            if status.get("error"):
                raise SandboxError(f"warm pytest worker did not start: {status['error']}")
            self._status = status
            self._stderr = _Capped(self.proc.stderr)
            self._send({"preload": sorted(set(preload))})
            ready = self._receive(time.monotonic() + _START_TIMEOUT_S)
            if not (isinstance(ready, dict) and ready.get("ready")):
                raise SandboxError(f"warm pytest worker did not start: {ready!r}; {self._stderr.text()[-2000:]}")
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return getattr(self, "proc", None) is not None and self.proc.poll() is None

    def run(self, args: Sequence[str], *, src: Path | str | None, files: Mapping[str, str | bytes | None] | None = None,
            aux_files: Mapping[str, str | bytes] | None = None, timeout_s: float = 30.0, cpu_s: int | None = None,
            mem_mb: int = 1024, fsize_mb: int = 64, nproc: int = 32,
            env_extra: Mapping[str, str] | None = None, hide: Sequence[Path | str] = (),
            trusted: Iterable[str] = (), preload: Iterable[str] = (), task_key: str = "") -> SandboxResult:
        """`python -m pytest *args` in a fresh copy of `src` (+ `files`), as `run_sandboxed` runs it.
        `hide`: host paths the run must not see (the protected ones are added).
        `trusted`: the copy's .py files whose content no untrusted party chose (the zygote compiles
        them once for all runs). Raises SandboxError when the zygote is gone or stuck (it is then
        closed). `preload`: standard library modules the zygote imports first, if it has not yet.
        `task_key`: runs with the same key share a fork of the zygote that holds their compiled
        `trusted` files (one at a time: a new key replaces it), so give one key per base state."""
        if not self.alive:
            raise SandboxError("the warm pytest worker is not running")
        start = time.monotonic()
        uid = _fresh_uid()
        job = self.work / f"job-{secrets.token_hex(8)}"
        cgroup = None
        try:
            job.mkdir(mode=0o711)
            repo, home, tmp = job / "repo", job / "home", job / "tmp"
            aux, out, log = (job / f"{k}-{secrets.token_hex(8)}" for k in ("aux", "out", "log"))
            _copy_tree(src, repo)
            for rel, content in (files or {}).items():
                if content is None:
                    _remove_inside(repo, rel)
                else:
                    _write_inside(repo, rel, content)
            for d in (home, tmp, aux, out):
                d.mkdir()
            log.mkdir(mode=0o700)
            for rel, content in (aux_files or {}).items():
                _write_inside(aux, rel, content)
            for d in (repo, home, tmp):
                _chown_tree(d, uid)
            os.chmod(aux, 0o755)
            os.chmod(out, 0o733)
            paths = {"repo": str(self.fixed), "aux": str(aux), "out": str(out), "work": str(job)}
            env = _scrubbed_env(home, tmp, {k: _fill(v, paths) for k, v in (env_extra or {}).items()})
            cgroup = _make_cgroup(nproc) if self._support["cgroup_pids"] else None
            self._send({"dir": str(job), "repo": str(repo), "cwd": str(self.fixed), "log": str(log),
                        "trusted": sorted(t for t in trusted if (repo / t).is_file() and not (repo / t).is_symlink()), "args": [_fill(a, paths) for a in args],
                        "env": env, "uid": uid, "nproc": nproc, "timeout_s": timeout_s,
                        "limits": _limits(cpu_s or max(1, int(timeout_s) + 1), mem_mb, fsize_mb, nproc),
                        "cgroup": str(self._cgroups / cgroup.relative_to(self._cgroup_base)) if cgroup else None,
                        "expose": self._expose,
                        "tmpfs_mb": max(16, fsize_mb),
                        "preload": sorted(set(preload)), "task": task_key,
                        "hide": _hideable([*hide, *protected(), *([self._cgroups] if cgroup else [])],
                                          self.work, self._exe)})
            reply = self._receive(start + timeout_s + _REPLY_GRACE_S)
            if not isinstance(reply, dict) or "error" in reply or "returncode" not in reply:
                self.close()
                raise SandboxError(f"warm pytest worker failed: {reply!r}; {self._stderr.text()[-2000:]}")
            return SandboxResult(
                returncode=int(reply["returncode"]), stdout=_capped_file(log / "stdout"),
                stderr=_capped_file(log / "stderr"), timed_out=bool(reply["timed_out"]),
                killed=bool(reply["killed"]), duration_s=time.monotonic() - start,
                network_isolated=bool(self._status.get("netns")),
                isolation={**reply.get("isolation", {}), "cpu_s": reply.get("cpu_s"),
                           "netns": bool(self._status.get("netns")), "loopback": self._status.get("loopback"),
                           "hidden": self._status.get("hidden"), "cgroup_pids": cgroup is not None},
                outputs=_collect(out), nproc_exceeded=bool(reply["nproc_exceeded"]))
        finally:
            # Every process of the run is in the cgroup (its pid-namespace init joined it first)
            # and in the zygote's pid namespace, where the zygote already swept the uid.
            _sweep(None, None if cgroup else uid, cgroup)
            if cgroup is not None:
                _remove_cgroup(cgroup)
            _rmtree(job)

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            child = self._status.get("child") if isinstance(getattr(self, "_status", None), dict) else None
            for pid in (child, proc.pid):
                if isinstance(pid, int) and pid > 1:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        _rmtree(self.work)
        if getattr(self, "mountpoint", None) is not None:
            _rmtree(self.mountpoint)

    # ---------------------------------------------------------------- the line protocol

    def _send(self, message: Mapping[str, Any]) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self.close()
            raise SandboxError(f"the warm pytest worker is gone: {exc}") from None

    def _receive(self, deadline: float) -> Any:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                self.close()
                raise SandboxError("the warm pytest worker did not answer in time")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.close()
                raise SandboxError(f"the warm pytest worker exited: {self._stderr.text()[-2000:]}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return {"error": f"unreadable reply {line[:200]!r}"}


def _capped_file(path: Path) -> str:
    """A run's stdout or stderr file, head and tail kept as a cold run's pipe reader keeps them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        half = OUTPUT_CAP // 2
        if size <= OUTPUT_CAP:
            data = f.read()
        else:
            head = f.read(half)
            f.seek(size - half)
            data = head + f"\n[... {size - 2 * half} bytes dropped ...]\n".encode() + f.read(half)
    return data.decode("utf-8", "replace")


# ---------------------------------------------------------------- the pool


_idle: dict[str, list[WarmPytest]] = {}
_lock = threading.Lock()


def acquire(python: str, preload: Iterable[str] = ()) -> WarmPytest:
    """An idle zygote of this interpreter, else a new one (importing `preload` too)."""
    with _lock:
        workers = _idle.get(python, [])
        while workers:
            worker = workers.pop()
            if worker.alive:
                return worker
            worker.close()
    return WarmPytest(python, preload)


def release(worker: WarmPytest) -> None:
    if not worker.alive:
        worker.close()
        return
    with _lock:
        _idle.setdefault(worker.python, []).append(worker)


def close_all() -> None:
    """Stop every idle zygote of this process (also at exit)."""
    with _lock:
        workers = [w for ws in _idle.values() for w in ws]
        _idle.clear()
    for worker in workers:
        worker.close()


atexit.register(close_all)
