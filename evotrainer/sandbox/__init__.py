"""The execution sandbox: run untrusted code in a throwaway copy under OS limits (run.py), and
the executors that spread such runs over processes (executor.py)."""

from evotrainer.sandbox.executor import Executor, LocalExecutor, get_executor, register_executor
from evotrainer.sandbox.run import (
    SandboxError,
    SandboxResult,
    isolation_support,
    network_isolation_available,
    run_sandboxed,
)

__all__ = [
    "Executor",
    "LocalExecutor",
    "SandboxError",
    "SandboxResult",
    "get_executor",
    "isolation_support",
    "network_isolation_available",
    "register_executor",
    "run_sandboxed",
]
