"""The warm grading path (evotrainer/sandbox/warm.py, zygote.py) against attacks of its own: one
zygote serves many grades, so whatever a grade does must be gone by the next one. Each attack is
graded, then the same grader (the same zygote) grades a wrong patch and the gold patch: their
verdicts must be what a fresh grader gives, and nothing of the attack may be left running.

The general reward hacks (forged reports, conftest, hidden tests, resource bombs, ...) are in
test_grader_redteam.py, which runs every attack on both paths.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from evotrainer.grade import Grader, make_patch
from evotrainer.sandbox import warm
from evotrainer.sandbox.processes import MIN_SANDBOX_UID, _proc_stats
from tests.test_grader_redteam import CALC, F2P, FIXED, P2P, task  # noqa: F401 -- `task` is a fixture

pytestmark = pytest.mark.skipif(not warm.warm_available(), reason="no fresh uids with mount and pid namespaces here")
TIMEOUT = 20.0


@pytest.fixture
def grader():
    return Grader(timeout_s=TIMEOUT, cache=None, warm=True)


def calc_patch(new_calc: str) -> str:
    return make_patch({"calc.py": (CALC, new_calc)})


def uid_of(result) -> int:
    found = re.search(r"'uid': (\d+)", result.log)
    assert found and int(found.group(1)) >= MIN_SANDBOX_UID, result.log
    return int(found.group(1))


def alive(uid: int) -> list[int]:
    return [s.pid for s in _proc_stats() if s.st_uid == uid]


def zygotes() -> int:
    return sum(len(ws) for ws in warm._idle.values())


def next_grades_are_clean(grader, task):  # noqa: F811
    """A wrong patch and then the gold patch, on the same (warm) grader: the verdicts a fresh
    process gives, from the same zygote as the attack (none was restarted)."""
    before = zygotes()
    wrong = grader.grade(task, calc_patch(CALC + "# looked at it\n"))
    assert wrong.outcome.kind == "wrong" and not wrong.outcome.success, wrong.log
    assert wrong.per_test == {F2P[0]: "failed", F2P[1]: "failed", P2P[0]: "passed"}, wrong.log
    assert "report_mismatch" not in wrong.outcome.flags
    gold = grader.grade(task, task.patch)
    assert gold.outcome.success and gold.outcome.kind == "ok", gold.log
    assert "'warm': True" in gold.log
    assert zygotes() == before


def test_the_warm_path_is_the_default_and_matches_the_cold_one(grader, task):  # noqa: F811
    assert Grader(cache=None).warm
    cold = Grader(timeout_s=TIMEOUT, cache=None, warm=False)
    for patch in (task.patch, calc_patch(CALC + "# looked at it\n"), calc_patch("def add(a, b)\n")):
        w, c = grader.grade(task, patch), cold.grade(task, patch)
        assert "'warm': True" in w.log and "'warm': True" not in c.log
        assert (w.outcome, w.per_test) == (c.outcome, c.per_test), (w.log, c.log)


def test_fallback_knob(task, monkeypatch):  # noqa: F811
    monkeypatch.setenv("EVOTRAINER_GRADER_WARM", "0")
    result = Grader(timeout_s=TIMEOUT, cache=None).grade(task, task.patch)
    assert result.outcome.success and "'warm': True" not in result.log


LINGER = '''import os, threading, time

def _linger():
    while True:
        try:
            for path in ("calc.py", "tests/test_calc.py"):
                with open(path, "a") as f:
                    f.write("\\n")
        except OSError:
            pass
        time.sleep(0.05)

def add(a, b):
    threading.Thread(target=_linger, daemon=True).start()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            _linger()
        os._exit(0)
    return a - b
'''


def test_background_thread_and_forked_grandchild_die_with_their_grade(grader, task):  # noqa: F811
    """A daemon thread and a double-forked, setsid grandchild that keep writing into the repo."""
    result = grader.grade(task, calc_patch(LINGER + CALC.split("\n\n\n", 1)[1]))
    assert not result.outcome.success
    assert alive(uid_of(result)) == []
    next_grades_are_clean(grader, task)


POISON = '''import importlib, json, re, sys
_r = importlib.import_module("_py" + "test.reports")
_orig = _r.TestReport.from_item_and_call
def _forge(item, call):
    rep = _orig(item, call)
    rep.outcome = "passed"
    rep.longrepr = None
    return rep
_r.TestReport.from_item_and_call = staticmethod(_forge)
for _name, _mod in list(sys.modules.items()):
    if _name.startswith("evo" + "_guard"):
        for _hook in [h for h in vars(_mod) if h.startswith("py" + "test_")]:
            setattr(_mod, _hook, lambda *a, **k: None)
json.dumps = lambda *a, **k: "{}"
re.compile = lambda *a, **k: None
importlib.import_module("_py" + "test." + "ju" + "nitxml").LogXML.pytest_sessionfinish = lambda self: None
'''


def test_poisoning_pytest_the_guard_and_preloaded_modules_stays_in_its_grade(grader, task):  # noqa: F811
    """pytest's report class, our guard plugin's hooks, the junit writer and standard library
    modules the zygote imported, all patched at import: that grade is not trusted, and the next
    one runs on the zygote's untouched copies."""
    result = grader.grade(task, calc_patch(POISON + FIXED))
    assert not result.outcome.success and result.outcome.score == 0.0, result.log
    next_grades_are_clean(grader, task)


def test_killing_everything_it_can_signal(grader, task):  # noqa: F811
    """kill(-1): every process the grade's uid may signal. The zygote (root) and other grades
    (other uids) are not among them."""
    result = grader.grade(task, calc_patch("import os, signal\n" + CALC.replace(
        "    return a - b", "    os.kill(-1, signal.SIGKILL)\n    return a + b", 1)))
    assert not result.outcome.success
    next_grades_are_clean(grader, task)


def test_writes_into_the_repo_path_and_the_temp_folders_are_gone_next_grade(grader, task):  # noqa: F811
    """Every grade sees its copy at the same path (compiled code is shared): what one grade
    writes there, or in /tmp, /var/tmp, /dev/shm and its cwd's __pycache__, must not reach the next."""
    plant = ('import os\n_here = os.path.dirname(os.path.abspath(__file__))\n'
             'for _p in (os.path.join(_here, "calc_helper.py"), "/tmp/evo-planted", "/dev/shm/evo-planted"):\n'
             '    try:\n        open(_p, "w").write("PLANTED = 1\\n")\n    except OSError:\n        pass\n'
             'os.makedirs(os.path.join(_here, "__pycache__"), exist_ok=True)\n'
             'open(os.path.join(_here, "__pycache__", "calc.cpython-311.pyc"), "wb").write(b"x")\n')
    first = grader.grade(task, calc_patch(plant + CALC))
    assert first.outcome.kind == "wrong", first.log
    probe = ('import os\n_here = os.path.dirname(os.path.abspath(__file__))\n'
             '_seen = [p for p in (os.path.join(_here, "calc_helper.py"), "/tmp/evo-planted", "/dev/shm/evo-planted",\n'
             '         os.path.join(_here, "__pycache__")) if os.path.exists(p)]\n'
             'def add(a, b):\n    return a + b if not _seen else a - b\n\n\n' + CALC.split("\n\n\n", 1)[1])
    second = grader.grade(task, calc_patch(probe))
    assert second.outcome.success, second.log  # nothing the first grade planted was there
    next_grades_are_clean(grader, task)


def test_a_hung_zygote_is_replaced(grader, task):  # noqa: F811
    """Stop the zygote outright (as the machine's OOM killer might): the grade is retried on a
    fresh one and the verdict is still right."""
    grader.grade(task, task.patch)
    [worker] = [w for ws in warm._idle.values() for w in ws if w.alive][:1]
    os.kill(worker.proc.pid, 9)
    worker.proc.wait()
    start = time.monotonic()
    result = grader.grade(task, task.patch)
    assert result.outcome.success, result.log
    assert time.monotonic() - start < TIMEOUT


def test_timeout_kills_a_thread_that_ignores_everything(task):  # noqa: F811
    """A busy loop in a thread, with the main thread waiting on it: only the pid namespace's
    end stops it. The next grade on the same zygote is on time and right."""
    grader = Grader(timeout_s=4, cache=None, warm=True)
    spin = ("import threading\n\n\ndef _spin():\n    while True:\n        pass\n\n\n"
            + CALC.replace("    return a - b", "    t = threading.Thread(target=_spin)\n    t.start()\n    t.join()", 1))
    start = time.monotonic()
    result = grader.grade(task, calc_patch(spin))
    assert result.outcome.kind == "timeout" and time.monotonic() - start < 15, result.log
    assert alive(uid_of(result)) == []
    gold = grader.grade(task, task.patch)
    assert gold.outcome.success, gold.log


OTHER = "def mul(a, b):\n    return a * b\n"
OTHER_TESTS = "from other import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
DIG = '''import sys

def _found():
    for value in list(vars(sys.modules["__main__"]).values()):
        if isinstance(value, dict):
            for key, code in list(value.items()):
                if isinstance(key, tuple) and str(key[0]).endswith("calc.py"):
                    space = {}
                    try:
                        exec(code, space)
                        if space["add"](2, 3) == 5:
                            return space["add"]
                    except Exception:
                        pass
    return None

_add = _found()

def add(a, b):
    return _add(a, b) if _add else a - b
'''


def test_no_run_finds_another_tasks_code_in_the_worker(grader, tmp_path):
    """Two tasks on one clean snapshot: B's bug is in other.py, so B's files hold calc.py as it
    should be, which is A's fix. After B is graded on the same warm worker, A's run looks for
    compiled calc.py code in the zygote's memory (its __main__ module's tables) and uses it."""
    from evotrainer.grade import load_tasks

    clean = tmp_path / "snap"
    (clean / "tests").mkdir(parents=True)
    (clean / "calc.py").write_text(FIXED)
    (clean / "other.py").write_text(OTHER)
    (clean / "tests" / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (clean / "tests" / "test_other.py").write_text(OTHER_TESTS)
    broken = OTHER.replace("a * b", "a + b")
    rows = [{"instance_id": "a", "repo": "snap", "base_commit": "s", "patch": make_patch({"calc.py": (CALC, FIXED)}),
             "bug_patch": make_patch({"calc.py": (FIXED, CALC)}), "test_patch": "",
             "FAIL_TO_PASS": ["tests/test_calc.py::test_add"], "PASS_TO_PASS": [], "problem_statement": "a", "level": 0},
            {"instance_id": "b", "repo": "snap", "base_commit": "s", "patch": make_patch({"other.py": (broken, OTHER)}),
             "bug_patch": make_patch({"other.py": (OTHER, broken)}), "test_patch": "",
             "FAIL_TO_PASS": ["tests/test_other.py::test_mul"], "PASS_TO_PASS": ["tests/test_calc.py::test_add"],
             "problem_statement": "b", "level": 0}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task_a, task_b = load_tasks(tmp_path / "tasks.jsonl")
    assert grader.grade(task_b, task_b.patch).outcome.success  # B's worker compiled the clean calc.py
    result = grader.grade(task_a, make_patch({"calc.py": (CALC, DIG + "\n\ndef sub(a, b):\n    return a - b\n")}))
    assert "'warm': True" in result.log
    assert not result.outcome.success and result.per_test["tests/test_calc.py::test_add"] == "failed", result.log
