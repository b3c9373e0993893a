"""Prompt and truncation rules for bfcl: the task's own prompt (docs, conversation, the call format), unchanged."""

from typing import Sequence

from evotrainer.api import Turn

# A Jinja template (StrictUndefined): `question` is the task's prompt as the domain wrote it.
PROMPT = "{{ question }}"


def stop(trajectory: Sequence[Turn]) -> "str | None":
    """A reason to cut the trajectory short, or None. The seed never stops early."""
    return None
