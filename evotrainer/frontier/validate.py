"""The trusted checks a synthesized task must pass before any training use, each with a named
reason when it fails.

- math: the answer is recomputed independently (the expression evaluated exactly with
  fractions) and the domain's own checker must accept it as a completion;
- code: the reference solution must pass every hidden test in the sandbox, and a do-nothing
  solution must fail them;
- swe: the gold patch resolves and the empty patch does not (tasks.synth.verify, the real grader);
- all: a task must be in the train split (a variant that hashes to held-out is never used),
  and not duplicate any known task or earlier variant (normalised prompt hash).
"""

from __future__ import annotations

import ast
import hashlib
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from evotrainer.domains.base import Task

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""  # why it was rejected: "wrong_answer: ...", "duplicate: ...", ...


def prompt_hash(text: str) -> str:
    return hashlib.sha256(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def exact_value(expression: str) -> Fraction:
    """+ - * / over integers, evaluated exactly; ValueError for anything else."""
    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported expression part {ast.dump(node)[:60]}")

    return ev(ast.parse(expression, mode="eval"))


def _intermediates(expression: str) -> list[Fraction]:
    """Every sub-expression's value: the generators keep all of them non-negative."""
    tree = ast.parse(expression, mode="eval")
    return [exact_value(ast.unparse(n)) for n in ast.walk(tree) if isinstance(n, ast.BinOp)]


def check_math(task: Task) -> Verdict:
    from evotrainer.domains.math import check_answer

    expression = task.meta.get("expression")
    if not isinstance(expression, str):
        return Verdict(False, "no_expression: the task carries no arithmetic to recompute")
    try:
        value = exact_value(expression)
        steps = _intermediates(expression)
    except (ValueError, SyntaxError) as exc:
        return Verdict(False, f"bad_expression: {expression!r}: {exc}")
    if value.denominator != 1:
        return Verdict(False, f"not_integer: {expression} = {value}")
    if any(v < 0 for v in steps):
        return Verdict(False, f"negative_step: {expression} goes below zero")
    if not check_answer(task.answer, f"Answer: {value.numerator}", False).success:
        return Verdict(False, f"wrong_answer: stored {task.answer!r}, recomputed {value.numerator}")
    return Verdict(True)


def check_code(task: Task) -> Verdict:
    from evotrainer.domains.code import check_code as run_hidden_tests

    entry = task.meta.get("entry_point")
    if not isinstance(entry, str) or not task.meta.get("tests"):
        return Verdict(False, "no_tests: the task has no entry point or hidden tests")
    gold = run_hidden_tests(task, f"```python\n{task.answer}\n```", False)
    if not gold.success:
        return Verdict(False, f"reference_fails: the reference solution scores {gold.score:.2f} on its hidden "
                              f"tests ({gold.kind}{', ' + ', '.join(gold.flags) if gold.flags else ''})")
    trivial = run_hidden_tests(task, f"```python\ndef {entry}(*args, **kwargs):\n    return None\n```", False)
    if trivial.success:
        return Verdict(False, "trivial_passes: a function returning None passes the hidden tests")
    return Verdict(True)


def check_task(task: Task) -> Verdict:
    """The domain's trusted check of a synthesized math or code task."""
    if task.split != "train":
        return Verdict(False, "heldout_split: the variant belongs to the held-out split")
    if task.domain == "math":
        return check_math(task)
    if task.domain == "code":
        return check_code(task)
    return Verdict(False, f"no_checker: no validator for domain {task.domain!r}")


class Deduper:
    """Drops a task whose normalised prompt (or canonical key) was seen before."""

    def __init__(self, known: Iterable[Task] = ()) -> None:
        self.prompts: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        for t in known:
            self.add(t)

    def seen(self, task: Task) -> str | None:
        """The id of the task this one duplicates, or None."""
        key = task.meta.get("key")
        return self.prompts.get(prompt_hash(task.prompt)) or (self.keys.get(key) if isinstance(key, str) else None)

    def add(self, task: Task) -> None:
        self.prompts.setdefault(prompt_hash(task.prompt), task.task_id)
        key = task.meta.get("key")
        if isinstance(key, str):
            self.keys.setdefault(key, task.task_id)
