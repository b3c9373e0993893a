"""Fetching a task pack's library sources: pins checked (sha256, content hash), unsafe archives
refused, the snapshot store used by the grader's loader, clear errors. A tiny library made here is
packed as a real sdist archive and fetched with --sdist-dir; the slow tests run real pip."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.grade import Grader, load_tasks, make_patch
from evotrainer.tasks import PACK_DIR, repos, sources

CLEAN = "def double(x):\n    return 2 * x\n"
BUGGY = "def double(x):\n    return 3 * x\n"
TESTS = ("from tinylib import double\n\n\ndef test_two():\n    assert double(2) == 4\n\n\n"
         "def test_zero():\n    assert double(0) == 0\n")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EVOTRAINER_SWE_CACHE", raising=False)
    return tmp_path / "home"


def _tar(path: Path, files: dict[str, str], top: str = "tinylib-1.0") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}" if top else rel)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _files(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"tinylib/__init__.py": CLEAN, "tests/test_tiny.py": TESTS, "LICENSE": "MIT\n", "PKG-INFO": "x\n",
            "tinylib.egg-info/PKG-INFO": "left out of the snapshot\n", **(extra or {})}


@pytest.fixture
def pack(tmp_path) -> tuple[Path, Path]:
    """(pack folder, folder holding the sdist archive) for the tiny library."""
    dists, unpacked = tmp_path / "dists", tmp_path / "unpacked"
    dists.mkdir()
    archive = _tar(dists / "tinylib-1.0.tar.gz", _files())
    with tarfile.open(archive) as tf:
        tf.extractall(unpacked, filter="data")
    folder = tmp_path / "pack"
    folder.mkdir()
    pin = {"name": "tinylib", "version": "1.0", "license": "MIT", "tasks": "tinylib.jsonl",
           "sdist": archive.name, "sha256": sources.sha256_file(archive), "root": "tinylib-1.0",
           "content_hash": repos.content_hash(unpacked / "tinylib-1.0")}
    (folder / sources.MANIFEST).write_text(json.dumps({"libraries": [pin]}))
    row = {"instance_id": "tinylib-1", "repo": f"tinylib-{pin['content_hash']}", "base_commit": "",
           "patch": make_patch({"tinylib/__init__.py": (BUGGY, CLEAN)}),
           "bug_patch": make_patch({"tinylib/__init__.py": (CLEAN, BUGGY)}), "test_patch": "",
           "FAIL_TO_PASS": ["tests/test_tiny.py::test_two"], "PASS_TO_PASS": ["tests/test_tiny.py::test_zero"],
           "problem_statement": "double() is wrong", "level": 1}
    (folder / "tinylib.jsonl").write_text(json.dumps(row) + "\n")
    return folder, dists


def _repin(folder: Path, **changes) -> None:
    data = json.loads((folder / sources.MANIFEST).read_text())
    data["libraries"][0].update(changes)
    (folder / sources.MANIFEST).write_text(json.dumps(data))


def test_fetch_builds_the_snapshot_the_grader_loads(pack, home):
    folder, dists = pack
    with pytest.raises(sources.PackNotFetched, match="evotrainer tasks fetch"):
        load_tasks(folder / "tinylib.jsonl")
    [(src, path, status)] = sources.fetch(folder, sdist_dir=dists)
    assert status == "fetched" and path == home / "swe" / "snapshots" / src.snapshot_name
    assert (path / "LICENSE").is_file() and not (path / "tinylib.egg-info").exists()
    assert [p.name for p in (home / "swe" / "snapshots").iterdir()] == [src.snapshot_name]  # no temp left
    [task] = load_tasks(folder / "tinylib.jsonl")
    assert task.root == path and home / "swe" in task.hide and task.bug_patch
    grader = Grader(cache=None)
    assert grader.grade(task, task.patch).outcome.success
    assert not grader.grade(task, "").outcome.success
    assert sources.fetch(folder, sdist_dir=dists)[0][2] == "cached"


def test_verify_rebuilds_an_edited_snapshot(pack):
    folder, dists = pack
    [(_, path, _)] = sources.fetch(folder, sdist_dir=dists)
    (path / "tinylib" / "__init__.py").write_text(BUGGY)
    assert sources.fetch(folder, sdist_dir=dists)[0][2] == "cached"  # no re-hash without verify
    assert sources.fetch(folder, sdist_dir=dists, verify=True)[0][2] == "fetched"
    assert (path / "tinylib" / "__init__.py").read_text() == CLEAN


def test_wrong_archive_is_refused(pack, home):
    folder, dists = pack
    _repin(folder, sha256="0" * 64)
    with pytest.raises(sources.FetchError, match="sha256"):
        sources.fetch(folder, sdist_dir=dists)
    assert not any((home / "swe" / "snapshots").iterdir())


def test_archive_with_other_content_is_refused(pack, home):
    folder, dists = pack
    archive = _tar(dists / "tinylib-1.0.tar.gz", _files({"tinylib/extra.py": "X = 1\n"}))
    _repin(folder, sha256=sources.sha256_file(archive))  # the right bytes for the pin, not the tasks' tree
    with pytest.raises(sources.FetchError, match="content hash"):
        sources.fetch(folder, sdist_dir=dists)
    assert not any((home / "swe" / "snapshots").iterdir())


def test_archive_escaping_its_folder_is_refused(pack, tmp_path):
    folder, dists = pack
    archive = _tar(dists / "tinylib-1.0.tar.gz", {"tinylib-1.0/LICENSE": "x", "../escaped.txt": "x"}, top="")
    _repin(folder, sha256=sources.sha256_file(archive))
    with pytest.raises(sources.FetchError, match="cannot extract"):
        sources.fetch(folder, sdist_dir=dists)
    assert not list(tmp_path.rglob("escaped.txt"))


def test_bad_manifests_are_named(tmp_path):
    (tmp_path / sources.MANIFEST).write_text(json.dumps({"libraries": [{"name": "x"}]}))
    with pytest.raises(ValueError, match=r"libraries\[0\].*needs"):
        sources.load_sources(tmp_path)
    (tmp_path / sources.MANIFEST).write_text(json.dumps({"libraries": [
        {k: "../up" if k == "root" else "v" for k in sources.FIELDS}]}))
    with pytest.raises(ValueError, match="plain file or folder name"):
        sources.load_sources(tmp_path)


def test_fetch_cli(pack, tmp_path):
    from evotrainer.cli.tasks import app

    folder, dists = pack
    runner = CliRunner()
    ok = runner.invoke(app, ["fetch", "--pack", str(folder), "--sdist-dir", str(dists)])
    assert ok.exit_code == 0 and "tinylib==1.0 (MIT): fetched" in ok.output, ok.output
    assert runner.invoke(app, ["fetch", "--pack", str(tmp_path / "absent")]).exit_code == 2
    assert runner.invoke(app, ["fetch", "--pack", str(folder), "--sdist-dir", str(tmp_path / "no")]).exit_code == 2
    empty = tmp_path / "empty-dists"
    empty.mkdir()
    missing = runner.invoke(app, ["fetch", "--pack", str(folder), "--sdist-dir", str(empty), "--verify"])
    assert missing.exit_code == 0  # already fetched: the archive is not needed
    _repin(folder, content_hash="0" * 12)
    failed = runner.invoke(app, ["fetch", "--pack", str(folder), "--sdist-dir", str(empty)])
    assert failed.exit_code == 2 and "not found" in failed.output, failed.output


@pytest.mark.slow
def test_real_pip_fetch_reproduces_a_bundled_pin(home):
    """pip download of the bundled pack's smallest library gives exactly the pinned archive and tree."""
    [src] = [s for s in sources.load_sources(PACK_DIR) if s.name == "inflection"]
    path, status = sources.fetch_one(src, sources.snapshot_store())
    assert status == "fetched" and repos.content_hash(path) == src.content_hash


@pytest.mark.slow
def test_pip_failure_says_what_to_do(tmp_path):
    [src] = [s for s in sources.load_sources(PACK_DIR) if s.name == "inflection"]
    bogus = sources.Source(**{**src.__dict__, "version": "0.0.0.dev999"})
    with pytest.raises(sources.FetchError) as err:
        sources.fetch_one(bogus, tmp_path / "store")
    assert "evotrainer tasks fetch" in str(err.value) and "--sdist-dir" in str(err.value)


def test_importing_a_pack_file_keeps_the_store_hidden(pack, home, tmp_path):
    from evotrainer.tasks.importer import import_tasks

    folder, dists = pack
    sources.fetch(folder, sdist_dir=dists)
    out = tmp_path / "elsewhere" / "tasks.jsonl"
    import_tasks(folder / "tinylib.jsonl", out)
    [task] = load_tasks(out)
    assert Path(task.repo).is_absolute() and (home / "swe").resolve() in task.hide



def test_the_grader_imports_nothing_from_tasks():
    """grade/ reads a pack's pins itself (grade/packs.py): tasks/ builds on the grader, not the
    reverse, not even inside a function."""
    import ast

    import evotrainer.grade

    found = []
    for path in Path(evotrainer.grade.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("evotrainer.tasks")]
    assert not found, found
