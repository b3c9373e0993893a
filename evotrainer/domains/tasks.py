"""The tasks domain: your own JSONL task file, checked by a verifier you choose.

A line is `{"task_id", "prompt", "answer"}` with optional `level` (an integer, 0 if absent) and
`meta` (an object). Ids are the file's own, kept exactly. `domain.heldout_source` names a second
file whose tasks are the held-out split (every task of `domain.source` is then train, and an id
in both is refused); without it a hash of the task id puts `heldout_fraction` of them there.

`domain.options.verifier` says what success is (docs/domains-tasks.md has the table):
- `exact`: the completion's final answer (evotrainer/domains/final_answer.py) equals the answer
  once both are tidied and their whitespace runs made single spaces; `case_sensitive: false`
  compares case-folded.
- `numeric`: the math domain's exact decimal check (math.check_answer / extract_answer).
- `math`: symbolic equivalence by math-verify, in a killable worker (symbolic.py).
- `regex`: the answer is a regular expression the final answer must match in full (the `regex`
  package, with a time limit per match; case_sensitive applies).
- `path/file.py:function` or `package.module:function`: the user's function, run in the sandbox
  (user_check.py) and first run on every gold answer, which must pass.

Every failure to load is a ValueError naming `file:line` (or the task), raised before the
trainer stores anything.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains import user_check
from evotrainer.domains.base import Task, check_split
from evotrainer.domains.final_answer import final_answer, tidy
from evotrainer.domains.math import _canonical_number, check_answer, split_of
from evotrainer.domains.symbolic import SymbolicChecker, SymbolicError, SymbolicTimeout
from evotrainer.domains.task_files import file_id, load_sources, unique_ids
from evotrainer.jsonfile import iter_jsonl

DOMAIN = "tasks"
BUILTIN_VERIFIERS = ("exact", "numeric", "math", "regex")
FIELDS = frozenset({"task_id", "prompt", "answer", "level", "meta"})
REGEX_TIMEOUT_S = 1.0
MATH_TIMEOUT_S = 5.0  # per check; math-verify's own default
USER_TIMEOUT_S = 10.0


def load_task_file(path: str | Path, heldout_fraction: float = 0.2) -> tuple[list[Task], int]:
    """(the tasks of one file, 0 repeats: a repeated id is an error here, not a repeat)."""
    path = Path(path)
    tasks: list[Task] = []
    for where, lineno, row in iter_jsonl(path, "task JSONL"):
        unknown = sorted(set(row) - FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} "
                             f"(a line has {', '.join(sorted(FIELDS))}; put the rest in 'meta')")
        task_id = file_id(row, where, ("task_id",))
        if task_id is None:
            raise ValueError(f"{where}: missing 'task_id'")
        prompt, answer = row.get("prompt"), row.get("answer")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string, got {type(prompt).__name__}")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{where}: 'answer' must be a non-empty string (or a number)")
        level = row.get("level", 0)
        if not isinstance(level, int) or isinstance(level, bool):
            raise ValueError(f"{where}: 'level' must be an integer, got {type(level).__name__} {level!r}")
        meta = row.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: 'meta' must be a JSON object, got {type(meta).__name__}")
        tasks.append(Task(task_id, DOMAIN, split_of(f"tasks:{task_id}", heldout_fraction), level, prompt, answer,
                          {**meta, "source": str(path), "line": lineno}))
    unique_ids(tasks)
    return tasks, 0


def _normalized(text: str, case_sensitive: bool) -> str:
    text = " ".join(tidy(text).split())
    return text if case_sensitive else text.casefold()


def _where(t: Task) -> str:
    return f"{t.meta.get('source')}:{t.meta.get('line')}"


class TasksDomain:
    """A JSONL task file with an exact, numeric, symbolic (math-verify), regex or user check."""

    name = DOMAIN

    def __init__(self, source: str | Path = "procedural", heldout_source: str | Path | None = None,
                 levels: Iterable[int] | None = None, verifier: str = "exact", heldout_fraction: float = 0.2,
                 case_sensitive: bool = True, timeout_s: float | None = None, gold_check: int | None = None) -> None:
        if str(source) == "procedural":
            raise ValueError("the tasks domain needs a JSONL task file: set domain.source=PATH")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if not isinstance(verifier, str) or not verifier.strip():
            raise ValueError(f"domain.options.verifier must be a string, got {verifier!r}")
        if not isinstance(case_sensitive, bool):
            raise ValueError(f"domain.options.case_sensitive must be true or false, got {case_sensitive!r}")
        if timeout_s is None:  # a true math-verify answer takes well under a second; a user's check starts Python
            timeout_s = MATH_TIMEOUT_S if verifier == "math" else USER_TIMEOUT_S
        if not timeout_s > 0:
            raise ValueError(f"domain.options.timeout_s must be > 0, got {timeout_s}")
        self.source = str(source)
        self.heldout_source = None if heldout_source is None else str(heldout_source)
        self.verifier = verifier
        self.case_sensitive = case_sensitive
        self.timeout_s = float(timeout_s)
        self.heldout_fraction = float(heldout_fraction)
        # The verifier is resolved before the file is read: an unknown one is the first thing to say.
        self._user: user_check.UserVerifier | None = None
        if verifier not in BUILTIN_VERIFIERS:
            self._user = user_check.resolve(verifier, Path(self.source).parent)
        loaded = load_sources(DOMAIN, load_task_file, self.source, self.heldout_source, levels, heldout_fraction)
        self._pool = loaded.tasks
        self.dropped, self.file_notes = loaded.dropped, loaded.notes
        self._patterns: dict[str, Any] = {}
        self._symbolic: SymbolicChecker | None = None
        self._validate(gold_check)

    def _validate(self, gold_check: int | None) -> None:
        """Every answer is one the verifier can use; ValueError names the first that is not."""
        if self.verifier in ("exact", "regex"):
            for t in self._pool:
                if "\n" in t.answer.strip():
                    raise ValueError(f"{_where(t)}: task {t.task_id!r}: the answer spans lines; the {self.verifier} "
                                     "verifier compares one final-answer line")
        if self.verifier == "numeric":
            for t in self._pool:
                try:
                    _canonical_number(t.answer)
                except Exception:
                    raise ValueError(f"{_where(t)}: task {t.task_id!r}: answer {t.answer!r} is not a number "
                                     "(verifier numeric)") from None
        elif self.verifier == "regex":
            for t in self._pool:
                try:
                    self._patterns[t.task_id] = self._compile(t.answer)
                except ValueError:
                    raise
                except Exception as exc:  # regex.error, and the odd OverflowError or RecursionError
                    raise ValueError(f"{_where(t)}: task {t.task_id!r}: answer {t.answer!r} is not a valid regular "
                                     f"expression: {exc}") from None
        elif self.verifier == "math":
            self._symbolic = SymbolicChecker(timeout_s=self.timeout_s)
            for t in self._pool:
                try:
                    ok = self._symbolic.parses(t.answer)
                except (SymbolicError, SymbolicTimeout) as exc:
                    raise ValueError(f"{_where(t)}: task {t.task_id!r}: math-verify cannot read answer "
                                     f"{t.answer!r}: {exc}") from None
                if not ok:
                    raise ValueError(f"{_where(t)}: task {t.task_id!r}: math-verify finds no expression in answer "
                                     f"{t.answer!r}")
        elif self._user is not None:
            sample = self._pool
            if gold_check is not None and gold_check < len(sample):
                sample = random.Random(f"gold:{self.source}").sample(self._pool, max(1, gold_check))
            user_check.check_gold(self._user, sample, self.timeout_s)

    def _compile(self, answer: str) -> Any:
        try:
            import regex  # transformers depends on it; re has no time limit, and a match runs on model output
        except ImportError:
            raise ValueError("verifier regex needs the regex package: pip install regex") from None

        return regex.compile(answer.strip(), 0 if self.case_sensitive else regex.IGNORECASE)

    def all_tasks(self) -> list[Task]:
        """Every task of both splits (levels applied)."""
        return list(self._pool)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = [t for t in self._pool if t.split == split]
        random.Random(f"tasks:{split}:{seed}").shuffle(pool)
        return pool[:n]

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        try:
            if not isinstance(completion, str) or not completion.strip():
                return Outcome(False, 0.0, "empty")
            if self.verifier == "numeric":
                return check_answer(task.answer, completion, truncated)
            if self._user is not None:
                return self._check_user(task, completion, truncated)
            return self._check_final(task, completion, truncated)
        except Exception:
            return Outcome(False, 0.0, "error", ("checker_error",))

    def _check_user(self, task: Task, completion: str, truncated: bool) -> Outcome:
        assert self._user is not None
        replies, how = user_check.run(self._user, [user_check.item(task, completion)], self.timeout_s)
        if how == "timeout":
            return Outcome(False, 0.0, "timeout", ("verifier_timeout",))
        if not replies:
            return Outcome(False, 0.0, "error", ("sandbox_error",))
        out = user_check.outcome(replies[0])
        if truncated and out.kind == "wrong":
            return Outcome(False, out.score, "truncated", out.flags)
        return out

    def _check_final(self, task: Task, completion: str, truncated: bool) -> Outcome:
        final = final_answer(completion)
        flags: tuple[str, ...] = ("answer_marker",) if final.marked else ()
        if not final.marked and truncated:
            return Outcome(False, 0.0, "truncated")  # the last line of a cut completion is where it stopped
        if final.too_long:
            return Outcome(False, 0.0, "wrong", (*flags, "answer_too_long"))
        if final.text is None or not final.text:
            return Outcome(False, 0.0, "format_error", flags)
        if self.verifier == "exact":
            same = _normalized(final.text, self.case_sensitive) == _normalized(task.answer, self.case_sensitive)
        elif self.verifier == "regex":
            try:
                pattern = self._patterns.get(task.task_id) or self._compile(task.answer)
                same = pattern.fullmatch(final.text, timeout=REGEX_TIMEOUT_S) is not None
            except TimeoutError:
                return Outcome(False, 0.0, "timeout", (*flags, "regex_timeout"))
        else:
            assert self._symbolic is not None
            try:
                equal = self._symbolic.equal(task.answer, final.text)
            except SymbolicTimeout:
                return Outcome(False, 0.0, "timeout", (*flags, "verifier_timeout"))
            if equal is None:
                return Outcome(False, 0.0, "format_error", flags)
            same = equal
        return Outcome(True, 1.0, "ok", flags) if same else Outcome(False, 0.0, "wrong", flags)

