"""Symbolic answer equivalence with math-verify, in a worker process we can kill.

math-verify bounds its own work with `signal.alarm`, which only works on the main thread and
cannot interrupt a long C-level step (a huge integer power in sympy). So its timeouts are off
(`parsing_timeout=None`, `timeout_seconds=None`) and it runs in one long-lived child process:
the parent waits for each answer with its own wall-clock limit and, past it, kills the child's
process group and starts a fresh one for the next call. The child caps its own address space
(RLIMIT_AS) and, once math-verify is imported, loads the sandbox's seccomp filter
(evotrainer/sandbox/seccomp.py: no fork, exec or network sockets) where the kernel allows.

Only math-verify's LaTeX extraction is used: its plain-expression path calls sympy's
`parse_expr`, which evaluates Python; the LaTeX path is an ANTLR parser. A bare answer such as
"1/2" or "x^2+1" is wrapped in `$...$`, so it still parses.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from evotrainer.sandbox import seccomp

STARTUP_S = 60.0  # importing sympy and math-verify on a loaded machine
MEM_MB = 2048
_SECCOMP = Path(seccomp.__file__).read_text(encoding="utf-8")

_WORKER = _SECCOMP + r'''
import ctypes, json, os, resource, sys

def _main():
    out = os.fdopen(os.dup(1), "w")  # the replies' channel; anything a library prints goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    mem = int(sys.argv[1]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import logging
    logging.disable(logging.CRITICAL)  # math-verify warns that its timeouts are off: ours are on
    from math_verify import LatexExtractionConfig, parse, verify
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, which seccomp requires
    filtered = install()
    config = [LatexExtractionConfig()]
    out.write(json.dumps({"ready": True, "seccomp": filtered}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            gold = parse(req["gold"], extraction_config=config, fallback_mode="no_fallback", parsing_timeout=None)
            if req.get("pred") is None:
                reply = {"parsed": bool(gold)}
            else:
                pred = parse(req["pred"], extraction_config=config, fallback_mode="no_fallback", parsing_timeout=None)
                if not gold:
                    reply = {"error": "gold answer does not parse"}
                elif not pred:
                    reply = {"parsed": False}
                else:
                    reply = {"parsed": True, "equal": bool(verify(gold, pred, timeout_seconds=None))}
        except BaseException as e:  # MemoryError and RecursionError included: answer, then go on
            reply = {"error": type(e).__name__}
        out.write(json.dumps(reply) + "\n")
        out.flush()

_main()
'''


class SymbolicTimeout(Exception):
    """The worker did not answer within the limit (it has been killed)."""


class SymbolicError(Exception):
    """The worker could not start or answered with an error."""


def latex(text: str) -> str:
    """The answer as math-verify's LaTeX extraction reads it: math mode unless it already has it."""
    if "$" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


class SymbolicChecker:
    """One worker process, shared by the threads of one domain (calls are serialized)."""

    def __init__(self, timeout_s: float = 5.0, mem_mb: int = MEM_MB) -> None:
        self.timeout_s = float(timeout_s)
        self.mem_mb = int(mem_mb)
        self.restarts = 0
        self.seccomp = False
        self._proc: subprocess.Popen | None = None
        self._eof = False
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # a copy in another process starts its own worker
        return {"timeout_s": self.timeout_s, "mem_mb": self.mem_mb}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def equal(self, gold: str, pred: str) -> bool | None:
        """Whether pred is equivalent to gold; None when pred does not parse. Raises SymbolicTimeout
        or SymbolicError."""
        reply = self._ask({"gold": latex(gold), "pred": latex(pred)}, self.timeout_s)
        if "error" in reply:
            raise SymbolicError(reply["error"])
        return bool(reply["equal"]) if reply.get("parsed") else None

    def parses(self, gold: str) -> bool:
        reply = self._ask({"gold": latex(gold), "pred": None}, self.timeout_s)
        if "error" in reply:
            raise SymbolicError(reply["error"])
        return bool(reply.get("parsed"))

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __del__(self) -> None:
        try:
            self._kill()
        except Exception:
            pass

    # ------------------------------------------------------------ the worker

    def _ask(self, request: dict, timeout_s: float) -> dict:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                self._kill()
                raise SymbolicError("the worker exited") from None
            line = self._read_line(timeout_s)
            if line is None:
                crashed = self._eof  # it closed its end: killed by its rlimit or the seccomp filter
                self._kill()
                self.restarts += 1
                if crashed:
                    raise SymbolicError(f"the worker died (exit {proc.returncode})")
                raise SymbolicTimeout(f"no answer within {timeout_s:g} s")
            try:
                return json.loads(line)
            except ValueError:
                self._kill()
                raise SymbolicError("the worker sent garbage") from None

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER, str(self.mem_mb)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1"})
        line = self._read_line(STARTUP_S)
        if line is None:
            self._kill()
            raise SymbolicError("math-verify's worker did not start (is math-verify installed? "
                                "pip install 'evotrainer[mathverify]')")
        self.seccomp = bool(json.loads(line).get("seccomp"))

    def _read_line(self, timeout_s: float) -> bytes | None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        self._eof = False
        deadline = time.monotonic() + timeout_s
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self._eof = True
                return None
            buf += chunk
        return buf

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
