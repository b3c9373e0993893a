"""What every file-backed domain does alike: read JSONL lines, keep a file's own task ids, split by
a second file or a hash, and say how many tasks a `levels` filter left out.

A file source never loses a task silently: a bad line is a ValueError naming `file:line`, two
lines with one id are refused, and tasks that `domain.levels` (or a repeated problem) leaves out
are counted in `FileTasks.dropped` and reported by `report()` as one warning line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evotrainer.domains.base import Task

log = logging.getLogger(__name__)

ID_MAX = 256  # the store's task_id column (store/models.py)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def file_id(row: dict[str, Any], where: str, keys: tuple[str, ...] = ("task_id", "id")) -> str | None:
    """The line's own id (the first of `keys` present) as text, or None when it has none.

    A string is kept exactly; an integer becomes its decimal text (MBPP numbers its problems).
    Anything else, an empty id, a control character or more than the store's 256 characters is
    refused, since the store could not hold it or two spellings would name one task.
    """
    for key in keys:
        if key not in row:
            continue
        value = row[key]
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: {key!r} must be a non-empty string or an integer, got {value!r}")
        if _CONTROL.search(value) or len(value) > ID_MAX:
            raise ValueError(f"{where}: {key!r} {value[:40]!r} holds a control character or is over "
                             f"{ID_MAX} characters")
        return value
    return None


def unique_ids(tasks: Iterable[Task]) -> None:
    """ValueError naming both lines when two tasks (of one file or of both) share an id."""
    seen: dict[str, Task] = {}
    for t in tasks:
        first = seen.get(t.task_id)
        if first is not None:
            raise ValueError(f"{_where(t)}: task_id {t.task_id!r} is already used at {_where(first)}"
                             + (" (domain.heldout_source must not repeat a task of domain.source)"
                                if first.meta.get("source") != t.meta.get("source") else ""))
        seen[t.task_id] = t


def _where(t: Task) -> str:
    return f"{t.meta.get('source', '?')}:{t.meta.get('line', '?')}"


def as_split(tasks: Iterable[Task], split: str) -> list[Task]:
    return [replace(t, split=split) for t in tasks]


@dataclass(frozen=True)
class FileTasks:
    """The tasks a domain keeps from its file(s), and what it left out and why."""

    tasks: list[Task]
    total: int  # tasks the files hold (after the loader's own de-duplication)
    dropped: int  # of those, left out by `levels`
    repeats: int  # lines the loader kept once (a repeated problem without its own id)
    notes: tuple[str, ...]  # the warning lines report() logged

    def report(self) -> None:
        for note in self.notes:
            log.warning(note)


def keep_levels(domain: str, tasks: list[Task], levels: Iterable[int] | None, files: str,
                repeats: int = 0) -> FileTasks:
    """The tasks whose level is in `levels` (None: all), with a note saying how many were left out."""
    wanted = None if levels is None else sorted(set(levels))
    kept = tasks if wanted is None else [t for t in tasks if t.level in wanted]
    dropped = len(tasks) - len(kept)
    notes = []
    if dropped:
        have = sorted({t.level for t in tasks})
        notes.append(f"{domain}: levels {wanted} keep {len(kept)} of {len(tasks)} tasks of {files}; "
                     f"{dropped} left out (the file's levels are {have}; domain.levels=null keeps all)")
    if repeats:
        notes.append(f"{domain}: {files} repeats {repeats} problem(s) without an id of their own; each is kept once "
                     "(give every line a task_id to keep them all)")
    if not tasks:
        raise ValueError(f"{domain}: {files} holds no tasks")
    if not kept:
        raise ValueError(f"{domain}: levels {wanted} keep none of the {len(tasks)} tasks of {files}")
    for split in ("train", "heldout"):
        if not any(t.split == split for t in kept):
            notes.append(f"{domain}: none of the {len(kept)} tasks kept from {files} is in the {split} split "
                         "(set domain.heldout_source, or options.heldout_fraction)")
    return FileTasks(kept, len(tasks), dropped, repeats, tuple(notes))


def load_sources(domain: str, loader: Any, source: str, heldout_source: str | None,
                 levels: Iterable[int] | None, heldout_fraction: float) -> FileTasks:
    """Both splits of a file source, levels applied and reported.

    `loader(path, heldout_fraction) -> (tasks, repeats)`. Without `heldout_source` the loader's
    hash split stands; with it every task of `source` is train and every task of `heldout_source`
    held out (the official test split), and an id in both files is refused.
    """
    for name, value in (("domain.source", source), ("domain.heldout_source", heldout_source)):
        if value is not None and not Path(value).is_file():
            raise ValueError(f"{domain}: {name} {value!r} is not a file")
    tasks, repeats = loader(source, heldout_fraction)
    files = str(source)
    if heldout_source is not None:
        held, held_repeats = loader(heldout_source, heldout_fraction)
        tasks = as_split(tasks, "train") + as_split(held, "heldout")
        repeats += held_repeats
        unique_ids(tasks)
        files = f"{source} + {heldout_source}"
    out = keep_levels(domain, tasks, levels, files, repeats)
    out.report()
    return out
