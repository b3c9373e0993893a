"""Run untrusted harness code in sandboxed worker processes: any harness fault becomes a CandidateFailure.

A candidate harness is code an LLM may have written. It runs only in worker processes, never in
the process that drives a run, and each worker starts inside the OS sandbox (sandbox_launch.py):
its own network, mount and pid namespaces, a fresh unprivileged uid, a minimal read-only root
with no workspace, home or checkout in it, a scrubbed environment, no descriptors but its
message socket, and a seccomp filter that kills it on fork, exec, ptrace, mounts, non-AF_UNIX
sockets or signals to other processes. That is the boundary: a worker holds nothing worth
stealing and can reach nothing that decides. tests/test_harness_escape.py attacks it.

Inside a worker, before any harness file is executed, two in-process guards give fast, clear
messages for the common mistakes (they are lint, not the boundary: Python objects are
introspectable, so determined code can switch them off, and then meets the OS sandbox):

- an audit hook (`sys.addaudithook`, which cannot be removed) refuses processes (`subprocess`,
  `os.system`, `os.exec*`, `os.spawn*`, `os.fork`), signals to other processes, sockets, ctypes,
  new database connections, and any write, delete, rename or chmod outside the worker's own
  temporary folder (also the working directory);
- an import guard lets code whose globals are not a real, non-harness module import only
  `evotrainer.api` (and `evotrainer.api.probes`), numpy and the pure standard-library modules in
  ALLOWED_MODULES. This is what stops `__import__("os")`, which the loader's static
  `check_imports` cannot see. The evotrainer.api package counts as harness code here: it imports
  only what a harness may.

A refused operation raises PermissionError/ImportError inside the harness *and* is recorded, so a
harness that swallows the exception still fails. The parent enforces a time budget per harness
call and kills the worker when it is exceeded, so a hang in C code (a regex, numpy) is caught
too: a small shared page (which call is running, since when) names the call and kills early, and
the parent's own per-message deadline (the message's harness calls times the per-call budget,
where the job counts them) holds when harness code forges the page. A memory cap turns a runaway
allocation into a MemoryError.

The parent also assumes the worker may be compromised: workers answer in JSON (never pickle,
which would run code in the parent), the parent reads only the bytes that are there (garbage in
the socket cannot block it), messages go out on a sender thread (a big chunk never blocks the
watchdog), and a worker that dies, stalls, writes into its socket or runs past the per-message
budget fails the harness it was running. Every frame is bounded before it is decoded (size, and
a count of containers and items), and any frame our worker code would not send where it came
(a wrong kind, a reply nobody asked for) fails the harness; the callers check every value of a
reply (types, finiteness, bounds). Nothing a worker does raises
anything but CandidateFailure in the parent: before the harnesses are loaded, a fault is ours
(SandboxError) only if a control worker that loads no harness fails the same way.

`EVOTRAINER_HARNESS_ISOLATION=none` (documented in sandbox_launch.py) is the only way to run
workers without the OS sandbox (forked from a local forkserver, guards only); without it, a
machine that cannot give the sandbox fails with SandboxError.

Layout: sandbox_worker.py is what runs inside a worker, sandbox_launch.py starts it in the OS
sandbox, sandbox_pool.py the parent's pool and call protocol, sandbox_failures.py the two failure types; this module re-exports their API.
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
