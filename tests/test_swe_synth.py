"""SWE task synthesis on a tiny real repo made here: real AST mutations, real sandboxed pytest runs,
the real grader."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from evotrainer.grade import Grader, apply_patch, load_tasks
from evotrainer.tasks import mutate, repos
from evotrainer.tasks.importer import import_tasks
from evotrainer.tasks.synth import SynthOptions, run_tests, synthesize

CALC = textwrap.dedent('''\
    """A tiny library with a test suite."""


    def clamp(x, lo, hi):
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x


    def total(items):
        s = 0
        for item in items:
            if item is None:
                continue
            s += item
        return s


    def mean(items):
        values = [i for i in items if i is not None]
        return total(values) / len(values)


    def describe(n):
        return "big" if n >= 10 and n % 2 == 0 else "small"
    ''')

TESTS = textwrap.dedent('''\
    from calc import clamp, describe, mean, total


    def test_clamp_low():
        assert clamp(-5, 0, 10) == 0


    def test_clamp_high():
        assert clamp(50, 0, 10) == 10


    def test_clamp_inside():
        assert clamp(5, 0, 10) == 5


    def test_total():
        assert total([1, 2, None, 4]) == 7


    def test_total_empty():
        assert total([]) == 0


    def test_mean():
        assert mean([2, None, 4]) == 3


    def test_describe():
        assert describe(12) == "big"
        assert describe(11) == "small"
        assert describe(3) == "small"
    ''')


pytestmark = pytest.mark.usefixtures("isolated_swe_cache")


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny") / "calc-repo"
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    (root / "LICENSE").write_text("MIT\n")
    (root / ".git").mkdir()  # a stray VCS folder must never reach a snapshot
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


@pytest.fixture(scope="module")
def synthesized(tiny_repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "tasks.jsonl"
    opts = SynthOptions(n=3, seed=0, levels=(0, 1, 2), workers=1, timeout_s=30)
    records = synthesize(tiny_repo, out, opts, snapshot=out.parent / "repos", name="calc")
    return out, records


# ---------------------------------------------------------------- mutations (no sandbox)


def test_every_mutation_kind_is_an_exact_minimal_edit():
    seen = set()
    for m in mutate.mutations("calc/__init__.py", CALC):
        seen.add(m.kind)
        assert m.mutated != m.original
        ast.parse(m.mutated)  # the text edit parses
        changed = [a for a, b in zip(m.original.splitlines(), m.mutated.splitlines()) if a != b]
        assert len(m.original.splitlines()) - len(m.mutated.splitlines()) <= mutate.MAX_DELETED_LINES
        assert len(changed) <= 2 or m.kind in ("remove_assign", "remove_branch", "break_loop")
    assert seen >= {"flip_compare", "flip_arith", "off_by_one", "remove_condition", "remove_branch",
                    "swap_operands", "invert_if", "remove_assign", "break_loop"}


def test_mutation_examples():
    by_desc = {(m.kind, m.description): m for m in mutate.mutations("c.py", CALC)}
    flip = by_desc[("flip_compare", "'<' -> '<='")]
    assert "if x <= lo:" in flip.mutated and flip.function == "clamp"
    brk = by_desc[("break_loop", "`continue` -> `break`")]
    assert "            break\n" in brk.mutated and brk.function == "total"
    cond = [m for (k, d), m in by_desc.items() if k == "remove_condition" and "n % 2 == 0" in d]
    assert cond and 'return "big" if n >= 10 else "small"' in cond[0].mutated


def test_module_level_code_is_never_mutated():
    src = "LIMIT = 3\nif LIMIT > 2:\n    X = LIMIT + 1\n\n\ndef f(a):\n    return a + 1\n"
    assert {m.function for m in mutate.mutations("m.py", src)} == {"f"}


def test_order_is_seeded():
    sites = mutate.sites("c.py", CALC)
    assert mutate.order(sites, 1) == mutate.order(sites, 1)
    assert mutate.order(sites, 1) != mutate.order(sites, 2)
    assert sorted(mutate.order(sites, 1), key=lambda s: s.index) == sites


# ---------------------------------------------------------------- synthesis end to end


def test_synthesis_keeps_tasks_with_swe_bench_fields(synthesized, tiny_repo):
    out, records = synthesized
    assert 1 <= len(records) <= 3
    tasks = load_tasks(out)  # the grader's own loader accepts the file
    assert [t.instance_id for t in tasks] == [r["instance_id"] for r in records]
    for r, t in zip(records, tasks):
        assert set(r) >= {"instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS",
                          "PASS_TO_PASS", "problem_statement", "level", "bug_patch"}
        assert r["FAIL_TO_PASS"] and r["PASS_TO_PASS"]
        assert not set(r["FAIL_TO_PASS"]) & set(r["PASS_TO_PASS"])
        assert r["repo"].startswith("repos/calc-") and not Path(r["repo"]).is_absolute()
        assert not (t.root / ".git").exists() and (t.root / "LICENSE").is_file()
        assert r["level"] in (0, 1, 2)
    assert [r["level"] for r in records] == [0, 1, 2][: len(records)]


def test_problem_statement_levels(synthesized):
    _, records = synthesized
    for r in records:
        text, m = r["problem_statement"], r["mutation"]
        assert r["FAIL_TO_PASS"][0] in text  # every level shows the symptom
        assert ("line" in text and m["path"] in text) == (r["level"] == 0)
        assert (f"`{m['function']}`" in text) == (r["level"] in (0, 1))


def test_fail_to_pass_and_pass_to_pass_are_true(synthesized):
    out, records = synthesized
    for task in load_tasks(out):
        ids = list(task.tests)
        clean = run_tests(task.root, ids, ids, 30)
        assert all(s == "passed" for s in clean.status.values()), clean.log
        buggy = run_tests(task.root, ids, ids, 30, files=repos.buggy_files(task))
        assert all(buggy.status[t] != "passed" for t in task.FAIL_TO_PASS), buggy.status
        assert all(buggy.status[t] == "passed" for t in task.PASS_TO_PASS), buggy.status


def test_gold_resolves_and_empty_does_not(synthesized):
    out, _ = synthesized
    grader = Grader(cache=None)
    for task in load_tasks(out):
        assert task.bug_patch and task.hide == (out.parent.resolve(),)  # the store beside the tasks is hidden
        assert grader.grade(task, task.patch).outcome.success  # the grader applies bug_patch itself
        assert not grader.grade(task, "").outcome.success
        # the bug patch undoes the gold patch: clean + bug + gold == clean
        buggy = repos.buggy_files(task)
        path = next(iter(buggy))
        assert apply_patch(task.root, task.patch, read=buggy.get)[path] == (task.root / path).read_text()
        # the materialized cache is the same buggy state, already at base (no bug_patch left)
        cached = repos.buggy_task(task)
        assert cached.bug_patch == "" and (cached.root / path).read_text() == buggy[path]
        assert grader.grade(cached, task.patch).outcome.success


def test_synthesis_is_deterministic_by_seed(synthesized, tiny_repo, tmp_path):
    _, first = synthesized
    again = synthesize(tiny_repo, tmp_path / "again.jsonl",
                       SynthOptions(n=3, seed=0, levels=(0, 1, 2), verify=False), snapshot=tmp_path / "repos",
                       name="calc")
    strip = [{k: v for k, v in r.items() if k != "repo"} for r in first]
    assert [{k: v for k, v in r.items() if k != "repo"} for r in again] == strip


def test_import_validates_and_rewrites_repo_paths(synthesized, tmp_path):
    out, records = synthesized
    dest = tmp_path / "imported" / "tasks.jsonl"
    tasks = import_tasks(out, dest)
    assert len(tasks) == len(records)
    rows = [json.loads(ln) for ln in dest.read_text().splitlines()]
    assert all(Path(r["repo"]).is_absolute() for r in rows)  # the repos live outside dest's folder
    assert [t.instance_id for t in load_tasks(dest)] == [r["instance_id"] for r in records]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**records[0], "FAIL_TO_PASS": []}) + "\n")
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        import_tasks(bad, tmp_path / "x.jsonl")


def test_tasks_cli_synth_list_and_import(tiny_repo, tmp_path):
    from typer.testing import CliRunner

    from evotrainer.cli.tasks import app

    runner = CliRunner()
    out = tmp_path / "cli" / "tasks.jsonl"
    result = runner.invoke(app, ["synth", "--repo", str(tiny_repo), "--out", str(out), "--n", "1", "--seed", "3",
                                 "--snapshot", str(tmp_path / "cli" / "repos"), "--levels", "1"])
    assert result.exit_code == 0, result.output
    (task,) = load_tasks(out)
    assert task.level == 1 and task.instance_id.startswith("calc-repo-")
    listed = runner.invoke(app, ["list", str(out)])
    assert listed.exit_code == 0 and task.instance_id in listed.output
    imported = runner.invoke(app, ["import", str(out), "--out", str(tmp_path / "cli" / "copy.jsonl")])
    assert imported.exit_code == 0, imported.output
    assert load_tasks(tmp_path / "cli" / "copy.jsonl")[0].repo.startswith("repos/")
    bad = runner.invoke(app, ["synth", "--repo", str(tiny_repo), "--out", str(out), "--levels", "5"])
    assert bad.exit_code != 0
