"""The base of every evotrainer exception, and the line between bad input and our own faults.

A `UserError` is something the user can fix (a missing folder, a malformed override, an unknown
revision, an endpoint that refuses the key): the CLI shows its message as one `Error:` line and
exits 2. Any other exception reaching the CLI is a bug in evotrainer and keeps its traceback.
Classes keep a builtin base too (ValueError, RuntimeError) where callers catch them by it.
"""


class EvotrainerError(Exception):
    """Base of every exception evotrainer raises on purpose."""


class UserError(EvotrainerError):
    """Bad input the user can fix; the message says what is wrong and, where it can, what to do."""


class SandboxError(EvotrainerError, RuntimeError):
    """The sandbox itself failed, not the code in it: a missing src, an unwritable temp dir, a
    harness worker that cannot start or open its job (then it carries the worker's traceback)."""


__all__ = ["EvotrainerError", "SandboxError", "UserError"]
