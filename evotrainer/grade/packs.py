"""A task pack as the grader reads it: the pins in its `sources.json`, where their snapshots live,
and whether they are fetched (evotrainer/tasks/sources.py fetches them).

A pack folder holds task files and `sources.json`; a task line of a pack names its snapshot
folder in `repo`, which resolves in `<EVOTRAINER_HOME>/swe/snapshots/`. That whole `swe/` folder
holds clean code, the fixes of every task, so graded code never sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from evotrainer.errors import UserError
from evotrainer.paths import evotrainer_home

MANIFEST = "sources.json"
FIELDS = ("name", "version", "license", "tasks", "sdist", "sha256", "root", "content_hash")


class PackNotFetched(UserError, ValueError):
    """The pack's library sources are not in the local store yet."""


@dataclass(frozen=True)
class Source:
    name: str  # the distribution name pip installs
    version: str
    license: str
    tasks: str  # the pack's task file built on it
    sdist: str  # archive file name
    sha256: str
    root: str  # the archive's top folder
    content_hash: str  # tasks.repos.content_hash of the snapshot

    @property
    def snapshot_name(self) -> str:
        return f"{self.name}-{self.content_hash}"

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def swe_cache() -> Path:
    """Everything fetched or built for SWE tasks (clean snapshots, buggy states): never graded code's to see."""
    return evotrainer_home() / "swe"


def snapshot_store() -> Path:
    return swe_cache() / "snapshots"


def is_pack(folder: Path | str) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def load_sources(pack_dir: Path | str) -> list[Source]:
    """The pins of a pack folder; ValueError names the bad entry."""
    path = Path(pack_dir) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the pack's sources: {exc}") from None
    rows = data.get("libraries") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected {{\"libraries\": [...]}} with at least one entry")
    out = []
    for i, row in enumerate(rows):
        where = f"{path}: libraries[{i}]"
        if not isinstance(row, dict) or any(not isinstance(row.get(k), str) or not row[k] for k in FIELDS):
            raise ValueError(f"{where}: needs non-empty strings {', '.join(FIELDS)}")
        src = Source(**{k: row[k] for k in FIELDS})
        for name in (src.sdist, src.root, src.tasks):
            if PurePosixPath(name).name != name or name in (".", ".."):
                raise ValueError(f"{where}: {name!r} must be a plain file or folder name")
        out.append(src)
    return out


def _for_tasks(sources: list[Source], tasks_file: Path | str | None) -> list[Source]:
    if tasks_file is None:
        return sources
    return [s for s in sources if s.tasks == Path(tasks_file).name]


def missing(pack_dir: Path | str, tasks_file: Path | str | None = None, store: Path | None = None) -> list[Source]:
    """The pack's libraries (those of `tasks_file` only, if given) whose snapshot is not in the store."""
    store = store or snapshot_store()
    return [s for s in _for_tasks(load_sources(pack_dir), tasks_file) if not (store / s.snapshot_name).is_dir()]


def pack_repo_base(pack_dir: Path | str, tasks_file: Path | str | None = None, *,
                   require: bool = True) -> tuple[Path, tuple[Path, ...]]:
    """(where the pack's `repo` names resolve, what graded code must not see); PackNotFetched when
    `require` and a snapshot is missing."""
    store = snapshot_store()
    if require:
        absent = missing(pack_dir, tasks_file, store)
        if absent:
            raise PackNotFetched(
                f"the task pack {pack_dir} is built on {', '.join(s.requirement for s in absent)}, whose sources "
                f"are not fetched into {store}: run `evotrainer tasks fetch` (or `make setup`) on a machine "
                "that can reach the package index with pip")
    return store, (swe_cache(),)


__all__ = ["FIELDS", "MANIFEST", "PackNotFetched", "Source", "is_pack", "load_sources", "missing", "pack_repo_base",
           "snapshot_store", "swe_cache"]
