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

Layout: sandbox_worker.py is what runs inside a worker, sandbox_pool.py the parent's pool and
call protocol, sandbox_failures.py the two failure types; this module re-exports their API.
"""

from evotrainer.harness.sandbox_failures import CandidateFailure, SandboxError
from evotrainer.harness.sandbox_pool import SandboxLimits, SandboxPool, WorkerJob
from evotrainer.harness.sandbox_worker import (
    ALLOWED_MODULES,
    HARNESS_MODULE_PREFIX,
    SandboxedHarness,
)

__all__ = ["ALLOWED_MODULES", "HARNESS_MODULE_PREFIX", "CandidateFailure", "SandboxError", "SandboxLimits",
           "SandboxPool", "SandboxedHarness", "WorkerJob"]
