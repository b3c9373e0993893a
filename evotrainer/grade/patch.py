"""Unified diffs, parsed and applied in Python: we see every path a patch touches, and refuse the unsafe.

`parse_patch` reads `git diff` and plain `diff -u` output (renames, new and deleted files). It is
lenient where models are sloppy (wrong hunk counts, a blank context line without its leading
space, prose around the diff) and strict where it matters: `apply_patch` computes every new file
in memory and writes nothing unless all hunks apply (exact context, found at the stated line or
the nearest offset; then the same with trailing whitespace ignored). A path that is absolute,
climbs out (`..`), enters `.git`, or passes through a symlink is refused as `UnsafePathError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from evotrainer.errors import EvotrainerError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_DIFF_GIT = re.compile(r"^diff --git (\S+|\"[^\"]*\") (\S+|\"[^\"]*\")\s*$")
_FILE_HEADERS = ("diff --git ", "--- ", "+++ ")


class PatchError(EvotrainerError, ValueError):
    """The patch cannot be parsed or does not apply."""


class UnsafePathError(PatchError):
    """The patch names a path outside the repository (or through a symlink)."""


@dataclass(frozen=True)
class Hunk:
    old_start: int
    new_start: int
    lines: tuple[str, ...]  # each starts with ' ', '-' or '+'
    old_no_eol: bool = False  # "\ No newline at end of file" after the old side's last line
    new_no_eol: bool = False

    @property
    def old(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " -"]

    @property
    def new(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " +"]


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    hunks: tuple[Hunk, ...]
    binary: bool = False
    symlink: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for p in (self.old_path, self.new_path) if p))

    def added_lines(self) -> list[str]:
        return [ln[1:] for h in self.hunks for ln in h.lines if ln[0] == "+"]

    def changed_lines(self) -> list[str]:
        return [ln[1:] for h in self.hunks for ln in h.lines if ln[0] in "+-"]


# ---------------------------------------------------------------- parsing


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] == '"':
        body = token[1:-1]
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode(
            "utf-8", "replace")
    return token


def _header_path(rest: str) -> str | None:
    """The path of a ---/+++ line: strip a timestamp after a tab and the a/ b/ prefix."""
    rest = rest.rstrip("\n").split("\t", 1)[0].rstrip()
    rest = _unquote(rest)
    if rest == "/dev/null":
        return None
    return _strip_prefix(rest)


def _strip_prefix(path: str) -> str:
    if path[:2] in ("a/", "b/", "i/", "w/", "c/", "o/"):
        return path[2:]
    return path


def parse_patch(text: str) -> list[FilePatch]:
    """The file patches in `text`, in order. Raises PatchError when there are none or one is broken."""
    lines = text.split("\n")  # a CRLF file's lines keep their "\r", as the file's own lines do
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(_FILE_HEADERS):
            i += 1  # prose, `index` lines outside a section, stray garbage
            continue
        fp, i = _parse_file(lines, i)
        if fp is not None:
            files.append(fp)
    if not files:
        raise PatchError("no file changes found in the patch")
    return files


def _parse_file(lines: list[str], i: int) -> tuple[FilePatch | None, int]:
    old = new = None
    git_old = git_new = None
    created = deleted = binary = symlink = False
    rename_from = rename_to = None
    m = _DIFF_GIT.match(lines[i])
    if lines[i].startswith("diff --git "):
        if m:
            git_old, git_new = _strip_prefix(_unquote(m.group(1))), _strip_prefix(_unquote(m.group(2)))
        i += 1
        while i < len(lines) and not lines[i].startswith(("--- ", "diff --git ", "@@ ")):
            ln = lines[i]
            if ln.startswith("new file mode"):
                created = True
                symlink |= ln.split()[-1] == "120000"
            elif ln.startswith("deleted file mode"):
                deleted = True
            elif ln.startswith("new mode"):
                symlink |= ln.split()[-1] == "120000"
            elif ln.startswith(("rename from ", "copy from ")):
                rename_from = _unquote(ln.split(" ", 2)[2])
            elif ln.startswith(("rename to ", "copy to ")):
                rename_to = _unquote(ln.split(" ", 2)[2])
            elif ln.startswith(("Binary files ", "GIT binary patch")):
                binary = True
            i += 1
    if i < len(lines) and lines[i].startswith("--- "):
        old = _header_path(lines[i][4:])
        i += 1
        if i >= len(lines) or not lines[i].startswith("+++ "):
            raise PatchError(f"'--- ' header without '+++ ' at patch line {i}")
        new = _header_path(lines[i][4:])
        created |= old is None
        deleted |= new is None
        i += 1
    elif git_old is not None:  # a git section without hunks: rename, mode change, binary, empty file
        old, new = rename_from or git_old, rename_to or git_new
        if created:
            old = None
        if deleted:
            new = None
    else:
        return None, i + 1
    hunks: list[Hunk] = []
    while i < len(lines) and lines[i].startswith("@@"):
        hunk, i = _parse_hunk(lines, i)
        hunks.append(hunk)
    if created:
        old = None
    if deleted:
        new = None
    if old is None and new is None:
        raise PatchError("a file patch names neither an old nor a new path")
    if not hunks and not binary and not (rename_from or created or deleted):
        return None, i  # a mode-only change: nothing to apply
    return FilePatch(old, new, tuple(hunks), binary=binary, symlink=symlink), i


def _parse_hunk(lines: list[str], i: int) -> tuple[Hunk, int]:
    m = _HUNK.match(lines[i])
    if not m:
        raise PatchError(f"malformed hunk header at patch line {i + 1}: {lines[i][:80]!r}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_left = int(m.group(2)) if m.group(2) is not None else 1
    new_left = int(m.group(4)) if m.group(4) is not None else 1
    body: list[str] = []
    old_no_eol = new_no_eol = False
    i += 1
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("\\"):  # "\ No newline at end of file" applies to the line before it
            if body:
                if body[-1][0] in " -":
                    old_no_eol = True
                if body[-1][0] in " +":
                    new_no_eol = True
            i += 1
            continue
        if old_left <= 0 and new_left <= 0:
            break
        if ln.startswith(_FILE_HEADERS[1:]) and old_left <= 0:
            break
        if ln.startswith(("diff --git ", "@@ ")):
            break  # the counts were wrong: trust the lines we have
        if ln == "":
            if i == len(lines) - 1:
                break  # the text's final newline
            ln = " "  # a blank context line whose leading space was stripped
        elif ln[0] not in " -+":
            break
        body.append(ln)
        if ln[0] in " -":
            old_left -= 1
        if ln[0] in " +":
            new_left -= 1
        i += 1
    if not body:
        raise PatchError(f"empty hunk at patch line {i}")
    return Hunk(old_start, new_start, tuple(body), old_no_eol, new_no_eol), i


# ---------------------------------------------------------------- path safety


def check_path(root: Path, rel: str) -> None:
    """Raise UnsafePathError unless `rel` names a place inside `root` reached without symlinks."""
    if not rel or "\x00" in rel or "\\" in rel:
        raise UnsafePathError(f"bad path in patch: {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("~"):
        raise UnsafePathError(f"absolute path in patch: {rel}")
    if any(part in ("..",) for part in pure.parts):
        raise UnsafePathError(f"path climbs out of the repository: {rel}")
    if any(part in (".git", ".hg", ".svn") for part in pure.parts):
        raise UnsafePathError(f"path enters version-control data: {rel}")
    cur = root
    for part in pure.parts:
        if part == ".":
            continue
        cur = cur / part
        if cur.is_symlink():
            raise UnsafePathError(f"path goes through a symlink: {rel}")
    try:
        cur.resolve().relative_to(root.resolve())
    except ValueError:
        raise UnsafePathError(f"path resolves outside the repository: {rel}") from None


# ---------------------------------------------------------------- applying


def _split(text: str) -> tuple[list[str], bool]:
    if text == "":
        return [], True
    eol = text.endswith("\n")
    return (text[:-1] if eol else text).split("\n"), eol


def _find(lines: list[str], block: list[str], guess: int, norm: Callable[[str], str]) -> int | None:
    """The start where `block` matches, nearest to `guess` first."""
    if not block:
        return max(0, min(guess, len(lines)))
    target = [norm(b) for b in block]
    limit = len(lines) - len(block)
    for delta in range(0, max(guess, limit - guess) + 1):
        for pos in ((guess + delta, guess - delta) if delta else (guess,)):
            if 0 <= pos <= limit and [norm(x) for x in lines[pos:pos + len(block)]] == target:
                return pos
    return None


def apply_hunks(text: str, hunks: tuple[Hunk, ...], path: str = "?") -> str:
    """`text` with the hunks applied in order; PatchError names the hunk that does not apply."""
    lines, eol = _split(text)
    offset = 0
    for n, hunk in enumerate(hunks, 1):
        old, new = hunk.old, hunk.new
        guess = max(0, hunk.old_start - 1 + offset) if old else max(0, hunk.old_start + offset)
        pos = _find(lines, old, guess, lambda s: s)
        if pos is None:
            pos = _find(lines, old, guess, lambda s: s.rstrip())
        if pos is None:
            raise PatchError(f"hunk {n} of {path} does not apply (context not found)")
        at_end = pos + len(old) == len(lines)
        lines[pos:pos + len(old)] = new
        offset = pos - (hunk.old_start - 1) + len(new) - len(old) if old else offset + len(new)
        if at_end:
            if hunk.new_no_eol:
                eol = False
            elif hunk.old_no_eol or new:
                eol = True
    if not lines:
        return ""
    return "\n".join(lines) + ("\n" if eol else "")


def apply_patch(root: Path, patch: str | list[FilePatch], *, read: Callable[[str], str | None] | None = None
                ) -> dict[str, str | None]:
    """New contents of every file the patch touches ({path: text, or None = deleted}).

    Nothing is written: the caller decides what lands where (the grader drops test files).
    `read(path)` gives a file's current text (default: from `root`), None if absent.
    """
    root = Path(root)
    files = parse_patch(patch) if isinstance(patch, str) else patch

    def read_root(rel: str) -> str | None:
        p = root / rel
        if not p.is_file():
            return None
        try:
            return p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise PatchError(f"{rel} is not UTF-8 text") from None

    read = read or read_root
    result: dict[str, str | None] = {}

    def current(rel: str) -> str | None:
        return result[rel] if rel in result else read(rel)

    for fp in files:
        for rel in fp.paths:
            check_path(root, rel)
        if fp.symlink:
            raise UnsafePathError(f"patch creates a symlink: {fp.path}")
        if fp.binary:
            raise PatchError(f"binary patches are not supported: {fp.path}")
        if fp.old_path is None:
            if current(fp.new_path) is not None:
                existing = current(fp.new_path)
                if existing:
                    raise PatchError(f"patch creates {fp.new_path}, which already exists")
            result[fp.new_path] = apply_hunks("", fp.hunks, fp.new_path)
            continue
        before = current(fp.old_path)
        if before is None:
            raise PatchError(f"patch modifies {fp.old_path}, which does not exist")
        after = apply_hunks(before, fp.hunks, fp.old_path)
        if fp.new_path is None:
            result[fp.old_path] = None
            continue
        if fp.new_path != fp.old_path:
            result[fp.old_path] = None
        result[fp.new_path] = after
    return result


def touched_paths(files: list[FilePatch]) -> list[str]:
    return list(dict.fromkeys(p for fp in files for p in fp.paths))


def make_patch(changes: Mapping[str, tuple[str | None, str | None]]) -> str:
    """A git-style unified diff from {path: (old text or None, new text or None)} (used by tests)."""
    import difflib

    out: list[str] = []
    for path, (before, after) in changes.items():
        a = (before or "").splitlines(keepends=True)
        b = (after or "").splitlines(keepends=True)
        out.append(f"diff --git a/{path} b/{path}\n")
        if before is None:
            out.append("new file mode 100644\n")
        if after is None:
            out.append("deleted file mode 100644\n")
        for ln in difflib.unified_diff(a, b, "/dev/null" if before is None else f"a/{path}",
                                       "/dev/null" if after is None else f"b/{path}"):
            out.append(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n")
    return "".join(out)
