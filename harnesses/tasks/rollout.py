"""Prompt and truncation rules for the tasks domain: the task's prompt and a request for an
"Answer:" line, which the exact, regex and math verifiers read first (evotrainer/domains/final_answer.py)."""

from typing import Sequence

from evotrainer.api import Turn

# A Jinja template (StrictUndefined): `question` is the task's prompt as the task file wrote it.
PROMPT = '{{ question }}\nGive the final answer after "Answer:".'


def stop(trajectory: Sequence[Turn]) -> "str | None":
    """A reason to cut the trajectory short, or None. The seed never stops early."""
    return None
