"""A task pack's library sources: fetch each pinned sdist with pip, check it, and keep its snapshot.

A pack folder (the bundled one is `packs/`) holds task files and `sources.json`, which pins, per
library, the exact source distribution the tasks were built on: name, version, archive file name,
the archive's sha256, the archive's top folder, and the `content_hash` (repos.py) of the
extracted snapshot. We never commit the libraries' code; `fetch` gets it:

1. `python -m pip download --no-deps --no-binary :all: --no-cache-dir NAME==VERSION` into a
   temp folder (or the archive from `sdist_dir`, for machines without access to the index);
2. the archive's sha256 must match;
3. it is extracted (tar's `data` filter: no links out, no absolute paths) and the snapshot of its
   top folder (repos.snapshot: no VCS folders, caches or egg-info) must have the pinned
   content hash;
4. the snapshot lands in `<EVOTRAINER_HOME>/swe/snapshots/<name>-<hash>/`; the archive is deleted.

A task line of a pack names its snapshot folder in `repo`; the grader's loader resolves it in the
store (see `pack_repo_base`). The whole `<EVOTRAINER_HOME>/swe/` folder holds clean code, the
fixes of every task, so graded code never sees it (tasks carry it in `hide`). pip's cache is off
for the same reason: it would keep another copy of the clean archive.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from collections.abc import Callable

from evotrainer.paths import evotrainer_home
from evotrainer.tasks import repos

MANIFEST = "sources.json"
FIELDS = ("name", "version", "license", "tasks", "sdist", "sha256", "root", "content_hash")
PIP_TIMEOUT_S = 600


class FetchError(RuntimeError):
    """A library's sources could not be fetched or do not match the pack's pins."""


class PackNotFetched(ValueError):
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
    content_hash: str  # repos.content_hash of the snapshot

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


# ---------------------------------------------------------------- fetching


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(src: Source, dest: Path, python: str = sys.executable) -> Path:
    """`pip download` the pinned sdist into `dest`; FetchError (with what to do) when pip fails."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", src.requirement, "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(_offline(src, f"pip did not finish: {exc}")) from None
    archive = dest / src.sdist
    if proc.returncode != 0 or not archive.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise FetchError(_offline(src, f"`{' '.join(cmd[1:])}` failed (exit {proc.returncode}):\n{tail}"))
    return archive


def _offline(src: Source, why: str) -> str:
    return (f"could not download {src.requirement}: {why}\n"
            "The SWE task pack needs this library's source archive. Fix pip's access to the package index "
            "(pip's own settings apply, e.g. a mirror in pip.conf or PIP_INDEX_URL) and run "
            f"`evotrainer tasks fetch` again, or download {src.sdist} on another machine and run "
            "`evotrainer tasks fetch --sdist-dir DIR`.")


def extract(archive: Path, dest: Path) -> None:
    """Unpack a .tar.gz/.tar.bz2/.zip sdist into `dest`, refusing links and paths that leave it."""
    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                rel = PurePosixPath(info.filename)
                if rel.is_absolute() or ".." in rel.parts:
                    raise FetchError(f"{archive.name}: unsafe path in the archive: {info.filename}")
            zf.extractall(dest)
        return
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise FetchError(f"{archive.name}: cannot extract: {exc}") from None


def fetch_one(src: Source, store: Path, *, sdist_dir: Path | None = None, verify: bool = False,
              python: str = sys.executable) -> tuple[Path, str]:
    """(the snapshot folder, "cached" | "fetched") for one library; FetchError on any mismatch."""
    dest = store / src.snapshot_name
    if dest.is_dir():
        if not verify or repos.content_hash(dest) == src.content_hash:
            return dest, "cached"
        shutil.rmtree(dest)  # edited or damaged: build it again
    store.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".fetch-{src.name}-", dir=store))
    try:
        if sdist_dir is not None:
            archive = Path(sdist_dir) / src.sdist
            if not archive.is_file():
                raise FetchError(f"{archive} not found (expected the sdist of {src.requirement})")
        else:
            (tmp / "dl").mkdir()
            archive = download(src, tmp / "dl", python)
        got = sha256_file(archive)
        if got != src.sha256:
            raise FetchError(f"{archive.name}: sha256 {got}, but the pack pins {src.sha256}: not the archive "
                             "the tasks were built on")
        extract(archive, tmp / "x")
        root = tmp / "x" / src.root
        if not root.is_dir():
            raise FetchError(f"{archive.name} has no top folder {src.root!r}")
        got = repos.content_hash(root)
        if got != src.content_hash:
            raise FetchError(f"{src.requirement}: the extracted snapshot has content hash {got}, the pack pins "
                             f"{src.content_hash}")
        built = repos.snapshot(root, store, src.name)
        if built != dest:  # cannot happen when the hash matched; guards a change in snapshot naming
            raise FetchError(f"{src.requirement}: snapshot landed in {built}, expected {dest}")
        return dest, "fetched"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(pack_dir: Path | str, *, sdist_dir: Path | str | None = None, verify: bool = False,
          progress: Callable[[Source, str], None] | None = None) -> list[tuple[Source, Path, str]]:
    """Fetch every library of a pack into the snapshot store; (source, folder, status) each."""
    store = snapshot_store()
    out = []
    for src in load_sources(pack_dir):
        folder, status = fetch_one(src, store, sdist_dir=Path(sdist_dir) if sdist_dir else None, verify=verify)
        if progress is not None:
            progress(src, status)
        out.append((src, folder, status))
    return out


def describe(pack_dir: Path | str) -> dict[str, dict[str, str]]:
    """{name: {version, license, snapshot, fetched}} for listings."""
    store = snapshot_store()
    return {s.name: {"version": s.version, "license": s.license, "snapshot": s.snapshot_name,
                     "fetched": "yes" if (store / s.snapshot_name).is_dir() else "no"}
            for s in load_sources(pack_dir)}


__all__ = ["MANIFEST", "FetchError", "PackNotFetched", "Source", "describe", "extract", "fetch", "fetch_one",
           "is_pack", "load_sources", "missing", "pack_repo_base", "snapshot_store", "swe_cache"]
