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
store (evotrainer/grade/packs.py, which also reads the pins). The whole `<EVOTRAINER_HOME>/swe/` folder holds clean code, the
fixes of every task, so graded code never sees it (tasks carry it in `hide`). pip's cache is off
for the same reason: it would keep another copy of the clean archive.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from evotrainer.errors import UserError
from evotrainer.grade.packs import (
    FIELDS,
    MANIFEST,
    PackNotFetched,
    Source,
    is_pack,
    load_sources,
    missing,
    pack_repo_base,
    snapshot_store,
    swe_cache,
)
from evotrainer.tasks import repos

PIP_TIMEOUT_S = 600


class FetchError(UserError, RuntimeError):
    """A library's sources could not be fetched or do not match the pack's pins."""


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


__all__ = ["FIELDS", "MANIFEST", "FetchError", "PackNotFetched", "Source", "describe", "extract", "fetch", "fetch_one",
           "is_pack", "load_sources", "missing", "pack_repo_base", "snapshot_store", "swe_cache"]
