"""The code domain's trusted check: the solution's process only answers calls; the verdict is ours.

Why this shape. Once a solution has run, nothing else in its process can be trusted: it may
patch builtins, `json`, the runner's functions, print a fake report, `os._exit(0)`, or return
an object whose `__eq__` says yes to anything. So nothing that process says is taken as a
verdict. It receives only the *calls* of the hidden tests (`f(3)`, never `== 9`), returns what
each call produced as tagged plain data (code_plain.py), and the trusted parent decodes that into
fresh builtin values and evaluates each assert itself (code_tests.py). The expected values never
enter the sandbox, so the most a forged report can do is claim some return values, which is no
more than a solution returning them honestly. Anything missing or malformed is a failure.

Asserts the parent's interpreter cannot evaluate (HumanEval checks with loops, helpers from the
prompt, random inputs) are *replayed*: (1) once per task, a sandboxed run of the reference
records the arguments of every call the test makes; (2) the solution's process answers those
recorded calls, in the same batch as the converted ones; (3) a fresh sandboxed process that never
ran the solution executes the original test, where the function is a stub that returns the
solution's decoded answers for exactly the recorded arguments (a call that differs from the
recording fails the test). That last process saw only test code and plain values, so its verdict
stands.

HumanEval runs as its official harness does: the prompt (imports, helpers, the stub), then the
completion, then the test. One sandboxed process answers all of a problem's calls.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Sequence
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains import code_plain
from evotrainer.domains.code_tests import RAISED, Plan, convert, holds
from evotrainer.errors import EvotrainerError

_CODEC = Path(code_plain.__file__).read_text(encoding="utf-8")
_RECORD_CACHE_MAX = 4096
TEST_SEED = 0  # `random` is seeded with it before each recorded or replayed test program
_records: dict[tuple[str, str, str, str], list | None] = {}

# The solution's process: exec the code, evaluate each call, report values (an untrusted claim).
_ANSWER = _CODEC + r'''
import json, os, sys, types


def _main():
    out = os.environ.pop("EVO_RESULT")
    data = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    mod = types.ModuleType("solution")
    mod.__file__ = "solution.py"
    sys.modules["solution"] = mod
    load, results = None, []
    try:
        exec(compile(data.pop("code"), "solution.py", "exec"), mod.__dict__)
    except BaseException as e:
        load = type(e).__name__
    if load is None:
        for call in data["calls"]:
            ns = dict(mod.__dict__)
            try:
                setup = call["setup"]
                if setup:
                    exec(compile(setup, "test_setup", "exec"), ns)
                ns[call["alias"]] = ns.get(data["entry"])
                if "expr" in call:
                    value = eval(compile(call["expr"], "hidden_test", "eval"), ns)
                else:
                    args, kwargs = decode(call["args"])
                    value = ns[data["entry"]](*args, **kwargs)
                results.append(["ok", encode(value)])
            except BaseException as e:
                results.append(["err", type(e).__name__[:80]])
    with open(out, "w") as f:
        json.dump({"load_error": load, "results": results}, f)


_main()
'''

# Once per task: the reference runs the original tests; we keep the arguments of every call.
_RECORD = _CODEC + r'''
import json, os, random, sys, types


def _main():
    out = os.environ.pop("EVO_RESULT")
    data = json.loads(sys.stdin.buffer.read())
    records = []
    for program in data["programs"]:
        mod = types.ModuleType("reference")
        sys.modules["reference"] = mod
        ns, calls = mod.__dict__, []
        try:
            exec(compile(data["code"], "reference.py", "exec"), ns)
            real = ns[data["entry"]]

            def recorder(*args, **kwargs):
                calls.append(encode((args, kwargs)))  # before the call: it may mutate its arguments
                return real(*args, **kwargs)

            ns[data["entry"]] = recorder
            random.seed(data["seed"])  # a test that draws random inputs draws the same ones in the replay
            exec(compile(program, "hidden_test", "exec"), ns)
        except Unencodable:
            calls = None
        except BaseException:
            pass  # the recording up to here still stands; the reference's own failure is validate's job
        records.append(calls)
    with open(out, "w") as f:
        json.dump(records, f)


_main()
'''

# A fresh process that never ran the solution: the original tests against its recorded answers.
_REPLAY = _CODEC + r'''
import builtins, json, os, random, sys


class Diverged(Exception):
    pass


def _main():
    out = os.environ.pop("EVO_RESULT")
    data = json.loads(sys.stdin.buffer.read())
    verdicts = []
    for item in data["programs"]:
        calls, answers, done = item["calls"], item["answers"], [0]

        def stub(*args, **kwargs):
            i = done[0]
            done[0] += 1
            if i >= len(calls) or encode((args, kwargs)) != calls[i]:
                raise Diverged("call %d differs from the recording" % i)
            if answers[i][0] != "ok":
                raise Diverged("the solution raised " + str(answers[i][1]))
            return decode(answers[i][1])

        # The answers are plain data, but a test that evals one would run the solution's text here.
        ns = {"__name__": "hidden_test", "__builtins__": {k: v for k, v in vars(builtins).items()
                                                          if k not in ("eval", "exec", "compile", "breakpoint")}}
        try:
            exec(compile(data["prefix"], "prompt.py", "exec"), ns)
            ns[data["entry"]] = stub
            random.seed(data["seed"])  # the recording's random inputs, in the recording's order
            exec(compile(item["source"], "hidden_test", "exec"), ns)
            verdicts.append(None)
        except BaseException as e:
            verdicts.append(type(e).__name__[:80])
    with open(out, "w") as f:
        json.dump(verdicts, f)


_main()
'''


class _Failed(EvotrainerError):
    """A sandboxed run that gave no usable report; `outcome` says how it ended."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


def run_hidden_tests(code: str, tests: Sequence[str], *, entry: str, setup: str = "", prefix: str = "",
                     reference: str = "", timeout_s: float, flags: Sequence[str] = (),
                     hide: Sequence[str] = ()) -> Outcome:
    """Score `prefix + code` on the hidden test programs; see the module docstring. Never trusts the
    solution's process for anything but claimed return values. `hide`: host paths that hold the
    tests (a task file), covered for the solution's process."""
    flags = list(flags)
    plans: list[Plan | None] = [convert(t, entry, setup) for t in tests]
    replayed = [i for i, p in enumerate(plans) if p is None]
    try:
        records = _recorded(reference, [tests[i] for i in replayed], entry, setup, timeout_s) if replayed else []
        calls, where = _batch(plans, replayed, records, setup)
        report = _answer(prefix + code, entry, calls, timeout_s, flags, hide)
    except _Failed as failed:
        return failed.outcome
    if report["load_error"]:
        return Outcome(False, 0.0, "wrong", tuple(flags + ["load_error"]))
    if report["returncode"] != 0:
        return Outcome(False, 0.0, "wrong", tuple(flags + ["exit_code_mismatch"]))
    answers = report["results"]
    passed = sum(1 for i, p in enumerate(plans) if p is not None and _plan_passes(p, [answers[j] for j in where[i]]))
    if replayed:
        try:
            verdicts = _replay(prefix, entry, [(setup + "\n" + tests[i], records[k], [answers[j] for j in where[i]])
                                               for k, i in enumerate(replayed)], timeout_s, flags)
        except _Failed as failed:
            return failed.outcome
        passed += sum(1 for v in verdicts if v is None)
        flags.append("replayed")
    if passed == len(tests):
        return Outcome(True, 1.0, "ok", tuple(flags))
    return Outcome(False, passed / len(tests), "wrong", tuple(flags))


def _batch(plans: list[Plan | None], replayed: list[int], records: list,
           setup: str) -> tuple[list[dict], dict[int, list[int]]]:
    """Every call of every test program in one list, and which indices belong to which program."""
    calls: list[dict] = []
    where: dict[int, list[int]] = {}
    for i, plan in enumerate(plans):
        if plan is None:
            continue
        where[i] = []
        for check in plan.checks:
            for expr in check.calls:
                where[i].append(len(calls))
                calls.append({"setup": plan.setup, "alias": plan.alias, "expr": expr})
    for k, i in enumerate(replayed):
        where[i] = []
        for args in records[k] or []:
            where[i].append(len(calls))
            calls.append({"setup": setup, "alias": "candidate", "args": args})
    return calls, where


def _plan_passes(plan: Plan, answers: list) -> bool:
    values = iter(answers)
    for check in plan.checks:
        decoded = []
        for _ in check.calls:
            answer = next(values)
            try:
                # A call that raised, or sent anything not exactly plain data, raises where the
                # assert uses it (`f(1) or f(2)` may never look at the second), as it did in Python.
                decoded.append(code_plain.decode(answer[1]) if answer[0] == "ok" else RAISED)
            except Exception:
                decoded.append(RAISED)
        if not holds(check, decoded):
            return False
    return True


def _answer(code: str, entry: str, calls: list[dict], timeout_s: float, flags: list[str],
            hide: Sequence[str]) -> dict:
    """The solution's claimed return values, each a well-formed ["ok", node] or ["err", name]."""
    sb, raw = _sandboxed(_ANSWER, {"code": code, "entry": entry, "calls": calls}, timeout_s,
                         hide=[*_own_sources(), *hide])
    if sb.timed_out:
        raise _Failed(Outcome(False, 0.0, "timeout", tuple(flags)))
    try:
        report = json.loads(raw)
        results = report["results"]
        load = report["load_error"]
        ok = isinstance(results, list) and (load is None or isinstance(load, str))
    except (KeyError, ValueError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise _Failed(Outcome(False, 0.0, "wrong", tuple(flags + ["no_report"])))
    if load is None and len(results) != len(calls):
        raise _Failed(Outcome(False, 0.0, "wrong", tuple(flags + ["no_report"])))
    well_formed = [r if isinstance(r, list) and len(r) == 2 and r[0] in ("ok", "err") else ["err", "malformed"]
                   for r in results]
    return {"load_error": load, "results": well_formed, "returncode": sb.returncode}


def _list_of(raw: str, n: int, flag: str) -> list:
    """A sandboxed process's JSON list of exactly n items; anything else is an error outcome."""
    try:
        got = json.loads(raw)
        if isinstance(got, list) and len(got) == n:
            return got
    except (ValueError, TypeError, RecursionError):
        pass
    raise _Failed(Outcome(False, 0.0, "error", (flag,)))


def _recorded(reference: str, programs: list[str], entry: str, setup: str, timeout_s: float) -> list:
    """The recorded call arguments of each program (None: cannot be replayed), cached per task."""
    keys = [(reference, p, entry, setup) for p in programs]
    missing = [k for k in keys if k not in _records]
    if missing and reference.strip():
        sb, raw = _sandboxed(_RECORD, {"code": reference, "entry": entry, "seed": TEST_SEED,
                                       "programs": [setup + "\n" + k[1] for k in missing]}, timeout_s)
        got = _list_of(raw, len(missing), "record_failed")
        if len(_records) > _RECORD_CACHE_MAX:
            _records.clear()
        _records.update(zip(missing, got))
    return [_records.get(k) for k in keys]


def _replay(prefix: str, entry: str, items: list[tuple[str, list | None, list]], timeout_s: float,
            flags: list[str]) -> list:
    """The original tests, run in a fresh process against the solution's recorded answers."""
    programs = [{"source": src, "calls": calls or [], "answers": answers} for src, calls, answers in items
                if calls is not None]
    sb, raw = _sandboxed(_REPLAY, {"prefix": prefix, "entry": entry, "seed": TEST_SEED, "programs": programs},
                         timeout_s)
    if sb.timed_out:
        raise _Failed(Outcome(False, 0.0, "timeout", tuple(flags)))
    verdicts = _list_of(raw, len(programs), "replay_failed")
    unreplayable = ["unreplayable"] * sum(1 for _, calls, _ in items if calls is None)
    return [v if v is None else str(v) for v in verdicts] + unreplayable


@lru_cache(maxsize=1)
def _own_sources() -> tuple[str, ...]:
    """Our package's folders (the one imported and an editable install's): they hold the generator
    of every procedural reference, so the solution's process must not import them."""
    found = {str(Path(__file__).resolve().parents[1])}
    try:
        url = json.loads(metadata.distribution("evotrainer").read_text("direct_url.json") or "{}").get("url", "")
        if url.startswith("file://"):
            found.add(str(Path(url[len("file://"):]) / "evotrainer"))
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        pass
    return tuple(sorted(found))


def _sandboxed(script: str, payload: dict[str, Any], timeout_s: float, hide: Sequence[str] = ()):
    """One sandboxed `python -I -c script` with `payload` on stdin; (result, its report's bytes). It
    runs in a root that holds the interpreter and its stdlib only (sandbox/python_root.py): no host
    file, installed package or copy of a benchmark for the solution to read."""
    from evotrainer.sandbox import run_sandboxed
    from evotrainer.sandbox.python_root import STDLIB

    name = f"r-{secrets.token_hex(12)}.json"
    sb = run_sandboxed([sys.executable, "-I", "-c", script], timeout_s=timeout_s, mem_mb=512, nproc=8, fsize_mb=16,
                       env_extra={"EVO_RESULT": "{out}/" + name}, stdin=json.dumps(payload).encode(), hide=hide,
                       root=STDLIB)
    if sb.launch_error:
        raise _Failed(Outcome(False, 0.0, "error", ("sandbox_error",)))
    return sb, sb.outputs.get(name, b"")
