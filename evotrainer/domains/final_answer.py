"""The final answer of a free-text completion, for the tasks domain's exact, regex and math checks.

Where the answer is, in this order:
1. after the last marker: "Answer:" (any case, `**Answer:**` too) gives the rest of that line
   (or the next non-empty line when the marker ends its line); `\\boxed{...}` gives its
   balanced-brace content. Whichever marker comes last wins, so "Answer: \\boxed{5}" is 5;
2. with no marker, the last non-empty line.

Then it is tidied: surrounding whitespace, markdown emphasis (`**`, `__`, backticks) and one
trailing period go. The text is capped at MAX_CHARS: a "final answer" longer than that is
not an answer but an attempt to list many (and would slow the regex and symbolic checks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 1000
_MARKER = re.compile(r"(?:\*\*|__)?\banswer\s*(?:\*\*|__)?\s*:(?:\*\*|__)?|\\boxed\s*\{", re.IGNORECASE)


@dataclass(frozen=True)
class Final:
    text: str | None  # None: nothing to read (no marker content and no non-empty line)
    marked: bool  # an explicit marker gave it
    too_long: bool = False


def _boxed(after: str) -> str | None:
    """The content of a `\\boxed{` whose opening brace is just before `after`, or None if unclosed."""
    depth = 1
    for i, ch in enumerate(after):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return after[:i]
    return None


def tidy(text: str) -> str:
    text = text.strip()
    for wrap in ("**", "__", "`"):
        while len(text) >= 2 * len(wrap) and text.startswith(wrap) and text.endswith(wrap):
            text = text[len(wrap):-len(wrap)].strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    return text


def final_answer(completion: str) -> Final:
    """Where the completion's final answer is (see the module docstring)."""
    for m in reversed(list(_MARKER.finditer(completion))):
        after = completion[m.end():]
        if m.group().startswith("\\"):
            content = _boxed(after)
            if content is None or not content.strip():
                continue  # an unclosed or empty box is no answer; an earlier marker may be
            return _capped(tidy(content), True)
        lines = after.split("\n")
        first = lines[0] if lines[0].strip() else next((ln for ln in lines[1:] if ln.strip()), "")
        if first.strip():
            return _capped(tidy(first), True)
    lines = [ln for ln in completion.split("\n") if ln.strip()]
    if not lines:
        return Final(None, False)
    return _capped(tidy(lines[-1]), False)


def _capped(text: str, marked: bool) -> Final:
    if len(text) > MAX_CHARS:
        return Final(None, marked, too_long=True)
    return Final(text, marked)
