"""The math domain: seeded arithmetic problems (levels 0-3) or GSM8K-style JSONL, exact answer check.

Every problem has a canonical key (its level and its arithmetic, e.g. `L2:3 * 4 + 5`, or the
normalized question of a JSONL line). A hash of that key alone fixes the task id, the surface
text and the split, so a held-out problem can never be drawn for train, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_HALF_EVEN, Context, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains.base import Task, check_split
from evotrainer.domains.task_files import FileTasks, file_id, load_sources, unique_ids
from evotrainer.jsonfile import iter_jsonl

LEVELS = (0, 1, 2, 3)
DOMAIN = "math"


# ---------------------------------------------------------------- canonical keys and splits


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def split_of(key: str, heldout_fraction: float) -> str:
    """The split a canonical key belongs to: a pure function of the key (and the fraction)."""
    bucket = int(_digest(key)[8:16], 16) / 2**32
    return "heldout" if bucket < heldout_fraction else "train"


def task_id_of(key: str, prefix: str) -> str:
    return f"{prefix}-{_digest(key)[:8]}"


# ---------------------------------------------------------------- procedural problems
# Each level draws a canonical key; the text and answer are computed from the key alone.


def _level0(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    if rng.random() < 0.5:
        return f"{a} + {b}", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b}", a - b


def _level1(rng: random.Random) -> tuple[str, int]:
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{a} * {b}", a * b
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if kind == 1:
        return f"{a} + {b}", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b}", a - b


# Two-step expressions; `ok` keeps every intermediate and final result non-negative.
_L2_FORMS: list[tuple[str, Callable[[int, int, int], int], Callable[[int, int, int], bool]]] = [
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c, lambda a, b, c: True),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c, lambda a, b, c: c <= a * b),
    ("{a} + {b} * {c}", lambda a, b, c: a + b * c, lambda a, b, c: True),
    ("{a} + {b} - {c}", lambda a, b, c: a + b - c, lambda a, b, c: c <= a + b),
    ("{a} - {b} + {c}", lambda a, b, c: a - b + c, lambda a, b, c: b <= a),
    ("({a} + {b}) * {c}", lambda a, b, c: (a + b) * c, lambda a, b, c: True),
    ("{a} * ({b} - {c})", lambda a, b, c: a * (b - c), lambda a, b, c: c <= b),
]


def _level2(rng: random.Random) -> tuple[str, int]:
    while True:
        form, value, ok = rng.choice(_L2_FORMS)
        small = "*" in form
        a, b, c = (rng.randint(2, 12) if small else rng.randint(1, 30) for _ in range(3))
        if ok(a, b, c):
            return form.format(a=a, b=b, c=c), value(a, b, c)


_NAMES = ("Mia", "Sam", "Ava", "Leo", "Noah", "Emma", "Omar", "Lina", "Ravi", "Zoe")


def _coins_operands(r: random.Random) -> tuple[int, int, int]:
    a = r.randint(10, 50)
    return a, r.randint(1, a), r.randint(1, 20)


def _train_operands(r: random.Random) -> tuple[int, int, int]:
    a, b = r.randint(2, 9), r.randint(5, 20)
    return a, b, r.randint(1, a * b)


def _pencils_operands(r: random.Random) -> tuple[int, int, int]:
    b = r.randint(2, 9)  # a is a multiple of b: the pencils share out evenly
    return b * r.randint(2, 12), b, r.randint(1, 9)


def _marbles_operands(r: random.Random) -> tuple[int, int, int]:
    a, b = r.randint(3, 40), r.randint(3, 40)
    return a, b, r.randint(1, a + b)


# name -> (question template, answer, the arithmetic it hides, operand sampler)
_L3_TEMPLATES: dict[str, tuple[str, Callable[..., int], str, Callable[[random.Random], tuple]]] = {
    "apples": (
        "{name} has {a} apples and buys {b} bags with {c} apples in each bag. "
        "How many apples does {name} have now?",
        lambda a, b, c: a + b * c,
        "{a} + {b} * {c}",
        lambda r: (r.randint(1, 20), r.randint(2, 9), r.randint(2, 9)),
    ),
    "coins": (
        "{name} has {a} coins, gives {b} coins to a friend and then finds {c} more coins. "
        "How many coins does {name} have now?",
        lambda a, b, c: a - b + c,
        "{a} - {b} + {c}",
        _coins_operands,
    ),
    "train": (
        "A train has {a} cars with {b} passengers in each car. At the next station {c} "
        "passengers get off. How many passengers are still on the train?",
        lambda a, b, c: a * b - c,
        "{a} * {b} - {c}",
        _train_operands,
    ),
    "pages": (
        "{name} reads {a} pages every day for {b} days and then reads {c} more pages. "
        "How many pages does {name} read in total?",
        lambda a, b, c: a * b + c,
        "{a} * {b} + {c}",
        lambda r: (r.randint(5, 30), r.randint(2, 9), r.randint(1, 20)),
    ),
    "pencils": (
        "A teacher shares {a} pencils equally among {b} children and then gives each child "
        "{c} more pencils. How many pencils does each child have now?",
        lambda a, b, c: a // b + c,
        "{a} / {b} + {c}",
        _pencils_operands,
    ),
    "marbles": (
        "{name} has {a} red marbles and {b} blue marbles and then loses {c} marbles. "
        "How many marbles does {name} have left?",
        lambda a, b, c: a + b - c,
        "{a} + {b} - {c}",
        _marbles_operands,
    ),
}


def _level3(rng: random.Random) -> tuple[str, tuple[int, int, int]]:
    template = rng.choice(sorted(_L3_TEMPLATES))
    return template, _L3_TEMPLATES[template][3](rng)


def _draw_key(level: int, rng: random.Random) -> str:
    if level == 3:
        template, (a, b, c) = _level3(rng)
        return f"L3:{template}:{a}:{b}:{c}"
    expr, _ = (_level0, _level1, _level2)[level](rng)
    return f"L{level}:{expr}"


def _eval_plain(expr: str) -> int:
    """Value of a generated level 0-2 expression (ints, + - *, one optional pair of parens)."""
    tokens = re.findall(r"\d+|[-+*()]", expr)
    pos = 0

    def atom() -> int:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            value = total()
            pos += 1  # ")"
            return value
        return int(tok)

    def product() -> int:
        nonlocal pos
        value = atom()
        while pos < len(tokens) and tokens[pos] == "*":
            pos += 1
            value *= atom()
        return value

    def total() -> int:
        nonlocal pos
        value = product()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            value = value + product() if op == "+" else value - product()
        return value

    return total()


def task_from_key(key: str, heldout_fraction: float) -> Task:
    """The task a canonical procedural key stands for (text, answer, id and split all follow)."""
    level = int(key[1])
    body = key[3:]
    meta: dict[str, Any] = {"key": key, "source": "procedural"}
    if level == 3:
        template, *nums = body.split(":")
        a, b, c = (int(x) for x in nums)
        text, value, expr, _ = _L3_TEMPLATES[template]
        name = _NAMES[int(_digest(key)[16:20], 16) % len(_NAMES)]
        question = text.format(name=name, a=a, b=b, c=c)
        answer = value(a, b, c)
        meta.update(template=template, expression=expr.format(a=a, b=b, c=c))
    else:
        question = f"What is {body}?"
        answer = _eval_plain(body)
        meta["expression"] = body
    return Task(
        task_id=task_id_of(key, f"math-L{level}"),
        domain=DOMAIN,
        split=split_of(key, heldout_fraction),
        level=level,
        prompt=question,
        answer=str(answer),
        meta=meta,
    )


# ---------------------------------------------------------------- GSM8K-style JSONL


# Our own context, passed explicitly: the thread's current one belongs to whoever set it last (a
# task library, a user's harness), and a lower precision there rounded true answers into wrong ones.
_EXACT = Context(prec=MAX_PREC, rounding=ROUND_HALF_EVEN, Emax=MAX_EMAX, Emin=MIN_EMIN, capitals=1, clamp=0,
                 flags=[], traps=[InvalidOperation])


def _to_decimal(text: str) -> Decimal:
    """Exact value of '1,234', '12.50' or '−3'; raises InvalidOperation if not a finite number."""
    value = _EXACT.create_decimal(text.strip().replace(",", "").replace("\u2212", "-"))
    if not value.is_finite():
        raise InvalidOperation(text)
    return value


def _same_number(a: Decimal, b: Decimal) -> bool:
    """Exact equality under our context (`==` would consult the thread's traps)."""
    return a.compare(b, context=_EXACT).is_zero()


def _canonical_number(text: str) -> str:
    """'1,234' -> '1234', '12.50' -> '12.5', '−3' -> '-3'; raises InvalidOperation if not a number."""
    out = format(_to_decimal(text).normalize(context=_EXACT), "f")
    return "0" if out in ("-0", "0") else out


_GSM_FINAL = re.compile(r"^[-\u2212]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?$")


def _normalize_question(question: str) -> str:
    return " ".join(question.split()).lower()


def load_gsm8k(path: str | Path, heldout_fraction: float = 0.2) -> list[Task]:
    """Tasks of both splits from a JSONL file of GSM8K-style lines; see `load_gsm8k_counted`."""
    return load_gsm8k_counted(path, heldout_fraction)[0]


def load_gsm8k_counted(path: str | Path, heldout_fraction: float = 0.2) -> tuple[list[Task], int]:
    """(tasks of both splits, lines kept once as repeats) from a JSONL file of
    {"question" or "prompt", "answer"} lines, optionally with "task_id" (or "id").

    The answer is GSM8K's "reasoning... #### N", a bare number ("42", "1,234.5") or a JSON number.
    A line's own id is its task id, kept exactly (two lines with one id are refused); without one
    the id is a hash of the normalized question, and a repeated question is kept once (counted).
    The split is a hash of the normalized question, so it does not depend on file order. The
    level is the number of solution lines before `####`, minus one, clamped to 0-3 (0 for a bare
    number). A bad line raises ValueError naming the file and line number.
    """
    path = Path(path)
    tasks: list[Task] = []
    seen: set[str] = set()
    repeats = 0
    for where, lineno, row in iter_jsonl(path, "GSM8K-style JSONL"):
        question = row.get("question", row.get("prompt"))
        solution = row.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: 'question' (or 'prompt') must be a non-empty string")
        own_id = file_id(row, where)
        if isinstance(solution, (int, float)) and not isinstance(solution, bool):
            final, steps = str(solution), 0
        elif isinstance(solution, str) and "####" in solution:
            reasoning, final = solution.rsplit("####", 1)
            final = final.strip()
            steps = sum(1 for s in reasoning.splitlines() if s.strip())
        elif isinstance(solution, str) and _GSM_FINAL.match(solution.strip()):
            final, steps = solution.strip(), 0
        else:
            raise ValueError(f"{where}: 'answer' must be a number or a string ending in '#### <number>'")
        if not _GSM_FINAL.match(final) and not isinstance(solution, (int, float)):
            raise ValueError(f"{where}: final answer {final!r} after '####' is not a number")
        try:
            answer = _canonical_number(final)
        except InvalidOperation:
            raise ValueError(f"{where}: final answer {final!r} is not a number") from None
        key = "gsm:" + _normalize_question(question)
        if own_id is None:
            if key in seen:
                repeats += 1
                continue
            seen.add(key)
        meta: dict[str, Any] = {"key": key, "source": str(path), "line": lineno}
        if own_id is not None:
            meta["source_id"] = own_id
        tasks.append(
            Task(
                task_id=own_id if own_id is not None else task_id_of(key, "math-gsm"),
                domain=DOMAIN,
                split=split_of(key, heldout_fraction),
                level=min(3, max(0, steps - 1)),
                prompt=question.strip(),
                answer=answer,
                meta=meta,
            )
        )
    unique_ids(tasks)
    return tasks, repeats


# ---------------------------------------------------------------- the trusted answer check

# A number not glued to a word or another number: "5-3" ends in 3, not -3; "1,234" is one number.
_NUMBER = re.compile(
    r"(?<![0-9A-Za-z_.])[-\u2212]?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
)
_MARKER = re.compile(r"answer\s*:|####|\\boxed\s*\{", re.IGNORECASE)


def _marker_number(after: str, boxed: bool) -> str | None:
    """The number a marker introduces: in `\\boxed{...}`, or on the first line after it.

    When that line is an equation ("Answer: 3 + 4 = 7") the number after the last '=' wins.
    """
    if boxed:
        segment = after.split("}", 1)[0]
    else:
        segment = after.lstrip().split("\n", 1)[0]
    if "=" in segment:
        found = _NUMBER.search(segment.rsplit("=", 1)[1])
        if found:
            return found.group()
    found = _NUMBER.search(segment)
    return found.group() if found else None


def extract_answer(completion: str) -> tuple[str | None, bool]:
    """(the final answer's number text or None, whether an explicit marker gave it).

    The marker is the last "Answer:" (any case), "#### N" or "\\boxed{N}"; a marker with no
    number after it does not count. Without one, the last number in the completion.
    """
    markers = list(_MARKER.finditer(completion))
    if markers:
        last = markers[-1]
        number = _marker_number(completion[last.end():], boxed=last.group().startswith("\\"))
        if number is not None:
            return number, True
    numbers = _NUMBER.findall(completion)
    return (numbers[-1] if numbers else None), False


def check_answer(expected: str, completion: str, truncated: bool) -> Outcome:
    """Exact numeric check of a completion against the expected answer. Never raises."""
    try:
        if not isinstance(completion, str) or not completion.strip():
            return Outcome(False, 0.0, "empty")
        number, marked = extract_answer(completion)
        flags = ("answer_marker",) if marked else ()
        if not marked and truncated:
            # A number in a completion cut mid-sentence is where it stopped, not an answer.
            return Outcome(False, 0.0, "truncated")
        if number is None:
            return Outcome(False, 0.0, "format_error")
        if _same_number(_to_decimal(number), _to_decimal(str(expected))):  # exact: "12.0" == "12"
            return Outcome(True, 1.0, "ok", flags)
        return Outcome(False, 0.0, "wrong", flags)
    except Exception:
        return Outcome(False, 0.0, "error", ("checker_error",))


# ---------------------------------------------------------------- the domain


class MathDomain:
    """Arithmetic word and expression problems with an exact answer check.

    `source` is "procedural" (an unbounded seeded generator) or the path of a GSM8K-style JSONL
    file. `tasks` returns exactly n procedural tasks (ValueError if the chosen levels run out of
    distinct problems), or up to n from a file. No task repeats within one call.
    """

    name = DOMAIN

    def __init__(
        self,
        levels: Iterable[int] | None = None,
        source: str | Path = "procedural",
        heldout_fraction: float = 0.2,
        heldout_source: str | Path | None = None,
    ) -> None:
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.heldout_fraction = float(heldout_fraction)
        self.source = str(source)
        self.heldout_source = None if heldout_source is None else str(heldout_source)
        self._pool: list[Task] | None = None
        self.dropped = 0  # file tasks `levels` left out (logged as a warning when not 0)
        self.file_notes: tuple[str, ...] = ()
        if self.source == "procedural":
            if self.heldout_source is not None:
                raise ValueError("domain.heldout_source needs a file as domain.source, not 'procedural'")
            levels = tuple(sorted(set(LEVELS if levels is None else levels)))
            if not levels or any(lv not in LEVELS for lv in levels):
                raise ValueError(f"math levels must be a non-empty subset of {LEVELS}, got {levels}")
            self.levels = levels
            return
        if not Path(self.source).is_file():
            raise ValueError(f"math source {self.source!r} is neither 'procedural' nor a file")
        if levels is not None and (not set(levels) or not set(levels) <= set(LEVELS)):
            raise ValueError(f"math levels must be a non-empty subset of {LEVELS}, got {sorted(set(levels))}")
        loaded: FileTasks = load_sources(DOMAIN, load_gsm8k_counted, self.source, self.heldout_source,
                                         levels, heldout_fraction)
        self.levels = LEVELS if levels is None else tuple(sorted(set(levels)))
        self._pool = loaded.tasks
        self.dropped, self.file_notes = loaded.dropped, loaded.notes

    def all_tasks(self) -> list[Task]:
        """Every task of both splits of a file source (levels applied); ValueError for procedural."""
        if self._pool is None:
            raise ValueError("math: a procedural source has no finite task list")
        return list(self._pool)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(f"math:{split}:{seed}:{self.levels}")
        if self._pool is not None:
            pool = [t for t in self._pool if t.split == split]
            rng.shuffle(pool)
            return pool[:n]
        out: list[Task] = []
        seen: set[str] = set()
        budget = 1000 + 200 * n
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(
                    f"math levels {self.levels} ran out of distinct {split} problems "
                    f"after {len(out)} of {n}"
                )
            key = _draw_key(rng.choice(self.levels), rng)
            if key in seen or split_of(key, self.heldout_fraction) != split:
                continue
            seen.add(key)
            out.append(task_from_key(key, self.heldout_fraction))
        return out

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        return check_answer(task.answer, completion, truncated)
