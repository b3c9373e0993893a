"""Inside a sandbox worker process: the audit hook and import guard, the timed harness wrapper, the worker loop."""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from evotrainer.api import Rollout, TaskStats, Turn
from evotrainer.harness.loader import Harness, HarnessError, is_api_module
from evotrainer.harness.sandbox_failures import CandidateFailure

# Modules harness code may import. Pure: no processes, files, network or interpreter internals.
ALLOWED_MODULES = frozenset({
    "__future__", "abc", "array", "base64", "bisect", "calendar", "cmath", "collections",
    "collections.abc", "colorsys", "contextlib", "copy", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq", "hmac",
    "itertools", "json", "keyword", "math", "numbers", "operator", "pprint", "random", "re",
    "statistics", "string", "struct", "textwrap", "types", "typing", "unicodedata", "zlib",
})
HARNESS_MODULE_PREFIX = "_evoharness_"  # loader._exec_module names every harness module this way

# Shared with the parent: marks[0] = slot * 16 + code of the last harness call, marks[1] = its
# monotonic start (0 = none running), marks[2] = 1 while the worker handles a message.
_LOAD, _REWARD, _KEEP_ROLLOUT, _KEEP_GROUP, _STOP, _WEIGHTS = 1, 2, 3, 4, 5, 6
_CALLS = {_LOAD: "loading the harness files", _REWARD: "reward.py: reward()",
          _KEEP_ROLLOUT: "filters.py: keep_rollout()", _KEEP_GROUP: "filters.py: keep_group()",
          _STOP: "rollout.py: stop()", _WEIGHTS: "curriculum.py: weights()"}


# ---------------------------------------------------------------- inside the worker

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_BLOCKED = ("os.system", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn",
            "os.kill", "os.killpg", "os.startfile", "signal.pthread_kill", "subprocess.",
            "socket.", "ctypes.", "sqlite3.connect", "pty.spawn", "webbrowser.open",
            "_posixsubprocess", "resource.setrlimit", "resource.prlimit")
_DB_EVENTS = ("sqlite3.connect", "socket.")  # what a trusted_io window permits
# event -> (indexes of path arguments, indexes of dir_fd arguments), as CPython raises them
_PATH_EVENTS = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
    "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)), "os.symlink": ((0, 1), (2,)),
    "os.truncate": ((0,), ()), "os.chflags": ((0,), ()), "os.lchflags": ((0,), ()),
    "os.mkfifo": ((0,), (2,)), "os.mknod": ((0,), (3,)), "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()), "shutil.rmtree": ((0,), (1,)), "shutil.copyfile": ((1,), ()),
    "shutil.copymode": ((1,), ()), "shutil.copystat": ((1,), ()), "shutil.copytree": ((1,), ()),
    "shutil.move": ((0, 1), ()), "shutil.chown": ((0,), ()),
}


class _Guard:
    """The audit hook and import guard of one worker. Permissive until `lock()`."""

    def __init__(self, tmpdir: str):
        self.tmpdir = os.path.realpath(tmpdir)
        self.locked = False
        self.importing = 0  # > 0 while an allowed module initialises (numpy's init loads ctypes)
        self.io_window = 0  # > 0 while trusted code opens a database connection
        self.violations: list[str] = []
        self._import = builtins.__import__

    def install(self) -> None:
        sys.addaudithook(self._hook)

    def lock(self) -> None:
        builtins.__import__ = self._guarded_import
        self.locked = True

    @contextmanager
    def trusted_io(self) -> Iterator[None]:
        self.io_window += 1
        try:
            yield
        finally:
            self.io_window -= 1

    def _refuse(self, what: str, exc: type[Exception] = PermissionError) -> None:
        self.violations.append(what)
        raise exc(f"sandbox: {what} is not allowed in harness code")

    def _inside(self, path: Any) -> bool:
        try:
            if isinstance(path, int):  # a descriptor: where does it point?
                path = os.readlink(f"/proc/self/fd/{path}")
                if not path.startswith("/"):
                    return False  # "pipe:[...]", "socket:[...]": not a file in the temp dir
            real = os.path.realpath(os.fsdecode(path))
        except (OSError, TypeError, ValueError):
            return False
        return real == self.tmpdir or real.startswith(self.tmpdir + os.sep) or real == os.devnull

    def _hook(self, event: str, args: tuple) -> None:
        if not self.locked or self.importing:
            return
        if self.io_window and event.startswith(_DB_EVENTS):
            return
        if event == "open":
            path, _mode, flags = args
            if flags & _WRITE_FLAGS and not self._inside(path):
                self._refuse(f"opening {path!r} for writing (outside the sandbox temp dir)")
        elif event in _PATH_EVENTS:
            path_at, dir_fd_at = _PATH_EVENTS[event]
            paths = [args[i] for i in path_at if i < len(args)]
            if any(i < len(args) and args[i] not in (None, -1) for i in dir_fd_at):  # -1: none given
                self._refuse(f"{event} with dir_fd")
            if not all(self._inside(p) for p in paths):
                self._refuse(f"{event}({', '.join(map(repr, paths))}) outside the sandbox temp dir")
        elif event.startswith(_BLOCKED):
            self._refuse(event)

    def _guarded_import(self, name: str, globals: Any = None, locals: Any = None,
                        fromlist: Sequence[str] | None = (), level: int = 0) -> Any:
        if self.locked and not _trusted(sys._getframe(1)):
            problem = _import_problem(name, fromlist or (), level)
            if problem:
                self._refuse(problem, ImportError)
            self.importing += 1
            try:
                return self._import(name, globals, locals, fromlist, level)
            finally:
                self.importing -= 1
        return self._import(name, globals, locals, fromlist, level)


def _trusted(frame: Any) -> bool:
    """Whether the code that asks for an import is ours or a library's, not harness code.

    A frame whose globals are a real module's namespace is trusted, unless that module is a
    harness file or of evotrainer.api: harness code calls into that package (probes.share(rollouts,
    fn) calls back), so a function it built with bare globals must not borrow our trust there.
    Code run with other globals (a Jinja template, an `exec` string) takes the verdict of the
    nearest caller that does belong to a module.
    """
    while frame is not None:
        globals_ = frame.f_globals
        name = globals_.get("__name__")
        if isinstance(name, str) and (name.startswith(HARNESS_MODULE_PREFIX) or is_api_module(name)):
            return False
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is not None and getattr(module, "__dict__", None) is globals_:
            return True
        frame = frame.f_back
    return False


def _import_problem(name: str, fromlist: Sequence[str], level: int) -> str | None:
    if level:
        return f"relative import of {name!r}"
    top = name.partition(".")[0]
    if top == "evotrainer":
        wanted = [f"{name}.{f}" for f in fromlist] if name == "evotrainer" and fromlist else [name]
        bad = [w for w in wanted if not is_api_module(w)]
        return f"import of {bad[0]!r} (harness code sees only evotrainer.api and evotrainer.api.probes)" if bad else None
    if top == "numpy" or name in ALLOWED_MODULES:
        return None
    return (f"import of {name!r} (allowed: evotrainer.api, evotrainer.api.probes, numpy and pure "
            f"standard-library modules such as math, re, json, collections)")


def _describe(exc: BaseException) -> str:
    """`Type: message` of an exception that harness code made, which may not print."""
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text[:500]}"


class SandboxedHarness:
    """A Harness whose every call is timed for the parent's watchdog and fails as CandidateFailure."""

    def __init__(self, harness: Harness, label: str, slot: int, marks: Any, guard: _Guard):
        self.harness, self.label, self._marks, self._guard = harness, label, marks, guard
        self.spec, self.version = harness.spec, harness.version
        self._code = {c: slot * 16 + c for c in _CALLS}

    def _run(self, code: int, method: Any, *args: Any) -> Any:
        marks = self._marks
        marks[0] = self._code[code]
        marks[1] = time.monotonic()
        try:
            value = method(*args)
        except HarnessError as exc:
            raise CandidateFailure(str(exc), self.label) from None
        except BaseException as exc:
            raise CandidateFailure(f"{_CALLS[code]} raised {_describe(exc)}", self.label) from None
        finally:
            marks[1] = 0.0
        if self._guard.violations:
            raise CandidateFailure(f"{_CALLS[code]} attempted {self._guard.violations[0]}", self.label)
        return value

    def reward(self, rollout: Rollout) -> dict[str, float]:
        return self._run(_REWARD, self.harness.reward, rollout)

    def training_reward(self, components: Mapping[str, float]) -> float:
        return self.harness.training_reward(components)  # trusted arithmetic, no harness code

    def keep_rollout(self, rollout: Rollout) -> bool:
        return self._run(_KEEP_ROLLOUT, self.harness.keep_rollout, rollout)

    def keep_group(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
        return self._run(_KEEP_GROUP, self.harness.keep_group, rollouts, rewards)

    def stop(self, turns: Sequence[Turn]) -> str | None:
        return self._run(_STOP, self.harness.stop, turns)

    def weights(self, task_stats: Sequence[TaskStats]) -> dict[str, float]:
        return self._run(_WEIGHTS, self.harness.weights, task_stats)


@dataclass(frozen=True)
class _Boot:
    tmpdir: str
    harnesses: tuple[tuple[str, Mapping[str, str]], ...]
    job: Any
    memory_limit_mb: int
    require_seccomp: bool = False  # in the OS sandbox without a fresh uid the filter is required


def _send(conn: Connection, message: list) -> None:
    """To the parent as JSON, never pickle: the parent must not unpickle what a worker (where
    harness code can reach `os.write`) puts on the pipe."""
    try:
        conn.send_bytes(json.dumps(message, allow_nan=False).encode())
    except (BrokenPipeError, EOFError, OSError):
        os._exit(0)  # the parent is gone or closed the pipe: nothing left to report to


def _close_resource_tracker() -> None:
    """The worker needs no semaphores or shared memory; a pipe to the tracker (which unlinks
    what it is told about) is one more descriptor harness code could write to."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    fd = getattr(tracker, "_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        tracker._fd = None


def _worker_main(conn: Connection, marks: Any, boot: _Boot, isolation: Mapping[str, Any] | None = None) -> None:
    """The worker loop. `isolation`: what the OS sandbox gave this process (sandbox_launch.py),
    sent to the parent with the ready message; None in a forkserver worker (the opt-out)."""
    os.setsid()  # its own process group, so a timeout kill takes anything it started with it
    os.chdir(boot.tmpdir)
    sys.dont_write_bytecode = True  # importlib writing .pyc files would look like a violation
    # Harness prints would land in the middle of the parent's progress bar.
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    if boot.memory_limit_mb:  # a runaway allocation is a MemoryError in the harness, not host swap
        limit = boot.memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _close_resource_tracker()
    guard = _Guard(boot.tmpdir)
    guard.install()
    try:
        state = boot.job.open(guard.trusted_io)
    except Exception:
        _send(conn, ["error", traceback.format_exc()])
        return
    guard.lock()
    harnesses = {}
    for slot, (label, sources) in enumerate(boot.harnesses):
        marks[0], marks[1] = slot * 16 + _LOAD, time.monotonic()
        try:
            harness = Harness(sources, Path(label))
        except HarnessError as exc:
            _send(conn, ["failed", label, str(exc)])
            return
        except BaseException as exc:
            _send(conn, ["failed", label, f"loading raised {_describe(exc)}"])
            return
        finally:
            marks[1] = 0.0
        if guard.violations:
            _send(conn, ["failed", label, f"loading the harness files attempted {guard.violations[0]}"])
            return
        harnesses[label] = SandboxedHarness(harness, label, slot, marks, guard)
    _send(conn, ["ready", [{label: h.version for label, h in harnesses.items()}, dict(isolation or {})]])
    while True:
        marks[2] = 0.0  # waiting for work: the parent's stall check watches this
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        marks[2] = 1.0
        if message is None:
            return
        try:
            _send(conn, ["done", boot.job.run(state, harnesses, message)])
        except CandidateFailure as failure:
            _send(conn, ["failed", failure.harness, failure.reason])
        except Exception:
            _send(conn, ["error", traceback.format_exc()])
