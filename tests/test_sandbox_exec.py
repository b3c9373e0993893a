"""The execution sandbox, attacked one property at a time with real subprocesses.

Isolation that depends on the kernel (namespaces, cgroups, a fresh uid) is asserted where
`isolation_support()` says it is available, and the result must always report what was real.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evotrainer.sandbox import (
    LocalExecutor,
    SandboxError,
    get_executor,
    isolation_support,
    network_isolation_available,
    run_sandboxed,
)
from evotrainer.sandbox.run import MIN_SANDBOX_UID, _proc_stats

PY = sys.executable
SUPPORT = isolation_support()


def py(code: str, **kw):
    kw.setdefault("timeout_s", 20)
    return run_sandboxed([PY, "-c", code], **kw)


def no_leftovers(result) -> bool:
    uid = result.isolation.get("uid")
    return not uid or uid < MIN_SANDBOX_UID or not any(s.st_uid == uid for s in _proc_stats())


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    (root / ".git" / "refs").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "mod.py").write_text("VALUE = 41\n")
    (root / "sub" / ".hg").mkdir(parents=True)
    return root


def test_fresh_copy_without_history(src):
    result = py("import os, pkg.mod as m; print(m.VALUE + 1); print(sorted(os.listdir('.')), os.path.exists('sub/.hg'))",
                src=src, files={"extra.txt": "hi", "pkg/new.py": "X = 1\n"}, list_workdir=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "42"
    assert ".git" not in lines[1] and "extra.txt" in lines[1] and lines[1].endswith("False")
    assert "pkg/new.py" in result.workdir_listing
    assert (src / ".git" / "HEAD").exists()  # the original is untouched


def test_each_run_gets_a_fresh_copy(src):
    first = py("open('pkg/mod.py', 'a').write('VALUE = 0\\n'); open('junk', 'w').write('x')", src=src)
    assert first.returncode == 0
    second = py("import os, pkg.mod as m; print(m.VALUE, os.path.exists('junk'))", src=src)
    assert second.stdout.strip() == "41 False"
    assert (src / "pkg" / "mod.py").read_text() == "VALUE = 41\n"


def test_files_cannot_escape(src):
    for bad in ("../evil.py", "/tmp/evil.py", "a/../../evil.py"):
        with pytest.raises(SandboxError):
            py("pass", src=src, files={bad: "x"})
    assert not (src.parent / "evil.py").exists()


def test_copy_is_removed_even_when_the_code_fights_it(src, monkeypatch):
    import evotrainer.sandbox.run as run_mod

    made: list[str] = []
    real = run_mod.tempfile.mkdtemp
    monkeypatch.setattr(run_mod.tempfile, "mkdtemp", lambda **kw: made.append(real(**kw)) or made[-1])
    code = ("import os, stat\nos.makedirs('deep/er')\nopen('deep/er/f', 'w').write('x')\n"
            "os.chmod('deep/er/f', 0)\nos.chmod('deep/er', 0)\nos.chmod('deep', stat.S_IRUSR)\n")
    result = py(code, src=src)
    assert result.returncode == 0, result.stderr
    timed = py("import time; time.sleep(60)", src=src, timeout_s=1)
    assert timed.timed_out
    with pytest.raises(SandboxError):
        run_sandboxed(["no-such-command-xyz"], src=src)
    assert len(made) == 3 and not any(os.path.exists(p) for p in made)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_a_copy_that_cannot_be_removed_leaves_its_parent_alone(tmp_path):
    """Seen in CI: a sandbox folder whose removal failed made /tmp 0700, and the PostgreSQL
    tests' initdb (another user) could no longer reach its own folder under /tmp. Here a mount
    inside the tree (in a private mount namespace) makes the removal fail for real."""
    parent = tmp_path / "parent"
    tree = parent / "evo-sbx-test"
    (tree / "busy").mkdir(parents=True)
    parent.chmod(0o1777)
    code = ("import ctypes, sys; from pathlib import Path; from evotrainer.sandbox.run import _rmtree\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "assert libc.mount(b'none', b'/', None, (1 << 14) | (1 << 18), None) == 0  # MS_REC | MS_PRIVATE\n"
            "assert libc.mount(b'tmpfs', sys.argv[1].encode() + b'/busy', b'tmpfs', 0, None) == 0\n"
            "_rmtree(Path(sys.argv[1]))\n"
            "assert Path(sys.argv[1]).exists()  # the mount kept it\n")
    done = subprocess.run(["unshare", "-m", PY, "-c", code, str(tree)], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(parent.stat().st_mode) == 0o1777


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("EVOTRAINER_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    result = py("import os, json; print(json.dumps(dict(os.environ)))", env_extra={"MINE": "{repo}"})
    import json

    env = json.loads(result.stdout)
    assert "EVOTRAINER_SECRET_TOKEN" not in env and "HTTPS_PROXY" not in env
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONNOUSERSITE"] == "1"
    assert env["HOME"] != os.environ.get("HOME") and env["MINE"].endswith("/repo")
    assert env["PATH"].split(":")[1:] == ["/usr/local/bin", "/usr/bin", "/bin"]


def test_timeout_kills_the_whole_group_and_escapers():
    code = ("import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\n"
            "if os.fork() == 0:\n    time.sleep(300)\n"
            "time.sleep(300)\n")
    start = time.monotonic()
    result = py(code, timeout_s=1.5)
    assert result.timed_out and result.killed
    assert time.monotonic() - start < 10
    assert no_leftovers(result)


def test_daemon_left_behind_after_exit_is_killed():
    result = py("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nprint('bye')")
    assert result.returncode == 0 and result.stdout.strip() == "bye"
    assert no_leftovers(result)


def test_cpu_limit():
    result = py("while True: pass", timeout_s=30, cpu_s=1)
    assert result.returncode is not None and result.returncode < 0 and not result.timed_out  # SIGXCPU/SIGKILL
    assert result.duration_s < 10


def test_memory_limit():
    result = py("x = bytearray(2 << 30)", mem_mb=512)
    assert result.returncode != 0 and "MemoryError" in result.stderr


def test_file_size_limit():
    result = py("open('big', 'wb').write(b'x' * (20 << 20))", fsize_mb=4)
    assert result.returncode != 0  # SIGXFSZ, or an OSError where the signal is ignored


@pytest.mark.skipif(not (SUPPORT["uid_drop"] or SUPPORT["cgroup_pids"]), reason="no process limit on this machine")
def test_fork_bomb_is_contained():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    result = py(bomb, nproc=16, timeout_s=15)
    assert result.nproc_exceeded and result.killed
    assert time.monotonic() - start < 10
    assert no_leftovers(result)


def test_output_is_capped():
    result = py("import sys\nsys.stdout.write('a' * (5 << 20))\nsys.stdout.write('THE END')")
    assert result.returncode == 0
    assert len(result.stdout) < 100_000 and result.stdout.endswith("THE END") and "bytes dropped" in result.stdout


def test_outputs_come_back_and_links_are_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    code = ("import os\nopen('{out}/result.json', 'w').write('{\"ok\": 1}')\n"
            f"os.symlink({str(secret)!r}, '{{out}}/leak')\n")
    result = run_sandboxed([PY, "-c", code], timeout_s=20)
    assert result.returncode == 0, result.stderr
    assert result.outputs == {"result.json": b'{"ok": 1}'}


def test_isolation_is_reported():
    result = py("print(1)")
    assert result.network_isolated == network_isolation_available() == SUPPORT["netns"]
    for key in ("netns", "mountns", "uid"):
        assert key in result.isolation


@pytest.mark.skipif(not SUPPORT["netns"], reason="no network namespace on this machine")
def test_no_network_but_loopback_works():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('host reached')\n"
            "except OSError as e:\n    print('blocked', e.errno)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
            "c = socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')\n")
    result = py(code)
    server.close()
    assert "blocked" in result.stdout and "loopback ok" in result.stdout, result.stdout + result.stderr
    assert not accepted


@pytest.mark.skipif(not SUPPORT["uid_drop"], reason="not root, or no fresh uid here")
def test_unprivileged_and_private_tmp(tmp_path):
    marker = f"/tmp/evo-sbx-test-{os.getpid()}"
    code = (f"import os\nprint(os.getuid())\nopen({marker!r}, 'w').write('x')\n"
            f"for p in ({str(tmp_path / 'pwned')!r}, {str(Path.cwd() / 'pwned-sbx')!r}):\n"
            "    try:\n        open(p, 'w')\n        print('wrote', p)\n    except OSError:\n        pass\n"
            "print(sorted(os.listdir('/proc'))[0])\n")
    result = py(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert int(lines[0]) >= MIN_SANDBOX_UID and "wrote" not in result.stdout
    assert not Path(marker).exists() and not (tmp_path / "pwned").exists()
    if SUPPORT["pidns"] and SUPPORT["mountns"]:
        assert lines[-1] == "1"  # its own /proc: the host's processes are out of sight


def test_hidden_paths(tmp_path):
    if not SUPPORT["mountns"]:
        pytest.skip("no mount namespace on this machine")
    secret_dir = Path.cwd() / "tests"  # a host folder the sandbox could otherwise read
    result = py(f"import os\nprint(os.listdir({str(secret_dir)!r}))", hide=[secret_dir])
    # Hidden shows up as an empty folder, or (when the repo itself sits under /tmp, which the
    # sandbox replaces with a private one) as no folder at all: either way nothing is listed.
    assert "test_sandbox_exec.py" not in result.stdout
    assert result.stdout.strip() == "[]" or "FileNotFoundError" in result.stderr


# ---------------------------------------------------------------- executors


def _square(x: int) -> int:
    return x * x


def test_executors_keep_order():
    items = list(range(7))
    with LocalExecutor(1) as one:
        assert list(one.map(_square, items)) == [x * x for x in items]
    two = get_executor("local", workers=2)
    try:
        assert list(two.map(_square, items)) == [x * x for x in items]
    finally:
        two.close()
    with pytest.raises(ValueError, match="unknown executor"):
        get_executor("ray-someday")
