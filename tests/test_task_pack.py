"""The bundled SWE task pack: well-formed, small, licensed, and graded right by the real grader.

The pack holds task files and the pins of its libraries' sdists, never their code: the `pack`
fixture fetches the sources (pip, once per machine; a no-op when cached in EVOTRAINER_HOME).
For every task the gold patch must resolve and the empty patch must not; a patch that only adds a
comment must not either (so the bug really fails its tests). The grader gets the task as loaded
(clean snapshot + bug_patch) and builds the buggy state itself. The fast run grades one task per
library; the slow run grades them all.
"""

from __future__ import annotations

import time

import pytest

from evotrainer.domains.swe import SweDomain, edit_prompt, focus
from evotrainer.grade import Grader, apply_patch, make_patch
from evotrainer.tasks import PACK_DIR, load_pack, pack_files, repos, sources

LIBRARIES = {"more-itertools", "toolz", "inflection"}


pytestmark = pytest.mark.usefixtures("isolated_swe_cache")


@pytest.fixture(scope="module")
def pack():
    sources.fetch(PACK_DIR)  # pip-downloads what is not cached yet; FetchError says what to do offline
    return load_pack()


@pytest.fixture(scope="module")
def grader():
    return Grader(cache=None)


def _library(task) -> str:
    return task.instance_id.rsplit("-", 1)[0]


def test_pack_shape(pack):
    assert {f.stem for f in pack_files()} == LIBRARIES
    assert 34 <= len(pack) <= 40
    assert {_library(t) for t in pack} == LIBRARIES
    assert {t.level for t in pack} == {0, 1, 2}
    for lib in LIBRARIES:  # every library spreads its tasks over the levels
        levels = [t.level for t in pack if _library(t) == lib]
        assert max(levels.count(lv) for lv in (0, 1, 2)) - min(levels.count(lv) for lv in (0, 1, 2)) <= 1, lib
    assert len({t.instance_id for t in pack}) == len(pack)
    assert len({t.patch for t in pack}) == len(pack)  # no duplicate bugs
    assert (PACK_DIR / "README.md").is_file()


def test_pack_holds_no_third_party_code():
    """Task files, the sdist pins and the README: nothing else (the libraries' code is fetched)."""
    assert sorted(p.name for p in PACK_DIR.iterdir() if p.name != "__pycache__") == sorted(
        [f"{lib}.jsonl" for lib in LIBRARIES] + ["README.md", sources.MANIFEST])
    size = sum(p.stat().st_size for p in PACK_DIR.iterdir() if p.is_file())
    assert size < 2**20, f"pack is {size / 2**20:.1f} MiB"
    pins = sources.load_sources(PACK_DIR)
    assert {s.name for s in pins} == LIBRARIES and {s.tasks for s in pins} == {f"{lib}.jsonl" for lib in LIBRARIES}
    readme = (PACK_DIR / "README.md").read_text()
    for s in pins:
        assert s.requirement in readme and s.license in readme and s.sha256 in readme


def test_every_snapshot_is_the_pinned_sdist_with_its_license(pack):
    pins = {s.snapshot_name: s for s in sources.load_sources(PACK_DIR)}
    store = sources.snapshot_store()
    for root in {t.root for t in pack}:
        assert root.parent == store.resolve() and root.name in pins, root
        assert repos.content_hash(root) == pins[root.name].content_hash
        assert any(p.name.startswith("LICENSE") for p in root.iterdir()), root
        assert not any(p.name in (".git", "__pycache__") for p in root.rglob("*")), root
    for t in pack:  # graded code never sees the store (clean code: every task's fix)
        assert sources.swe_cache() in t.hide and t.task_file is not None
        assert t.repo == t.root.name and t.base_commit == f"snapshot-{pins[t.repo].content_hash}"


def test_bug_and_gold_patches_are_inverse(pack):
    for t in pack:
        buggy = repos.buggy_files(t)
        assert len(buggy) == 1, t.instance_id
        (path, text), = buggy.items()
        clean = (t.root / path).read_text(encoding="utf-8")
        assert text != clean
        assert apply_patch(t.root, t.patch, read=lambda rel, buggy=buggy: buggy.get(rel))[path] == clean
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        for test in t.tests:
            assert (t.root / test.split("::", 1)[0]).is_file(), test


def test_unfetched_pack_names_the_fetch_command(monkeypatch, tmp_path):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(sources.PackNotFetched, match="evotrainer tasks fetch"):
        load_pack()
    with pytest.raises(ValueError, match="evotrainer tasks fetch"):
        SweDomain(source="pack")


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
    gold = grader.grade(task, task.patch)  # clean snapshot + bug_patch: the grader builds the buggy state
    assert gold.outcome.success, f"{task.instance_id}: gold {gold.outcome}\n{gold.log[-2000:]}"
    empty = grader.grade(task, "")
    assert not empty.outcome.success and empty.outcome.kind == "empty"
    noop = grader.grade(task, _noop(task))
    assert not noop.outcome.success and noop.outcome.kind == "wrong", f"{task.instance_id}: {noop.outcome}"
    assert all(noop.per_test[t] != "passed" for t in task.FAIL_TO_PASS)


def test_gold_resolves_and_empty_does_not_sample(pack, grader):
    """One task per library (the first of each file)."""
    seen = set()
    for t in pack:
        if _library(t) not in seen:
            seen.add(_library(t))
            _check(t, grader)


def test_buggy_task_cache_matches_what_the_grader_builds(pack, grader):
    """The thin materialized cache (for the agent scaffold) is graded the same as the task itself."""
    t = pack[0]
    buggy = repos.buggy_task(t)
    assert buggy.bug_patch == "" and t.root.resolve() in buggy.hide
    assert grader.grade(buggy, t.patch).outcome.success
    assert not grader.grade(buggy, _noop(t)).outcome.success


@pytest.mark.slow
def test_gold_resolves_and_empty_does_not_all(pack, grader):
    failures = []
    start = time.monotonic()
    for t in pack:
        try:
            _check(t, grader)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    print(f"\n{len(pack) - len(failures)}/{len(pack)} gold resolve, 0 empty/no-op resolve; "
          f"{time.monotonic() - start:.1f}s for {3 * len(pack)} grades")
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


def _paths_agree(task, warm: Grader, cold: Grader) -> list[str]:
    """Gold, a comment-only patch and a wrong line-scaffold answer, graded on both paths: the
    same outcome and per-test statuses; and gold resolves, the others do not, on the warm path."""
    from evotrainer.scaffold.line import replace_line

    path, line = focus(task)
    buggy = repos.read_buggy(task, path)
    wrong_line = make_patch({path: (buggy, replace_line(buggy, line, [buggy.splitlines()[line - 1].strip() + "  # ok"]))})
    problems = []
    for name, patch in (("gold", task.patch), ("noop", _noop(task)), ("wrong line", wrong_line)):
        w, c = warm.grade(task, patch), cold.grade(task, patch)
        if "'warm': True" not in w.log:
            problems.append(f"{task.instance_id} {name}: not graded on the warm path")
        if (w.outcome, w.per_test) != (c.outcome, c.per_test):
            problems.append(f"{task.instance_id} {name}: warm {w.outcome} != cold {c.outcome}")
        if w.outcome.success != (name == "gold"):
            problems.append(f"{task.instance_id} {name}: {w.outcome}")
    return problems


def _warm_and_cold():
    from evotrainer.sandbox.warm import warm_available

    if not warm_available():
        pytest.skip("the warm path needs fresh uids with mount and pid namespaces")
    return Grader(cache=None, warm=True), Grader(cache=None, warm=False)


def test_warm_and_cold_paths_agree_sample(pack):
    """One task per library: the warm grading path gives the cold one's verdicts."""
    warm, cold = _warm_and_cold()
    seen, problems = set(), []
    for t in pack:
        if _library(t) not in seen:
            seen.add(_library(t))
            problems += _paths_agree(t, warm, cold)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_warm_and_cold_paths_agree_all(pack):
    """Every bundled task: gold resolves and the bug fails on the warm path, with the verdicts
    (outcome, flags, score, per-test statuses) of the cold path."""
    warm, cold = _warm_and_cold()
    problems = [p for t in pack for p in _paths_agree(t, warm, cold)]
    assert not problems, "\n".join(problems)
