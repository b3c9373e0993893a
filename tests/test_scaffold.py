"""The policy scaffolds: SEARCH/REPLACE parsing and diffs (edit), and the multi-turn tool loop
(agent) driven by a scripted policy, both graded by the real grader on a real tiny repo."""

from __future__ import annotations

import json

import pytest

from evotrainer.api import Turn
from evotrainer.domains.swe import SweDomain, check_edit
from evotrainer.grade import apply_patch, make_patch, task_from_dict
from evotrainer.scaffold.agent import FormatError, ScriptedPolicy, parse_action, run_agent, to_rollout
from evotrainer.scaffold.edit import Edit, EditApplyError, EditFormatError, apply_edit, edits_to_patch, parse_edits
from tests.clamp_task import BUGGY, CLEAN, FIX, TESTS, clamp_repo, clamp_row  # noqa: F401
from tests.test_grader_redteam import visible_dir  # noqa: F401 -- a folder the sandbox can see

pytestmark = pytest.mark.usefixtures("isolated_swe_cache")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = clamp_repo(tmp_path_factory.mktemp("scaffold") / "repo")
    row = clamp_row(root)
    path = root.parent / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return task_from_dict(row, base=root.parent), path


# ---------------------------------------------------------------- parse_edits


def test_parse_edits_reads_blocks_with_paths_fences_and_prose():
    text = ("Here is the fix:\n```python\nshapes.py\n<<<<<<< SEARCH\n    if x >= hi + 1:\n=======\n"
            "    if x > hi:\n>>>>>>> REPLACE\n```\nand a second one\n\n**pkg/b.py**\n<<<<<<< SEARCH\na\n=======\n"
            ">>>>>>> REPLACE\n")
    edits = parse_edits(text)
    assert edits == [Edit("shapes.py", "    if x >= hi + 1:\n", "    if x > hi:\n"), Edit("pkg/b.py", "a\n", "")]


def test_parse_edits_default_path_and_errors():
    assert parse_edits("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE", default_path="m.py")[0].path == "m.py"
    for bad, why in [("just prose", "no SEARCH/REPLACE block"),
                     ("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE", "without a file path"),
                     ("f.py\n<<<<<<< SEARCH\na\n>>>>>>> REPLACE", "expected '======='"),
                     ("f.py\n<<<<<<< SEARCH\na\n=======\nb\n", "never reaches '>>>>>>> REPLACE'"),
                     ("f.py\n<<<<<<< SEARCH\na\nb", "never reaches '======='")]:
        with pytest.raises(EditFormatError, match=why):
            parse_edits(bad)


def test_apply_edit_fuzzy_whitespace_and_indentation():
    src = "def f():\n    x = 1   \n    return x\n"
    assert apply_edit(src, Edit("f.py", "    x = 1\n", "    x = 2\n")) == "def f():\n    x = 2\n    return x\n"
    assert apply_edit(src, Edit("f.py", "x = 1\nreturn x\n", "x = 3\nreturn x + 1\n")) == \
        "def f():\n    x = 3\n    return x + 1\n"
    twice = "a = 1\nb = 2\na = 1\n"
    assert apply_edit(twice, Edit("f.py", "a = 1\n", "a = 9\n")) == "a = 9\nb = 2\na = 1\n"
    assert apply_edit(twice, Edit("f.py", "a = 1\n", "a = 9\n"), near=3) == "a = 1\nb = 2\na = 9\n"
    with pytest.raises(EditApplyError) as err:
        apply_edit(src, Edit("f.py", "y = 1\n", "y = 2\n"))
    assert err.value.reason == "search_not_found"


def test_edits_to_patch_is_a_diff_the_grader_applies(task):
    swe, _ = task
    buggy = {"shapes.py": BUGGY}
    patch = edits_to_patch(buggy, parse_edits(FIX))
    assert patch.startswith("diff --git a/shapes.py b/shapes.py")
    assert apply_patch(swe.root, patch, read=buggy.get) == {"shapes.py": CLEAN}
    assert edits_to_patch(buggy, [Edit("shapes.py", "        return lo\n", "        return lo\n")]) == ""
    new = edits_to_patch(buggy, [Edit("notes/new.py", "", "X = 1\n")])
    assert apply_patch(swe.root, new, read=buggy.get) == {"notes/new.py": "X = 1\n"}
    with pytest.raises(EditApplyError) as err:
        edits_to_patch(buggy, [Edit("../outside.py", "", "x")])
    assert err.value.reason == "unsafe_path"


def test_edit_check_outcomes(task):
    swe, _ = task
    ok = check_edit(swe, FIX, truncated=False, path="shapes.py")
    assert ok.success and ok.kind == "ok" and "format_ok" in ok.flags and "f2p_all" in ok.flags
    assert check_edit(swe, "", False, "shapes.py").kind == "empty"
    assert check_edit(swe, "I think the bug is in clamp.", False, "shapes.py").kind == "format_error"
    assert check_edit(swe, "shapes.py\n<<<<<<< SEARCH\n    if x", True, "shapes.py").kind == "truncated"
    missing = check_edit(swe, FIX.replace("hi + 1", "hi + 2"), False, "shapes.py")
    assert missing.kind == "patch_failed" and "search_not_found" in missing.flags
    same = check_edit(swe, FIX.replace("    if x > hi:\n>>>", "    if x >= hi + 1:\n>>>"), False, "shapes.py")
    assert same.kind == "empty" and "no_change" in same.flags
    wrong = check_edit(swe, FIX.replace("if x > hi:", "if x > hi + 5:"), False, "shapes.py")
    assert wrong.kind == "wrong" and not wrong.success and "f2p_all" not in wrong.flags
    tamper = check_edit(swe, "test_shapes.py\n<<<<<<< SEARCH\n    assert clamp(10.5, 0, 10) == 10\n=======\n"
                        "    assert True\n>>>>>>> REPLACE\n", False, "shapes.py")
    assert not tamper.success and tamper.kind == "tampering"
    escape = check_edit(swe, "../x.py\n<<<<<<< SEARCH\n=======\nx = 1\n>>>>>>> REPLACE\n", False, "shapes.py")
    assert escape.kind == "patch_failed" and "tampering" in escape.flags


def test_swe_domain_on_a_task_file(task):
    _, path = task
    domain = SweDomain(levels=(0,), source=str(path), heldout_fraction=0.5)
    both = domain.tasks("train", 5, 0) + domain.tasks("heldout", 5, 0)
    assert [t.task_id for t in both] == ["shapes-1"]
    t = both[0]
    assert "clamp(10.5, 0, 10) returns 10.5" in t.prompt and "if x >= hi + 1:" in t.prompt
    assert t.meta["path"] == "shapes.py" and t.answer.startswith("diff --git")
    assert domain.check(t, FIX, False).success
    assert domain.check(t, "nonsense", False).kind == "format_error"
    # The trusted check also gives the grader's per-test results, which the recorder stores.
    outcome, meta = domain.check_meta(t, FIX.replace("if x > hi:", "if x > hi + 5:"), False)
    assert outcome.kind == "wrong"
    assert meta == {"per_test": {"test_shapes.py::test_high": "failed", "test_shapes.py::test_low": "passed"}}
    assert domain.check_meta(t, "nonsense", False)[1] == {}


# ---------------------------------------------------------------- the agent scaffold


def test_parse_action():
    assert parse_action('```json\n{"tool": "view", "path": "a.py"}\n```').tool == "view"
    assert parse_action('ok {"tool": "submit"}').tool == "submit"
    assert parse_action(FIX).args["edits"][0].path == "shapes.py"
    for bad in ("no action here", '{"tool": "rm -rf"}', '{"tool": "view"} {"tool": "submit"}'):
        with pytest.raises(FormatError):
            parse_action(bad)


def test_agent_reaches_submitted_and_resolves(task):
    swe, _ = task
    policy = ScriptedPolicy([
        '{"tool": "search", "pattern": "def clamp"}',
        '{"tool": "view", "path": "shapes.py", "start": 1, "end": 6}',
        FIX,
        '{"tool": "run_tests", "tests": ["test_shapes.py"]}',
        '{"tool": "submit"}',
    ])
    result = run_agent(swe, policy, max_steps=8)
    assert result.exit_status == "submitted" and result.steps == 5
    assert result.outcome.success and "submitted" in result.outcome.flags
    assert result.patch == make_patch({"shapes.py": (BUGGY, CLEAN)})
    roles = [t.role for t in result.turns]
    assert roles[:2] == ["system", "user"] and roles.count("assistant") == 5
    observations = [t.content for t in result.turns[3::2]]
    assert "shapes.py:1: def clamp" in observations[0]
    assert "if x >= hi + 1:" in observations[1]  # the working copy starts at the buggy state
    assert "2 passed" in observations[3]
    rollout = to_rollout(swe, result)
    assert rollout.outcome.success and rollout.meta["exit_status"] == "submitted" and not rollout.truncated
    assert rollout.meta["per_test"] == {"test_shapes.py::test_high": "passed", "test_shapes.py::test_low": "passed"}


def test_agent_terminal_states(task):
    swe, _ = task
    looping = run_agent(swe, ScriptedPolicy(['{"tool": "view", "path": "shapes.py"}']), max_steps=3)
    assert looping.exit_status == "step_limit" and looping.steps == 3
    assert looping.outcome.kind == "truncated" and "step_limit" in looping.outcome.flags
    chatty = run_agent(swe, ScriptedPolicy(["Let me think about it."]), max_steps=10, max_format_errors=2)
    assert chatty.exit_status == "format_error" and chatty.outcome.kind == "format_error" and chatty.steps == 2
    empty = run_agent(swe, ScriptedPolicy(['{"tool": "view", "path": "/etc/passwd"}', '{"tool": "submit"}']))
    assert empty.exit_status == "submitted" and empty.outcome.kind == "empty"
    assert "not a relative path" in empty.turns[3].content
    stopped = run_agent(swe, ScriptedPolicy(['{"tool": "view", "path": "nope.py"}']), max_steps=10,
                        stop=lambda turns: "two errors" if sum("Error" in t.content for t in turns) >= 2 else None)
    assert stopped.exit_status == "stopped" and stopped.reason == "two errors" and stopped.steps == 2
    slow = run_agent(swe, ScriptedPolicy(['{"tool": "view", "path": "shapes.py"}']), time_limit_s=0.0)
    assert slow.exit_status == "timeout" and slow.outcome.kind == "timeout"
    assert all(isinstance(t, Turn) for t in slow.turns)


def test_agent_test_runs_cannot_read_the_tasks_hidden_paths(task, visible_dir, monkeypatch):  # noqa: F811
    """task.hide (the snapshot store, other tasks' states: they hold this task's fix) is hidden from
    the agent's own test runs, as from the grader. The runs now have a root of their own, which holds
    none of those paths, so the hide list is checked in the sandbox as it was before the root
    (`without_the_root`), where the same probe reads the file when it is not hidden (the control);
    with the root it reads nothing even when task.hide leaves the file out."""
    from dataclasses import replace

    import evotrainer.scaffold.agent as agent

    swe, _ = task
    secret = visible_dir / "fix.txt"
    secret.write_text("THE-FIX")
    secret.chmod(0o644)
    probe = ("shapes.py\n<<<<<<< SEARCH\ndef clamp(x, lo, hi):\n=======\nimport os\n"
             f"_S = open({str(secret)!r}).read() if os.path.exists({str(secret)!r}) else 'none'\n"
             "assert _S == 'none', 'PEEK ' + _S\n\n\ndef clamp(x, lo, hi):\n>>>>>>> REPLACE\n")
    script = [probe, '{"tool": "run_tests", "tests": ["test_shapes.py"]}', '{"tool": "submit"}']
    rooted = run_agent(swe, ScriptedPolicy(script), max_steps=4)
    assert "PEEK" not in rooted.turns[5].content and "1 failed" in rooted.turns[5].content  # the root alone
    real = agent.run_sandboxed
    with monkeypatch.context() as m:
        m.setattr(agent, "run_sandboxed", lambda cmd, root=None, **kw: real(cmd, **kw))
        seen = run_agent(swe, ScriptedPolicy(script), max_steps=4)
        assert "PEEK THE-FIX" in seen.turns[5].content  # the probe works where nothing hides the file
        hidden = run_agent(replace(swe, hide=(visible_dir,)), ScriptedPolicy(script), max_steps=4)
        assert "PEEK" not in hidden.turns[5].content and "1 failed" in hidden.turns[5].content
