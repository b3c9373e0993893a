"""The parent side of the harness sandbox: a pool of sandboxed workers, the message protocol, the watchdog."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import queue
import shutil
import signal
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Protocol

from evotrainer.errors import EvotrainerError
from evotrainer.harness.sandbox_failures import CandidateFailure, SandboxError
from evotrainer.harness.sandbox_launch import INSIDE, SandboxedProcess, isolated
from evotrainer.harness.sandbox_worker import (
    _CALLS,
    _LOAD,
    SandboxedHarness,
    _Boot,
    _worker_main,
)

_START_LOCK = threading.Lock()


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

    def open(self, trusted_io: Callable[[], AbstractContextManager[None]]) -> Any: ...

    def run(self, state: Any, harnesses: Mapping[str, SandboxedHarness], message: Any) -> Any: ...


# ---------------------------------------------------------------- in the parent


class _Corrupt(EvotrainerError):
    """What came back on a worker's pipe is not a message the worker code sends."""


_KINDS = {"ready": 2, "done": 2, "failed": 3, "error": 2}
_MAX_MESSAGE = 256 * 2**20


class _Worker:
    """One worker process: in the OS sandbox (ctx None, sandbox_launch.py), or forked from the
    local forkserver (the explicit opt-out)."""

    def __init__(self, ctx: Any, harnesses: tuple, job: WorkerJob, memory_limit_mb: int):
        self.buffer = b""
        self.stalled_since: float | None = None
        self.since = 0.0  # when the message it now works on was sent, or its last reply came
        self.labels = [label for label, _ in harnesses]
        # Inside, every harness is named by its slot alone: "base", "candidate" or a trainer's
        # label would tell harness code which job loaded it (harness/calls.py). Replies name the
        # inside label; `outer` maps it back.
        self.inner = inner_labels(len(self.labels))
        harnesses = tuple((name, sources) for name, (_, sources) in zip(self.inner, harnesses))
        self.ready = False
        self.busy: list[int] = []  # message indexes in flight, oldest first
        self.isolation: dict[str, Any] = {}
        self.tmpdir: str | None = None
        if ctx is None:
            self.process: Any = SandboxedProcess(memory_limit_mb, require_seccomp=False)
            try:
                self.process.start()  # SandboxError if the sandbox cannot be had: fail closed
            except BaseException:
                self.process.close()
                raise
            self.conn, self.marks = self.process.conn, self.process.marks
            self.isolation = {k: self.process.status.get(k) for k in _ISOLATION_KEYS}
            self._send_boot(_Boot(INSIDE, harnesses, job, memory_limit_mb, self.process.require_seccomp))
        else:
            self.tmpdir = tempfile.mkdtemp(prefix="evotrainer-sandbox-")
            boot = _Boot(self.tmpdir, harnesses, job, memory_limit_mb, False)
            self.marks = ctx.RawArray("d", 3)
            self.conn, child = ctx.Pipe()
            self.process = ctx.Process(target=_worker_main, args=(child, self.marks, boot),
                                       name="evotrainer-sandbox", daemon=True)
            with _START_LOCK, _worker_env():
                self.process.start()
            child.close()
        # Messages go out on a thread: a large chunk must never block the parent in a send while
        # the worker is busy, or the watchdog would stop watching.
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(target=self._sender, name="evotrainer-sandbox-send", daemon=True)
        self.sender.start()

    def _send_boot(self, boot: _Boot) -> None:
        try:
            self.conn.send(boot)
        except OSError as exc:
            self.process.close()
            raise SandboxError(f"the sandboxed worker did not take its boot message: {exc}") from None

    def post(self, message: Any) -> None:
        self.outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _sender(self) -> None:
        while True:
            data = self.outbox.get()
            if data is None:
                return
            try:
                self.conn.send_bytes(data)
            except OSError:  # it died or closed its end: the sentinel tells the parent
                return

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
            except RecursionError:  # nested past the parent's stack: a worker's own frame
                raise _Corrupt("a frame nested too deeply") from None
            if not (isinstance(message, list) and message and _KINDS.get(message[0]) == len(message)):
                raise _Corrupt("a message of unknown shape")
            out.append(message)
        return out

    def outer(self, label: Any) -> str:
        """The parent's label for a label a worker message names (harness code may forge it)."""
        return self.labels[self.inner.index(label)] if label in self.inner else self.last_label()

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
        if isinstance(self.process, SandboxedProcess):
            self.process.kill()
            return
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
        self.outbox.put(None)
        self.sender.join(timeout=2)  # the peer is gone, so a send in progress has failed by now
        self.conn.close()
        if isinstance(self.process, SandboxedProcess):
            self.process.close()
        else:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def inner_labels(n: int) -> list[str]:
    """What the harnesses of a worker are called inside it: the same for every job."""
    return ["harness"] if n == 1 else [f"harness-{i}" for i in range(n)]


_ISOLATION_KEYS = ("netns", "mountns", "pidns", "root", "uid", "no_new_privs")
_preloaded = False


def _context(job: WorkerJob) -> Any:
    """Used only with the opt-out (sandbox_launch.ISOLATION_ENV=none). The "forkserver" context:
    a clean server process (a fresh interpreter, never a fork of this one, never running harness
    code) imports our worker modules once, and every worker is forked from it in milliseconds
    instead of importing them again (~0.4 s each)."""
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
        self.isolation: dict[str, Any] = {}

    def __enter__(self) -> SandboxPool:
        ctx = None if isolated() else _context(self.job)
        try:
            for _ in range(self.size):
                self.workers.append(_Worker(ctx, self.harnesses, self.job, self.limits.memory_limit_mb))
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
                if not (isinstance(payload, list) and len(payload) == 2 and all(isinstance(p, dict) for p in payload)):
                    label = worker.labels[-1]
                    self.close()
                    raise CandidateFailure("the sandbox worker sent a malformed ready message "
                                           "(harness code wrote into its pipe?)", label)
                self.versions = {worker.outer(k): v for k, v in payload[0].items()}
                worker.isolation.update(payload[1])
        # What the workers really got (the launcher's report and the worker's own), e.g. for a report.
        self.isolation = dict(self.workers[0].isolation) if self.workers else {}

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
                    worker.post(item[1])  # a worker that died meanwhile shows on its sentinel
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
                        raise CandidateFailure(str(message[2]), worker.outer(message[1]))
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
        if code == -signal.SIGSYS:  # the seccomp filter's answer
            how += ": a system call the sandbox forbids (a process, a program, a socket, ptrace...)"
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
