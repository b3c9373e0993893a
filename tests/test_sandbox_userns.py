"""The sandbox as a user who is not root runs it: the command is uid 0 of its own user namespace.

Found while closing "the policy can read the host": there, exec used to hand the command every
capability of that namespace, so a code solution could `chroot` twice out of its root (and list
the host's /, read its files), and a plain run could `umount` the tmpfs or /dev/null covering a
hidden path (a task file with the answers) and read it. The launcher now locks SECBIT_NOROOT
before exec, so the command has no capability. These tests run the real launcher as an
unprivileged user: directly when the suite is not root, else through `setpriv` as nobody, with an
interpreter that user can run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


def _as_user(script: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    return subprocess.run([shutil.which("setpriv") or "setpriv", *NOBODY, _PYTHON, "-c", script],
                          capture_output=True, text=True, timeout=180, env={"PATH": "/usr/bin:/bin"})


def _runnable() -> str | None:
    """An interpreter nobody can run that imports our sandbox from this checkout; None if none."""
    if os.geteuid() != 0:
        return sys.executable
    if shutil.which("setpriv") is None:
        return None
    # the launcher starts the same interpreter again: its own probe says whether that works
    check = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from evotrainer.sandbox.run import isolation_support; "
             "raise SystemExit(0 if isolation_support()['probe_error'] is None else 3)")
    for exe in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        try:
            if subprocess.run(["setpriv", *NOBODY, exe, "-c", check], capture_output=True, timeout=60).returncode == 0:
                return exe
        except (OSError, subprocess.SubprocessError):
            continue
    return None


_PYTHON = _runnable()
pytestmark = pytest.mark.skipif(_PYTHON is None, reason="no interpreter an unprivileged user can run here")

RUN = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from evotrainer.sandbox.run import isolation_support, run_sandboxed
if not isolation_support()["mountns"]:
    print(json.dumps({{"skip": "no user namespaces for this user"}}))
    raise SystemExit
r = run_sandboxed([sys.executable, "-I", "-c", CODE], timeout_s=60, **KW)
print(json.dumps({{"out": r.stdout, "err": r.stderr[-400:], "isolation": r.isolation}}))
"""


def _sandboxed_as_user(code: str, **kw) -> dict:
    proc = _as_user(f"CODE = {code!r}\nKW = {kw!r}\n" + RUN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["isolation"].get("userns"), got
    return got


def test_a_double_chroot_does_not_leave_the_root():
    escape = ("import os\ntry:\n    os.makedirs('jail', exist_ok=True)\n    os.chroot('jail')\n"
              "    os.chdir('../../../../../../..')\n    os.chroot('.')\n    print('ESCAPED', sorted(os.listdir('/')))\n"
              "except OSError as e:\n    print('refused', e.errno)\n")
    got = _sandboxed_as_user(escape, root="stdlib")
    assert "ESCAPED" not in got["out"] and "refused 1" in got["out"], got
    assert got["isolation"].get("no_caps")


def test_a_hidden_file_stays_hidden_under_umount():
    target = str(REPO / "pyproject.toml")  # readable by this user, and hidden for the run
    unhide = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('umount', libc.umount2({target!r}.encode(), 2))\n"
              f"print('READ' if 'build-system' in open({target!r}).read() else 'hidden')\n")
    got = _sandboxed_as_user(unhide, hide=[target])
    assert "READ" not in got["out"] and "hidden" in got["out"] and "umount -1" in got["out"], got
    assert got["isolation"].get("no_caps")
