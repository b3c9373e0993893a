"""The bfcl domain: single-turn function calling from the Berkeley Function Calling Leaderboard (BFCL v4).

Tasks are the benchmark's own entries, read from the data files that ship in the `bfcl-eval` wheel
(or a folder with the same layout, `source=<dir>`): one task per entry, its id the dataset's id,
its split a hash of that id. The prompt shows the functions' JSON docs and the conversation and
asks for calls in Python syntax, `[f(a=1), g(b="x")]` (BFCL's "prompting" format).

The check (bfcl_parse.py reads, bfcl_check.py judges; nothing runs model text):
- AST categories (simple, multiple, parallel, parallel_multiple and their live_ twins): success
  when the calls and the ground-truth entries pair up one-to-one, each call satisfying its entry;
  score = matched / max(#calls, #entries).
- irrelevance, live_irrelevance: success when the answer makes no call (prose, or `[]`); any call,
  even a malformed one, fails.
- live_relevance (no ground truth): success when the answer makes at least one call and every call
  is one the docs accept (a documented name, required params, no unknown ones, right types).
An empty answer fails everywhere (BFCL would count it as a correct refusal in irrelevance; here it
is `empty`, so silence is never rewarded). A cut-off answer that holds no readable calls is `truncated`.

Ground-truth entries that contradict their own docs (no allowed value of the declared type, a
required parameter missing, an undocumented parameter or function) cannot be answered right; they
are left out and listed in `excluded` (docs/domains-bfcl.md has the measured list).
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.api import Outcome
from evotrainer.domains.base import Task, check_split
from evotrainer.domains.bfcl_check import gold_calls, match_calls, valid_against_docs
from evotrainer.domains.bfcl_parse import parse_calls, render_calls
from evotrainer.domains.math import split_of
from evotrainer.jsonfile import iter_jsonl
from evotrainer.paths import HARNESSES_DIR

DOMAIN = "bfcl"
VERSION_PREFIX = "BFCL_v4"
# Our category name -> (the wheel's file stem, how it is checked, level).
CATEGORIES: dict[str, tuple[str, str, int]] = {
    "simple": ("simple_python", "ast", 0),
    "multiple": ("multiple", "ast", 1),
    "parallel": ("parallel", "ast", 1),
    "parallel_multiple": ("parallel_multiple", "ast", 2),
    "irrelevance": ("irrelevance", "irrelevance", 0),
    "live_simple": ("live_simple", "ast", 0),
    "live_multiple": ("live_multiple", "ast", 1),
    "live_parallel": ("live_parallel", "ast", 1),
    "live_parallel_multiple": ("live_parallel_multiple", "ast", 2),
    "live_irrelevance": ("live_irrelevance", "irrelevance", 0),
    "live_relevance": ("live_relevance", "relevance", 0),
}
_ALIASES = {"simple_python": "simple"}
LEVELS = (0, 1, 2)
SEED_HARNESS = HARNESSES_DIR / "bfcl"
_env = Environment(loader=FileSystemLoader(str(Path(__file__).resolve().parent / "templates")),
                   undefined=StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
_PROMPT = _env.get_template("bfcl_prompt.j2")


def wheel_data_dir() -> Path:
    """The data folder inside the installed bfcl-eval wheel (found without importing the package)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("bfcl needs the bfcl-eval wheel's data: pip install --no-deps bfcl-eval "
                         "(or give domain.source=<folder with BFCL_v4_*.json and possible_answer/>)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def parse_categories(categories: str | Iterable[str] | None) -> tuple[str, ...]:
    if categories is None:
        return tuple(CATEGORIES)
    names = categories.split(",") if isinstance(categories, str) else list(categories)
    out = []
    for raw in names:
        name = _ALIASES.get(str(raw).strip(), str(raw).strip())
        if name not in CATEGORIES:
            raise ValueError(f"bfcl category {raw!r} is not one of {', '.join(CATEGORIES)}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("bfcl categories must name at least one category")
    return tuple(out)


def _read_jsonl(path: Path) -> list[dict]:
    return [row for _, _, row in iter_jsonl(path, "BFCL data")]


def render_prompt(functions: Sequence[Mapping[str, Any]] | str, messages: Sequence[Mapping[str, str]]) -> str:
    """The task text: the instructions, the functions' JSON docs, then the conversation."""
    docs = functions if isinstance(functions, str) else json.dumps(list(functions), ensure_ascii=False)
    return _PROMPT.render(functions=docs, messages=messages)


def load_category(data_dir: Path, category: str, heldout_fraction: float
                  ) -> tuple[list[Task], dict[str, list[str]]]:
    """(the category's answerable tasks, {id: reasons} for ground truth that contradicts its docs)."""
    stem, kind, level = CATEGORIES[category]
    questions = _read_jsonl(data_dir / f"{VERSION_PREFIX}_{stem}.json")
    answers: dict[str, Any] = {}
    if kind == "ast":
        answers = {r["id"]: r["ground_truth"] for r in _read_jsonl(data_dir / "possible_answer" / f"{VERSION_PREFIX}_{stem}.json")}
    tasks, excluded = [], {}
    for row in questions:
        tid, turns, functions = row.get("id"), row.get("question"), row.get("function")
        if not isinstance(tid, str) or not isinstance(turns, list) or len(turns) != 1 or not isinstance(functions, list):
            raise ValueError(f"{stem}: entry {tid!r} is not a single-turn entry with functions")
        docs = {f["name"]: f for f in functions}
        ground_truth = answers.get(tid)
        gold, problems = "", list[str]()
        if kind == "ast":
            if ground_truth is None:
                raise ValueError(f"{stem}: entry {tid!r} has no ground truth")
            calls, problems = gold_calls(ground_truth, docs)
            gold = render_calls(calls)
            if not problems:
                outcome = check_calls(kind, gold, False, docs, ground_truth)
                if not outcome.success:
                    problems = [f"our own gold answer fails: {outcome.kind} {outcome.flags}"]
        elif kind == "irrelevance":
            gold = "None of the given functions can be used for this request."
        if problems:
            excluded[tid] = problems
            continue
        docs_json = json.dumps(functions, ensure_ascii=False)
        tasks.append(Task(task_id=tid, domain=DOMAIN, split=split_of(f"bfcl:{tid}", heldout_fraction), level=level,
                          prompt=render_prompt(docs_json, turns[0]), answer=gold,
                          meta={"category": category, "check": kind, "functions": docs_json,
                                "ground_truth": json.dumps(ground_truth) if ground_truth is not None else "",
                                "n_calls": len(ground_truth or ())}))
    return tasks, excluded


@lru_cache(maxsize=1024)  # more than a run's train and held-out tasks; live docs run to 20 KB
def _decoded(functions: str, ground_truth: str) -> tuple[dict[str, Any], list | None]:
    return {f["name"]: f for f in json.loads(functions)}, (json.loads(ground_truth) if ground_truth else None)


def check_calls(kind: str, completion: str, truncated: bool, docs: Mapping[str, Mapping[str, Any]],
                ground_truth: Sequence[Mapping[str, Any]] | None) -> Outcome:
    """The outcome of one answer under a category's check (see the module docstring)."""
    if not isinstance(completion, str) or not completion.strip():
        return Outcome(False, 0.0, "empty")
    parsed = parse_calls(completion)
    if parsed.error == "dunder":
        return Outcome(False, 0.0, "tampering", parsed.flags)
    error = (parsed.error,) if parsed.error else ()
    if kind == "irrelevance":
        if parsed.calls == []:
            return Outcome(True, 1.0, "ok", ("empty_call_list",))
        if parsed.calls or parsed.shaped:
            return Outcome(False, 0.0, "wrong", ("made_call", *error))
        return Outcome(False, 0.0, "truncated") if truncated else Outcome(True, 1.0, "ok", ("no_call",))
    if parsed.calls is None:
        return Outcome(False, 0.0, "truncated" if truncated else "format_error", error)
    if not parsed.calls:
        return Outcome(False, 0.0, "wrong", ("no_call",))
    if kind == "relevance":
        valid = sum(1 for c in parsed.calls if valid_against_docs(c, docs))
        ok = valid == len(parsed.calls)
        return Outcome(ok, valid / len(parsed.calls), "ok" if ok else "wrong", () if ok else ("invalid_call",))
    if ground_truth is None:
        return Outcome(False, 0.0, "error", ("no_ground_truth",))
    matched = match_calls(parsed.calls, ground_truth, docs)
    n, m = len(ground_truth), len(parsed.calls)
    if matched == n == m:
        return Outcome(True, 1.0, "ok")
    flags = []
    if m != n:
        flags.append("wrong_count")
    if matched < min(m, n):
        flags.append("unmatched_call")
    return Outcome(False, matched / max(n, m), "wrong", tuple(flags))


class BfclDomain:
    """BFCL v4 single-turn function calling: AST-checked calls, irrelevance and relevance.

    Options: `categories` (a list or comma-separated names; default all eleven), `heldout_fraction`
    (the hash split), `levels` (0 simple/irrelevance/relevance, 1 multiple/parallel,
    2 parallel_multiple), `source` ("procedural", the default, means the installed wheel's data;
    else a folder with BFCL_v4_*.json and possible_answer/), `max_prompt_chars` (leave out tasks
    whose prompt is longer: live_multiple's docs run long).
    """

    name = DOMAIN

    def __init__(self, categories: str | Iterable[str] | None = None, heldout_fraction: float = 0.2,
                 levels: Iterable[int] | None = None, source: str | Path = "procedural",
                 max_prompt_chars: int | None = None) -> None:
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.categories = parse_categories(categories)
        self.levels = tuple(sorted(set(levels))) if levels is not None else LEVELS
        if not self.levels or any(lv not in LEVELS for lv in self.levels):
            raise ValueError(f"bfcl levels must be a non-empty subset of {LEVELS}, got {self.levels}")
        data_dir = wheel_data_dir() if str(source) in ("procedural", "bfcl-eval") else Path(source).expanduser()
        if not data_dir.is_dir():
            raise ValueError(f"bfcl source {str(source)!r} is not a folder of BFCL data")
        self.heldout_fraction = float(heldout_fraction)
        self.excluded: dict[str, list[str]] = {}
        self.too_long = 0
        self._tasks: list[Task] = []
        for category in self.categories:
            if CATEGORIES[category][2] not in self.levels:
                continue
            tasks, excluded = load_category(data_dir, category, self.heldout_fraction)
            self.excluded.update(excluded)
            for t in tasks:
                if max_prompt_chars is not None and len(t.prompt) > max_prompt_chars:
                    self.too_long += 1
                else:
                    self._tasks.append(t)

    def all_tasks(self) -> list[Task]:
        """Every task of both splits, in the data's order."""
        return list(self._tasks)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = [t for t in self._tasks if t.split == split]
        random.Random(f"bfcl:{split}:{seed}:{self.categories}:{self.levels}").shuffle(pool)
        return pool[:n]

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        try:
            docs, ground_truth = _decoded(task.meta["functions"], task.meta["ground_truth"])
            return check_calls(task.meta["check"], completion, truncated, docs, ground_truth)
        except Exception:
            return Outcome(False, 0.0, "error", ("checker_error",))
