"""The `edit` scaffold: one turn, the model answers with SEARCH/REPLACE blocks, we turn them into a diff.

    path/to/file.py
    <<<<<<< SEARCH
    lines copied from the file
    =======
    the lines that replace them
    >>>>>>> REPLACE

`parse_edits` reads the blocks (EditFormatError when there are none or one is broken);
`edits_to_patch` applies them to the repo's files in memory and returns a git-style unified diff
(EditApplyError when a SEARCH text is not in the file). Both failures are counted outcomes in the
swe domain, never crashes. Matching is exact first, then ignoring trailing whitespace, then
ignoring a uniform indentation shift (small models drop leading spaces); a fuzzy match must be
unique.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from evotrainer.errors import EvotrainerError
from evotrainer.grade import make_patch

_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_PATH_NOISE = re.compile(r"^(?:#+\s*)?(?:file(?:name)?\s*:\s*)?", re.I)


@dataclass(frozen=True)
class Edit:
    path: str
    search: str
    replace: str


class EditFormatError(EvotrainerError, ValueError):
    """The text holds no well-formed SEARCH/REPLACE block."""


class EditApplyError(EvotrainerError, ValueError):
    """A block does not apply: its file is missing, its SEARCH text is not found, or its path is unsafe."""

    def __init__(self, message: str, reason: str = "search_not_found") -> None:
        super().__init__(message)
        self.reason = reason


def _path_line(lines: list[str], start: int) -> str | None:
    """The file path written on the closest non-blank line above a block (fences skipped)."""
    for i in range(start - 1, max(-1, start - 4), -1):
        line = lines[i].strip()
        if not line or _FENCE.match(line):
            continue
        if _SEARCH.match(line) or _REPLACE.match(line) or _DIVIDER.match(line):
            return None
        candidate = _PATH_NOISE.sub("", line).strip().strip("`*'\"").strip()
        if candidate and " " not in candidate and ("." in candidate or "/" in candidate):
            return candidate.removeprefix("./")
        return None
    return None


def parse_edits(text: str, default_path: str | None = None) -> list[Edit]:
    """Every SEARCH/REPLACE block in `text`, in order. A block without a path line gets
    `default_path` (the file the prompt showed); EditFormatError names what is wrong."""
    if not isinstance(text, str):
        raise EditFormatError("completion is not text")
    lines = text.splitlines()
    edits: list[Edit] = []
    i = 0
    while i < len(lines):
        if not _SEARCH.match(lines[i]):  # prose, fences, stray markers: only blocks count
            i += 1
            continue
        path = _path_line(lines, i) or default_path
        if not path:
            raise EditFormatError(f"line {i + 1}: SEARCH block without a file path line above it")
        j = i + 1
        while j < len(lines) and not _DIVIDER.match(lines[j]):
            if _SEARCH.match(lines[j]) or _REPLACE.match(lines[j]):
                raise EditFormatError(f"line {j + 1}: expected '=======' before '{lines[j].strip()}'")
            j += 1
        if j == len(lines):
            raise EditFormatError(f"line {i + 1}: SEARCH block never reaches '======='")
        k = j + 1
        while k < len(lines) and not _REPLACE.match(lines[k]):
            if _SEARCH.match(lines[k]) or _DIVIDER.match(lines[k]):
                raise EditFormatError(f"line {k + 1}: expected '>>>>>>> REPLACE' before '{lines[k].strip()}'")
            k += 1
        if k == len(lines):
            raise EditFormatError(f"line {j + 1}: block never reaches '>>>>>>> REPLACE'")
        search = "\n".join(lines[i + 1:j])
        replace = "\n".join(lines[j + 1:k])
        edits.append(Edit(path, search + "\n" if search else "", replace + "\n" if replace else ""))
        i = k + 1
    if not edits:
        raise EditFormatError("no SEARCH/REPLACE block")
    return edits


# ---------------------------------------------------------------- applying


def safe_path(path: str) -> bool:
    p = PurePosixPath(path)
    return bool(path) and not p.is_absolute() and ".." not in p.parts and ".git" not in p.parts and "\\" not in path


def _find_lines(content: list[str], block: list[str], norm: Callable[[str], str]) -> list[int]:
    want = [norm(x) for x in block]
    n = len(want)
    return [i for i in range(len(content) - n + 1) if [norm(x) for x in content[i:i + n]] == want]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _occurrences(content: str, text: str) -> list[int]:
    found, i = [], content.find(text)
    while i != -1:
        found.append(i)
        i = content.find(text, i + 1)
    return found


def apply_edit(content: str, edit: Edit, near: int | None = None) -> str:
    """`content` with the edit's SEARCH text replaced: an exact match (the one closest to line
    `near` when there are several, else the first), else a unique fuzzy one."""
    if edit.search and edit.search in content:
        starts = _occurrences(content, edit.search)
        at = starts[0] if near is None else min(starts, key=lambda i: abs(content.count("\n", 0, i) + 1 - near))
        return content[:at] + edit.replace + content[at + len(edit.search):]
    if not edit.search.strip():
        raise EditApplyError(f"{edit.path}: empty SEARCH on an existing file", "empty_search")
    lines = content.splitlines(keepends=True)
    block = edit.search.splitlines()
    replacement = edit.replace.splitlines(keepends=True)
    hits = _find_lines(lines, block, lambda s: s.rstrip())
    if len(hits) >= 1:
        at = hits[0]
        return "".join(lines[:at] + replacement + lines[at + len(block):])
    hits = _find_lines(lines, block, lambda s: s.strip())
    if len(hits) == 1:
        at = hits[0]
        first = next((k for k, b in enumerate(block) if b.strip()), 0)
        have, wrote = _indent(lines[at + first]), _indent(block[first])
        shifted = []
        for line in replacement:
            if line.strip() and line.startswith(wrote):
                line = have + line[len(wrote):]
            elif line.strip() and not wrote:
                line = have + line
            shifted.append(line)
        return "".join(lines[:at] + shifted + lines[at + len(block):])
    if len(hits) > 1:
        raise EditApplyError(f"{edit.path}: SEARCH text matches {len(hits)} places only up to indentation",
                             "ambiguous_search")
    raise EditApplyError(f"{edit.path}: SEARCH text not found in the file")


def apply_edits(read: Mapping[str, str] | Callable[[str], str | None], edits: Sequence[Edit],
                near: Mapping[str, int] | None = None) -> dict[str, tuple[str | None, str]]:
    """{path: (before or None, after)} of every file the edits change, applied in order. `near`:
    {path: line} to prefer among several exact matches (the lines the prompt showed)."""
    reader = read.get if isinstance(read, Mapping) else read
    files: dict[str, tuple[str | None, str]] = {}
    for edit in edits:
        if not safe_path(edit.path):
            raise EditApplyError(f"{edit.path}: path outside the repository", "unsafe_path")
        if edit.path in files:
            before, current = files[edit.path]
        else:
            before = reader(edit.path)
            current = before
        if current is None:
            if edit.search.strip():
                raise EditApplyError(f"{edit.path}: no such file", "missing_file")
            files[edit.path] = (None, edit.replace)  # an empty SEARCH creates a new file
            continue
        files[edit.path] = (before, apply_edit(current, edit, (near or {}).get(edit.path)))
    return {p: ba for p, ba in files.items() if ba[0] != ba[1]}


def edits_to_patch(repo_files: Mapping[str, str] | Callable[[str], str | None], edits: Sequence[Edit],
                   near: Mapping[str, int] | None = None) -> str:
    """A git-style unified diff of what the edits change ('' when they change nothing)."""
    changed = apply_edits(repo_files, edits, near)
    return make_patch({p: changed[p] for p in sorted(changed)}) if changed else ""


__all__ = ["Edit", "EditFormatError", "EditApplyError", "parse_edits", "apply_edit", "apply_edits",
           "edits_to_patch", "safe_path"]
