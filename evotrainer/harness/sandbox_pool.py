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
from typing import Any, NoReturn, Protocol

from evotrainer.errors import EvotrainerError
from evotrainer.harness.redact import redact
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
    # Any one message (a chunk) whose job does not say how many harness calls it makes.
    message_timeout_s: float = 600.0


class WorkerJob(Protocol):
    """Trusted code a worker runs. Picklable. `open` runs before harness code is loaded and gets
    `trusted_io`: a context manager inside which the job may open database connections (and
    nothing else the guards refuse); it must close them before it returns to harness code."""

    def open(self, trusted_io: Callable[[], AbstractContextManager[None]]) -> Any: ...

    def run(self, state: Any, harnesses: Mapping[str, SandboxedHarness], message: Any) -> Any: ...

    # Optional: `calls(message) -> int | None`, at most how many harness calls `run` makes for
    # that message. With it the parent's own deadline for the message is that many per-call
    # budgets (see SandboxPool._budget); without it, SandboxLimits.message_timeout_s.


# ---------------------------------------------------------------- in the parent


class _Corrupt(EvotrainerError):
    """What came back on a worker's pipe is not a message the worker code sends."""


_KINDS = {"ready": 2, "done": 2, "failed": 3, "error": 2}
# What one frame from a worker may cost the parent to decode. json.loads turns two bytes into a
# 64-byte list (`[]`) or an 8-byte pointer (`0,`), so the size cap alone would let a frame of
# nested empty lists cost ~27x its size. A count of its brackets and separators (C speed, before
# any decoding, over-counting those inside strings) bounds the objects decoding can make: at most
# _MAX_CONTAINERS lists or dicts and _MAX_ITEMS items, so at most about 200 MB for any frame.
# An honest reply is far below each (a backtest chunk of 4096 rollouts: ~0.6 MB, ~10k containers).
_MAX_MESSAGE = 16 * 2**20
_MAX_CONTAINERS = 2**18
_MAX_ITEMS = 2**21
_GRACE_S = 1.0  # a message's own work beside its harness calls (decoding rollouts, encoding the reply)


def _text(value: Any) -> str:
    """A string field of a worker's message (any JSON value a forger put there), bounded."""
    return value[:20_000] if isinstance(value, str) else repr(value)[:2000]


def _decode(payload: bytes) -> Any:
    """A worker's frame as JSON, refused (_Corrupt) before decoding when it could cost more than
    the bounds above."""
    containers = payload.count(b"[") + payload.count(b"{")
    if containers > _MAX_CONTAINERS:
        raise _Corrupt(f"a frame of up to {containers} lists or objects (at most {_MAX_CONTAINERS})")
    items = payload.count(b",") + payload.count(b":")
    if items > _MAX_ITEMS:
        raise _Corrupt(f"a frame of up to {items} items (at most {_MAX_ITEMS})")
    try:
        # NaN, Infinity and 1e999 (which reads as inf) decode; the consumers refuse them
        # (validate_*, scoring.py) as they check everything else in a reply: a hook per float
        # here would double the decoding time of a backtest reply.
        return json.loads(payload)
    except ValueError:
        raise _Corrupt("a frame that is not JSON") from None
    except RecursionError:  # nested past the parent's stack: a worker's own frame
        raise _Corrupt("a frame nested too deeply") from None


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
        self.started = time.monotonic()
        self.busy: list[int] = []  # message indexes in flight, oldest first
        self.budgets: list[float] = []  # the parent's deadline of each, in seconds from `since`
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
            message = _decode(payload)
            if not (isinstance(message, list) and message and isinstance(message[0], str)
                    and _KINDS.get(message[0]) == len(message)):
                raise _Corrupt("a message of unknown shape")
            out.append(message)
        return out

    def outer(self, label: Any) -> str:
        """The parent's label for a label a worker message names (harness code may forge it)."""
        return self.labels[self.inner.index(label)] if label in self.inner else self.last_label()

    def last_label(self) -> str:
        """The harness to blame. The call marks are the worker's own (harness code can write
        them), so they only choose among the harnesses this worker holds."""
        if len(self.labels) == 1:
            return self.labels[0]
        slot = int(self.marks[0]) // 16 if 0 <= self.marks[0] < 16 * len(self.labels) else -1
        return self.labels[slot] if 0 <= slot < len(self.labels) else (self.labels or ["candidate"])[-1]

    def blame(self, label: Any) -> str:
        """The parent's label for a harness a worker's message names, if it is one this worker
        holds (by its inside name); else last_label()."""
        return self.outer(label) if isinstance(label, str) else self.last_label()

    def current_call(self) -> tuple[str, str, float] | None:
        """(harness label, what, seconds running) of the harness call in progress, if any."""
        code, started = self.marks[0], self.marks[1]
        if not started or not (0 <= code < 2**20 and 0 < started < 2**40):  # forged marks: no call
            return None
        slot, call = divmod(int(code), 16)
        label = self.labels[slot] if slot < len(self.labels) else self.last_label()
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
                if kind != "ready" or worker.ready:  # only harness code, loaded by now, sends these
                    self._violation(worker, f"a {kind!r} message before the worker was ready"
                                    if kind != "ready" else "a second 'ready' message")
                worker.ready = True
                if not (isinstance(payload, list) and len(payload) == 2 and all(isinstance(p, dict) for p in payload)):
                    self._violation(worker, "a malformed ready message")
                self.versions = {worker.outer(k): v for k, v in payload[0].items()}
                # what the launcher reported stands: the worker's own word only adds to it
                worker.isolation.update({k: v for k, v in payload[1].items() if k not in worker.isolation})
        # What the workers really got (the launcher's report and the worker's own), e.g. for a report.
        self.isolation = dict(self.workers[0].isolation) if self.workers else {}

    def _violation(self, worker: _Worker, what: str) -> NoReturn:
        """A message our worker code never sends where it came: harness code wrote it."""
        label = worker.last_label()
        self.close()
        raise CandidateFailure(f"the sandbox worker broke the message protocol ({what}; harness code "
                               "wrote into its socket?)", label)

    def _machine_fault(self) -> str | None:
        """Why a worker that loads no harness cannot start here either, or None when it can.

        The parent cannot tell a failure of our own start-up code from one harness code forged
        (both come before the ready message, and the call marks are the worker's to write), so it
        asks a control: the same job in a fresh worker with no harness at all. Only if that
        fails too is it the machine's fault (SandboxError); otherwise the harness's."""
        control = SandboxPool((), self.job, 1, self.limits)
        try:
            control.__enter__()
        except SandboxError as exc:
            return redact(str(exc))
        except CandidateFailure as exc:  # nothing of a harness ran: ours after all
            return exc.reason
        finally:
            control.close()
        return None

    def _failed_before_ready(self, worker: _Worker, what: str) -> NoReturn:
        label = worker.labels[-1] if worker.labels else "candidate"
        self.close()
        fault = self._machine_fault() if self.harnesses else what
        if fault is not None:
            raise SandboxError(f"a sandbox worker could not start: {fault}")
        raise CandidateFailure(f"{what} while loading the harnesses (a worker that loads none starts)", label)

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
                    worker.budgets.append(self._budget(item[1]))
                    worker.stalled_since = None
                    worker.post(item[1])  # a worker that died meanwhile shows on its sentinel
            if exhausted and not any(w.busy for w in self.workers):
                return
            for worker, kind, payload in self._poll(None):
                if kind != "done":
                    self._violation(worker, f"a {kind!r} message after the worker was ready")
                if not worker.busy:
                    self._violation(worker, "a reply to no request")
                worker.since, worker.stalled_since = time.monotonic(), None
                worker.budgets.pop(0)
                yield worker.busy.pop(0), payload

    def _budget(self, message: Any) -> float:
        """The parent's own deadline for one message, in seconds from when the worker can start
        on it: its harness calls times the per-call budget where the job can count them, else
        message_timeout_s. It reads nothing the worker writes, so forged call marks (the worker's
        shared page) cannot stretch it."""
        count = getattr(self.job, "calls", None)
        calls = count(message) if count is not None else None
        if calls is None:
            return self.limits.message_timeout_s
        return min(self.limits.message_timeout_s, max(1, calls) * self.limits.call_timeout_s + _GRACE_S)

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
                        label = worker.blame(message[1])
                        self.close()
                        raise CandidateFailure(_text(message[2]), label)
                    if kind == "error":
                        if worker.ready:  # harness code ran here and may have broken our code
                            last = _text(message[1]).strip().splitlines()[-1:]
                            label = worker.last_label()
                            self.close()
                            raise CandidateFailure("the sandbox worker failed outside harness code after "
                                                   f"running it: {' '.join(last)}", label)
                        # Before ready: our start-up code, or harness code forging its message.
                        last = _text(message[1]).strip().splitlines()[-1:]
                        self._failed_before_ready(worker, f"the worker failed: {' '.join(last)}")
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
            if worker.busy and now - worker.since > worker.budgets[0]:
                label = worker.last_label()
                self.close()
                raise CandidateFailure(f"one message took over {worker.budgets[0]:g} s, the parent's "
                                       "deadline for its harness calls (worker killed)", label)
            call = worker.current_call()
            if call is None:
                continue
            label, what, running = call
            limit = self.limits.load_timeout_s if what == _CALLS[_LOAD] else self.limits.call_timeout_s
            if running > limit:
                self.close()
                raise CandidateFailure(f"{what} did not return within {limit:g} s (worker killed)", label)
        if load_deadline is not None and time.monotonic() > load_deadline:
            late = next(w for w in self.workers if not w.ready)
            self._failed_before_ready(late, f"no ready message within {time.monotonic() - late.started:.0f} s")
