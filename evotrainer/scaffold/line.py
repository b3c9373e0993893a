"""The `line` scaffold: the trusted prompt shows the code around the bug and names the line it is
on; the answer is that line, fixed, in one fenced code block.

    ```python
    if window_size < 1:
    ```

The smallest edit format there is, made for small policies: the embedded 135M model never writes
a parsable SEARCH/REPLACE block (0 of 48 samples on the level-0 pack tasks at temperature 0.5),
but it writes a fenced line 91% of the time (`bench/swe_learnable.py --scaffold line`). The block's lines replace the named line, re-indented to that line's indentation
(the block is dedented first), so an answer may also split the line in two or add a guard.
An empty block deletes the line. `parse_line_answer` raises LineFormatError when there is no
fenced block; `replace_line` does the edit in memory.
"""

from __future__ import annotations

import re
import textwrap

from evotrainer.errors import EvotrainerError

_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M | re.I)
MAX_LINES = 8  # a fix of one line, not a rewrite of the function


class LineFormatError(EvotrainerError, ValueError):
    """The answer holds no fenced code block, or one too long to be a line's fix."""


def parse_line_answer(text: str) -> list[str]:
    """The lines of the first fenced code block, dedented, trailing blank lines dropped."""
    m = _BLOCK.search(text or "")
    if m is None:
        raise LineFormatError("no ``` code block in the answer")
    lines = textwrap.dedent(m.group(1)).rstrip().splitlines()
    if len(lines) > MAX_LINES:
        raise LineFormatError(f"the code block has {len(lines)} lines (at most {MAX_LINES})")
    return [ln.rstrip() for ln in lines]


def replace_line(content: str, lineno: int, new: list[str]) -> str:
    """`content` with its 1-based line `lineno` replaced by `new`, each at that line's indentation."""
    lines = content.splitlines(keepends=True)
    if not 1 <= lineno <= len(lines):
        raise ValueError(f"line {lineno} is outside a file of {len(lines)} lines")
    old = lines[lineno - 1]
    ending = old[len(old.rstrip("\r\n")):] or "\n"
    indent = re.match(r"[ \t]*", old).group()
    body = [(indent + ln if ln.strip() else "") + ending for ln in new]
    return "".join(lines[:lineno - 1] + body + lines[lineno:])


__all__ = ["LineFormatError", "MAX_LINES", "parse_line_answer", "replace_line"]
