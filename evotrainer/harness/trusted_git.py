"""Trusted git on the harness repo: no hooks, no fsmonitor, no config that runs programs, and a guard on main.

The harness repo sits next to untrusted code (harness workers, the outer agent's edits), so git
itself must not become the way in. Every git command we run on it gets `safe_env()`: no system or
global config, overrides (as `GIT_CONFIG_COUNT` entries, which outrank the repo's own config) for
every setting that makes git start a program we did not ask for, and no terminal prompts. On top
of that `check_config` refuses a repo whose `.git/config` holds anything beyond the few plain
keys a harness repo needs: a filter, textconv or diff driver, an include, an alias, a pager...
so a setting we did not think to override still never runs.

`main` moves only by our own promote and revert. `MainGuard` keeps the tip we last left it at in
a file outside the repo; a tip that moved otherwise stops the run with RefMovedError.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from evotrainer.errors import UserError
from evotrainer.jsonfile import write_json

# Settings that would start a program (or read files we do not choose) during the commands we
# run: hooks, fsmonitor, pagers and editors, signing, external diff, maintenance.
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("merge.verifySignatures", "false"),
    ("gpg.program", "false"),
    ("diff.external", "false"),
    ("diff.noprefix", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("protocol.allow", "never"),
    ("credential.helper", ""),
)

# The keys a harness repo's own config may hold (`section.key`, or a pattern for named
# subsections). None of them makes git run anything.
_ALLOWED_KEYS = (
    r"core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|symlinks)",
    r"user\.(name|email)",
    r"evotrainer\.domain",
    r"remote\.[A-Za-z0-9_.-]+\.(url|fetch)",
    r"branch\.[A-Za-z0-9_./-]+\.(remote|merge)",
)
_ALLOWED = re.compile("|".join(f"(?:{k})" for k in _ALLOWED_KEYS), re.IGNORECASE)


class UnsafeRepoError(UserError, RuntimeError):
    """The harness repo holds git settings or layout that could run code; names the file and key."""


class RefMovedError(UserError, RuntimeError):
    """A ref we guard moved by something other than our own promote or revert."""

    def __init__(self, ref: str, expected: str, found: str | None, guard: Path):
        self.ref, self.expected, self.found, self.guard = ref, expected, found, guard
        super().__init__(
            f"{ref} moved outside evotrainer: expected {expected}, found {found or 'nothing'} "
            f"(the tip evotrainer last left it at is recorded in {guard}); stopping. "
            f"Inspect the harness repo; if the new tip is yours, delete {guard} to accept it.")


def safe_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for every git command on a harness repo (merged over `base`)."""
    env = dict(base or {})
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
                "GIT_ATTR_NOSYSTEM": "1", "GIT_PAGER": "cat", "GIT_EDITOR": "true",
                "GIT_OPTIONAL_LOCKS": "0", "GIT_CONFIG_COUNT": str(len(OVERRIDES)),
                # refs/replace/* and info/grafts make a sha read as other content: main's files
                # would not be the files of main's commit
                "GIT_NO_REPLACE_OBJECTS": "1", "GIT_GRAFT_FILE": os.devnull})
    for i, (key, value) in enumerate(OVERRIDES):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def _config_keys(text: str) -> list[str]:
    """`section[.subsection].key` of each entry in a git config file (a small, strict reader:
    what it cannot read it reports as a key, so it is refused rather than skipped)."""
    keys, section = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        head = re.fullmatch(r'\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(?:[#;].*)?', line)
        if head:
            section = head.group(1) + (f".{head.group(2)}" if head.group(2) is not None else "")
            continue
        entry = re.match(r"([A-Za-z][A-Za-z0-9-]*)\s*(=|$)", line)
        if section is None or entry is None or line.startswith("["):
            keys.append(f"<unreadable line {raw.strip()[:60]!r}>")
            continue
        keys.append(f"{section}.{entry.group(1)}")
    return keys


def check_config(repo: Path) -> None:
    """UnsafeRepoError unless `repo/.git` is a plain git dir whose config holds only allowed keys."""
    gitdir = Path(repo) / ".git"
    if gitdir.is_symlink() or not gitdir.is_dir():
        raise UnsafeRepoError(f"{gitdir}: not a plain .git folder (a gitfile or link could point anywhere)")
    for name in ("commondir", "config.worktree", "shallow"):  # shallow: history cut like a graft
        if (gitdir / name).exists():
            raise UnsafeRepoError(f"{gitdir / name}: not allowed in a harness repo")
    config = gitdir / "config"
    try:
        text = config.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnsafeRepoError(f"{config}: cannot read: {exc}") from None
    for key in _config_keys(text):
        if not _ALLOWED.fullmatch(key):
            raise UnsafeRepoError(f"{config}: {key} is not allowed in a harness repo's config "
                                  "(it could make git run a program); remove it")


GUARD_FILE = "harness-refs.json"  # beside the harness repo, in the workspace: out of the repo's reach


class MainGuard:
    """The tip of a guarded ref as evotrainer last left it, kept in a JSON file outside the repo."""

    def __init__(self, file: Path, ref: str = "refs/heads/main"):
        self.file, self.ref = Path(file), ref

    def expected(self) -> str | None:
        import json

        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise UnsafeRepoError(f"{self.file}: unreadable ref guard ({exc}); delete it to accept the repo as it is") from None
        value = data.get(self.ref) if isinstance(data, dict) else None
        return value if isinstance(value, str) else None

    def check(self, found: str | None) -> None:
        """RefMovedError if the ref is not where we left it; the first sight of a repo records it."""
        expected = self.expected()
        if expected is None:
            if found is not None:
                self.record(found)
            return
        if found != expected:
            raise RefMovedError(self.ref, expected, found, self.file)

    def record(self, sha: str) -> None:
        write_json(self.file, {self.ref: sha}, indent=1)
