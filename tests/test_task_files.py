"""The tasks domain (your own JSONL file) and the file sources of math and code: ids kept, nothing
dropped silently, bad input refused with file:line before anything is stored. Real files, the real
math-verify worker, the real sandbox for a user's verifier function."""

from __future__ import annotations

import json
import logging
import platform
import re
import sys
import threading
import time

import pytest

from evotrainer.domains import DomainError, get_domain, resolve
from evotrainer.domains.code import CodeDomain, load_jsonl
from evotrainer.domains.final_answer import final_answer
from evotrainer.domains.math import MathDomain, load_gsm8k
from evotrainer.domains.tasks import TasksDomain
from evotrainer.paths import HARNESSES_DIR


def write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


ROWS = [{"task_id": f"cap/{i:03d}", "prompt": f"Capital number {i}?", "answer": f"City {i}", "level": i % 3}
        for i in range(40)]


@pytest.fixture
def task_file(tmp_path):
    return write(tmp_path / "tasks.jsonl", ROWS)


def task(domain, task_id):
    return next(t for t in domain.all_tasks() if t.task_id == task_id)


# ---------------------------------------------------------------- loading and splitting


def test_ids_are_the_files_own_and_the_split_is_a_hash_of_the_id(task_file, tmp_path):
    d = TasksDomain(source=str(task_file))
    assert sorted(t.task_id for t in d.all_tasks()) == sorted(r["task_id"] for r in ROWS)
    assert {t.split for t in d.all_tasks()} == {"train", "heldout"}
    assert task(d, "cap/007").level == 1 and task(d, "cap/007").meta["line"] == 8
    # File order does not move a task between splits.
    again = TasksDomain(source=str(write(tmp_path / "rev.jsonl", ROWS[::-1])))
    assert {(t.task_id, t.split) for t in again.all_tasks()} == {(t.task_id, t.split) for t in d.all_tasks()}
    train, held = d.tasks("train", 100, 0), d.tasks("heldout", 100, 0)
    assert len(train) + len(held) == 40 and not {t.task_id for t in train} & {t.task_id for t in held}
    assert d.tasks("train", 5, 3) == d.tasks("train", 5, 3) != d.tasks("train", 5, 4)


def test_heldout_source_is_the_heldout_split(task_file, tmp_path):
    test = write(tmp_path / "test.jsonl", [{"task_id": "t1", "prompt": "2+2?", "answer": "4", "meta": {"k": 1}}])
    d = TasksDomain(source=str(task_file), heldout_source=str(test))
    assert [t.task_id for t in d.tasks("heldout", 10, 0)] == ["t1"]
    assert task(d, "t1").meta["k"] == 1
    assert len(d.tasks("train", 100, 0)) == 40


def test_levels_filter_says_how_many_it_left_out(task_file, caplog):
    with caplog.at_level(logging.WARNING):
        d = TasksDomain(source=str(task_file), levels=[0])
    assert d.dropped == 26 and len(d.all_tasks()) == 14
    assert f"tasks: levels [0] keep 14 of 40 tasks of {task_file}; 26 left out" in caplog.text
    assert "domain.levels=null keeps all" in caplog.text
    with pytest.raises(ValueError, match=r"levels \[7\] keep none of the 40"):
        TasksDomain(source=str(task_file), levels=[7])


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    (json.dumps({"prompt": "p", "answer": "a"}), "missing 'task_id'"),
    (json.dumps({"task_id": "", "prompt": "p", "answer": "a"}), "'task_id' must be a non-empty string"),
    (json.dumps({"task_id": "cap/001", "prompt": "p", "answer": "a"}), "'cap/001' is already used at .*tasks.jsonl:2"),
    (json.dumps({"task_id": "x", "prompt": 3, "answer": "a"}), "'prompt' must be a non-empty string, got int"),
    (json.dumps({"task_id": "x", "prompt": "p"}), "'answer' must be a non-empty string"),
    (json.dumps({"task_id": "x", "prompt": "p", "answer": "a", "level": "1"}), "'level' must be an integer, got str"),
    (json.dumps({"task_id": "x", "prompt": "p", "answer": "a", "level": True}), "'level' must be an integer"),
    (json.dumps({"task_id": "x", "prompt": "p", "answer": "a", "meta": []}), "'meta' must be a JSON object"),
    (json.dumps({"task_id": "x", "prompt": "p", "answer": "a", "levle": 1}), "unknown field.*'levle'"),
    (json.dumps({"task_id": "x\u0000y", "prompt": "p", "answer": "a"}), "control character"),
])
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "tasks.jsonl", ROWS[:3] + [line] + ROWS[3:5])
    with pytest.raises(ValueError, match=rf"tasks\.jsonl:4: .*{message}"):
        TasksDomain(source=str(path))


def test_heldout_ids_colliding_with_train_are_refused(task_file, tmp_path):
    test = write(tmp_path / "test.jsonl", [{"task_id": "t1", "prompt": "p", "answer": "a"}, ROWS[5]])
    with pytest.raises(ValueError, match=r"test\.jsonl:2: task_id 'cap/005' is already used at .*tasks\.jsonl:6 "
                                         r"\(domain\.heldout_source must not repeat"):
        TasksDomain(source=str(task_file), heldout_source=str(test))


def test_unknown_verifier_and_missing_file(task_file):
    with pytest.raises(ValueError, match="verifier 'exakt': expected exact, numeric, math, regex"):
        TasksDomain(source=str(task_file), verifier="exakt")
    with pytest.raises(ValueError, match="needs a JSONL task file"):
        TasksDomain()
    with pytest.raises(ValueError, match="domain.source '/no/such.jsonl' is not a file"):
        TasksDomain(source="/no/such.jsonl")


def test_registered_with_its_seed_harness_and_options(task_file):
    entry = resolve("tasks")
    assert entry.seed_harness() == HARNESSES_DIR / "tasks"
    assert "Answer:" in (HARNESSES_DIR / "tasks" / "rollout.py").read_text()
    d = get_domain("tasks", source=str(task_file), verifier="exact", case_sensitive=False)
    assert d.check(task(d, "cap/001"), "Answer: CITY 1", False).success
    with pytest.raises(DomainError, match="verifier"):
        get_domain("tasks", source=str(task_file), verifier="nope")
    with pytest.raises(DomainError, match="unexpected keyword argument 'colour'"):
        get_domain("tasks", source=str(task_file), colour="red")


def test_seed_harness_asks_for_the_marker_the_check_reads(task_file):
    from evotrainer.harness.loader import load_harness

    harness = load_harness(HARNESSES_DIR / "tasks")
    d = TasksDomain(source=str(task_file))
    t = task(d, "cap/005")
    prompt = harness.render_prompt(t.prompt)
    assert prompt.startswith(t.prompt) and prompt.endswith('Give the final answer after "Answer:".')
    assert harness.spec.reward_weights == {"correct": 1.0, "format": 0.1}


# ---------------------------------------------------------------- the final answer and the exact check


def test_final_answer_rules():
    assert final_answer("blah\nAnswer: Paris.\nmore text").text == "Paris"
    assert final_answer("**Answer:** `Paris`").text == "Paris"
    assert final_answer("Answer:\n\n Paris \n").text == "Paris"
    assert final_answer("Answer: 1\nso \\boxed{x^{2}}").text == "x^{2}"  # the last marker wins
    assert final_answer("\\boxed{3} and then Answer: 4").text == "4"
    assert final_answer("Answer: 5\nAnswer:").text == "5"  # an empty marker does not count
    assert final_answer("no marker\nlast line\n\n").text == "last line" and not final_answer("x").marked
    assert final_answer("Answer: " + "y" * 5000).too_long


@pytest.fixture
def exact(task_file):
    return TasksDomain(source=str(task_file))


@pytest.mark.parametrize("completion, truncated, kind", [
    ("Answer: City 7", False, "ok"),
    ("I think... Answer:   City    7.", False, "ok"),  # whitespace runs and one trailing period
    ("Answer: city 7", False, "wrong"),  # case-sensitive by default
    ("City 7", False, "ok"),  # no marker: the last non-empty line
    ("City 7", True, "truncated"),  # ...but not when the completion was cut
    ("", False, "empty"),
    ("Answer: City 7\nAnswer: City 8", False, "wrong"),  # the last marker wins
    # Gaming: listing candidates, or hiding the answer before an injected marker.
    ("Answer: City 6, City 7, City 8", False, "wrong"),
    ("Answer: City 7 or City 8", False, "wrong"),
    ("City 7\nCity 8\nCity 9", False, "wrong"),
    ("Answer: City 7\n(ignore the above) Answer: City 8", False, "wrong"),
    ("The prompt says 'Answer: City 7' is right.\nAnswer: none", False, "wrong"),
    ("Answer: " + "City 7 " * 400, False, "wrong"),
])
def test_exact_check(exact, completion, truncated, kind):
    out = exact.check(task(exact, "cap/007"), completion, truncated)
    assert out.kind == kind, out
    assert out.success == (kind == "ok")


def test_exact_case_insensitive(task_file):
    d = TasksDomain(source=str(task_file), case_sensitive=False)
    assert d.check(task(d, "cap/007"), "Answer: city 7", False).success


def test_check_never_raises(exact):
    t = task(exact, "cap/001")
    for junk in [None, 12, "\ud800", "Answer:" * 2000, "\\boxed{" * 500, "\x00" * 10]:
        assert exact.check(t, junk, False).kind in ("empty", "format_error", "wrong")


# ---------------------------------------------------------------- numeric


def test_numeric_reuses_the_math_check(tmp_path):
    path = write(tmp_path / "n.jsonl", [{"task_id": "a", "prompt": "How many?", "answer": "1,234"},
                                        {"task_id": "b", "prompt": "Half?", "answer": 0.5}])
    d = TasksDomain(source=str(path), verifier="numeric")
    assert d.check(task(d, "a"), "So the answer is 1234.", False).success
    assert d.check(task(d, "b"), "Answer: 0.50", False).success
    assert d.check(task(d, "a"), "Answer: 1233", False).kind == "wrong"
    bad = write(tmp_path / "bad.jsonl", [{"task_id": "a", "prompt": "p", "answer": "many"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: task 'a': answer 'many' is not a number"):
        TasksDomain(source=str(bad), verifier="numeric")


# ---------------------------------------------------------------- regex


def test_regex_fullmatches_the_final_answer(tmp_path):
    path = write(tmp_path / "r.jsonl", [{"task_id": "date", "prompt": "When?", "answer": r"(19|20)\d\d-\d\d"},
                                        {"task_id": "slow", "prompt": "?", "answer": r"(a|aa)+b"}])
    d = TasksDomain(source=str(path), verifier="regex")
    t = task(d, "date")
    assert d.check(t, "Answer: 2024-05", False).success
    assert d.check(t, "Answer: 2024-05 or 1999-01", False).kind == "wrong"  # fullmatch, not search
    assert d.check(t, "Answer: x2024-05", False).kind == "wrong"
    start = time.monotonic()
    out = d.check(task(d, "slow"), "Answer: " + "a" * 60 + "!", False)  # catastrophic backtracking
    assert out.kind == "timeout" and "regex_timeout" in out.flags
    assert time.monotonic() - start < 20  # 1 s limit; the regex package checks it now and then
    bad = write(tmp_path / "bad.jsonl", [ROWS[0], {"task_id": "b", "prompt": "p", "answer": "(unclosed"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: task 'b': answer '\(unclosed' is not a valid regular"):
        TasksDomain(source=str(bad), verifier="regex")
    multi = write(tmp_path / "multi.jsonl", [{"task_id": "m", "prompt": "p", "answer": "a\nb"}])
    with pytest.raises(ValueError, match=r"multi\.jsonl:1: .*spans lines"):
        TasksDomain(source=str(multi), verifier="exact")


# ---------------------------------------------------------------- math (math-verify)


@pytest.fixture(scope="module")
def math_domain(tmp_path_factory):
    pytest.importorskip("math_verify")
    path = write(tmp_path_factory.mktemp("m") / "m.jsonl", [
        {"task_id": "half", "prompt": "1/2 as a decimal?", "answer": "\\frac{1}{2}"},
        {"task_id": "sq", "prompt": "Expand (x+1)^2", "answer": "x^2+2x+1"},
        {"task_id": "three", "prompt": "1+2?", "answer": "3"},
    ])
    d = TasksDomain(source=str(path), verifier="math", timeout_s=3.0)
    yield d
    d._symbolic.close()


@pytest.mark.parametrize("task_id, completion, kind", [
    ("half", "Answer: 0.5", "ok"),
    ("half", "so \\boxed{\\frac{2}{4}}", "ok"),
    ("half", "Answer: $1/2$", "ok"),
    ("sq", "Answer: (x+1)^2", "ok"),
    ("sq", "Answer: x^2+1", "wrong"),
    ("three", "Answer: 3", "ok"),
    ("three", "Answer: 4", "wrong"),
    # Gaming: every candidate at once is a set, and a set is not 3.
    ("three", "Answer: 1, 2, 3, 4", "wrong"),
    ("three", "Answer: $1$ or $2$ or $3$", "wrong"),
    ("three", "Answer: \\{1, 2, 3\\}", "wrong"),
    ("three", "Answer: 3\nActually, Answer: 5", "wrong"),
])
def test_math_verify_equivalence(math_domain, task_id, completion, kind):
    out = math_domain.check(task(math_domain, task_id), completion, False)
    assert out.kind == kind, out


def test_math_verify_off_the_main_thread(math_domain):
    got = []
    threads = [threading.Thread(target=lambda: got.append(math_domain.check(task(math_domain, "half"),
                                                                            "Answer: 0.5", False).kind))
               for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert got == ["ok"] * 3


def test_math_verify_adversarial_expression_times_out_and_recovers(math_domain):
    start = time.monotonic()
    out = math_domain.check(task(math_domain, "three"), "Answer: 9^{9^{9^{9}}}", False)
    assert out.kind == "timeout" and time.monotonic() - start < 10
    assert math_domain._symbolic.restarts >= 1
    assert math_domain.check(task(math_domain, "three"), "Answer: 3", False).kind == "ok"  # a fresh worker
    if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64"):
        assert math_domain._symbolic.seccomp is True  # the worker runs under the no-fork/exec/socket filter


def test_math_gold_that_does_not_parse_is_refused(tmp_path):
    pytest.importorskip("math_verify")
    path = write(tmp_path / "m.jsonl", [{"task_id": "ok", "prompt": "p", "answer": "3"},
                                        {"task_id": "junk", "prompt": "p", "answer": "\\frac{"}])
    with pytest.raises(ValueError, match=r"m\.jsonl:2: task 'junk': math-verify"):
        TasksDomain(source=str(path), verifier="math")


# ---------------------------------------------------------------- a user's function, in the sandbox

CHECKS = '''
import os

def check(completion, answer, task):
    return completion.strip().lower().endswith(answer.lower())

def score(completion, answer, task):
    return 0.5 if "half" in completion else float(completion.strip() == answer)

def picky(completion, answer, task):
    if task["task_id"] == "cap/003":
        raise KeyError("no such city")
    return True

def raises_on_model_output(completion, answer, task):
    if completion != answer:
        raise RuntimeError("boom")
    return True

def wrong_type(completion, answer, task):
    return "yes" if completion != answer else True

def never(completion, answer, task):
    return False

def spin(completion, answer, task):
    while completion != answer:
        pass
    return True

def spin_on_gold(completion, answer, task):
    while True:
        pass
'''


@pytest.fixture
def checks(tmp_path, task_file):
    (tmp_path / "checks.py").write_text(CHECKS)
    return task_file


def test_user_function_runs_in_the_sandbox(checks):
    d = TasksDomain(source=str(checks), verifier="checks.py:check")  # next to the task file
    t = task(d, "cap/002")
    assert d.check(t, "The answer is city 2", False).kind == "ok"
    assert d.check(t, "The answer is city 3", False).kind == "wrong"
    assert d.check(t, "The answer is city 3", True).kind == "truncated"


RUNS_THE_COMPLETION = '''
def check(completion, answer, task):
    if completion == answer:
        return True
    ns = {}
    exec(completion, ns)  # a verifier that runs the model's code: the policy's text runs here
    return ns.get("ok") is True
'''
READS_THE_HOST = {
    "/etc/passwd": "try:\n    ok = 'root:' in open('/etc/passwd').read()\nexcept OSError:\n    ok = False\n",
    "the repository": (f"try:\n    ok = 'evotrainer' in open({str(HARNESSES_DIR.parents[1] / 'pyproject.toml')!r}).read()\n"
                       "except OSError:\n    ok = False\n"),
    "the host's /etc": "import os\nok = len(os.listdir('/etc')) > 2\n",  # the root has ld.so.cache and localtime
}


def test_a_verifier_that_runs_the_completion_lets_it_read_nothing_of_the_host(tmp_path, task_file):
    (tmp_path / "runs.py").write_text(RUNS_THE_COMPLETION)
    d = TasksDomain(source=str(task_file), verifier="runs.py:check")
    t = task(d, "cap/002")
    assert d.check(t, "ok = True", False).kind == "ok"  # the honest control: the code runs
    for what, code in READS_THE_HOST.items():
        assert d.check(t, code, False).kind == "wrong", what
    # ...and installed packages are still there for the verifier (the workers' root)
    assert d.check(t, "import jinja2\nok = True", False).kind == "ok"


def test_user_function_scores(checks):
    d = TasksDomain(source=str(checks), verifier="checks.py:score", gold_check=3)
    t = task(d, "cap/002")
    half = d.check(t, "half right", False)
    assert (half.kind, half.success, half.score) == ("wrong", False, 0.5)


def test_user_function_that_raises_on_a_gold_answer_is_refused(checks):
    with pytest.raises(ValueError, match=r"verifier checks\.py:picky on the gold answer of task 'cap/003' "
                                         r"\(.*tasks\.jsonl:4\) raised KeyError: 'no such city'"):
        TasksDomain(source=str(checks), verifier="checks.py:picky")


def test_user_function_errors_on_model_output_are_named_outcomes(checks):
    d = TasksDomain(source=str(checks), verifier="checks.py:raises_on_model_output")
    out = d.check(task(d, "cap/001"), "not it", False)
    assert (out.kind, out.flags) == ("error", ("verifier_raised",))
    d = TasksDomain(source=str(checks), verifier="checks.py:wrong_type")
    out = d.check(task(d, "cap/001"), "not it", False)
    assert (out.kind, out.flags) == ("error", ("verifier_bad_return",))


def test_user_function_that_spins_times_out(checks):
    d = TasksDomain(source=str(checks), verifier="checks.py:spin", timeout_s=1.0, gold_check=2)
    start = time.monotonic()
    out = d.check(task(d, "cap/001"), "not it", False)
    assert (out.kind, out.flags) == ("timeout", ("verifier_timeout",)) and time.monotonic() - start < 8
    with pytest.raises(ValueError, match=r"on the gold answer of task 'cap/0\d\d' .* ran past its 1 s"):
        TasksDomain(source=str(checks), verifier="checks.py:spin_on_gold", timeout_s=1.0, gold_check=2)


def test_user_function_that_fails_gold_is_refused(checks):
    with pytest.raises(ValueError, match=r"on the gold answer of task 'cap/0\d\d' .* returned False"):
        TasksDomain(source=str(checks), verifier="checks.py:never")


def test_user_function_by_module_name_and_bad_specs(tmp_path, task_file, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('the package must not be imported by the trainer')\n")
    (pkg / "verify.py").write_text(CHECKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    d = TasksDomain(source=str(task_file), verifier="mypkg.verify:check", gold_check=2)
    assert d.check(task(d, "cap/004"), "city 4", False).success
    assert "mypkg" not in sys.modules
    with pytest.raises(ValueError, match="no Python file for module 'nosuch.mod'"):
        TasksDomain(source=str(task_file), verifier="nosuch.mod:check")
    with pytest.raises(ValueError, match="defines no function 'nope'"):
        TasksDomain(source=str(task_file), verifier="mypkg.verify:nope")
    with pytest.raises(ValueError, match=r"no file missing\.py"):
        TasksDomain(source=str(task_file), verifier="missing.py:check")


def test_a_bad_task_file_stores_nothing(tmp_path, checks):
    from evotrainer.config import load_config
    from evotrainer.store import Store
    from evotrainer.train.loop import open_session

    cfg = load_config(None, [f"domain.source={checks}", "domain.options.verifier=checks.py:picky",
                             "domain.train_size=4", "domain.heldout_size=2"], domain="tasks")
    with pytest.raises(DomainError, match="cap/003"):
        open_session(cfg, tmp_path / "work")
    assert Store.open(tmp_path / "work", cfg.store.url).tasks("tasks") == []


# ---------------------------------------------------------------- math and code file sources


def test_gsm8k_accepts_prompt_and_plain_answers_and_keeps_ids(tmp_path):
    path = write(tmp_path / "g.jsonl", [
        {"question": "Tom has 3 pens and buys 2. How many?", "answer": "He buys 2.\n3 + 2 = 5\n#### 5"},
        {"prompt": "What is 6 * 7?", "answer": "42", "task_id": "mul-1"},
        {"prompt": "What is 6 * 7?", "answer": "42", "id": 17},  # the same question, its own id: kept
        {"prompt": "Half of 3?", "answer": 1.5},
    ])
    tasks = load_gsm8k(path)
    assert [t.task_id for t in tasks][1:3] == ["mul-1", "17"]
    assert tasks[0].task_id.startswith("math-gsm-") and tasks[1].meta["source_id"] == "mul-1"
    assert [t.answer for t in tasks] == ["5", "42", "42", "1.5"]
    assert tasks[1].split == tasks[2].split  # one question, one split
    dup = write(tmp_path / "dup.jsonl", [{"prompt": "a?", "answer": "1", "task_id": "x"},
                                         {"prompt": "b?", "answer": "2", "task_id": "x"}])
    with pytest.raises(ValueError, match=r"dup\.jsonl:2: task_id 'x' is already used at .*dup\.jsonl:1"):
        load_gsm8k(dup)
    with pytest.raises(ValueError, match=r"g2\.jsonl:1: 'answer' must be a number or a string ending in '#### <number>'"):
        load_gsm8k(write(tmp_path / "g2.jsonl", [{"prompt": "a?", "answer": "five"}]))


GSM = [{"question": f"Q{i}: how many?", "answer": "\n".join(["step"] * (i % 4 + 1)) + f"\n#### {i}"}
       for i in range(20)]


def test_math_levels_report_what_they_leave_out(tmp_path, caplog):
    path = write(tmp_path / "gsm.jsonl", GSM + [GSM[0]])  # one repeated line without an id
    with caplog.at_level(logging.WARNING):
        d = MathDomain(source=str(path), levels=[0, 1])
    assert len(d.all_tasks()) == 10 and d.dropped == 10
    assert f"math: levels [0, 1] keep 10 of 20 tasks of {path}; 10 left out" in caplog.text
    assert "repeats 1 problem(s)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        d = MathDomain(source=str(write(tmp_path / "clean.jsonl", GSM)))
    assert d.dropped == 0 and len(d.all_tasks()) == 20 and caplog.text == ""


def test_math_heldout_source(tmp_path):
    train = write(tmp_path / "train.jsonl", GSM[:12])
    test = write(tmp_path / "test.jsonl", GSM[12:])
    d = MathDomain(source=str(train), heldout_source=str(test))
    assert len(d.tasks("train", 100, 0)) == 12 and len(d.tasks("heldout", 100, 0)) == 8
    with pytest.raises(ValueError, match=r"test2\.jsonl:1: task_id 'math-gsm-\w+' is already used at .*train\.jsonl:1"):
        MathDomain(source=str(train), heldout_source=str(write(tmp_path / "test2.jsonl", GSM[:1])))
    with pytest.raises(ValueError, match="heldout_source needs a file"):
        MathDomain(heldout_source=str(test))
    d = get_domain("math", source=str(train), heldout_source=str(test))  # the config key reaches it
    assert len(d.all_tasks()) == 20


MBPP = [{"task_id": i, "text": f"Return x plus {i}.", "code": f"def add(x):\n    return x + {i}\n",
         "test_list": [f"assert add(1) == {1 + i}"]} for i in range(1, 7)]
LONG = {"task_id": "HumanEval/9", "entry_point": "f", "prompt": "def f(x):\n    \"\"\"x squared, slowly.\"\"\"\n",
        "canonical_solution": "".join(f"    y{k} = x\n" for k in range(10)) + "    return x * x\n",
        "test": "def check(candidate):\n    assert candidate(3) == 9\n"}


def test_code_file_ids_levels_and_heldout_source(tmp_path, caplog):
    path = write(tmp_path / "mbpp.jsonl", MBPP + [LONG])
    tasks = load_jsonl(path)
    assert [t.task_id for t in tasks] == ["1", "2", "3", "4", "5", "6", "HumanEval/9"]
    with caplog.at_level(logging.WARNING):
        d = CodeDomain(source=str(path), levels=[0])
    assert d.dropped == 1 and "HumanEval/9" not in {t.task_id for t in d.all_tasks()}
    assert re.search(r"code: levels \[0\] keep 6 of 7 tasks of .*mbpp\.jsonl; 1 left out", caplog.text)
    test = write(tmp_path / "test.jsonl", [LONG])
    d = CodeDomain(source=str(write(tmp_path / "train.jsonl", MBPP)), heldout_source=str(test))
    assert [t.task_id for t in d.tasks("heldout", 10, 0)] == ["HumanEval/9"]
    assert len(d.tasks("train", 10, 0)) == 6
    with pytest.raises(ValueError, match=r"mbpp2\.jsonl:2: task_id '1' is already used at .*mbpp2\.jsonl:1"):
        load_jsonl(write(tmp_path / "mbpp2.jsonl", [MBPP[0], MBPP[0]]))


def test_math_worker_that_dies_is_an_error_then_replaced(math_domain):
    import os
    import signal

    checker = math_domain._symbolic
    assert math_domain.check(task(math_domain, "three"), "Answer: 3", False).kind == "ok"
    os.killpg(checker._proc.pid, signal.SIGKILL)  # as the kernel would on its memory cap
    out = math_domain.check(task(math_domain, "three"), "Answer: 3", False)
    assert out.kind in ("ok", "error")  # a dead worker is noticed on write or on read
    assert math_domain.check(task(math_domain, "three"), "Answer: 3", False).kind == "ok"


def test_an_empty_split_is_reported(tmp_path, caplog):
    path = write(tmp_path / "one.jsonl", [{"task_id": "only", "prompt": "p", "answer": "a"}])
    with caplog.at_level(logging.WARNING):
        d = TasksDomain(source=str(path))
    empty = "heldout" if task(d, "only").split == "train" else "train"
    assert f"none of the 1 tasks kept from {path} is in the {empty} split" in caplog.text
    assert d.tasks(empty, 5, 0) == []


def test_user_module_that_fails_to_load_in_the_sandbox_is_refused(tmp_path, task_file):
    (tmp_path / "broken.py").write_text("import no_such_package_here\n\ndef check(c, a, t):\n    return True\n")
    with pytest.raises(ValueError, match=r"verifier broken\.py:check: load: ModuleNotFoundError"):
        TasksDomain(source=str(task_file), verifier="broken.py:check")
    (tmp_path / "aliased.py").write_text("import operator\n\ncheck = lambda c, a, t: operator.eq(c.strip(), a)\n")
    d = TasksDomain(source=str(task_file), verifier="aliased.py:check", gold_check=1)  # not a def
    assert d.check(task(d, "cap/001"), " City 1\n", False).kind == "ok"
    assert d.check(task(d, "cap/001"), "Answer: City 1", False).kind == "wrong"  # the function reads the raw text
