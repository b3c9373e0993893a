"""The swe domain: repository bug-fix tasks (the bundled pack or any SWE-bench JSONL), graded by
running the hidden tests in the sandbox with the trusted grader.

With the `edit` scaffold a task's prompt is the issue plus an excerpt of the relevant file (the
file the gold patch touches, around the bug: the enclosing function at levels 0-1, a wider window
at level 2). `check` parses the SEARCH/REPLACE blocks, turns them into a diff against the buggy
files and grades it. The split is a hash of the instance id, so a held-out task is never trained on.

Outcome flags beyond the grader's: `format_ok` (the blocks parsed), `f2p_all` / `f2p_partial`
(all / some but not all FAIL_TO_PASS tests pass), `p2p_broken` (a PASS_TO_PASS test fails), and
for edits that do not apply the reason (`search_not_found`, `missing_file`, `unsafe_path`, ...).
"""

from __future__ import annotations

import ast
import hashlib
import random
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.api import Outcome
from evotrainer.domains.base import Task, check_split
from evotrainer.grade import GradeResult, SweTask, is_test_path, load_tasks, make_patch, parse_patch
from evotrainer.grade import grade as grade_patch
from evotrainer.scaffold import SCAFFOLDS
from evotrainer.scaffold.edit import EditApplyError, EditFormatError, edits_to_patch, parse_edits, safe_path
from evotrainer.scaffold.line import LineFormatError, parse_line_answer, replace_line
from evotrainer.tasks import PACK_DIR, pack_files, repos

DOMAIN = "swe"
LEVELS = (0, 1, 2)
_TEMPLATES = Path(__file__).resolve().parent.parent / "scaffold" / "templates"


def split_of(instance_id: str, heldout_fraction: float) -> str:
    bucket = int(hashlib.sha256(f"swe:{instance_id}".encode()).hexdigest()[8:16], 16) / 2**32
    return "heldout" if bucket < heldout_fraction else "train"


def load_source(source: str | Path) -> list[SweTask]:
    """Tasks from "pack" (the bundled pack), a pack-like folder of *.jsonl, or one JSONL file."""
    if str(source) in ("pack", "procedural"):  # "procedural" is DomainConfig's default spelling
        folder: Path | None = PACK_DIR
    else:
        path = Path(source).expanduser()
        if path.is_file():
            return load_tasks(path)
        if not path.is_dir():
            raise ValueError(f"swe source {str(source)!r} is neither 'pack', a task file nor a folder of them")
        folder = path
    files = pack_files(folder)
    if not files:
        raise ValueError(f"swe source {str(folder)!r} holds no *.jsonl task file")
    return [t for f in files for t in load_tasks(f)]


# ---------------------------------------------------------------- what the edit prompt shows


def focus(task: SweTask) -> tuple[str, int]:
    """(the file to show, the line to center on): the mutation's, else the gold patch's first hunk
    in a non-test file."""
    m = task.extra.get("mutation")
    if isinstance(m, dict) and isinstance(m.get("path"), str) and isinstance(m.get("line"), int):
        return m["path"], m["line"]
    files = parse_patch(task.patch)
    if not files:
        raise ValueError(f"{task.instance_id}: the gold patch changes no file")
    fp = next((f for f in files if f.old_path and not is_test_path(f.old_path)), files[0])
    hunk = fp.hunks[0]
    before = 0  # old-side lines ahead of the first change
    for line in hunk.lines:
        if line[:1] in "-+":
            break
        before += 1
    return fp.old_path or fp.new_path, hunk.old_start + before


def _enclosing(tree: ast.AST, line: int) -> tuple[int, int] | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if best is None or start >= best[0]:
                best = (start, node.end_lineno)
    return best


def excerpt_window(text: str, center: int, level: int, max_lines: int, key: str) -> tuple[int, int]:
    """1-based inclusive (start, end) of the lines to show."""
    total = max(1, len(text.splitlines()))
    center = min(max(1, center), total)
    try:
        span = _enclosing(ast.parse(text), center)
    except (SyntaxError, ValueError):
        span = None
    if level >= 2:
        width = 2 * max_lines
        lead = random.Random(key).randint(width // 5, 4 * width // 5)  # the bug is not always mid-window
        start = center - lead
    elif span and span[1] - span[0] + 1 <= max_lines:
        return span
    else:
        width = max_lines
        start = max(span[0], center - width // 2) if span else center - width // 2
    start = min(max(1, start), max(1, total - width + 1))
    return start, min(total, start + width - 1)


_env = Environment(loader=FileSystemLoader(str(_TEMPLATES)), undefined=StrictUndefined, keep_trailing_newline=True)


def edit_prompt(task: SweTask, max_lines: int = 40) -> tuple[str, dict[str, Any]]:
    """The trusted prompt body of the edit scaffold, and what it showed."""
    path, center = focus(task)
    text = repos.read_buggy(task, path)
    if text is None:
        raise ValueError(f"{task.instance_id}: {path} is not in the repo")
    start, end = excerpt_window(text, center, task.level, max_lines, task.instance_id)
    lines = text.splitlines()
    body = _env.get_template("edit_task.md.j2").render(
        problem_statement=task.problem_statement.strip(), path=path, start=start, end=end, total=len(lines),
        excerpt="\n".join(lines[start - 1:end]))
    return body, {"path": path, "start": start, "end": end}


LINE_CONTEXT = (3, 2)  # lines shown before and after the buggy one (the line scaffold)


def line_prompt(task: SweTask) -> tuple[str, dict[str, Any]]:
    """The trusted prompt body of the line scaffold (the code around the bug and the line it is
    on), and what it showed: {"path", "line", "start", "end"}."""
    path, line = focus(task)
    text = repos.read_buggy(task, path)
    if text is None:
        raise ValueError(f"{task.instance_id}: {path} is not in the repo")
    lines = text.splitlines()
    line = min(max(1, line), len(lines))
    start, end = max(1, line - LINE_CONTEXT[0]), min(len(lines), line + LINE_CONTEXT[1])
    body = _env.get_template("line_task.md.j2").render(
        problem_statement=task.problem_statement.strip(), path=path, start=start, end=end, total=len(lines),
        excerpt="\n".join(lines[start - 1:end]), line=line, buggy=lines[line - 1].strip())
    return body, {"path": path, "line": line, "start": start, "end": end}


# ---------------------------------------------------------------- outcomes


def _test_flags(task: SweTask, result: GradeResult) -> tuple[str, ...]:
    f2p = [result.per_test.get(t) == "passed" for t in task.FAIL_TO_PASS]
    p2p = [result.per_test.get(t) == "passed" for t in task.PASS_TO_PASS]
    flags = []
    if f2p and all(f2p):
        flags.append("f2p_all")
    elif any(f2p):
        flags.append("f2p_partial")
    if not all(p2p):
        flags.append("p2p_broken")
    return tuple(flags)


PER_TEST_LIMIT = 200  # tests kept per rollout; a real suite can list thousands of PASS_TO_PASS
TEST_ID_CHARS = 300


def per_test_meta(task: SweTask, per_test: Mapping[str, str]) -> dict[str, Any]:
    """The grader's per-test statuses for a rollout's meta, bounded: {"per_test": {test id:
    status}} with FAIL_TO_PASS first, then the other tests that did not pass, then passing ones;
    `per_test_omitted` counts what the bound left out."""
    f2p = set(task.FAIL_TO_PASS)
    ordered = sorted(per_test.items(), key=lambda kv: (kv[0] not in f2p, kv[1] == "passed"))
    kept = {str(name)[:TEST_ID_CHARS]: str(status) for name, status in ordered[:PER_TEST_LIMIT]}
    out: dict[str, Any] = {"per_test": kept} if kept else {}
    if len(ordered) > PER_TEST_LIMIT:
        out["per_test_omitted"] = len(ordered) - PER_TEST_LIMIT
    return out


def grade_checked(task: SweTask, patch: str, timeout_s: float,
                  extra_flags: Iterable[str] = ()) -> tuple[Outcome, dict[str, Any]]:
    """Grade a diff on the task's buggy state with the trusted grader; the outcome with the
    test-tier flags, and the rollout meta that records the per-test results (per_test_meta)."""
    result = grade_patch(task, patch, timeout_s=timeout_s)  # the grader applies the task's bug_patch itself
    o = result.outcome
    flags = tuple(extra_flags) + tuple(o.flags)
    if o.kind in ("ok", "wrong", "timeout"):
        flags += _test_flags(task, result)
    return Outcome(o.success, o.score, o.kind, tuple(dict.fromkeys(flags))), per_test_meta(task, result.per_test)


def grade_outcome(task: SweTask, patch: str, timeout_s: float, extra_flags: Iterable[str] = ()) -> Outcome:
    """grade_checked without the meta."""
    return grade_checked(task, patch, timeout_s, extra_flags)[0]


def check_edit(task: SweTask, completion: str, truncated: bool, path: str | None,
               timeout_s: float = 60.0, near: int | None = None) -> Outcome:
    """The verified outcome of one edit-scaffold completion. Never raises. `path`: the file the
    prompt showed (for blocks without a path line); `near`: a line of the excerpt shown there
    (where a SEARCH text that occurs several times is taken)."""
    return check_edit_meta(task, completion, truncated, path, timeout_s, near)[0]


def check_edit_meta(task: SweTask, completion: str, truncated: bool, path: str | None,
                    timeout_s: float = 60.0, near: int | None = None) -> tuple[Outcome, dict[str, Any]]:
    """check_edit, plus the rollout meta of a graded patch (the grader's per-test results)."""
    try:
        if not isinstance(completion, str) or not completion.strip():
            return Outcome(False, 0.0, "empty"), {}
        try:
            edits = parse_edits(completion, default_path=path)
        except EditFormatError:
            return Outcome(False, 0.0, "truncated" if truncated else "format_error"), {}
        try:
            patch = edits_to_patch(lambda rel: repos.read_buggy(task, rel) if safe_path(rel) else None, edits,
                                   {path: near} if path and near else None)
        except EditApplyError as exc:
            flags = ("format_ok", exc.reason) + (("tampering",) if exc.reason == "unsafe_path" else ())
            return Outcome(False, 0.0, "patch_failed", flags), {}
        if not patch.strip():
            return Outcome(False, 0.0, "empty", ("format_ok", "no_change")), {}
        return grade_checked(task, patch, timeout_s, ("format_ok",))
    except Exception:
        return Outcome(False, 0.0, "error", ("checker_error",)), {}


def check_line_meta(task: SweTask, completion: str, truncated: bool, path: str,
                    line: int, timeout_s: float = 60.0) -> tuple[Outcome, dict[str, Any]]:
    """The verified outcome of one line-scaffold completion (the named line replaced by the
    answer's code block), and the graded patch's rollout meta. Never raises."""
    try:
        if not isinstance(completion, str) or not completion.strip():
            return Outcome(False, 0.0, "empty"), {}
        try:
            new = parse_line_answer(completion)
        except LineFormatError:
            return Outcome(False, 0.0, "truncated" if truncated else "format_error"), {}
        before = repos.read_buggy(task, path)
        if before is None:
            return Outcome(False, 0.0, "patch_failed", ("format_ok", "missing_file")), {}
        after = replace_line(before, line, new)
        if after == before:
            return Outcome(False, 0.0, "empty", ("format_ok", "no_change")), {}
        return grade_checked(task, make_patch({path: (before, after)}), timeout_s, ("format_ok",))
    except Exception:
        return Outcome(False, 0.0, "error", ("checker_error",)), {}


# ---------------------------------------------------------------- the domain


class SweDomain:
    """Repository bug-fix tasks with a sandboxed test check.

    `source`: "pack" (the bundled pack), a task JSONL, or a folder of them. `scaffold`: "edit"
    (single turn, what TRL training uses) or "agent" (multi-turn; `evotrainer.scaffold.agent`
    runs it, and `check` then grades a completion that is already a diff). `tasks` returns up
    to n tasks of the chosen levels in a seeded order.
    """

    name = DOMAIN

    def __init__(self, levels: Iterable[int] = LEVELS, source: str | Path = "pack", heldout_fraction: float = 0.2,
                 scaffold: str = "edit", excerpt_lines: int = 40, grade_timeout_s: float = 60.0) -> None:
        levels = tuple(sorted(set(levels)))
        if not levels or any(lv not in LEVELS for lv in levels):
            raise ValueError(f"swe levels must be a non-empty subset of {LEVELS}, got {levels}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if scaffold not in SCAFFOLDS:
            raise ValueError(f"swe scaffold must be one of {', '.join(SCAFFOLDS)}, got {scaffold!r}")
        self.levels, self.source, self.scaffold = levels, str(source), scaffold
        self.heldout_fraction, self.excerpt_lines, self.grade_timeout_s = heldout_fraction, excerpt_lines, grade_timeout_s
        self._swe = {t.instance_id: t for t in load_source(source) if t.level in levels}
        if not self._swe:
            raise ValueError(f"swe source {self.source!r} holds no task of levels {levels}")

    def swe_task(self, task: Task | str) -> SweTask:
        return self._swe[task if isinstance(task, str) else task.task_id]

    @cache  # noqa: B019 -- one domain per session; the prompts are pure
    def _task(self, instance_id: str) -> Task:
        swe = self._swe[instance_id]
        if self.scaffold == "edit":
            prompt, shown = edit_prompt(swe, self.excerpt_lines)
        elif self.scaffold == "line":
            prompt, shown = line_prompt(swe)
        else:
            prompt, shown = swe.problem_statement.strip(), {}
        return Task(task_id=instance_id, domain=DOMAIN, split=split_of(instance_id, self.heldout_fraction),
                    level=swe.level, prompt=prompt, answer=swe.patch,
                    meta={"source": self.source, "scaffold": self.scaffold, **shown})

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        ids = sorted(i for i in self._swe if split_of(i, self.heldout_fraction) == split)
        random.Random(f"swe:{split}:{seed}:{self.levels}").shuffle(ids)
        return [self._task(i) for i in ids[:n]]

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        return self.check_meta(task, completion, truncated)[0]

    def check_meta(self, task: Task, completion: str, truncated: bool) -> tuple[Outcome, dict[str, Any]]:
        """check, plus what the trusted check adds to the rollout's meta (the grader's per-test
        results); the recorder stores it with the rollout."""
        try:
            swe = self.swe_task(task)
        except KeyError:
            return Outcome(False, 0.0, "error", ("unknown_task",)), {}
        if self.scaffold == "agent":  # the agent loop already produced a diff (see scaffold/agent.py)
            if not completion.strip():
                return Outcome(False, 0.0, "empty"), {}
            try:
                return grade_checked(swe, completion, self.grade_timeout_s)
            except Exception:
                return Outcome(False, 0.0, "error", ("checker_error",)), {}
        meta = task.meta
        if self.scaffold == "line":
            return check_line_meta(swe, completion, truncated, meta["path"], meta["line"], self.grade_timeout_s)
        near = (meta["start"] + meta["end"]) // 2 if "start" in meta and "end" in meta else None
        return check_edit_meta(swe, completion, truncated, meta.get("path"), self.grade_timeout_s, near)
