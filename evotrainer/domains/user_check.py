"""A user's verifier function, `module:function`, run in the execution sandbox (evotrainer/sandbox).

The function is `check(completion: str, answer: str, task: dict) -> bool | float`. It reads model
output, and it is the user's code, so it runs in a sandboxed `python -I` process, never in the
trainer's: its module file is copied into the job's folder and imported there; the completion,
the gold answer and the task (task_id, split, level, prompt, answer, meta) go in on stdin; what it
returns comes back as JSON and is validated here. True/False is success; a number in [0, 1] is
the score, success when it is 1. Anything else (None, a string, NaN, 2.0) is outcome kind
`error` with the flag `verifier_bad_return`; a function that raises gives `error` with
`verifier_raised`; one that runs past the limit gives `timeout`.

It runs in the harness workers' root (sandbox/python_root.py PACKAGES): the interpreter with its
installed packages and the system's libraries, and no /etc, home folder, workspace or repository
checkout, so a verifier that runs the completion's code lets it read nothing of the host's files.

The module is one self-contained file (it may import installed packages, not its neighbours):
`path/to/file.py:function` (a relative path is looked for next to the task file, then in the
working directory) or `package.module:function`, found on sys.path without importing it here.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome

_SPEC = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_]\w*)$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_MODULE_NAME = "user_verifier"

_RUNNER = r'''
import importlib.util, json, math, os, signal, sys


class ItemTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise ItemTimeout()


def _main():
    signal.signal(signal.SIGALRM, _alarm)
    out = os.environ.pop("EVO_RESULT")
    data = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    spec = importlib.util.spec_from_file_location("user_verifier", data["path"])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["user_verifier"] = mod
    with open(out, "w") as f:
        try:
            spec.loader.exec_module(mod)
            fn = getattr(mod, data["function"])
        except BaseException as e:
            f.write(json.dumps(["load", "%s: %s" % (type(e).__name__, str(e)[:300])]) + "\n")
            return
        for item in data["items"]:
            try:
                signal.setitimer(signal.ITIMER_REAL, data["item_s"])
                try:
                    value = fn(item["completion"], item["answer"], item["task"])
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
                    line = ["ok", value]
                else:
                    line = ["bad", type(value).__name__]
            except ItemTimeout:
                line = ["timeout", data["item_s"]]
            except BaseException as e:
                line = ["raised", "%s: %s" % (type(e).__name__, str(e)[:300])]
            f.write(json.dumps(line) + "\n")
            f.flush()

_main()
'''


@dataclass(frozen=True)
class UserVerifier:
    """The user's function as the sandbox gets it: the module's text and the function's name."""

    spec: str
    path: Path
    source: str
    function: str


def resolve(spec: str, near: Path | None = None) -> UserVerifier:
    """The module file `spec` names; ValueError says what is wrong with it."""
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"verifier {spec!r}: expected exact, numeric, math, regex, "
                         "path/to/file.py:function or package.module:function")
    module, function = m.group("module"), m.group("function")
    path: Path | None = None
    if module.endswith(".py") or "/" in module:
        candidates = [Path(module)] if Path(module).is_absolute() else [
            *([near / module] if near is not None else []), Path.cwd() / module]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise ValueError(f"verifier {spec!r}: no file {module} (looked in "
                             f"{', '.join(str(c.parent) for c in candidates)})")
    elif _DOTTED.match(module):
        found = PathFinder.find_spec(module.split(".")[0])
        for part in module.split(".")[1:]:
            if found is None or not found.submodule_search_locations:
                found = None
                break
            found = PathFinder.find_spec(f"{found.name}.{part}", list(found.submodule_search_locations))
        if found is None or not found.origin or not found.origin.endswith(".py"):
            raise ValueError(f"verifier {spec!r}: no Python file for module {module!r} on sys.path")
        path = Path(found.origin)
    else:
        raise ValueError(f"verifier {spec!r}: {module!r} is neither a .py path nor a dotted module name")
    try:
        source = path.read_text(encoding="utf-8")
        compile(source, str(path), "exec")
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise ValueError(f"verifier {spec!r}: cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not re.search(rf"\b{function}\b", source):  # the sandboxed load says the rest (an import, a typo'd def)
        raise ValueError(f"verifier {spec!r}: {path} defines no function {function!r}")
    return UserVerifier(spec, path.resolve(), source, function)


def run(verifier: UserVerifier, items: Sequence[Mapping[str, Any]], timeout_s: float) -> tuple[list | None, str]:
    """One sandboxed job over `items` ({completion, answer, task}), `timeout_s` for each (an
    interval timer in the job; the job's own wall-clock limit, timeout_s per item plus 5 s, is
    the backstop); (one reply per item answered, how the job ended: "ok", "timeout",
    "load: <error>" or "sandbox: <error>")."""
    from evotrainer.sandbox import SandboxError, run_sandboxed
    from evotrainer.sandbox.python_root import PACKAGES

    name = f"r-{secrets.token_hex(12)}.jsonl"
    payload = {"path": f"{_MODULE_NAME}/{verifier.path.name}", "function": verifier.function,
               "items": list(items), "item_s": timeout_s}
    try:
        # the harness workers' root: installed packages, no /etc, home, workspace or checkout
        sb = run_sandboxed([sys.executable, "-I", "-c", _RUNNER],
                           files={f"{_MODULE_NAME}/{verifier.path.name}": verifier.source},
                           timeout_s=timeout_s * len(items) + 5.0, mem_mb=1024, nproc=8, fsize_mb=16,
                           env_extra={"EVO_RESULT": "{out}/" + name}, stdin=json.dumps(payload).encode(),
                           root=PACKAGES)
    except SandboxError as exc:
        return None, f"sandbox: {exc}"
    if sb.launch_error:
        return None, f"sandbox: {sb.launch_error}"
    replies: list = []
    for line in sb.outputs.get(name, b"").decode("utf-8", "replace").splitlines():
        try:
            reply = json.loads(line)
        except ValueError:
            break
        if not (isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], str)):
            break
        if reply[0] == "load":
            return None, f"load: {reply[1]}"
        replies.append(reply)
    if sb.timed_out:
        return replies, "timeout"
    if len(replies) != len(items):
        return replies, f"sandbox: the job ended (exit {sb.returncode}) after {len(replies)} of {len(items)} items"
    return replies, "ok"


def outcome(reply: list) -> Outcome:
    """The validated outcome of one reply of the runner."""
    tag, value = reply
    if tag == "raised":
        return Outcome(False, 0.0, "error", ("verifier_raised",))
    if tag == "timeout":
        return Outcome(False, 0.0, "timeout", ("verifier_timeout",))
    if tag != "ok" or not isinstance(value, (bool, int, float)):
        return Outcome(False, 0.0, "error", ("verifier_bad_return",))
    if isinstance(value, bool):
        return Outcome(value, 1.0 if value else 0.0, "ok" if value else "wrong")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return Outcome(False, 0.0, "error", ("verifier_bad_return",))
    return Outcome(value >= 1.0, float(value), "ok" if value >= 1.0 else "wrong")


def describe(reply: list) -> str:
    """A reply in words, for an error message."""
    tag, value = reply
    if tag == "raised":
        return f"raised {value}"
    if tag == "bad":
        return f"returned a {value}, not a bool or a number in [0, 1]"
    if tag == "timeout":
        return f"ran past its {value:g} s"
    return f"returned {value!r}"


def check_gold(verifier: UserVerifier, tasks: Sequence[Any], timeout_s: float, batch: int = 200) -> None:
    """Run the function on each task's gold answer (as the completion); ValueError naming the first
    task whose gold answer does not pass (raises, times out, a bad return, or not a success)."""
    for start in range(0, len(tasks), batch):
        chunk = tasks[start:start + batch]
        replies, how = run(verifier, [item(t, t.answer) for t in chunk], timeout_s)
        if replies is None:
            raise ValueError(f"verifier {verifier.spec}: {how}")
        for t, reply in zip(chunk, replies):
            if not outcome(reply).success:
                raise ValueError(f"verifier {verifier.spec} on the gold answer of task {t.task_id!r} "
                                 f"({t.meta.get('source')}:{t.meta.get('line')}) {describe(reply)}; "
                                 "a verifier must pass every gold answer (nothing was stored)")
        if how != "ok":
            t = chunk[len(replies)]
            raise ValueError(f"verifier {verifier.spec} on the gold answer of task {t.task_id!r}: "
                             f"{'timed out' if how == 'timeout' else how} (nothing was stored)")


def item(task: Any, completion: str) -> dict[str, Any]:
    return {"completion": completion, "answer": task.answer,
            "task": {"task_id": task.task_id, "split": task.split, "level": task.level, "prompt": task.prompt,
                     "answer": task.answer, "meta": _plain(dict(task.meta))}}


def _plain(value: Any) -> Any:
    """The task's meta as JSON (tuples become lists); anything JSON cannot hold becomes its repr."""
    return json.loads(json.dumps(value, default=repr))
