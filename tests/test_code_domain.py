"""The code domain: generated problems, JSONL import, code extraction and the sandboxed check.

Real sandboxed runs throughout; a few completions attack the check the way a policy could.
"""

from __future__ import annotations

import json
import random

import pytest

from evotrainer.config import load_config
from evotrainer.domains import available, get_domain
from evotrainer.domains.code import FAMILIES, LEVELS, CodeDomain, draw_key, extract_code, load_jsonl, task_from_key


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}```\nThis passes."


@pytest.fixture(scope="module")
def domain() -> CodeDomain:
    return get_domain("code", levels=LEVELS)


def one_task_per_family() -> list:
    tasks, rng = {}, random.Random(0)
    while len(tasks) < len(FAMILIES):
        key = draw_key(rng.choice(LEVELS), rng)
        tasks.setdefault(key.split(":")[1], task_from_key(key, 0.2))
    return list(tasks.values())


# ---------------------------------------------------------------- generation


def test_registered_and_configurable():
    assert "code" in available()
    cfg = load_config(None, domain="code")
    assert cfg.domain.name == "code" and cfg.harness_dir().name == "code"


def test_every_reference_passes_its_hidden_tests_in_process():
    rng = random.Random(1)
    for _ in range(600):
        task = task_from_key(draw_key(rng.choice(LEVELS), rng), 0.2)
        namespace: dict = {}
        exec(task.answer, namespace)
        for test in task.meta["tests"]:
            exec(test, dict(namespace))
        assert len(task.meta["tests"]) >= 5


def test_every_family_reference_passes_in_the_sandbox(domain):
    for task in one_task_per_family():
        outcome = domain.check(task, fenced(task.answer), truncated=False)
        assert outcome.kind == "ok" and outcome.success and outcome.score == 1.0, (task.meta["key"], outcome)


def test_tasks_are_deterministic_and_splits_disjoint(domain):
    train = domain.tasks("train", 120, seed=0)
    assert [t.task_id for t in train] == [t.task_id for t in domain.tasks("train", 120, seed=0)]
    assert [t.task_id for t in train] != [t.task_id for t in domain.tasks("train", 120, seed=1)]
    held = {t.meta["key"] for s in range(3) for t in domain.tasks("heldout", 40, seed=s)}
    assert not held & {t.meta["key"] for s in range(3) for t in domain.tasks("train", 120, seed=s)}
    assert len({t.task_id for t in train}) == 120 and {t.split for t in train} == {"train"}
    assert {t.level for t in train} == set(LEVELS)


def test_levels_and_their_limits():
    easy = CodeDomain(levels=[0])
    assert {t.level for t in easy.tasks("train", 50, 0)} == {0}
    with pytest.raises(ValueError, match="levels"):
        CodeDomain(levels=[7])
    with pytest.raises(ValueError, match="ran out"):
        CodeDomain(levels=[0]).tasks("train", 5000, 0)


def test_prompt_names_the_function_and_hides_the_tests(domain):
    for task in domain.tasks("train", 20, 3):
        entry = task.meta["entry_point"]
        assert f"`{entry}(" in task.prompt
        hidden = [t.split("==")[0] for t in task.meta["tests"][:-1]]  # the last input is the example
        assert not any(h.replace("assert ", "").strip() in task.prompt for h in hidden if "()" not in h)


# ---------------------------------------------------------------- extraction


def test_extract_code_variants():
    code = "def f(x):\n    return x\n"
    assert extract_code(fenced(code), "f") == (code, True)
    two = f"```python\ndef helper():\n    pass\n```\nand\n```python\n{code}```\n```\nprint(1)\n```"
    assert extract_code(two, "f") == (code, True)
    assert extract_code("Sure.\n\n" + code + "\nThat returns x.", "f")[0].startswith("def f(x):")
    assert extract_code("```python\ndef f(x):\n    return", "f") == ("def f(x):\n    return", False)
    assert extract_code("no code here, sorry", "f") == (None, True)


# ---------------------------------------------------------------- the check


@pytest.fixture(scope="module")
def task():
    return task_from_key('L1:keep_if:{"op": ">", "t": 3}', 0.2)


@pytest.mark.parametrize("completion,truncated,kind", [
    ("", False, "empty"),
    ("   \n", False, "empty"),
    ("I would loop over the list.", False, "format_error"),
    ("```python\ndef keep_if(nums):\n    return [x for x in nums if", True, "truncated"),
    ("```python\ndef keep_if(nums)\n    return nums\n```", False, "wrong"),
    ("```python\ndef keep_if(nums):\n    return nums\n```", False, "wrong"),
    ("```python\ndef keep_if(nums):\n    return [x for x in nums if x > 3]\n```", False, "ok"),
    ("```python\ndef keep_if(nums):\n    return [x for x in nums if x > 3]\n```\nMore text that was cut", True, "ok"),
])
def test_outcome_kinds(domain, task, completion, truncated, kind):
    assert domain.check(task, completion, truncated).kind == kind


def test_partial_credit_and_flags(domain, task):
    outcome = domain.check(task, fenced("def keep_if(nums):\n    return [x for x in nums if x >= 3]\n"), False)
    assert outcome.kind == "wrong" and 0.0 < outcome.score < 1.0
    assert "syntax_error" in domain.check(task, fenced("def keep_if(:\n"), False).flags
    assert "missing_entry_point" in domain.check(task, fenced("def other(nums):\n    return nums\n"), False).flags


def test_infinite_loop_times_out(task):
    quick = CodeDomain(timeout_s=2)
    outcome = quick.check(task, fenced("def keep_if(nums):\n    while True:\n        pass\n"), False)
    assert outcome.kind == "timeout" and not outcome.success


@pytest.mark.parametrize("hack", [
    "import sys\nsys.exit(0)\n",
    "import os\ngetattr(os, '_' + 'exit')(0)\n",
    "print('{\"results\": [null, null, null, null, null, null, null]}')\n",
    "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n",
    "import sys\n_m = getattr(sys, 'modules')['__' + 'main__']\nprint(vars(_m))\n",
])
def test_hacks_are_not_success(domain, task, hack):
    outcome = domain.check(task, fenced(hack + "def keep_if(nums):\n    return nums\n"), False)
    assert not outcome.success and outcome.kind in ("wrong", "tampering"), outcome


@pytest.mark.parametrize("hack", [
    "import sys\nf = sys._getframe(1)\n",
    "import gc\nobjs = gc.get_objects()\n",
    "import os\nos._exit(0)\n",
    "import __main__\n",
])
def test_reaching_into_the_runner_is_tampering(domain, task, hack):
    outcome = domain.check(task, fenced(hack + "def keep_if(nums):\n    return nums\n"), False)
    assert outcome.kind == "tampering" and outcome.score == 0.0


def test_check_never_raises(domain, task):
    for weird in ("\x00", "```python\n\x00\n```", "```" * 50, "def keep_if(" * 200):
        assert domain.check(task, weird, False).kind in ("wrong", "format_error", "truncated", "error")


# ---------------------------------------------------------------- JSONL import


MBPP = [
    {"task_id": 1, "text": "Write a function to find the minimum of two numbers.",
     "code": "def minimum(a, b):\n    return a if a <= b else b", "test_setup_code": "",
     "test_list": ["assert minimum(1, 2) == 1", "assert minimum(-5, -4) == -5", "assert minimum(0, 0) == 0"]},
    {"task_id": 2, "prompt": "Write a python function to reverse the words of a sentence.",
     "code": "def reverse_words(s):\n    words = s.split()\n    words.reverse()\n    out = ' '.join(words)\n"
             "    return out",
     "test_list": ["assert reverse_words('a b c') == 'c b a'", "assert reverse_words('') == ''"]},
]
HUMANEVAL = {
    "task_id": "HumanEval/0", "entry_point": "has_close",
    "prompt": "def has_close(numbers, threshold):\n    \"\"\"True if two numbers are closer than threshold.\"\"\"\n",
    "canonical_solution": "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
                          "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n",
    "test": "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3)\n"
            "    assert not candidate([1.0, 2.0, 3.0], 0.5)\n",
}


def test_mbpp_and_humaneval_import(tmp_path, domain):
    path = tmp_path / "code.jsonl"
    unnumbered = {k: v for k, v in MBPP[0].items() if k != "task_id"}
    path.write_text("\n".join(json.dumps(r) for r in MBPP + [HUMANEVAL, unnumbered, unnumbered]) + "\n")
    tasks = load_jsonl(path)
    assert len(tasks) == 4  # the repeated line without an id is kept once; ids are the file's own
    assert {t.task_id for t in tasks} >= {"1", "2", "HumanEval/0"}
    by_entry = {t.meta["entry_point"]: t for t in tasks}
    assert set(by_entry) == {"minimum", "reverse_words", "has_close"}
    assert "`minimum(a, b)`" in by_entry["minimum"].prompt and "has_close" in by_entry["has_close"].prompt
    for t in tasks:
        assert domain.check(t, fenced(t.answer + "\n"), False).kind == "ok", t.meta["key"]
        assert domain.check(t, fenced(f"def {t.meta['entry_point']}(*a):\n    return None\n"), False).kind == "wrong"
    from_file = CodeDomain(source=str(path), levels=LEVELS)
    split_sizes = len(from_file.tasks("train", 10, 0)) + len(from_file.tasks("heldout", 10, 0))
    assert split_sizes == 4


def test_import_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(MBPP[0]) + "\n" + json.dumps({"text": "x", "code": "y"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_jsonl(path)


# ---------------------------------------------------------------- random hidden tests and grading a file whole

# HumanEval 53's shape: the check draws unseeded random inputs in a loop, which the parent cannot
# evaluate, so the reference's calls are recorded and the test is replayed against the answers.
RANDOM_CHECK = {
    "task_id": "HumanEval/953", "entry_point": "add", "prompt": "def add(x: int, y: int):\n    \"\"\"x + y\"\"\"\n",
    "canonical_solution": "    return x + y\n",
    "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    import random\n    assert candidate(2, 3) == 5\n"
            "    for i in range(100):\n        x, y = random.randint(0, 1000), random.randint(0, 1000)\n"
            "        assert candidate(x, y) == x + y\n",
}
LONG_BODY = "    total = x\n" + "    total = total + 0\n" * 9 + "    return total + y\n"  # level 2 (over 8 lines)


def test_gold_passes_a_hidden_test_that_draws_random_inputs(tmp_path, domain):
    path = tmp_path / "he.jsonl"
    path.write_text(json.dumps(RANDOM_CHECK) + "\n")
    task = load_jsonl(path, heldout_fraction=0.01)[0]
    for _ in range(3):  # every recording and replay draws the same inputs, not only the first
        outcome = domain.check(task, RANDOM_CHECK["canonical_solution"], False)
        assert outcome.kind == "ok" and "replayed" in outcome.flags, outcome
    assert domain.check(task, "    return x + y + (x > 500)\n", False).kind == "wrong"


def test_grading_a_task_file_grades_every_task_whatever_the_config_levels(tmp_path):
    import subprocess
    import sys

    from evotrainer.paths import CONFIGS_DIR

    rows = [dict(RANDOM_CHECK, task_id=f"HumanEval/{i}", canonical_solution=LONG_BODY if i % 2 else "    return x + y\n")
            for i in range(6)]
    tasks = tmp_path / "he.jsonl"
    tasks.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    preds = tmp_path / "gold.jsonl"
    preds.write_text("\n".join(json.dumps({"task_id": r["task_id"], "completion": r["canonical_solution"]})
                               for r in rows) + "\n")
    assert {t.level for t in load_jsonl(tasks)} == {0, 2}
    cmd = [sys.executable, "-m", "evotrainer", "grade", "--domain", "code", "--tasks", str(tasks),
           "--predictions", str(preds), "--config", str(CONFIGS_DIR / "code.yaml"), "--json"]  # levels [0, 1]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)["summary"]
    assert summary["n"] == 6 and summary["successes"] == 6 and summary["tasks_without_prediction"] == 0
    # a level the user names on the command line still applies
    narrowed = subprocess.run([*cmd, "domain.levels=[0]"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert narrowed.returncode == 2 and "name no task of domain 'code'" in narrowed.stderr
