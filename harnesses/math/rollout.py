"""Prompt and truncation rules for math rollouts."""

from typing import Sequence

from evotrainer.api import Turn

# A Jinja template (StrictUndefined): `question` is the task's problem text.
PROMPT = '{{ question }}\nGive the final answer after "Answer:".'


def stop(trajectory: Sequence[Turn]) -> "str | None":
    """A reason to cut the trajectory short, or None. Single-turn math never stops early."""
    return None
