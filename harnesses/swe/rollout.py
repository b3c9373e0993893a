"""Prompt and truncation rules for swe rollouts."""

from typing import Sequence

from evotrainer.api import Turn

# A Jinja template (StrictUndefined): `question` is the issue plus the relevant file, written by
# the trusted domain. The edit scaffold grades SEARCH/REPLACE blocks in exactly this form.
# `scaffold` is the domain's: "edit" grades SEARCH/REPLACE blocks in exactly this form, "line" the
# first ``` code block, which replaces the line the question names.
PROMPT = """{{ question }}
{% if scaffold is defined and scaffold == "line" %}Write the corrected line in a ```python code block.
{% else %}Fix the bug. Answer only with SEARCH/REPLACE blocks like this one:

path/to/file.py
<<<<<<< SEARCH
lines copied exactly from the file
=======
the fixed lines
>>>>>>> REPLACE
{% endif %}"""


def stop(trajectory: Sequence[Turn]) -> "str | None":
    """A reason to cut a multi-turn trajectory short, or None. The seed never stops early."""
    return None
