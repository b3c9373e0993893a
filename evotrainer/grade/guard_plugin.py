"""Trusted pytest plugin the grader loads in the sandbox (`-p <random name>`): it selects the target
tests, keeps the test sources away from the code under test, and keeps its own per-test record.

Shipped as a file into the sandbox's aux folder, so it imports nothing of evotrainer. Reads:
`EVO_GUARD_CONFIG` (JSON: `targets`, `hidden` test files relative to the repo) and `EVO_GUARD_OUT`
(a folder for `guard.json` and the `guard-events` log).

Hidden tests. The code under test may not read a test module's source (to copy expected values
out of it). Two layers:
- collection: an audit hook (which cannot be removed) refuses to open a hidden test file,
  or to link to one, while a frame of the repository's non-test code is on the stack, and
  refuses process spawns from such frames (`cat tests/...`); each refusal is logged at once;
- run time: once collection is over, every hidden test module that was imported is unlinked
  (its code is in memory) and dropped from linecache, so a process the code starts finds
  nothing on disk; the audit hook keeps refusing in-process reads. Package `__init__.py` files
  stay on disk (pytest re-imports them by path to set packages up).
What remains readable in-process are the test's own objects (its frames, constants): a solution
determined to walk the interpreter can reach those. The grader's static scan flags the usual
tools for that (`f_back`, `co_consts`, `_pytest`, ...).

Vendored copies. pip and setuptools carry private copies of libraries (`pip._vendor.packaging`,
`setuptools._vendor.more_itertools`, ...), some of them the very libraries a task asks to fix.
The audit hook refuses to open a file under a `_vendor` folder (a module's source or its
cached bytecode) when the nearest frame past the import machinery is the repository's non-test
code, so such an import fails however its name was built (`importlib.import_module` raises no
"import" audit event, but every load opens the file); pip's own imports of its vendored modules
come from pip's frames and pass. A module some other code already imported is not reopened.
"""

import json
import linecache
import os
import sys
import threading

import pytest

_CFG = json.load(open(os.environ["EVO_GUARD_CONFIG"], encoding="utf-8"))
_OUT = os.environ["EVO_GUARD_OUT"]
_REPO = os.path.realpath(os.getcwd())
_PREFIX = _REPO + os.sep
_TARGETS = list(_CFG["targets"])
_HIDDEN = {os.path.join(_REPO, rel) for rel in _CFG["hidden"]}
_TRUSTED = set(_HIDDEN)  # frames from test files are the tests, not the solution
_INODES = {}
for _p in _HIDDEN:
    try:
        _st = os.stat(_p)
        _INODES[(_st.st_dev, _st.st_ino)] = _p
    except OSError:
        pass
_SPAWN = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "pty.spawn"}
_VENDOR = os.sep + "_vendor" + os.sep
_state = {"collecting": True}
_local = threading.local()
_records = {}  # from pytest's reports (what junit shows)
_verdicts = {}  # from the raw calls
_collect_errors = []
_collected = []
_logged = {}


def _log(kind, detail):
    _logged[kind] = _logged.get(kind, 0) + 1
    if _logged[kind] > 5:  # a loop retrying a refused call must not fill the disk
        return
    fd = os.open(os.path.join(_OUT, "guard-events"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps({"kind": kind, "detail": str(detail)[:300]}) + "\n").encode())
    finally:
        os.close(fd)


def _solution_frame():
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(_PREFIX) and os.path.normpath(name) not in _TRUSTED:
            return name
        f = f.f_back
    return None


def _importer():
    """The file of the frame that asked for an import, past the import machinery's own frames."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith("<frozen") or os.sep + "importlib" + os.sep in name):
            return name
        f = f.f_back
    return None


def _is_hidden(path):
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        return None
    full = os.path.normpath(os.path.join(os.getcwd(), path))
    if full in _HIDDEN:
        return full
    try:
        st = os.stat(full)
    except OSError:
        return None
    return _INODES.get((st.st_dev, st.st_ino))


def _audit(event, args):
    if getattr(_local, "busy", False):
        return
    if event not in ("open", "os.link", "os.symlink", "os.rename", "shutil.copyfile") and event not in _SPAWN:
        return
    _local.busy = True
    try:
        if event == "open" and isinstance(args[0], str) and _VENDOR in args[0]:
            who = _importer()
            if who and who.startswith(_PREFIX) and os.path.normpath(who) not in _TRUSTED:
                _log("vendored_import", f"{who} -> {args[0]}")
                raise PermissionError("evotrainer grader: the code under test may not load vendored copies")
        if event in _SPAWN:
            if _state["collecting"] and _solution_frame():
                _log("spawn_blocked", event)
                raise PermissionError("evotrainer grader: no processes from the code under test during collection")
            return
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        hidden = _is_hidden(path)
        if hidden is None:
            return
        who = _solution_frame()
        if who is not None:
            _log("hidden_test_read", f"{who} -> {hidden}")
            raise PermissionError("evotrainer grader: test sources are not readable by the code under test")
    finally:
        _local.busy = False


sys.addaudithook(_audit)


def pytest_collection_modifyitems(session, config, items):
    wanted = set(_TARGETS)
    keep = [it for it in items if it.nodeid in wanted]
    drop = [it for it in items if it.nodeid not in wanted]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
    _collected.extend(it.nodeid for it in keep)


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid or "<session>")


def pytest_collection_finish(session):
    _state["collecting"] = False
    loaded = {os.path.normpath(getattr(m, "__file__", None) or "") for m in list(sys.modules.values())}
    # Package __init__.py files stay: pytest imports them again (by path) to set up packages.
    for path in sorted(p for p in _HIDDEN & loaded if os.path.basename(p) != "__init__.py"):
        linecache.cache.pop(path, None)
        try:
            st = os.stat(path)
            if st.st_nlink > 1:  # someone made a hard link while collecting: keep watching it
                _log("hidden_test_link", path)
            else:
                _INODES.pop((st.st_dev, st.st_ino), None)
            os.unlink(path)
        except OSError:
            pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Our own verdict from the raw call, before any report object exists: code that rewrites
    # reports (TestReport, the junit writer) changes what pytest prints, not this.
    exc = call.excinfo
    xfail = item.get_closest_marker("xfail") is not None
    if exc is None:
        status = "passed"
    elif exc.errisinstance(pytest.skip.Exception) or (xfail and call.when == "call"):
        status = "skipped"
    else:
        status = "failed" if call.when == "call" else "error"
    before = _verdicts.get(item.nodeid, "passed")
    if before == "passed" or (before == "skipped" and status in ("failed", "error")):
        _verdicts[item.nodeid] = status
    yield


def pytest_runtest_logreport(report):
    status = _records.get(report.nodeid, "passed")
    if report.when == "call":
        if report.failed:
            status = "failed"
        elif report.skipped:
            status = "skipped"
    elif report.failed:
        status = "error" if status != "failed" else status
    elif report.skipped and report.when == "setup":
        status = "skipped"
    _records[report.nodeid] = status


def pytest_sessionfinish(session, exitstatus):
    record = {"tests": _records, "verdicts": _verdicts, "collected": _collected, "collect_errors": _collect_errors,
              "exitstatus": int(exitstatus)}
    fd = os.open(os.path.join(_OUT, "guard.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
