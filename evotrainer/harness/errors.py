"""The one exception a harness fault becomes (own module, so the spec and the loader share it)."""

from evotrainer.errors import UserError


class HarnessError(UserError):
    """A harness fault. The message starts with the file (and function) at fault."""
