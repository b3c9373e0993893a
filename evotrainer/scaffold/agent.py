"""The `agent` scaffold: a multi-turn tool loop (view, search, edit, run_tests, submit) over a
working copy of a task repo, with every turn kept and every ending a counted outcome.

The policy is any callable `policy(messages) -> text` (a chat list of {"role", "content"}). Each
assistant reply must hold one action: a JSON object with a "tool" key (in a ```json block or
bare), or SEARCH/REPLACE blocks (an edit). The environment reads and edits files with trusted
code confined to the copy; only `run_tests` executes the repo's code, in the sandbox, chrooted in
a root that holds the interpreter, its installed packages and the copy, and nothing else of the
host (no clean snapshot, task file, checkout, /etc or home; sandbox/python_root.py `PACKAGES`).
Endings (`AgentResult.exit_status`):

- submitted: the diff of the copy against the buggy state is graded by the trusted grader;
- format_error: `max_format_errors` replies in a row without a valid action;
- step_limit: `max_steps` actions without a submit;
- timeout: the episode's wall-clock budget ran out;
- stopped: the harness's `stop(turns)` rule cut the trajectory (its reason is kept);
- context_limit: the policy raised ContextLimit (the trajectory no longer fits its context).

Only `submitted` is graded; the others are not successes (kind format_error, truncated, timeout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.api import Outcome, Rollout, Turn
from evotrainer.errors import EvotrainerError, SandboxError
from evotrainer.grade import SweTask, make_patch
from evotrainer.sandbox import run_sandboxed
from evotrainer.sandbox.python_root import PACKAGES, installed_benchmarks
from evotrainer.scaffold.edit import Edit, EditApplyError, EditFormatError, apply_edit, parse_edits, safe_path
from evotrainer.tasks import repos

Policy = Callable[[list[dict[str, str]]], str]
TOOLS = ("view", "search", "edit", "run_tests", "submit")
EXIT_STATUSES = ("submitted", "format_error", "step_limit", "timeout", "stopped", "context_limit")
_env = Environment(loader=FileSystemLoader(str(Path(__file__).with_name("templates"))),
                   undefined=StrictUndefined, keep_trailing_newline=False)


class FormatError(EvotrainerError, ValueError):
    """A reply without exactly one valid action."""


class ContextLimit(EvotrainerError):
    """Raised by a policy that cannot reply because the conversation no longer fits its context."""


@dataclass(frozen=True)
class Action:
    tool: str
    args: dict[str, Any]


def _json_objects(text: str) -> list[dict]:
    decoder = json.JSONDecoder()
    found, i = [], text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found.append(obj)
        i = text.find("{", end)
    return found


def parse_action(text: str) -> Action:
    """The one action of a reply; FormatError says what is wrong."""
    if "<<<<<<< SEARCH" in text or re.search(r"^\s*<{5,9}\s*SEARCH\s*$", text, re.M):
        try:
            edits = parse_edits(text)
        except EditFormatError as exc:
            raise FormatError(str(exc)) from None
        return Action("edit", {"edits": edits})
    calls = [o for o in _json_objects(text) if "tool" in o]
    if not calls:
        raise FormatError('no action: write one JSON object with a "tool" key, e.g. {"tool": "submit"}')
    if len(calls) > 1:
        raise FormatError(f"{len(calls)} actions in one reply; write exactly one")
    call = calls[0]
    tool = call.get("tool")
    if tool not in TOOLS:
        raise FormatError(f"unknown tool {tool!r}; tools: {', '.join(TOOLS)}")
    return Action(tool, {k: v for k, v in call.items() if k != "tool"})


# ---------------------------------------------------------------- the environment


class RepoEnv:
    """A working copy of the task repo at its buggy state, in a temp folder removed by close()."""

    def __init__(self, task: SweTask, test_timeout_s: float = 60.0, max_output: int = 4000) -> None:
        self.clean_root = task.root  # the clean snapshot holds the fix: never visible to the tests
        self.task = repos.buggy_task(task)
        self.test_timeout_s, self.max_output = test_timeout_s, max_output
        self._tmp = Path(tempfile.mkdtemp(prefix="evo-agent-"))
        self.root = self._tmp / "repo"
        shutil.copytree(self.task.root, self.root, symlinks=True,
                        ignore=shutil.ignore_patterns(*repos.SKIP_DIRS, "*.pyc"))
        self._base: dict[str, str | None] = {}  # original text of every file touched so far

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> RepoEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _clip(self, text: str) -> str:
        if len(text) <= self.max_output:
            return text
        half = self.max_output // 2
        return f"{text[:half]}\n[... {len(text) - self.max_output} characters cut ...]\n{text[-half:]}"

    def _file(self, rel: Any) -> Path:
        if not isinstance(rel, str) or not safe_path(rel.removeprefix("./")):
            raise ValueError(f"path {rel!r} is not a relative path inside the repository")
        path = self.root / rel.removeprefix("./")
        real = Path(os.path.realpath(path))
        if self.root.resolve() not in (real, *real.parents):
            raise ValueError(f"path {rel!r} leaves the repository")
        return path

    def _read(self, rel: str) -> str | None:
        path = self._file(rel)
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

    # -- tools (each returns the observation text; ValueError is an error observation)

    def view(self, path: str, start: int = 1, end: int | None = None) -> str:
        text = self._read(path)
        if text is None:
            target = self._file(path)
            if target.is_dir():
                return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()))
            raise ValueError(f"no such file: {path}")
        lines = text.splitlines()
        start = max(1, int(start))
        end = min(len(lines), int(end) if end is not None else start + 99)
        return self._clip("\n".join(f"{i:5d} {lines[i - 1]}" for i in range(start, end + 1)))

    def search(self, pattern: str, path: str = ".") -> str:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("search needs a non-empty `pattern`")
        base = self._file(path) if path not in (".", "") else self.root
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        hits = []
        for f in files:
            if f.is_symlink():
                continue
            for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if pattern in line:
                    hits.append(f"{f.relative_to(self.root).as_posix()}:{n}: {line.strip()}")
        return self._clip("\n".join(hits[:100]) or "no match")

    def edit(self, path: str | None = None, search: str = "", replace: str = "",
             edits: Sequence[Edit] | None = None) -> str:
        todo = list(edits) if edits else [Edit(str(path), search, replace)]
        for e in todo:
            before = self._read(e.path)
            if before is None:
                if e.search.strip():
                    raise ValueError(f"no such file: {e.path}")
                after = e.replace  # an empty SEARCH creates the file
            else:
                try:
                    after = apply_edit(before, e)
                except EditApplyError as exc:
                    raise ValueError(str(exc)) from None
            self._base.setdefault(e.path, before)
            target = self._file(e.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(after, encoding="utf-8")
        return f"edited {', '.join(dict.fromkeys(e.path for e in todo))}"

    def run_tests(self, tests: Sequence[str] | None = None) -> str:
        args = [t for t in (tests or []) if isinstance(t, str) and t and not t.startswith("-")]
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "--rootdir", "{repo}", *args]
        # the snapshot store and other tasks' states (task.hide) hold this task's fix too
        hide = [p for p in (self.clean_root, self.task.root, self.task.task_file, *self.task.hide) if p is not None]
        # The policy's edited code runs here, so it gets a root of its own: the interpreter with its
        # installed packages (pytest, and what the task's repo imports) and the copy, read-write at
        # its own path; no /etc, home, workspace, checkout, other processes' /proc, nor an installed
        # benchmark's data (python_root.py).
        sb = run_sandboxed(cmd, src=self.root, timeout_s=self.test_timeout_s, hide=[*hide, *installed_benchmarks()],
                           env_extra={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, root=PACKAGES)
        if sb.launch_error and not sb.isolation.get("root"):
            # the root could not be built, which nothing the policy writes can cause: every later
            # run would fail the same way, so training stops instead of going on without tests
            raise SandboxError(f"the agent's test run could not enter its root: {sb.launch_error}")
        status = "timed out" if sb.timed_out else f"exit code {sb.returncode}"
        return self._clip(f"{sb.stdout}\n{sb.stderr}".strip() + f"\n({status})")

    def diff(self) -> str:
        changes = {}
        for rel, before in sorted(self._base.items()):
            after = self._read(rel)
            if after != before:
                changes[rel] = (before, after)
        return make_patch(changes) if changes else ""


# ---------------------------------------------------------------- the loop


@dataclass
class AgentResult:
    exit_status: str
    patch: str
    turns: tuple[Turn, ...]
    outcome: Outcome
    steps: int
    duration_s: float
    reason: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def _execute(env: RepoEnv, action: Action) -> str:
    args = action.args
    if action.tool == "view":
        return env.view(args.get("path", ""), args.get("start", 1), args.get("end"))
    if action.tool == "search":
        return env.search(args.get("pattern", ""), args.get("path", "."))
    if action.tool == "edit":
        if "edits" in args:
            return env.edit(edits=args["edits"])
        for name in ("path", "search", "replace"):
            if not isinstance(args.get(name), str):
                raise ValueError(f"edit needs string `{name}`")
        return env.edit(args["path"], args["search"], args["replace"])
    if action.tool == "run_tests":
        tests = args.get("tests")
        return env.run_tests([tests] if isinstance(tests, str) else tests)
    raise ValueError(f"unknown tool {action.tool!r}")


def run_agent(task: SweTask, policy: Policy, *, max_steps: int = 20, time_limit_s: float = 600.0,
              max_format_errors: int = 3, stop: Callable[[Sequence[Turn]], str | None] | None = None,
              test_timeout_s: float = 60.0, grade_timeout_s: float = 60.0, max_output: int = 4000) -> AgentResult:
    """Run one episode of `policy` on `task`; never raises for anything the policy does."""
    from evotrainer.domains.swe import grade_checked  # the domain owns the outcome flags

    started = time.monotonic()
    messages = [{"role": "system", "content": _env.get_template("agent_system.md.j2").render(max_steps=max_steps)},
                {"role": "user", "content": _env.get_template("agent_task.md.j2").render(
                    problem_statement=task.problem_statement.strip())}]
    status, reason, steps, bad = "step_limit", "", 0, 0
    env = RepoEnv(task, test_timeout_s, max_output)
    try:
        while True:
            if steps >= max_steps:
                status = "step_limit"
                break
            if time.monotonic() - started > time_limit_s:
                status = "timeout"
                break
            try:
                reply = policy([dict(m) for m in messages])
            except ContextLimit:
                status = "context_limit"
                break
            reply = reply if isinstance(reply, str) else str(reply)
            messages.append({"role": "assistant", "content": reply})
            steps += 1
            error, output = None, ""
            try:
                action = parse_action(reply)
                bad = 0
                if action.tool == "submit":
                    status = "submitted"
                    break
                output = _execute(env, action)
            except FormatError as exc:
                bad += 1
                error = f"format error: {exc}"
            except (ValueError, TypeError, OSError) as exc:
                error = str(exc)
            if bad >= max_format_errors:
                status = "format_error"
                break
            messages.append({"role": "user", "content": _env.get_template("agent_observation.md.j2").render(
                error=error, output=output, remaining=max_steps - steps)})
            if stop is not None:
                why = stop(tuple(Turn(m["role"], m["content"]) for m in messages))
                if why:
                    status, reason = "stopped", str(why)
                    break
        if time.monotonic() - started > time_limit_s and status != "submitted":
            status = "timeout"
        patch = env.diff()
    finally:
        env.close()
    turns = tuple(Turn(m["role"], m["content"]) for m in messages)
    meta: dict[str, Any] = {}  # the grader's per-test results, for the stored rollout
    if status == "submitted":
        flags = ("submitted",)
        if patch.strip():
            outcome, meta = grade_checked(task, patch, grade_timeout_s, flags)
        else:
            outcome = Outcome(False, 0.0, "empty", flags)
    elif status == "format_error":
        outcome = Outcome(False, 0.0, "format_error", ("format_error_limit",))
    elif status == "timeout":
        outcome = Outcome(False, 0.0, "timeout", ("time_limit",))
    else:
        outcome = Outcome(False, 0.0, "truncated", (status,))
    return AgentResult(status, patch, turns, outcome, steps, time.monotonic() - started, reason, meta)


def to_rollout(task: SweTask, result: AgentResult, group_id: str = "", num_tokens: int = 0,
               meta: Mapping[str, Any] | None = None) -> Rollout:
    """The trajectory as an api.Rollout (prompt = the first user message, completion = the diff)."""
    first_user = next((t.content for t in result.turns if t.role == "user"), "")
    return Rollout(id=uuid.uuid4().hex, task_id=task.instance_id, group_id=group_id, domain="swe",
                   prompt=first_user, completion=result.patch, turns=result.turns, outcome=result.outcome,
                   num_tokens=num_tokens,
                   truncated=result.exit_status in ("step_limit", "timeout", "stopped", "context_limit"),
                   meta={"level": task.level, "exit_status": result.exit_status, "steps": result.steps,
                         "scaffold": "agent", "stop_reason": result.reason, **result.meta, **(meta or {})})


class HFPolicy:
    """A transformers causal LM (e.g. the embedded model) as a policy: chat template, sampled
    reply. Counts the tokens it generates in `num_tokens`."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.num_tokens = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        import torch

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        with torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=self.temperature > 0,
                                      temperature=self.temperature or None,
                                      pad_token_id=self.tokenizer.pad_token_id)
        new = out[0, ids["input_ids"].shape[1]:]
        self.num_tokens += int(new.shape[0])
        return self.tokenizer.decode(new, skip_special_tokens=True)


class ScriptedPolicy:
    """A deterministic policy that replays fixed replies (then repeats the last): for tests and
    demos, in place of a model."""

    def __init__(self, replies: Sequence[str]) -> None:
        if not replies:
            raise ValueError("ScriptedPolicy needs at least one reply")
        self.replies = list(replies)
        self.calls = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return reply


__all__ = ["Action", "AgentResult", "ContextLimit", "FormatError", "HFPolicy", "RepoEnv", "ScriptedPolicy", "EXIT_STATUSES", "TOOLS",
           "parse_action", "run_agent", "to_rollout"]
