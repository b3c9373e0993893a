"""The code domain: write one Python function; hidden tests, judged outside the solution's sandbox, decide.

Tasks come from a seeded generator (levels 0-2: simple arithmetic and string functions, list
processing, small algorithms) or from MBPP/HumanEval-style JSONL. As in math.py, a canonical key
(`L1:keep_above:{"t": 7}`, or the normalized problem text of a JSONL line) alone fixes the task
id, the text, the hidden tests and the split, so a held-out problem is never drawn for train.

Generated problems carry a reference solution; the hidden asserts are that reference's own
answers on inputs drawn from the key, so the reference passes them by construction (a test checks
it in the sandbox anyway).

The check: code is taken from the last ```python block that defines the function (or the raw
text; for HumanEval it runs after the prompt, as that harness does). The solution's sandboxed
process only answers the tests' calls with plain data; the trusted side compares (code_check.py).
Code that reaches for frames or the interpreter's objects (`sys._getframe`, `gc`, `__main__`) is
`tampering`: a clear name for a lint, not the boundary.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains.base import Task, check_split
from evotrainer.domains.code_check import run_hidden_tests
from evotrainer.domains.code_problems import _BY_NAME, FAMILIES, Family  # noqa: F401  (re-exported)
from evotrainer.domains.math import split_of, task_id_of
from evotrainer.domains.task_files import file_id, load_sources, unique_ids
from evotrainer.jsonfile import iter_jsonl

LEVELS = (0, 1, 2)
DOMAIN = "code"
TIMEOUT_S = 10.0



def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _call_text(entry: str, args: tuple) -> str:
    return f"{entry}({', '.join(repr(a) for a in args)})"


def _run_reference(code: str, entry: str, args: tuple) -> Any:
    """The reference's answer (trusted code we generated, run in-process, on copies of the args)."""
    namespace: dict[str, Any] = {}
    exec(compile(code, f"<reference {entry}>", "exec"), namespace)
    return namespace[entry](*copy.deepcopy(args))


def task_from_key(key: str, heldout_fraction: float) -> Task:
    """The generated task a canonical key stands for: text, hidden tests, id and split all follow."""
    level_part, name, params_json = key.split(":", 2)
    family = _BY_NAME[name]
    params = json.loads(params_json)
    rng = random.Random(_digest(key))
    entry, args, text, reference, inputs = family.make(params, rng)
    tests = tuple(f"assert {_call_text(entry, a)} == {_run_reference(reference, entry, a)!r}" for a in inputs)
    example = inputs[-1]
    prompt = (f"Write a Python function `{entry}({args})` that {text}.\n"
              f"Example: `{_call_text(entry, example)}` returns `{_run_reference(reference, entry, example)!r}`.")
    return Task(task_id=task_id_of(key, f"code-L{family.level}"), domain=DOMAIN, split=split_of(key, heldout_fraction),
                level=family.level, prompt=prompt, answer=reference,
                meta={"key": key, "source": "procedural", "entry_point": entry, "tests": tests, "setup": ""})


def draw_key(level: int, rng: random.Random) -> str:
    family = rng.choice([f for f in FAMILIES if f.level == level])
    return f"L{level}:{family.name}:{json.dumps(family.draw(rng), sort_keys=True)}"


# ---------------------------------------------------------------- MBPP / HumanEval JSONL

_ASSERT_CALL = re.compile(r"assert\s+(?:not\s+)?\(?\s*(?:\w+\.isclose\(\s*|set\(\s*)?([A-Za-z_]\w*)\s*\(")


def _def_line(code: str, entry: str) -> str | None:
    m = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(([^)]*)\)", code, re.M)
    return m.group(1).strip() if m else None


def _level_of(code: str) -> int:
    lines = sum(1 for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#"))
    return 0 if lines <= 3 else 1 if lines <= 8 else 2


def load_jsonl(path: str | Path, heldout_fraction: float = 0.2) -> list[Task]:
    """Tasks of both splits from MBPP or HumanEval JSONL; see `load_jsonl_counted`."""
    return load_jsonl_counted(path, heldout_fraction)[0]


def load_jsonl_counted(path: str | Path, heldout_fraction: float = 0.2) -> tuple[list[Task], int]:
    """(tasks of both splits, lines kept once as repeats) from MBPP lines ({text|prompt, code,
    test_list[, test_setup_code]}) or HumanEval lines ({prompt, canonical_solution, test,
    entry_point}); ValueError names file:line.

    A line's `task_id` (MBPP's number, HumanEval's "HumanEval/0") is its task id, kept exactly;
    two lines with one id are refused. Without one the id is a hash of the problem text, and a
    repeated problem is kept once (counted). The split is a hash of the problem text either way.
    """
    path = Path(path)
    tasks: list[Task] = []
    seen: set[str] = set()
    repeats = 0
    for where, lineno, row in iter_jsonl(path, "code JSONL"):
        if "test_list" in row:
            task = _mbpp_task(row, where, heldout_fraction)
        elif "entry_point" in row and "test" in row:
            task = _humaneval_task(row, where, heldout_fraction)
        else:
            raise ValueError(f"{where}: neither MBPP (test_list) nor HumanEval (test + entry_point) fields")
        own_id = file_id(row, where, ("task_id",))
        meta = {**task.meta, "source": str(path), "line": lineno}
        if own_id is None:
            if task.meta["key"] in seen:
                repeats += 1
                continue
            seen.add(task.meta["key"])
        else:
            meta["source_id"] = own_id
        tasks.append(Task(own_id if own_id is not None else task.task_id, task.domain, task.split, task.level,
                          task.prompt, task.answer, meta))
    unique_ids(tasks)
    return tasks, repeats


def _mbpp_task(row: dict, where: str, heldout_fraction: float) -> Task:
    text = row.get("text", row.get("prompt"))
    code, tests = row.get("code"), row.get("test_list")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: 'text' (or 'prompt') must be a non-empty string")
    if not isinstance(code, str) or not code.strip():
        raise ValueError(f"{where}: 'code' must be a non-empty string")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"{where}: 'test_list' must be a non-empty list of assert strings")
    m = _ASSERT_CALL.search(tests[0])
    entry = m.group(1) if m and _def_line(code, m.group(1)) is not None else None
    if entry is None:
        d = re.search(r"^def\s+([A-Za-z_]\w*)", code, re.M)
        if not d:
            raise ValueError(f"{where}: cannot find the function the tests call")
        entry = d.group(1)
    key = "mbpp:" + " ".join(text.split()).lower()
    prompt = f"{text.strip()}\nWrite a Python function `{entry}({_def_line(code, entry)})`."
    return Task(task_id_of(key, "code-mbpp"), DOMAIN, split_of(key, heldout_fraction), _level_of(code), prompt,
                code.replace("\r\n", "\n"), {"key": key, "entry_point": entry, "tests": tuple(tests),
                                              "setup": row.get("test_setup_code") or ""})


def _humaneval_task(row: dict, where: str, heldout_fraction: float) -> Task:
    stub, body, test, entry = row.get("prompt"), row.get("canonical_solution", ""), row.get("test"), row.get("entry_point")
    for name, value in (("prompt", stub), ("test", test), ("entry_point", entry)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: {name!r} must be a non-empty string")
    if not isinstance(body, str):
        raise ValueError(f"{where}: 'canonical_solution' must be a string")
    key = "humaneval:" + " ".join(stub.split())
    prompt = f"Complete the Python function `{entry}`:\n\n{stub.rstrip()}\n"
    return Task(task_id_of(key, "code-he"), DOMAIN, split_of(key, heldout_fraction), _level_of(body), prompt,
                stub + body, {"key": key, "entry_point": entry, "tests": (f"{test}\n\ncheck({entry})\n",), "setup": "",
                              "prefix": stub})


# ---------------------------------------------------------------- the trusted check

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S | re.I)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*)\Z", re.S | re.I)
_CODE_START = re.compile(r"^(?:def |class |import |from |@)", re.M)
# Reaching into the runner (its frames, the interpreter's objects) instead of solving the task.
_SUSPICIOUS = re.compile(r"\b_getframe\b|\bf_back\b|\bf_locals\b|\bf_globals\b|\btb_frame\b|\bco_consts\b"
                         r"|inspect\.(?:stack|currentframe|trace)|\bgc\.get_objects\b|\bget_referrers\b|\bos\._exit\b"
                         r"|EVO_RESULT|sys\.stdin|import\s+__main__|modules\s*\[\s*['\"]__main__")

def extract_code(completion: str, entry: str | None = None) -> tuple[str | None, bool]:
    """(the code in a completion or None, whether it ended properly).

    The last closed ```python block that defines `entry`, else the last closed block; else an
    unclosed block at the end (ended=False); else raw text from its first def/import line, cut to
    the longest prefix that compiles.
    """
    blocks = _FENCE.findall(completion)
    if blocks:
        defining = [b for b in blocks if entry and re.search(rf"^\s*def\s+{re.escape(entry)}\b", b, re.M)]
        return (defining or blocks)[-1], True
    tail = _OPEN_FENCE.search(completion)
    if tail:
        return tail.group(1), False
    start = _CODE_START.search(completion)
    if not start:
        return None, True
    lines = completion[start.start():].split("\n")
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end])
        try:
            compile(candidate, "solution.py", "exec")
            return candidate + "\n", True
        except (SyntaxError, ValueError):
            continue
    return "\n".join(lines), False


def _compiles(source: str) -> bool:
    try:
        compile(source, "solution.py", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def check_code(task: Task, completion: str, truncated: bool, *, timeout_s: float = TIMEOUT_S) -> Outcome:
    """Run the hidden tests on the completion's code in the sandbox. Never raises."""
    try:
        if not isinstance(completion, str) or not completion.strip():
            return Outcome(False, 0.0, "empty")
        entry = task.meta.get("entry_point")
        prefix = task.meta.get("prefix", "")  # HumanEval: the prompt runs first, as its harness does
        if prefix and "```" not in completion and _compiles(prefix + completion):
            code, ended = completion, True  # a plain continuation of the prompt, as HumanEval's own samples are
        else:
            code, ended = extract_code(completion, entry)
        if code is None or not code.strip():
            return Outcome(False, 0.0, "truncated" if truncated else "format_error")
        try:
            compile(prefix + code, "solution.py", "exec")
        except (SyntaxError, ValueError):
            if truncated or not ended:
                return Outcome(False, 0.0, "truncated")
            return Outcome(False, 0.0, "wrong", ("syntax_error",))
        flags: list[str] = []
        if entry and not re.search(rf"^\s*def\s+{re.escape(entry)}\b", prefix + code, re.M):
            flags.append("missing_entry_point")
        if _SUSPICIOUS.search(code):  # lint with a clear name; the boundary is code_check.py
            return Outcome(False, 0.0, "tampering", ("suspicious_code",))
        return run_hidden_tests(code, list(task.meta["tests"]), entry=entry or "", setup=task.meta.get("setup", ""),
                                prefix=prefix, reference=task.answer, timeout_s=timeout_s, flags=flags,
                                hide=_task_files(task))
    except Exception:
        return Outcome(False, 0.0, "error", ("checker_error",))


def _task_files(task: Task) -> list[str]:
    """The file a task came from holds its expected answers: the solution must not read it."""
    source = task.meta.get("source")
    return [source] if isinstance(source, str) and source != "procedural" and Path(source).is_file() else []


# ---------------------------------------------------------------- the domain


class CodeDomain:
    """Function-writing problems with hidden tests, checked in the sandbox.

    `source` is "procedural" (the seeded generator) or the path of an MBPP/HumanEval-style JSONL
    file. Same contract as MathDomain: exactly n procedural tasks (ValueError if the chosen levels
    run out of distinct problems), up to n from a file, no repeats within one call.
    """

    name = DOMAIN

    def __init__(self, levels: Iterable[int] | None = None, source: str | Path = "procedural",
                 heldout_fraction: float = 0.2, timeout_s: float = TIMEOUT_S,
                 heldout_source: str | Path | None = None) -> None:
        chosen = tuple(sorted(set(LEVELS if levels is None else levels)))
        if not chosen or any(lv not in LEVELS for lv in chosen):
            raise ValueError(f"code levels must be a non-empty subset of {LEVELS}, got {chosen}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.levels = chosen
        self.heldout_fraction = float(heldout_fraction)
        self.timeout_s = float(timeout_s)
        self.source = str(source)
        self.heldout_source = None if heldout_source is None else str(heldout_source)
        self._pool: list[Task] | None = None
        self.dropped = 0  # file tasks `levels` left out (logged as a warning when not 0)
        self.file_notes: tuple[str, ...] = ()
        if self.source == "procedural":
            if self.heldout_source is not None:
                raise ValueError("domain.heldout_source needs a file as domain.source, not 'procedural'")
            return
        if not Path(self.source).is_file():
            raise ValueError(f"code source {self.source!r} is neither 'procedural' nor a file")
        loaded = load_sources(DOMAIN, load_jsonl_counted, self.source, self.heldout_source, levels,
                              heldout_fraction)
        self._pool = loaded.tasks
        self.dropped, self.file_notes = loaded.dropped, loaded.notes

    def all_tasks(self) -> list[Task]:
        """Every task of both splits of a file source (levels applied); ValueError for procedural."""
        if self._pool is None:
            raise ValueError("code: a procedural source has no finite task list")
        return list(self._pool)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(f"code:{split}:{seed}:{self.levels}")
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
                raise ValueError(f"code levels {self.levels} ran out of distinct {split} problems "
                                 f"after {len(out)} of {n}")
            key = draw_key(rng.choice(self.levels), rng)
            if key in seen or split_of(key, self.heldout_fraction) != split:
                continue
            seen.add(key)
            out.append(task_from_key(key, self.heldout_fraction))
        return out

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        return check_code(task, completion, truncated, timeout_s=self.timeout_s)
