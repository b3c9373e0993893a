"""Prompt and truncation rules for code rollouts."""

from typing import Sequence

from evotrainer.api import Turn

# A Jinja template (StrictUndefined): `question` is the task's problem text.
PROMPT = "{{ question }}\nAnswer with the complete Python function in a ```python code block."


def stop(trajectory: Sequence[Turn]) -> "str | None":
    """A reason to cut the trajectory short, or None. Single-turn code never stops early."""
    return None
