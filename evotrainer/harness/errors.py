"""The one exception a harness fault becomes (own module, so the spec and the loader share it)."""


class HarnessError(Exception):
    """A harness fault. The message starts with the file (and function) at fault."""
