"""Consoles for people and for pipes: a terminal gets rich's layout, anything else whole lines.

rich lays output out for a terminal of 80 columns when it cannot ask one, so in a CI log, a pipe
or `| grep` it broke error messages and paths in two. Output that is not a terminal is never
hard-wrapped here: text is printed soft-wrapped (each message is one line, however long), and
tables and panels are drawn as wide as their content needs, so no cell is cropped or folded.
A terminal, or an explicit `COLUMNS`, keeps rich's behaviour.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.measure import Measurement
from rich.text import Text

# What a renderable is measured against off a terminal: wider than any line we print, so the
# measure is the renderable's natural width. Nothing is ever drawn this wide.
_UNBOUNDED = 100_000


class LineConsole(Console):
    """A rich Console that does not hard-wrap when it is not writing to a terminal."""

    def _laid_out_for_lines(self) -> bool:
        return not self.is_terminal and self._width is None and "COLUMNS" not in os.environ

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return ConsoleDimensions(_UNBOUNDED, size.height) if self._laid_out_for_lines() else size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if self._laid_out_for_lines():
            if kwargs.get("soft_wrap") is None:
                kwargs["soft_wrap"] = True
            if kwargs.get("width") is None and objects:
                kwargs["width"] = max(self._natural_width(o) for o in objects)
        super().print(*objects, **kwargs)

    def rule(self, title: Any = "", **kwargs: Any) -> None:
        if not self._laid_out_for_lines():
            return super().rule(title, **kwargs)
        label = Text.from_markup(title) if isinstance(title, str) else title
        self.print(Text.assemble("── ", label, " ──") if label else Text("─" * 40))

    def _natural_width(self, renderable: Any) -> int:
        if isinstance(renderable, str):
            renderable = self.render_str(renderable)
        try:
            return max(1, Measurement.get(self, self.options, renderable).maximum)
        except Exception:  # not measurable (a plain object): let rich print its repr whole
            return _UNBOUNDED


def make_console(stderr: bool = False, **kwargs: Any) -> Console:
    """The console every evotrainer command prints through (stdout, or stderr for messages)."""
    return LineConsole(stderr=stderr, **kwargs)
