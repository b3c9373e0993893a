"""SWE tasks in SWE-bench JSONL form: the `SweTask` record, its loader and its writer.

One line per task, with SWE-bench's field names: `instance_id`, `repo`, `base_commit`, `patch`
(the gold fix), `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `problem_statement`, plus our
`level` (0 names file, function and line; 1 the function; 2 only the symptom, the default for
imported SWE-bench lines). Other SWE-bench fields (`version`, `hints_text`, ...) are kept in
`extra`. Differences from SWE-bench: `repo` is a local folder (absolute, or relative to the task
file's folder; in a task pack, a folder with `sources.json`, relative to the pack's fetched
snapshot store, see packs.py) holding the repository at the buggy state, or,
when the line has a `bug_patch`, the clean repository that `bug_patch` turns into the buggy state
(the grader applies it); and `FAIL_TO_PASS`/`PASS_TO_PASS` may be lists or JSON-encoded lists
(SWE-bench ships both).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.grade.packs import is_pack, pack_repo_base, swe_cache
from evotrainer.jsonfile import iter_jsonl, read_records

FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
          "problem_statement", "level")
DEFAULT_LEVEL = 2


@dataclass(frozen=True)
class SweTask:
    instance_id: str
    repo: str  # as written in the file
    base_commit: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    problem_statement: str
    level: int = DEFAULT_LEVEL
    repo_path: Path | None = None  # `repo` resolved against the task file's folder
    task_file: Path | None = None  # where it was loaded from (the grader hides it from the code)
    extra: Mapping[str, Any] = field(default_factory=dict)
    # More host paths graded code must not see: where the repo's other states live (a snapshot
    # store holds the clean code, i.e. every task's fix).
    hide: tuple[Path, ...] = ()

    @property
    def tests(self) -> tuple[str, ...]:
        """The target tests: FAIL_TO_PASS then PASS_TO_PASS, each once."""
        return tuple(dict.fromkeys(self.FAIL_TO_PASS + self.PASS_TO_PASS))

    @property
    def root(self) -> Path:
        return self.repo_path or Path(self.repo)

    @property
    def bug_patch(self) -> str:
        """The diff that turns `root` (a clean snapshot) into the buggy base state ("" when `root` is it)."""
        value = self.extra.get("bug_patch", "")
        return value if isinstance(value, str) else ""

    def to_dict(self) -> dict[str, Any]:
        """The JSONL line (SWE-bench names; lists as JSON lists)."""
        data: dict[str, Any] = dict(self.extra)
        data.update(instance_id=self.instance_id, repo=self.repo, base_commit=self.base_commit,
                    patch=self.patch, test_patch=self.test_patch, FAIL_TO_PASS=list(self.FAIL_TO_PASS),
                    PASS_TO_PASS=list(self.PASS_TO_PASS), problem_statement=self.problem_statement,
                    level=self.level)
        return data


def _tests(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: {name!r} must be a list of pytest node ids") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise ValueError(f"{where}: {name!r} must be a list of pytest node ids")
    return tuple(t.strip() for t in value)


def task_from_dict(row: Any, *, base: Path | None = None, where: str = "task",
                   check_repo: bool = True) -> SweTask:
    """Validate one JSON object; ValueError names `where` and the bad field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in ("instance_id", "repo"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise ValueError(f"{where}: {name!r} must be a non-empty string")
    for name in ("base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(row.get(name, ""), str):
            raise ValueError(f"{where}: {name!r} must be a string")
    if "FAIL_TO_PASS" not in row:
        raise ValueError(f"{where}: missing 'FAIL_TO_PASS'")
    f2p = _tests(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = _tests(row.get("PASS_TO_PASS", []), "PASS_TO_PASS", where)
    if not f2p:
        raise ValueError(f"{where}: 'FAIL_TO_PASS' is empty: nothing would show the fix")
    level = row.get("level", DEFAULT_LEVEL)
    if isinstance(level, bool) or not isinstance(level, int) or level < 0:
        raise ValueError(f"{where}: 'level' must be a non-negative integer")
    repo_path = Path(row["repo"]).expanduser()
    if not repo_path.is_absolute() and base is not None:
        repo_path = base / repo_path
    if check_repo and not repo_path.is_dir():
        raise ValueError(f"{where}: repo folder not found: {repo_path}")
    extra = {k: v for k, v in row.items() if k not in FIELDS}
    return SweTask(
        instance_id=row["instance_id"].strip(), repo=row["repo"], base_commit=row.get("base_commit", ""),
        patch=row.get("patch", ""), test_patch=row.get("test_patch", ""), FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p, problem_statement=row.get("problem_statement", ""), level=level,
        repo_path=repo_path.resolve() if repo_path.exists() else repo_path, extra=extra,
    )


def repo_base(path: Path, *, check_repo: bool = True) -> tuple[Path, tuple[Path, ...]]:
    """(the folder a task file's relative `repo` paths start from, paths to hide from graded code).

    A plain file: its own folder, hidden (it may hold other states of the repo). A task pack's
    file: the pack's fetched snapshot store and the SWE cache (ValueError naming the fetch command
    when the pack's sources are not fetched and `check_repo`).
    """
    folder = path.parent.resolve()
    if is_pack(folder):
        return pack_repo_base(folder, path.name, require=check_repo)
    return folder, (folder,)


def _hide(task: SweTask, base_hide: tuple[Path, ...]) -> tuple[Path, ...]:
    """The base folder's hide paths for a relative `repo`; the SWE cache for any repo inside it."""
    hide = () if Path(task.repo).expanduser().is_absolute() else base_hide
    cache = swe_cache().resolve()
    if cache == task.root or cache in task.root.parents:
        hide = (*hide, cache)
    return tuple(dict.fromkeys(hide))


def load_tasks(path: Path | str, *, check_repo: bool = True) -> list[SweTask]:
    """Every task of a JSONL file; ValueError names the file and line of the first bad one."""
    path = Path(path)
    base, hide = repo_base(path, check_repo=check_repo)
    tasks: list[SweTask] = []
    seen: dict[str, int] = {}
    for where, lineno, row in iter_jsonl(path, "task JSONL"):
        task = task_from_dict(row, base=base, where=where, check_repo=check_repo)
        if task.instance_id in seen:
            raise ValueError(f"{where}: instance_id {task.instance_id!r} repeats line {seen[task.instance_id]}")
        seen[task.instance_id] = lineno
        tasks.append(_with(task, task_file=path.resolve(), hide=_hide(task, hide)))
    return tasks


def write_tasks(path: Path | str, tasks: Iterable[SweTask]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task.to_dict()) + "\n")


def load_predictions(path: Path | str) -> list[dict[str, str]]:
    """SWE-bench predictions ({instance_id, model_patch}, other keys ignored): JSONL or a JSON list."""
    rows = read_records(path, "predictions")
    preds = []
    for where, row in rows:
        if not isinstance(row.get("instance_id"), str):
            raise ValueError(f"{where}: expected an object with a string 'instance_id'")
        patch = row.get("model_patch")
        if patch is None:
            patch = ""
        if not isinstance(patch, str):
            raise ValueError(f"{where}: 'model_patch' must be a string")
        preds.append({"instance_id": row["instance_id"], "model_patch": patch})
    return preds


def _with(task: SweTask, **changes: Any) -> SweTask:
    from dataclasses import replace

    return replace(task, **changes)
