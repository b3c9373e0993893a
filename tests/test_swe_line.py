"""The `line` scaffold: parse the fenced fix, replace the named line, grade it in the sandbox; and
the seed swe PROMPT's instructions for it."""

from __future__ import annotations

import json

import pytest

from evotrainer.domains.swe import SweDomain
from evotrainer.harness import load_harness
from evotrainer.paths import HARNESSES_DIR
from evotrainer.scaffold.line import MAX_LINES, LineFormatError, parse_line_answer, replace_line
from tests.clamp_task import BUGGY, clamp_repo, clamp_row

pytestmark = pytest.mark.usefixtures("isolated_swe_cache")


@pytest.fixture(scope="module")
def domain(tmp_path_factory):
    root = clamp_repo(tmp_path_factory.mktemp("line") / "repo")
    path = root.parent / "tasks.jsonl"
    path.write_text(json.dumps(clamp_row(root)) + "\n")
    return SweDomain(levels=(0,), source=str(path), heldout_fraction=0.5, scaffold="line")


def _task(domain):
    return (domain.tasks("train", 5, 0) + domain.tasks("heldout", 5, 0))[0]


def test_parse_line_answer():
    assert parse_line_answer("Here:\n```python\n    if x > hi:\n```\nDone.") == ["if x > hi:"]
    assert parse_line_answer("```\nif a:\n    b()\n\n```") == ["if a:", "    b()"]
    assert parse_line_answer("```py\n```") == []  # an empty block deletes the line
    assert parse_line_answer("```python\nif x > hi:") == ["if x > hi:"]  # an unclosed block at the end
    with pytest.raises(LineFormatError):
        parse_line_answer("if x > hi:")
    with pytest.raises(LineFormatError):
        parse_line_answer("```\n" + "x = 1\n" * (MAX_LINES + 1) + "```")


def test_replace_line_keeps_the_indentation_and_the_rest():
    text = "def f(x):\n    if x:\n        return 1\n    return 2\n"
    assert replace_line(text, 2, ["if not x:"]) == text.replace("if x:", "if not x:")
    assert replace_line(text, 4, ["y = 2", "return y"]) == text.replace("    return 2\n", "    y = 2\n    return y\n")
    assert replace_line(text, 3, []) == "def f(x):\n    if x:\n    return 2\n"
    with pytest.raises(ValueError):
        replace_line(text, 9, ["x"])


def test_line_prompt_names_the_buggy_line(domain):
    t = _task(domain)
    assert t.meta["path"] == "shapes.py" and t.meta["line"] == 4
    assert "The bug is on line 4:" in t.prompt and "if x >= hi + 1:" in t.prompt
    assert "clamp(10.5, 0, 10) returns 10.5" in t.prompt
    assert BUGGY.splitlines()[1] in t.prompt  # the lines around it


def test_line_check_outcomes(domain):
    t = _task(domain)
    ok, meta = domain.check_meta(t, "The fix:\n```python\nif x > hi:\n```", False)
    assert ok.success and ok.kind == "ok" and "format_ok" in ok.flags and "f2p_all" in ok.flags
    assert meta["per_test"]["test_shapes.py::test_high"] == "passed"
    assert domain.check(t, "```python\n        if x > hi:\n```", False).success  # dedented, re-indented
    wrong = domain.check(t, "```python\nif x > hi + 5:\n```", False)
    assert wrong.kind == "wrong" and not wrong.success
    assert domain.check(t, "if x > hi:", False).kind == "format_error"
    assert domain.check(t, "I would rewrite", True).kind == "truncated"
    same = domain.check(t, "```python\nif x >= hi + 1:\n```", False)
    assert same.kind == "empty" and "no_change" in same.flags
    assert domain.check(t, "", False).kind == "empty"
    broken = domain.check(t, "```python\nif x > hi\n```", False)  # a syntax error fails the tests
    assert not broken.success


@pytest.mark.parametrize("attack", [
    "import os; os._exit(0)",  # end the test process with success before any test reports
    "import sys; sys.exit(0)",
    "return hi if x > hi else x",  # orphans the old body under it: the module no longer imports
])
def test_line_answers_that_game_the_run_do_not_pass(domain, attack):
    outcome = domain.check(_task(domain), f"```python\n{attack}\n```", False)
    assert not outcome.success, outcome


def test_seed_prompt_follows_the_scaffold(tmp_path):
    harness = load_harness(HARNESSES_DIR / "swe")
    line = harness.render_prompt("Q", scaffold="line")
    assert "```python code block" in line and "SEARCH" not in line
    edit = harness.render_prompt("Q", scaffold="edit")
    assert "<<<<<<< SEARCH" in edit
    assert harness.render_prompt("Q") == edit  # a caller that passes no scaffold gets the edit form
