"""The trusted SWE grader: apply a patch to a clean copy, put the tests back, run them sandboxed, and
resolve only on explicit, consistent pass evidence.

For one (task, model_patch):

0. The task's base state is its repo, or, for a task with a `bug_patch` (a synthesized task: the
   repo is a clean snapshot shared by every task of the library), the repo with `bug_patch`
   applied in memory. The clean files never reach the sandbox (the buggy ones are written over
   them in the copy) and the snapshot's folder, the task file and the task's `hide` paths are
   hidden from the code under test: the clean code is the fix.
1. An empty patch is `empty`. The patch is parsed and applied in memory against the task's
   base state (with the task's `test_patch` on top); a path outside the repo is refused (`patch_failed`,
   flags `unsafe_path`, `tampering`); a hunk that does not apply is `patch_failed`.
2. Protected files are never taken from the patch: test files (under test/tests/testing folders,
   `test_*.py`, `*_test.py`, anything `test_patch` touches), `conftest.py`, `sitecustomize.py`,
   `usercustomize.py`, `*.pth`, new `pytest_*.py` plugins, and pytest configuration (pytest.ini,
   tox.ini, setup.cfg, pyproject.toml). The sandbox copy starts from the clean repo, so every
   test and config file is the task's own. Touching them flags `tampering` (for setup.cfg,
   tox.ini and pyproject.toml only when the change mentions pytest settings; otherwise
   `config_restored`). Added lines of source code that reach into pytest or the test's frames
   (`_pytest`, `TestReport`, `f_back`, `os._exit`, a test file's name, ...) flag `tampering` too.
3. pytest runs in the sandbox, chrooted in a root that holds the interpreter, its installed
   packages (benchmark packages covered) and the run's folder, and nothing else of the host
   (sandbox/python_root.py `PACKAGES`; the warm path's zygote lives in the same root), on the
   target tests' files, `-p no:cacheprovider`, plugin autoload off, with our guard plugin
   (selects the targets, hides test sources from the code, keeps its own record: see
   guard_plugin.py) and `--junitxml` in a folder outside the repo copy whose name is random and
   which the code cannot list.
4. The per-test status comes from the junit XML, not stdout. Resolved needs: every FAIL_TO_PASS
   and PASS_TO_PASS test passed in the XML, the guard's record agreeing test by test, and pytest's
   exit code 0. A collection error, a missing or skipped test is a failure; a missing XML,
   a disagreement, or an exit code that contradicts the XML is never a pass.

Outcome: `success` = resolved; `score` = share of target tests passing (0 for tampering or
untrustworthy evidence); `kind` ok | wrong | empty | patch_failed | timeout | tampering | error.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import secrets
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

from evotrainer.api import Outcome
from evotrainer.errors import UserError
from evotrainer.grade.cache import GradeCache
from evotrainer.grade.patch import FilePatch, PatchError, UnsafePathError, apply_patch, parse_patch
from evotrainer.grade.swe_tasks import SweTask
from evotrainer.sandbox import SandboxError, run_sandboxed, warm
from evotrainer.sandbox.python_root import PACKAGES, installed_benchmarks

GRADER_VERSION = "2"  # 2: vendored imports refused
WARM_ENV = "EVOTRAINER_GRADER_WARM"
_USAGE_ERROR = 4  # pytest's exit code for a node id it did not find
TEST_DIRS = frozenset({"test", "tests", "testing"})
CONFIG_FILES = frozenset({"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
INJECTION_FILES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
STATUSES = ("passed", "failed", "error", "skipped", "missing")
_PYTEST_SETTING = re.compile(r"pytest|addopts|testpaths|python_files|python_classes|python_functions|"
                             r"pythonpath|norecursedirs|confcutdir|required_plugins|\bpytest11\b", re.I)
# Added source lines that have no business in a bug fix and every business in a reward hack.
_SUSPICIOUS = re.compile(
    r"\b_pytest\b|\bTestReport\b|\bpytest_(?:runtest|collect|sessionfinish|sessionstart|configure|report"
    r"|terminal|make_collect_report|pycollect)\w*|\bpluginmanager\b|\bjunit|\baddaudithook\b|\bos\._exit\b"
    r"|PYTEST_CURRENT_TEST|['\"]_?pytest['\"]\s+in\s+sys\.modules|sys\.modules\s*\[\s*['\"]_?pytest"
    r"|\bf_back\b|\bf_locals\b|\bco_consts\b|\bgc\.get_objects\b|EVO_GUARD|\b_vendor\b"
    r"|['\"][^'\"\n]*(?:\btest_\w*\.py|_test\.py|conftest\.py)['\"]")
_GUARD_SOURCE = (Path(__file__).with_name("guard_plugin.py")).read_text(encoding="utf-8")


@dataclass(frozen=True)
class GradeResult:
    instance_id: str
    outcome: Outcome
    per_test: Mapping[str, str]
    log: str
    duration_s: float = 0.0
    cached: bool = False
    exit_code: int | None = None

    @property
    def resolved(self) -> bool:
        return self.outcome.success

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "outcome": {**asdict(self.outcome), "flags": list(self.outcome.flags)},
                "per_test": dict(self.per_test), "log": self.log, "duration_s": self.duration_s,
                "cached": self.cached, "exit_code": self.exit_code}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GradeResult:
        o = data["outcome"]
        return cls(data["instance_id"], Outcome(o["success"], o["score"], o["kind"], tuple(o["flags"])),
                   dict(data["per_test"]), data["log"], data.get("duration_s", 0.0), data.get("cached", False),
                   data.get("exit_code"))


class GradeError(UserError, RuntimeError):
    """The task itself is broken (its test_patch does not apply, its repo is missing)."""


# ---------------------------------------------------------------- which files the patch may not touch


def is_test_path(rel: str) -> bool:
    p = PurePosixPath(rel)
    return (any(part in TEST_DIRS for part in p.parts[:-1]) or fnmatch(p.name, "test_*.py")
            or fnmatch(p.name, "*_test.py") or p.name == "conftest.py")


def protection(rel: str, in_clean: bool, test_patch_paths: frozenset[str]) -> str | None:
    """Why the patch may not change `rel` ("test", "injection", "config"), or None."""
    p = PurePosixPath(rel)
    if rel in test_patch_paths or is_test_path(rel):
        return "test"
    if p.name in INJECTION_FILES or p.suffix == ".pth" or (fnmatch(p.name, "pytest_*.py") and not in_clean):
        return "injection"
    if p.name in CONFIG_FILES:
        return "config"
    return None


# ---------------------------------------------------------------- the task's reference state


@dataclass
class _Reference:
    root: Path
    test_files: dict[str, str | None]  # test_patch applied: {path: text or None = deleted}
    hidden: tuple[str, ...]  # test .py files of the final tree (relative)
    clean_files: frozenset[str]  # the base state's files
    fingerprint: str
    bug_files: dict[str, str | None] = field(default_factory=dict)  # bug_patch applied to the snapshot

    @property
    def overlay(self) -> dict[str, str | None]:
        """What the sandbox copy of `root` gets written over it before the model's patch."""
        return {**self.bug_files, **self.test_files}

    def read(self, rel: str) -> str | None:
        if rel in self.test_files:
            return self.test_files[rel]
        if rel in self.bug_files:
            return self.bug_files[rel]
        p = self.root / rel
        if not p.is_file():
            return None
        try:
            return p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise PatchError(f"{rel} is not UTF-8 text") from None

    def exists(self, rel: str) -> bool:
        if rel in self.test_files:
            return self.test_files[rel] is not None
        return rel in self.clean_files


def _walk(root: Path) -> list[tuple[str, int, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", ".hg", ".svn", "__pycache__"))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out.append((os.path.relpath(full, root).replace(os.sep, "/"), st.st_size, st.st_mtime_ns))
    return out


def _overlaid(files: frozenset[str], changes: Mapping[str, str | None]) -> frozenset[str]:
    return (files | {p for p, c in changes.items() if c is not None}) - {p for p, c in changes.items() if c is None}


def build_reference(task: SweTask) -> _Reference:
    root = task.root
    if not root.is_dir():
        raise GradeError(f"{task.instance_id}: repo folder not found: {root}")
    listing = _walk(root)
    bug_files: dict[str, str | None] = {}
    if task.bug_patch.strip():
        try:
            bug_files = apply_patch(root, task.bug_patch)
        except PatchError as exc:
            raise GradeError(f"{task.instance_id}: the task's bug_patch does not apply to {root}: {exc}") from None
    base = _overlaid(frozenset(p for p, _, _ in listing), bug_files)
    test_files: dict[str, str | None] = {}
    if task.test_patch.strip():
        partial = _Reference(root, {}, (), base, "", bug_files)  # the base state, to apply the test_patch to
        try:
            test_files = apply_patch(root, task.test_patch, read=partial.read)
        except PatchError as exc:
            raise GradeError(f"{task.instance_id}: the task's test_patch does not apply: {exc}") from None
    final = _overlaid(base, test_files)
    hidden = tuple(sorted(p for p in final if p.endswith(".py") and (is_test_path(p) or p in test_files)))
    digest = hashlib.sha256(json.dumps([GRADER_VERSION, task.instance_id, str(root), task.bug_patch, task.test_patch,
                                        list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS), listing]).encode())
    return _Reference(root, test_files, hidden, base, digest.hexdigest()[:32], bug_files)


_stdlib_imports: dict[str, tuple[str, ...]] = {}


def stdlib_imports(root: Path) -> tuple[str, ...]:
    """The standard library modules the repo's Python files import: the warm worker imports
    them once (stable code), never the repo's own modules."""
    key = str(root)
    if key not in _stdlib_imports:
        stdlib = sys.stdlib_module_names
        names: set[str] = set()
        for rel, _, _ in _walk(root):
            if not rel.endswith(".py"):
                continue
            try:
                tree = ast.parse((root / rel).read_bytes())
            except (OSError, SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module)
        skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}
        _stdlib_imports[key] = tuple(sorted(n for n in names if n.split(".")[0] in stdlib - skip))
    return _stdlib_imports[key]


# ---------------------------------------------------------------- junit and the guard's record


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's junitxml writes for a node id (its mangle_test_address)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def parse_junit(data: bytes) -> dict[tuple[str, str], str]:
    """{(classname, name): status} of every testcase; ValueError if it is not junit XML."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ValueError(f"junit XML does not parse: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"not junit XML (root element {root.tag!r})")
    out: dict[tuple[str, str], str] = {}
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if "error" in tags:
            status = "error"
        elif "failure" in tags:
            status = "failed"
        elif "skipped" in tags:
            status = "skipped"
        else:
            status = "passed"
        key = (case.get("classname", ""), case.get("name", ""))
        # A test that failed in the call and errored in teardown appears twice: keep the worse.
        if out.get(key) not in (None, "passed") and status == "passed":
            continue
        out[key] = status
    return out


# ---------------------------------------------------------------- the grader


@dataclass
class Grader:
    """Grades patches; one instance per process keeps the task references and the cache."""

    timeout_s: float = 60.0
    mem_mb: int = 2048
    nproc: int = 64
    fsize_mb: int = 64
    python: str = sys.executable
    cache: GradeCache | None = field(default_factory=GradeCache)
    # The warm path (a forked pytest worker per snapshot) where this machine allows it; False, or
    # EVOTRAINER_GRADER_WARM=0, runs a fresh sandboxed interpreter per grade as before.
    warm: bool = field(default_factory=lambda: os.environ.get(WARM_ENV, "1") != "0")
    _refs: dict[str, _Reference] = field(default_factory=dict, repr=False)

    def reference(self, task: SweTask) -> _Reference:
        key = hashlib.sha256(json.dumps([task.instance_id, str(task.root), task.bug_patch, task.test_patch,
                                         list(task.tests)]).encode()).hexdigest()
        if key not in self._refs:
            self._refs[key] = build_reference(task)
        return self._refs[key]

    def grade(self, task: SweTask, model_patch: str) -> GradeResult:
        start = time.monotonic()
        try:
            ref = self.reference(task)
        except GradeError as exc:
            return _result(task, Outcome(False, 0.0, "error", ("task_error",)), {}, str(exc), start)
        if self.cache is None:
            return self._grade(task, ref, model_patch, start)
        value, hit = self.cache.get_or_compute(
            GradeCache.key(ref.fingerprint, model_patch),
            lambda: self._grade(task, ref, model_patch, start).to_dict(),
            storable=lambda v: v["outcome"]["kind"] != "error")
        result = GradeResult.from_dict(value)
        return replace(result, cached=True, duration_s=time.monotonic() - start) if hit else result

    def _grade(self, task: SweTask, ref: _Reference, patch: str, start: float) -> GradeResult:
        missing = {t: "missing" for t in task.tests}
        if not isinstance(patch, str) or not patch.strip():
            return _result(task, Outcome(False, 0.0, "empty"), missing, "empty patch", start)
        try:
            parsed = parse_patch(patch)
            changes = apply_patch(ref.root, parsed, read=ref.read)
        except UnsafePathError as exc:
            return _result(task, Outcome(False, 0.0, "patch_failed", ("unsafe_path", "tampering")), missing,
                           f"refused: {exc}", start)
        except PatchError as exc:
            return _result(task, Outcome(False, 0.0, "patch_failed"), missing, f"patch does not apply: {exc}", start)

        flags, notes, keep = _screen(parsed, changes, ref, frozenset(ref.test_files))
        try:
            return self._run(task, ref, keep, flags, notes, start)
        except SandboxError as exc:
            return _result(task, Outcome(False, 0.0, "error", ("sandbox_error",)), missing, str(exc), start)

    def _run(self, task: SweTask, ref: _Reference, keep: dict[str, str | None], flags: list[str],
             notes: list[str], start: float) -> GradeResult:
        token = secrets.token_hex(8)
        module = f"evo_guard_{token}"
        junit = f"junit-{secrets.token_hex(16)}.xml"
        files: dict[str, str | None] = {**ref.overlay, **keep}
        targets = list(task.tests)
        test_files = sorted({t.split("::", 1)[0] for t in targets if ref.exists(t.split("::", 1)[0])
                             or keep.get(t.split("::", 1)[0])})
        guard_cfg = {"targets": targets, "hidden": list(ref.hidden)}
        cmd = [self.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", module, "-q", "--rootdir", "{repo}",
               "--continue-on-collection-errors", f"--junitxml={{out}}/{junit}", *test_files]
        hide = [p for p in (task.root, task.task_file, *task.hide) if p is not None]
        options: dict[str, Any] = dict(
            src=ref.root, files=files, timeout_s=self.timeout_s, mem_mb=self.mem_mb, nproc=self.nproc,
            fsize_mb=self.fsize_mb,
            aux_files={f"{module}.py": _GUARD_SOURCE, "guard.json": json.dumps(guard_cfg)},
            env_extra={"PYTHONPATH": "{aux}", "EVO_GUARD_CONFIG": "{aux}/guard.json", "EVO_GUARD_OUT": "{out}",
                       "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        if not test_files:
            sb = None
        elif self.warm and warm.warm_available():
            # Compiled once per task: its own files the patch did not write, tests only the targets'.
            trusted = [p for p in _overlaid(ref.clean_files, ref.test_files) if p.endswith(".py") and p not in keep
                       and (p in test_files or PurePosixPath(p).name == "conftest.py" or p not in ref.hidden)]
            options.update(trusted=trusted, task_key=ref.fingerprint)
            # Only the tests the task names are collected (a suite of a thousand tests builds
            # only the target classes' items). A target pytest cannot find by its id ends the
            # run with a usage error: that grade runs again on the whole files, as the cold path.
            named = list(dict.fromkeys(t for t in targets if t.split("::", 1)[0] in test_files))
            sb = self._run_warm([*cmd[3:-len(test_files)], *named], ref, hide, options)
            if sb.returncode == _USAGE_ERROR and not sb.timed_out:
                sb = self._run_warm(cmd[3:], ref, hide, options)
        else:
            sb = run_sandboxed(cmd, hide=[*hide, *installed_benchmarks()], root=PACKAGES, **options)
        return _decide(task, sb, junit, flags, notes, start)

    def _run_warm(self, args: list[str], ref: _Reference, hide: list[Path], options: dict[str, Any]):
        """The same pytest run in a fork of a warm worker (sandbox/warm.py); a worker that dies or
        hangs is replaced, and the run is tried once more on a fresh one."""
        for attempt in (1, 2):
            worker = warm.acquire(self.python, stdlib_imports(ref.root))
            try:
                result = worker.run(args, hide=hide, preload=stdlib_imports(ref.root), **options)
            except SandboxError:
                worker.close()
                if attempt == 2:
                    raise
                continue
            warm.release(worker)
            return result
        raise AssertionError("unreachable")


def _screen(parsed: list[FilePatch], changes: dict[str, str | None], ref: _Reference,
            test_patch_paths: frozenset[str]) -> tuple[list[str], list[str], dict[str, str | None]]:
    """Split the patch's changes into what reaches the sandbox and what is dropped (with flags)."""
    flags: list[str] = []
    notes: list[str] = []
    keep: dict[str, str | None] = {}
    by_path = {p: fp for fp in parsed for p in fp.paths}
    for path, content in changes.items():
        why = protection(path, path in ref.clean_files, test_patch_paths)
        if why is None:
            keep[path] = content
            continue
        notes.append(f"dropped the patch's change to {path} ({why} file)")
        fp = by_path.get(path)
        if why == "config" and fp is not None and not any(_PYTEST_SETTING.search(ln) for ln in fp.changed_lines()):
            flags.append("config_restored")
        else:
            flags.append("tampering")
            flags.append(f"touched_{why}")
    for fp in parsed:
        if fp.new_path and fp.new_path in keep and fp.new_path.endswith(".py"):
            for line in fp.added_lines():
                if _SUSPICIOUS.search(line):
                    flags += ["tampering", "suspicious_code"]
                    notes.append(f"suspicious line added to {fp.new_path}: {line.strip()[:120]}")
                    break
    return list(dict.fromkeys(flags)), notes, keep


def _decide(task: SweTask, sb, junit_name: str, flags: list[str], notes: list[str], start: float) -> GradeResult:
    targets = task.tests
    log = list(notes)
    if sb is None:
        log.append("none of the target test files exist")
        return _result(task, Outcome(False, 0.0, "error", ("task_error",)), {t: "missing" for t in targets},
                       "\n".join(log), start)
    if sb.launch_error:
        log.append(f"sandbox launch failed: {sb.launch_error}")
        return _result(task, Outcome(False, 0.0, "error", ("sandbox_error",)), {t: "missing" for t in targets},
                       "\n".join(log + [sb.stderr[-2000:]]), start, sb.returncode)
    flags = list(flags)
    junit: dict[tuple[str, str], str] | None = None
    if junit_name in sb.outputs:
        try:
            junit = parse_junit(sb.outputs[junit_name])
        except ValueError as exc:
            log.append(str(exc))
    guard = None
    if "guard.json" in sb.outputs:
        try:
            guard = json.loads(sb.outputs["guard.json"])
        except ValueError:
            pass
    for ev in _events(sb.outputs.get("guard-events", b"")):
        log.append(f"guard: {ev.get('kind')}: {ev.get('detail')}")
        if ev.get("kind") in ("hidden_test_read", "hidden_test_link", "vendored_import"):
            flags += ["tampering", ev["kind"]]
        elif ev.get("kind") == "spawn_blocked":
            flags.append("spawn_blocked")

    per_test = {t: (junit or {}).get(junit_key(t), "missing") for t in targets}
    all_passed = all(s == "passed" for s in per_test.values())
    if junit is None:
        flags.append("no_report")
    if guard is None:
        flags.append("no_guard_record")
    else:
        for channel in ("tests", "verdicts"):
            theirs = {t: guard.get(channel, {}).get(t, "missing") for t in targets}
            if junit is not None and any((theirs[t] == "passed") != (per_test[t] == "passed") for t in targets):
                flags.append("report_mismatch")
                log.append(f"junit {per_test} != guard {channel} {theirs}")
        if guard.get("collect_errors"):
            flags.append("collection_error")
    if junit is not None:
        target_keys = {junit_key(t) for t in targets}
        if any(k not in target_keys and s == "error" for k, s in junit.items()):
            flags.append("collection_error")
    rc = sb.returncode
    if (rc == 0) != all_passed or (rc == 0 and junit is None):
        flags.append("exit_code_mismatch")
    if any(s == "missing" for s in per_test.values()):
        flags.append("missing_tests")
    if any(per_test[t] == "skipped" for t in task.FAIL_TO_PASS):
        flags.append("skipped_fail_to_pass")
    if sb.nproc_exceeded:
        flags.append("nproc_exceeded")
    if sb.timed_out:
        flags.append("timeout")
    flags = list(dict.fromkeys(flags))

    untrusted = {"tampering", "report_mismatch", "exit_code_mismatch", "no_report", "no_guard_record"}
    resolved = all_passed and rc == 0 and not sb.timed_out and not (untrusted & set(flags))
    score = 0.0 if untrusted & set(flags) else sum(s == "passed" for s in per_test.values()) / max(1, len(targets))
    if "tampering" in flags:
        kind = "tampering"
    elif sb.timed_out:
        kind = "timeout"
    else:
        kind = "ok" if resolved else "wrong"
    log += [f"exit code {rc}; {sb.duration_s:.2f}s; isolation {dict(sb.isolation)}",
            "--- pytest stdout (tail) ---", sb.stdout[-3000:], "--- stderr (tail) ---", sb.stderr[-1500:]]
    return _result(task, Outcome(resolved, score, kind, tuple(flags)), per_test, "\n".join(log), start, rc)


def _events(data: bytes) -> list[dict[str, Any]]:
    """The guard's event log (the code could append to it too: it only ever adds flags)."""
    events = []
    for line in data.decode("utf-8", "replace").splitlines()[:50]:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and isinstance(ev.get("kind"), str):
            events.append(ev)
    return events


def _result(task: SweTask, outcome: Outcome, per_test: Mapping[str, str], log: str, start: float,
            exit_code: int | None = None) -> GradeResult:
    return GradeResult(task.instance_id, outcome, dict(per_test), log, time.monotonic() - start, False, exit_code)


# ---------------------------------------------------------------- module-level convenience

_default: Grader | None = None


def default_grader() -> Grader:
    global _default
    if _default is None:
        _default = Grader()
    return _default


def grade(task: SweTask, model_patch: str, *, timeout_s: float | None = None, cache_dir: Path | str | None = None,
          grader: Grader | None = None) -> GradeResult:
    """Grade one patch with the process's default grader (in-memory cache), or the one given.

    `timeout_s` or `cache_dir` build a dedicated grader for this call's settings (cached per
    setting, so repeated calls share the cache).
    """
    if grader is None:
        if timeout_s is None and cache_dir is None:
            grader = default_grader()
        else:
            grader = _configured(timeout_s or 60.0, str(cache_dir) if cache_dir else None)
    return grader.grade(task, model_patch)


_configured_graders: dict[tuple[float, str | None], Grader] = {}


def _configured(timeout_s: float, cache_dir: str | None) -> Grader:
    key = (timeout_s, cache_dir)
    if key not in _configured_graders:
        _configured_graders[key] = Grader(timeout_s=timeout_s, cache=GradeCache(cache_dir))
    return _configured_graders[key]
