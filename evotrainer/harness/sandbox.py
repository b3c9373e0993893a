"""Run untrusted harness code in guarded worker processes: any harness fault becomes a CandidateFailure.

A candidate harness is code an LLM may have written. It runs only in worker processes (forked
from a clean "forkserver" process), never in the process that drives a run. Inside a worker, before any
harness file is executed:

- an audit hook (`sys.addaudithook`, which cannot be removed) refuses processes (`subprocess`,
  `os.system`, `os.exec*`, `os.spawn*`, `os.fork`), signals to other processes, sockets, ctypes,
  new database connections, and any write, delete, rename or chmod outside the worker's own
  temporary folder (also the working directory);
- an import guard lets code whose globals are not a real, non-harness module import only
  `evotrainer.api`, numpy and the pure standard-library modules in ALLOWED_MODULES. This is what
  stops `__import__("os")`, which the loader's static `check_imports` cannot see.

A refused operation raises PermissionError/ImportError inside the harness *and* is recorded, so a
harness that swallows the exception still fails. The parent enforces a time budget per harness
call through a small shared array (which call is running, since when) and kills the worker's
process group when it is exceeded, so a hang in C code (a regex, numpy) is caught too; a memory
cap turns a runaway allocation into a MemoryError.

The parent also assumes the worker may be compromised: workers answer in JSON (never pickle,
which would run code in the parent), the parent reads only the bytes that are there (garbage in
the pipe cannot block it), and a worker that dies, stalls, writes into its pipes or runs past
the per-message budget fails the harness it was running. Nothing a worker does raises anything
but CandidateFailure in the parent once the harnesses are loaded.

What this is not: a security boundary against code written to escape. Python objects are
introspectable (any allowed module that imports os exposes `os.sys.modules`), so determined
code can switch the guards off. They stop mistakes and the obvious attacks; a hostile threat
model needs OS isolation (a container, seccomp, a read-only store mount) around the worker.
"""

from __future__ import annotations

import builtins
import json
import multiprocessing
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Iterator, Mapping, Protocol, Sequence

from evotrainer.api import Rollout, Turn
from evotrainer.harness.loader import Harness, HarnessError

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
_LOAD, _REWARD, _KEEP_ROLLOUT, _KEEP_GROUP, _STOP = 1, 2, 3, 4, 5
_CALLS = {_LOAD: "loading the harness files", _REWARD: "reward.py: reward()",
          _KEEP_ROLLOUT: "filters.py: keep_rollout()", _KEEP_GROUP: "filters.py: keep_group()",
          _STOP: "rollout.py: stop()"}
_START_LOCK = threading.Lock()


class CandidateFailure(Exception):
    """A harness fault that rejects that harness (not the run); `harness` is its label."""

    def __init__(self, reason: str, harness: str = "candidate"):
        super().__init__(reason)
        self.reason = reason
        self.harness = harness

    def __reduce__(self):  # multi-argument exceptions need this to cross a process boundary
        return (CandidateFailure, (self.reason, self.harness))

    def __str__(self) -> str:
        return f"{self.harness} harness: {self.reason}"


class SandboxError(RuntimeError):
    """A fault of our own side before any harness code ran (a worker that cannot start or open
    its job); carries the worker traceback."""


@dataclass(frozen=True)
class SandboxLimits:
    call_timeout_s: float = 5.0  # any one call into harness code
    load_timeout_s: float = 60.0  # executing the harness files in a worker
    memory_limit_mb: int = 4096  # address space of one worker (0: no limit)
    # Any one message (a chunk): a bound that holds even if harness code forges the call marks.
    message_timeout_s: float = 600.0


class WorkerJob(Protocol):
    """Trusted code a worker runs. Picklable. `open` runs before harness code is loaded and gets
    `trusted_io`: a context manager inside which the job may open database connections (and
    nothing else the guards refuse); it must close them before it returns to harness code."""

    def open(self, trusted_io: Callable[[], ContextManager[None]]) -> Any: ...

    def run(self, state: Any, harnesses: Mapping[str, "SandboxedHarness"], message: Any) -> Any: ...


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
    harness file. Code run with other globals (a Jinja template, an `exec` string) takes the
    verdict of the nearest caller that does belong to a module.
    """
    while frame is not None:
        globals_ = frame.f_globals
        name = globals_.get("__name__")
        if isinstance(name, str) and name.startswith(HARNESS_MODULE_PREFIX):
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
        bad = [w for w in wanted if w != "evotrainer.api"]
        return f"import of {bad[0]!r} (harness code sees only evotrainer.api)" if bad else None
    if top == "numpy" or name in ALLOWED_MODULES:
        return None
    return (f"import of {name!r} (allowed: evotrainer.api, numpy and pure standard-library "
            f"modules such as math, re, json, collections)")


def _describe(exc: BaseException) -> str:
    """`Type: message` of an exception that harness code made, which may not print."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001
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
        except BaseException as exc:  # noqa: BLE001 -- e.g. an exception whose __str__ raises
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


@dataclass(frozen=True)
class _Boot:
    tmpdir: str
    harnesses: tuple[tuple[str, Mapping[str, str]], ...]
    job: Any
    memory_limit_mb: int


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


def _worker_main(conn: Connection, marks: Any, boot: _Boot) -> None:
    os.setsid()  # its own process group, so a timeout kill takes anything it started with it
    os.chdir(boot.tmpdir)
    sys.dont_write_bytecode = True  # importlib writing .pyc files would look like a violation
    # Harness prints would land in the middle of the parent's progress bar.
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    if boot.memory_limit_mb:  # a runaway allocation is a MemoryError in the harness, not host swap
        limit = boot.memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _close_resource_tracker()
    guard = _Guard(boot.tmpdir)
    guard.install()
    try:
        state = boot.job.open(guard.trusted_io)
    except Exception:  # noqa: BLE001
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
        except BaseException as exc:  # noqa: BLE001
            _send(conn, ["failed", label, f"loading raised {_describe(exc)}"])
            return
        finally:
            marks[1] = 0.0
        if guard.violations:
            _send(conn, ["failed", label, f"loading the harness files attempted {guard.violations[0]}"])
            return
        harnesses[label] = SandboxedHarness(harness, label, slot, marks, guard)
    _send(conn, ["ready", {label: h.version for label, h in harnesses.items()}])
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
        except Exception:  # noqa: BLE001 -- ours, or harness code broke ours: the parent decides
            _send(conn, ["error", traceback.format_exc()])


# ---------------------------------------------------------------- in the parent


class _Corrupt(Exception):
    """What came back on a worker's pipe is not a message the worker code sends."""


_KINDS = {"ready": 2, "done": 2, "failed": 3, "error": 2}
_MAX_MESSAGE = 256 * 2**20


class _Worker:
    def __init__(self, ctx: Any, boot: _Boot):
        self.marks = ctx.RawArray("d", 3)
        self.buffer = b""
        self.stalled_since: float | None = None
        self.since = 0.0  # when the message it now works on was sent, or its last reply came
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, self.marks, boot),
                                   name="evotrainer-sandbox", daemon=True)
        self.tmpdir = boot.tmpdir
        self.labels = [label for label, _ in boot.harnesses]
        self.ready = False
        self.busy: list[int] = []  # message indexes in flight, oldest first
        with _START_LOCK, _worker_env():
            self.process.start()
        child.close()

    def read(self) -> list[list] | None:
        """The complete messages on the pipe now (None at EOF). Reads only what is there, so
        garbage written into the pipe can never block the parent; it raises _Corrupt instead."""
        try:
            data = os.read(self.conn.fileno(), 1 << 20)
        except OSError:
            return None
        if not data:
            return None
        self.buffer += data
        out = []
        while len(self.buffer) >= 4:  # multiprocessing's framing: !i size (-1: then !Q size)
            (size,), header = struct.unpack("!i", self.buffer[:4]), 4
            if size == -1:
                if len(self.buffer) < 12:
                    break
                (size,), header = struct.unpack("!Q", self.buffer[4:12]), 12
            if not 0 <= size <= _MAX_MESSAGE:
                raise _Corrupt(f"a frame of {size} bytes")
            if len(self.buffer) < header + size:
                break
            payload, self.buffer = self.buffer[header:header + size], self.buffer[header + size:]
            try:
                message = json.loads(payload)
            except ValueError:
                raise _Corrupt("a frame that is not JSON") from None
            if not (isinstance(message, list) and message and _KINDS.get(message[0]) == len(message)):
                raise _Corrupt("a message of unknown shape")
            out.append(message)
        return out

    def last_label(self) -> str:
        slot = int(self.marks[0]) // 16
        return self.labels[slot] if slot < len(self.labels) else "candidate"

    def current_call(self) -> tuple[str, str, float] | None:
        """(harness label, what, seconds running) of the harness call in progress, if any."""
        code, started = self.marks[0], self.marks[1]
        if not started:
            return None
        slot, call = divmod(int(code), 16)
        label = self.labels[slot] if slot < len(self.labels) else "?"
        return label, _CALLS.get(call, "harness code"), time.monotonic() - started

    def reap(self, timeout: float) -> bool:
        """Wait for the process to exit, polling. Never `Process.join`: it trusts the sentinel
        pipe, which harness code can write to, and then blocks in waitpid on a live process."""
        deadline = time.monotonic() + timeout
        while self.process.exitcode is None:  # exitcode polls with WNOHANG
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def kill(self) -> None:
        if self.process.pid is not None and self.process.exitcode is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.reap(5)

    def close(self) -> None:
        if self.process.exitcode is None and self.ready and not self.busy:  # idle: let it exit
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.reap(2)
        self.kill()
        self.conn.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


_preloaded = False


def _context(job: WorkerJob) -> Any:
    """The "forkserver" context: a clean server process (a fresh interpreter, never a fork of
    this one, never running harness code) imports our worker modules once, and every worker is
    forked from it in milliseconds instead of importing them again (~0.4 s each)."""
    global _preloaded
    ctx = multiprocessing.get_context("forkserver")
    if not _preloaded:  # only matters before the server starts, which the first worker does
        ctx.set_forkserver_preload([__name__, type(job).__module__])
        _preloaded = True
    return ctx


_WORKER_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}


@contextmanager
def _worker_env() -> Iterator[None]:
    """What the fork server (started with the first worker) and so every worker inherits: fixed
    str hashing, so `hash()` and set order (and so a harness's results) are the same in every
    worker and every replay; one BLAS thread per worker. Restored in the parent right after."""
    saved = {k: os.environ.get(k) for k in _WORKER_ENV}
    os.environ.update(_WORKER_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class SandboxPool:
    """Worker processes that each load the same harnesses and run a trusted job on messages.

    `harnesses` is [(label, {filename: text})]. `imap` hands messages out (at most two in flight
    per worker) and yields `(index, reply)` as replies arrive. A harness fault in any worker stops
    every worker and raises CandidateFailure naming the harness by its label; the pool is then
    closed, and the calling process carries on.
    """

    POLL_S = 0.05
    STALL_S = 5.0  # generous: on a loaded machine a woken worker can wait to be scheduled
    STARTUP_S = 120.0

    def __init__(self, harnesses: Sequence[tuple[str, Mapping[str, str]]], job: WorkerJob,
                 workers: int = 1, limits: SandboxLimits = SandboxLimits()):
        self.harnesses = tuple((label, dict(sources)) for label, sources in harnesses)
        self.job, self.limits = job, limits
        self.size = max(1, int(workers))
        self.workers: list[_Worker] = []
        self.versions: dict[str, str] = {}

    def __enter__(self) -> "SandboxPool":
        ctx = _context(self.job)
        try:
            for _ in range(self.size):
                tmpdir = tempfile.mkdtemp(prefix="evotrainer-sandbox-")
                boot = _Boot(tmpdir, self.harnesses, self.job, self.limits.memory_limit_mb)
                self.workers.append(_Worker(ctx, boot))
            self._await_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []

    def _await_ready(self) -> None:
        # Loading harness files is timed per worker (marks); this only bounds the interpreter
        # start and our imports, which a loaded machine can slow down a lot.
        deadline = time.monotonic() + max(self.STARTUP_S, 2 * self.limits.load_timeout_s)
        while not all(w.ready for w in self.workers):
            for worker, kind, payload in self._poll(deadline):
                if kind != "ready":
                    raise SandboxError(f"worker sent {kind!r} before it was ready")
                worker.ready = True
                self.versions = payload

    def imap(self, messages: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        pending = enumerate(messages)
        exhausted = False
        while True:
            for worker in self.workers:
                while not exhausted and len(worker.busy) < 2:
                    item = next(pending, None)
                    if item is None:
                        exhausted = True
                        break
                    if not worker.busy:
                        worker.since = time.monotonic()
                    worker.busy.append(item[0])
                    worker.stalled_since = None
                    try:
                        worker.conn.send(item[1])
                    except OSError:  # it died (or its pipe was closed) under harness code
                        self._died(worker)
            if exhausted and not any(w.busy for w in self.workers):
                return
            for worker, kind, payload in self._poll(None):
                if kind != "done":
                    raise SandboxError(f"worker sent {kind!r} while busy")
                worker.since, worker.stalled_since = time.monotonic(), None
                yield worker.busy.pop(0), payload

    def _poll(self, load_deadline: float | None) -> Iterator[tuple[_Worker, str, Any]]:
        """Wait for messages; turn faults, deaths and timeouts into exceptions (workers stopped)."""
        while True:
            by_conn = {w.conn: w for w in self.workers}
            by_sentinel = {w.process.sentinel: w for w in self.workers}
            ready = wait([*by_conn, *by_sentinel], timeout=self.POLL_S)
            got, dead = [], []
            for obj in ready:
                worker = by_conn.get(obj)
                if worker is None:
                    continue
                try:
                    messages = worker.read()
                except _Corrupt as exc:
                    label = worker.last_label()
                    self.close()
                    raise CandidateFailure(f"wrote into the sandbox worker's result pipe ({exc})", label) from None
                if messages is None:
                    dead.append(worker)  # EOF: it died; its sentinel says how
                for message in messages or ():
                    kind = message[0]
                    if kind == "failed":
                        self.close()
                        raise CandidateFailure(str(message[2]), str(message[1]))
                    if kind == "error":
                        self.close()
                        if worker.ready:  # harness code ran here and may have broken our code
                            last = str(message[1]).strip().splitlines()[-1:]
                            raise CandidateFailure("the sandbox worker failed outside harness code after "
                                                   f"running it: {' '.join(last)}", worker.last_label())
                        raise SandboxError(f"sandbox worker failed:\n{message[1]}")
                    got.append((worker, kind, message[1]))
            if got:
                yield from got
                return
            for obj in ready:
                if obj in by_sentinel:
                    self._died(by_sentinel[obj])
            for worker in dead:
                worker.reap(1)
                self._died(worker)
            self._check_time(load_deadline)

    def _died(self, worker: _Worker) -> None:
        if not worker.reap(1):  # its sentinel fired, yet it runs: harness code wrote to the pipe
            label = worker.last_label()
            self.close()
            raise CandidateFailure("wrote into the sandbox worker's exit sentinel", label)
        code = worker.process.exitcode
        call = worker.current_call()
        self.close()
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        if call is not None:
            raise CandidateFailure(f"the worker process died ({how}) during {call[1]}", call[0])
        if not worker.ready:
            raise CandidateFailure(f"the worker process died ({how}) while loading the harnesses",
                                   worker.labels[-1])
        # Our code does not exit on its own: harness code (os._exit, a closed pipe) made it.
        raise CandidateFailure(f"the worker process died ({how}) after running harness code",
                               worker.last_label())

    def _check_time(self, load_deadline: float | None) -> None:
        now = time.monotonic()
        for worker in self.workers:
            # Waiting for work while we wait for its answer: someone else read the request.
            if worker.busy and not worker.marks[2]:
                worker.stalled_since = worker.stalled_since or now
                if now - worker.stalled_since > self.STALL_S:
                    label = worker.last_label()
                    self.close()
                    raise CandidateFailure("the sandbox worker lost the parent's request "
                                           "(harness code read from its pipe?)", label)
            else:
                worker.stalled_since = None
            if worker.busy and now - worker.since > self.limits.message_timeout_s:
                label = worker.last_label()
                self.close()
                raise CandidateFailure(f"one chunk took over {self.limits.message_timeout_s:g} s "
                                       "(the time budget)", label)
            call = worker.current_call()
            if call is None:
                continue
            label, what, running = call
            limit = self.limits.load_timeout_s if what == _CALLS[_LOAD] else self.limits.call_timeout_s
            if running > limit:
                self.close()
                raise CandidateFailure(f"{what} did not return within {limit:g} s (worker killed)", label)
        if load_deadline is not None and time.monotonic() > load_deadline:
            self.close()
            raise SandboxError("a sandbox worker did not start in time")


__all__ = ["ALLOWED_MODULES", "CandidateFailure", "SandboxError", "SandboxLimits", "SandboxPool",
           "SandboxedHarness", "WorkerJob"]
