"""The math domain: seeded generation, splits disjoint by construction, GSM8K loading, the exact check."""

from __future__ import annotations

import ast
import json
import operator
import re

import pytest

from evotrainer.api import Outcome
from evotrainer.domains import Domain, DomainError, Task, available, get_domain, register
from evotrainer.domains.math import MathDomain, check_answer, extract_answer, load_gsm8k


def _eval(expr: str) -> int:
    """An evaluator independent of the generator's: Python's own parser, four operators."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        assert isinstance(node, ast.BinOp), ast.dump(node)
        return ops[type(node.op)](walk(node.left), walk(node.right))

    return walk(ast.parse(expr, mode="eval").body)


# Word problems: the numbers appear in the question in order a, b, c.
WORD_ANSWERS = {
    "apples": lambda a, b, c: a + b * c,
    "coins": lambda a, b, c: a - b + c,
    "train": lambda a, b, c: a * b - c,
    "pages": lambda a, b, c: a * b + c,
    "pencils": lambda a, b, c: a / b + c,
    "marbles": lambda a, b, c: a + b - c,
}


def test_registry_builds_math_with_options():
    assert "math" in available()
    domain = get_domain("math", levels=[0])
    assert isinstance(domain, MathDomain) and isinstance(domain, Domain)
    assert domain.levels == (0,)
    with pytest.raises(DomainError, match="unknown domain .nope."):
        get_domain("nope")
    with pytest.raises(ValueError, match="already registered"):
        register("math", dict)


def test_same_seed_same_tasks_and_different_seeds_differ():
    domain = MathDomain()
    first = domain.tasks("train", 40, seed=3)
    assert first == MathDomain().tasks("train", 40, seed=3)
    assert first[:10] == domain.tasks("train", 10, seed=3)
    assert [t.task_id for t in first] != [t.task_id for t in domain.tasks("train", 40, seed=4)]
    assert len({t.task_id for t in first}) == 40
    assert {t.level for t in first} == {0, 1, 2, 3}


def test_splits_are_disjoint_whatever_the_seeds():
    domain = MathDomain()
    train = {t.meta["key"] for s in range(15) for t in domain.tasks("train", 200, seed=s)}
    heldout = {t.meta["key"] for s in range(15) for t in domain.tasks("heldout", 200, seed=s)}
    assert len(heldout) > 1000 and len(train) > 1000
    assert not train & heldout
    # The split is a property of the problem: the same key always lands in the same split.
    for t in domain.tasks("heldout", 50, seed=99):
        assert t.split == "heldout" and t.task_id.startswith(f"math-L{t.level}-")


def test_task_id_and_text_follow_from_the_key():
    a = {t.task_id: t for t in MathDomain().tasks("train", 300, seed=1)}
    b = {t.task_id: t for t in MathDomain().tasks("train", 300, seed=2)}
    for task_id in a.keys() & b.keys():
        assert a[task_id] == b[task_id]


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_each_level_has_correct_answers(level):
    domain = MathDomain(levels=[level])
    for task in domain.tasks("train", 150, seed=level) + domain.tasks("heldout", 50, seed=level):
        assert task.level == level and task.domain == "math"
        if level < 3:
            match = re.fullmatch(r"What is (.+)\?", task.prompt)
            assert match, task.prompt
            expected = _eval(match.group(1))
            ops = re.findall(r"[-+*]", match.group(1))
            assert len(ops) == (1 if level < 2 else 2)
        else:
            a, b, c = (int(x) for x in re.findall(r"\d+", task.prompt))
            expected = WORD_ANSWERS[task.meta["template"]](a, b, c)
        assert expected == int(expected) and expected >= 0
        assert task.answer == str(int(expected)), task.prompt
        assert domain.check(task, f"Answer: {task.answer}", False).success


def test_level0_is_small_and_level1_has_products_or_two_digit_sums():
    for task in MathDomain(levels=[0]).tasks("train", 100, seed=0):
        assert all(int(x) <= 20 for x in re.findall(r"\d+", task.prompt))
    prompts = [t.prompt for t in MathDomain(levels=[1]).tasks("train", 100, seed=0)]
    assert any("*" in p for p in prompts) and any("+" in p for p in prompts)


def test_exhausted_levels_raise_instead_of_looping():
    with pytest.raises(ValueError, match="ran out of distinct heldout problems"):
        MathDomain(levels=[0], heldout_fraction=0.01).tasks("heldout", 500, seed=0)


def test_bad_options_and_arguments():
    with pytest.raises(ValueError, match="levels"):
        MathDomain(levels=[5])
    with pytest.raises(ValueError, match="heldout_fraction"):
        MathDomain(heldout_fraction=1.0)
    with pytest.raises(ValueError, match="split 'test'"):
        MathDomain().tasks("test", 1, 0)
    with pytest.raises(ValueError, match="neither 'procedural' nor a file"):
        MathDomain(source="/no/such/file.jsonl")


# ---------------------------------------------------------------- GSM8K-style JSONL


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GSM_ROWS = [
    {"question": f"Q{i}: Tom has {i} boxes of 1,000 pens. How many pens?",
     "answer": f"Each box has 1,000 pens.\n{i} * 1000 = {i * 1000}\n#### {i * 1000:,}"}
    for i in range(1, 61)
]


def test_gsm8k_loader_parses_answers_and_splits_by_question(tmp_path):
    path = _write_jsonl(tmp_path / "gsm.jsonl", GSM_ROWS + [""])  # a blank line is fine
    tasks = load_gsm8k(path)
    assert len(tasks) == 60
    assert tasks[4].answer == "5000" and tasks[4].level == 1 and tasks[4].meta["line"] == 5
    assert {t.split for t in tasks} == {"train", "heldout"}
    # Split and id depend on the question, not on the file order.
    reordered = load_gsm8k(_write_jsonl(tmp_path / "rev.jsonl", GSM_ROWS[::-1]))
    assert {(t.task_id, t.split) for t in reordered} == {(t.task_id, t.split) for t in tasks}
    domain = MathDomain(source=str(path))
    train, heldout = domain.tasks("train", 100, seed=0), domain.tasks("heldout", 100, seed=0)
    assert len(train) + len(heldout) == 60 and not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert domain.tasks("train", 5, seed=1) == domain.tasks("train", 5, seed=1)
    assert domain.check(train[0], f"So the answer is {int(train[0].answer):,}.", False).success


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"answer": "#### 3"}), "'question' (or 'prompt') must be a non-empty string"),
        (json.dumps({"question": "q?", "answer": "three"}), "#### <number>"),
        (json.dumps({"question": "q?", "answer": "#### three"}), "is not a number"),
    ],
)
def test_gsm8k_bad_line_names_its_line_number(tmp_path, bad, message):
    path = _write_jsonl(tmp_path / "gsm.jsonl", GSM_ROWS[:2] + [bad] + GSM_ROWS[2:4])
    with pytest.raises(ValueError, match=rf"gsm\.jsonl:3: .*{re.escape(message)}"):
        load_gsm8k(path)


# ---------------------------------------------------------------- the trusted check

TASK = Task("math-L0-test", "math", "train", 0, "What is 7 + 5?", "12", {})
NEG = Task("math-L0-neg", "math", "train", 0, "What is 3 - 8?", "-5", {})
BIG = Task("math-gsm-big", "math", "train", 3, "How many?", "1234", {})

CASES = [
    # (task, completion, truncated, kind, success, marker)
    (TASK, "", False, "empty", False, False),
    (TASK, "   \n\t ", True, "empty", False, False),
    (TASK, "7 + 5 = 12", False, "ok", True, False),
    (TASK, "7 + 5 = 1", True, "truncated", False, False),  # cut mid-number
    (TASK, "Answer: 12", True, "ok", True, True),  # answered before the cut
    (TASK, "7 + 5 = 11, no wait. Answer: 12.", False, "ok", True, True),
    (TASK, "Answer: 11\nHmm. ANSWER:12", False, "ok", True, True),  # the last marker wins
    (TASK, "Answer: 12\nanswer: 13", False, "wrong", False, True),
    (TASK, "answer: 7 + 5 = 12", False, "ok", True, True),
    (TASK, "**Answer:** $12", False, "ok", True, True),
    (TASK, "Answer:\n12", False, "ok", True, True),
    (TASK, "So \\boxed{12} is it, 13 was wrong", False, "ok", True, True),
    (TASK, "We get 5 + 7.\n#### 12", False, "ok", True, True),
    (TASK, "Answer: 12.0", False, "ok", True, True),
    (TASK, "12.000001", False, "wrong", False, False),
    (TASK, "The answer is 13", False, "wrong", False, False),
    (TASK, "twelve", False, "format_error", False, False),
    (TASK, "Answer: twelve", False, "format_error", False, False),
    (TASK, "Give the final answer after \"Answer:\".\n12", False, "ok", True, False),
    (TASK, "x2 L12", False, "format_error", False, False),
    (TASK, "\u202e\u0000\ud83d\ude00 \uff11\uff12 \u00b2", False, "format_error", False, False),
    (TASK, "\x00\x01 answer: \u0661\u0662", False, "format_error", False, False),
    (TASK, "1" * 5000, False, "wrong", False, False),
    (NEG, "3 - 8 = -5", False, "ok", True, False),
    (NEG, "Answer: \u22125", False, "ok", True, True),
    (NEG, "8-5", False, "wrong", False, False),  # "8-5" ends in 5, not -5
    (BIG, "Answer: 1,234", False, "ok", True, True),
    (BIG, "#### 1,234.00 dollars", False, "ok", True, True),
    (BIG, "That is 1234 pens", False, "ok", True, False),
    (BIG, "Answer: 1,23", False, "wrong", False, True),
]


@pytest.mark.parametrize("task, completion, truncated, kind, success, marker", CASES)
def test_check_table(task, completion, truncated, kind, success, marker):
    outcome = MathDomain().check(task, completion, truncated)
    assert isinstance(outcome, Outcome)
    assert (outcome.kind, outcome.success) == (kind, success), outcome
    assert outcome.score == (1.0 if success else 0.0)
    assert ("answer_marker" in outcome.flags) == marker


def test_extract_answer():
    assert extract_answer("3 + 4 = 7, then 7 * 2 = 14") == ("14", False)
    assert extract_answer("Answer: -3 apples") == ("-3", True)
    assert extract_answer("no numbers") == (None, False)


def test_check_never_raises():
    junk = ["\ud800", "Answer:" * 1000, "\\boxed{", "#### ", "1,,,2", "-", "--5", "9" * 20000 + ".",
            None, 12]
    for completion in junk:
        assert check_answer("12", completion, False).kind in ("empty", "format_error", "wrong")
    assert check_answer("not a number", "12", False).kind == "error"


@pytest.mark.parametrize("tweak", ["low_precision", "trap_rounding", "no_invalid_trap", "tiny_exponent"])
def test_check_ignores_the_process_decimal_context(tmp_path, tweak):
    """Another library (a task pack, a user's harness) changing the thread's decimal context must not
    turn a true answer wrong, a wrong one true, or the check into a crash."""
    import decimal

    path = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": "How many ants?", "answer": "Count.\n#### 1,234,567.5"},
                                                 {"question": "How many bees?", "answer": "#### 120"}])
    with decimal.localcontext() as ctx:
        if tweak == "low_precision":
            ctx.prec = 3
        elif tweak == "trap_rounding":
            ctx.prec, ctx.traps[decimal.Rounded], ctx.traps[decimal.Inexact] = 2, True, True
        elif tweak == "no_invalid_trap":
            ctx.traps[decimal.InvalidOperation] = False
        else:
            ctx.Emax, ctx.Emin = 2, -2
        ants, bees = load_gsm8k(path)
        assert (ants.answer, bees.answer) == ("1234567.5", "120")
        assert check_answer(ants.answer, "So #### 1234567.50", False).kind == "ok"
        assert check_answer(ants.answer, "So #### 1234567", False).kind == "wrong"
        assert check_answer(bees.answer, "Answer: 120", False).kind == "ok"
        assert check_answer(bees.answer, "Answer: 1.2e2", False).kind in ("ok", "wrong", "format_error")
        assert check_answer(bees.answer, "Answer: 121", False).kind == "wrong"
