"""The bundled SWE task pack: well-formed, small, licensed, and graded right by the real grader.

For every task the gold patch must resolve and the empty patch must not; a patch that only adds a
comment must not either (so the bug really fails its tests). The fast run grades one task per
library; the slow run grades them all.
"""

from __future__ import annotations

import os
import pytest

from evotrainer.domains.swe import SweDomain, edit_prompt, focus
from evotrainer.grade import Grader, apply_patch, make_patch
from evotrainer.tasks import PACK_DIR, load_pack, pack_files, repos

LIBRARIES = {"more-itertools", "toolz", "inflection"}

@pytest.fixture(scope="module", autouse=True)
def _swe_cache(tmp_path_factory):
    """Buggy task states are built under a temp folder, not the user's cache."""
    old = os.environ.get("EVOTRAINER_SWE_CACHE")
    os.environ["EVOTRAINER_SWE_CACHE"] = str(tmp_path_factory.mktemp("swe-cache"))
    yield
    if old is None:
        os.environ.pop("EVOTRAINER_SWE_CACHE", None)
    else:
        os.environ["EVOTRAINER_SWE_CACHE"] = old



@pytest.fixture(scope="module")
def pack():
    return load_pack()


@pytest.fixture(scope="module")
def grader():
    return Grader(cache=None)


def _library(task) -> str:
    return task.instance_id.rsplit("-", 1)[0]


def test_pack_shape(pack):
    assert {f.stem for f in pack_files()} == LIBRARIES
    assert 20 <= len(pack) <= 40
    assert {_library(t) for t in pack} == LIBRARIES
    assert {t.level for t in pack} == {0, 1, 2}
    assert len({t.instance_id for t in pack}) == len(pack)
    assert len({t.patch for t in pack}) == len(pack)  # no duplicate bugs
    size = sum(p.stat().st_size for p in PACK_DIR.rglob("*") if p.is_file())
    assert size < 5 * 2**20, f"pack is {size / 2**20:.1f} MiB"
    assert (PACK_DIR / "README.md").is_file()


def test_every_snapshot_keeps_its_license_and_no_history(pack):
    for root in {t.root for t in pack}:
        assert any(p.name.startswith("LICENSE") for p in root.iterdir()), root
        assert not any(p.name in (".git", "__pycache__") for p in root.rglob("*")), root
        assert str(root).startswith(str(PACK_DIR))


def test_bug_and_gold_patches_are_inverse(pack):
    for t in pack:
        buggy = repos.buggy_files(t)
        assert len(buggy) == 1, t.instance_id
        (path, text), = buggy.items()
        clean = (t.root / path).read_text(encoding="utf-8")
        assert text != clean
        assert apply_patch(t.root, t.patch, read=lambda rel: buggy.get(rel))[path] == clean
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        for test in t.tests:
            assert (t.root / test.split("::", 1)[0]).is_file(), test


def test_domain_splits_and_prompts(pack):
    domain = SweDomain(source="pack")
    train, heldout = domain.tasks("train", 100, 0), domain.tasks("heldout", 100, 0)
    assert len(train) + len(heldout) == len(pack) and heldout
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert [t.task_id for t in domain.tasks("train", 5, 3)] == [t.task_id for t in domain.tasks("train", 5, 3)]
    for t in train + heldout:
        swe = domain.swe_task(t)
        path, line = focus(swe)
        buggy_line = repos.read_buggy(swe, path).splitlines()[line - 1]
        assert buggy_line.strip() in t.prompt or not buggy_line.strip(), t.task_id
        assert t.meta["start"] <= line <= t.meta["end"]
        assert edit_prompt(swe)[0] == t.prompt


def gold_as_edit_blocks(task) -> str:
    """The gold patch written the way the edit scaffold asks a model to answer."""
    from evotrainer.grade import parse_patch

    blocks = []
    for fp in parse_patch(task.patch):
        for hunk in fp.hunks:
            old = "".join(ln[1:] + "\n" for ln in hunk.lines if ln[:1] in " -")
            new = "".join(ln[1:] + "\n" for ln in hunk.lines if ln[:1] in " +")
            blocks.append(f"{fp.old_path}\n<<<<<<< SEARCH\n{old}=======\n{new}>>>>>>> REPLACE\n")
    return "Here is the fix.\n\n" + "\n".join(blocks)


def test_gold_written_as_edit_blocks_resolves_through_the_domain(pack):
    domain = SweDomain(source="pack")
    tasks = domain.tasks("train", 100, 0) + domain.tasks("heldout", 100, 0)
    for t in tasks[:: max(1, len(tasks) // 3)][:3]:
        outcome = domain.check(t, gold_as_edit_blocks(domain.swe_task(t)), truncated=False)
        assert outcome.success and "format_ok" in outcome.flags, (t.task_id, outcome)


def _noop(task) -> str:
    (path, text), = repos.buggy_files(task).items()
    return make_patch({path: (text, text + "# touched\n")})


def _check(task, grader) -> None:
    buggy = repos.buggy_task(task)
    gold = grader.grade(buggy, task.patch)
    assert gold.outcome.success, f"{task.instance_id}: gold {gold.outcome}\n{gold.log[-2000:]}"
    empty = grader.grade(buggy, "")
    assert not empty.outcome.success and empty.outcome.kind == "empty"
    noop = grader.grade(buggy, _noop(task))
    assert not noop.outcome.success and noop.outcome.kind == "wrong", f"{task.instance_id}: {noop.outcome}"
    assert all(noop.per_test[t] != "passed" for t in task.FAIL_TO_PASS)


def test_gold_resolves_and_empty_does_not_sample(pack, grader):
    """One task per library (the first of each file)."""
    seen = set()
    for t in pack:
        if _library(t) not in seen:
            seen.add(_library(t))
            _check(t, grader)


@pytest.mark.slow
def test_gold_resolves_and_empty_does_not_all(pack, grader):
    failures = []
    for t in pack:
        try:
            _check(t, grader)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_gold_written_as_edit_blocks_resolves_all(pack):
    domain = SweDomain(source="pack")
    failures = []
    for t in domain.tasks("train", 100, 0) + domain.tasks("heldout", 100, 0):
        outcome = domain.check(t, gold_as_edit_blocks(domain.swe_task(t)), truncated=False)
        if not outcome.success:
            failures.append(f"{t.task_id}: {outcome}")
    assert not failures, "\n".join(failures)
