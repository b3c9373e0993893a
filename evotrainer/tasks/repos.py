"""Task repositories: snapshot a repo's source into a task store, and read a task's buggy state.

Storage. A synthesized task keeps ONE clean snapshot of the repository per library (`repo`) and
its bug as a per-task diff (`bug_patch`, an extra SWE-bench field): clean + bug_patch is the
buggy base state, the one `patch` (the gold fix) applies to. Thirty tasks on one library cost
one copy of it plus thirty one-hunk diffs, instead of thirty copies.

The grader applies `bug_patch` itself (in memory, written over the clean files in its sandbox
copy) and hides the snapshot, the task file and the task's `hide` paths from the code under test:
the clean snapshot is the fix. `read_buggy` gives one file of the buggy state (prompts, the edit
scaffold). `buggy_task` is a thin cache for callers that need the buggy state as a real folder
(the agent scaffold's working copy): it materializes clean + bug_patch once per task and returns
a task that is already at its base state (no `bug_patch`), with the snapshot added to `hide`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from evotrainer.grade import SweTask, apply_patch
from evotrainer.grade.packs import swe_cache

# Never copied into a snapshot: VCS history (no peeking at future commits), caches, builds.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", "__pycache__", ".pytest_cache",
                       ".mypy_cache", ".ruff_cache", ".tox", ".nox", ".venv", "venv", "build", "dist",
                       "node_modules", ".eggs", ".github"})
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".egg-info")


def source_files(root: Path) -> Iterator[str]:
    """Repo-relative paths ('/'-separated, sorted) of the files a snapshot keeps."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if name.endswith(SKIP_SUFFIXES) or full.is_symlink() or not full.is_file():
                continue
            yield full.relative_to(root).as_posix()


def content_hash(root: Path) -> str:
    """sha256 over the kept files' paths and bytes (12 hex): equal trees, equal hash."""
    digest = hashlib.sha256()
    for rel in source_files(root):
        digest.update(rel.encode() + b"\0" + (Path(root) / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def git_head(root: Path) -> str | None:
    if not (Path(root) / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def snapshot(repo: Path, store: Path, name: str | None = None) -> Path:
    """Copy the repo's source (no .git, no caches) to `<store>/<name>-<hash>/`; reuse an equal one."""
    repo, store = Path(repo).resolve(), Path(store)
    name = name or repo.name
    dest = store / f"{name}-{content_hash(repo)}"
    if dest.is_dir():
        return dest
    store.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=store))
    try:
        for rel in source_files(repo):
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, target)
        _publish(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def bug_patch(task: SweTask) -> str:
    return task.bug_patch


def buggy_files(task: SweTask) -> dict[str, str | None]:
    """{path: buggy text} of the files the task's bug_patch changes ({} without one)."""
    patch = bug_patch(task)
    if not patch.strip():
        return {}
    return apply_patch(task.root, patch)


def read_buggy(task: SweTask, rel: str) -> str | None:
    """One file of the task's buggy base state (None if it does not exist)."""
    changed = buggy_files(task)
    if rel in changed:
        return changed[rel]
    path = task.root / rel
    return path.read_text(encoding="utf-8") if path.is_file() else None


def cache_root() -> Path:
    """Where `buggy_task` builds buggy states: EVOTRAINER_SWE_CACHE, else inside the SWE cache
    (which pack tasks hide from graded code: another task's buggy state holds this task's fix)."""
    env = os.environ.get("EVOTRAINER_SWE_CACHE")
    if env:
        return Path(env)
    return swe_cache() / "buggy"


def buggy_task(task: SweTask, cache: Path | None = None) -> SweTask:
    """The task with `repo_path` at its buggy base state in a cache folder (see module doc)."""
    patch = bug_patch(task)
    if not patch.strip():
        return task
    key = hashlib.sha256(f"{task.root.resolve()}\0{content_hash(task.root)}\0{patch}".encode()).hexdigest()[:16]
    dest = (cache or cache_root()) / f"{_safe(task.instance_id)}-{key}"
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))
        try:
            shutil.copytree(task.root, tmp, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(*SKIP_DIRS, "*.pyc"))
            for rel, text in buggy_files(task).items():
                target = tmp / rel
                if text is None:
                    target.unlink(missing_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text, encoding="utf-8")
            _publish(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    extra = {k: v for k, v in task.extra.items() if k != "bug_patch"}
    return replace(task, repo_path=dest, extra=extra, hide=tuple(dict.fromkeys((*task.hide, task.root.resolve()))))


def _publish(tmp: Path, dest: Path) -> None:
    """Move a finished folder into place; another process may have built the same one first."""
    try:
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():
            raise


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
