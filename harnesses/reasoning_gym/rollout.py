"""Prompt and truncation rules for reasoning_gym rollouts: the generator's question, then how to answer."""

from typing import Sequence

from evotrainer.api import Turn

# A Jinja template (StrictUndefined): `question` is the generator's question text. The domain reads
# the answer from an <answer>...</answer> block or, failing that, a line starting "Answer:".
PROMPT = '{{ question }}\nGive the final answer on its own line after "Answer:".'


def stop(trajectory: Sequence[Turn]) -> "str | None":
    """A reason to cut the trajectory short, or None. Single-turn tasks never stop early."""
    return None
