"""Import SWE-bench-format JSONL whose repos are local folders: validate with the grader's loader,
check the patches parse, and write the tasks with `repo` paths that resolve from the new file."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from evotrainer.grade import PatchError, SweTask, apply_patch, parse_patch, task_from_dict, write_tasks
from evotrainer.grade.swe_tasks import repo_base
from evotrainer.jsonfile import iter_jsonl


def _resolve_repo(row: dict, base: Path, repo_root: Path | None) -> dict:
    """An 'owner/name' repo (SWE-bench's spelling) found under repo_root as name or owner__name."""
    repo = row.get("repo")
    if not isinstance(repo, str) or repo_root is None:
        return row
    if (base / repo).is_dir() or Path(repo).expanduser().is_absolute():
        return row
    owner, _, name = repo.partition("/")
    for candidate in (repo_root / repo, repo_root / name, repo_root / f"{owner}__{name}"):
        if name and candidate.is_dir():
            return {**row, "repo": str(candidate.resolve())}
    return row


def import_tasks(src: Path | str, out: Path | str, *, repo_root: Path | str | None = None,
                 default_level: int | None = None) -> list[SweTask]:
    """Validate every line of `src` and write them to `out`; ValueError names the first bad line."""
    src, out = Path(src), Path(out)
    base, _ = repo_base(src)  # a task pack's file: its repos are in the fetched snapshot store
    root = Path(repo_root).resolve() if repo_root else None
    tasks: list[SweTask] = []
    seen: set[str] = set()
    for where, _, row in iter_jsonl(src, "task JSONL"):
        row = _resolve_repo(row, base, root)
        if default_level is not None and "level" not in row:
            row = {**row, "level": default_level}
        task = task_from_dict(row, base=base, where=where)
        if task.instance_id in seen:
            raise ValueError(f"{where}: instance_id {task.instance_id!r} repeats")
        seen.add(task.instance_id)
        try:
            if not parse_patch(task.patch):
                raise PatchError("no file diff found")
            if task.test_patch.strip():
                apply_patch(task.root, task.test_patch)
        except PatchError as exc:
            raise ValueError(f"{where}: {exc}") from None
        tasks.append(task)
    out.parent.mkdir(parents=True, exist_ok=True)
    out_dir = out.parent.resolve()
    write_tasks(out, [replace(t, repo=_ref(t.root, out_dir)) for t in tasks])
    return tasks


def _ref(root: Path, out_dir: Path) -> str:
    """Relative to the output's folder when the repo lies under it, else absolute."""
    root = root.resolve()
    try:
        root.relative_to(out_dir)
        return os.path.relpath(root, out_dir)
    except ValueError:
        return str(root)
