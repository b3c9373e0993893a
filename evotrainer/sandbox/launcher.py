"""The trusted launcher of a sandboxed command: cgroup, namespaces, mounts, rlimits and uid are set before it execs."""

from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PATH = "/usr/local/bin:/usr/bin:/bin"


# ---------------------------------------------------------------- the launcher (runs as the child)

_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1]); sfd = int(sys.argv[2]); st = {}
os.set_inheritable(sfd, False)  # closes at exec: the parent reads the status until EOF
NEWNS, NEWNET, NEWUSER, NEWPID = 0x00020000, 0x40000000, 0x10000000, 0x20000000
REC, PRIV, BIND, NOSUID, NODEV, NOEXEC = 16384, 1 << 18, 4096, 2, 4, 8
RDONLY, REMOUNT = 1, 32
def report(**kw):
    st.update(kw)
    try:
        os.write(sfd, (json.dumps(st) + "\n").encode())
    except OSError:
        pass
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG: if the grader dies, so does this run (the reaper does the same)
    if os.getppid() != cfg["parent"]:
        os._exit(125)
    def mount(src, dst, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()
        if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
            raise OSError(ctypes.get_errno(), "mount " + dst)
    if cfg["cgroup"]:
        try:
            with open(cfg["cgroup"], "w") as f: f.write(str(os.getpid()))
            st["cgroup"] = True
        except OSError:
            st["cgroup"] = False
    root = os.geteuid() == 0
    if not root and (cfg["netns"] or cfg["mountns"]):
        # Unprivileged: a user namespace where we are root, to own the other namespaces.
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(NEWUSER) == 0:
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open("/proc/self/" + name, "w") as f: f.write(text)
            st["userns"] = True
    st["netns"] = bool(cfg["netns"]) and libc.unshare(NEWNET) == 0
    if st["netns"]:
        import fcntl, socket, struct
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, b""))[:18])[1]
            fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))
            s.close(); st["loopback"] = True
        except OSError:
            st["loopback"] = False
    st["mountns"] = False
    R = cfg.get("root")
    def locked(path):  # a remount must keep the flags a user namespace locked on the source mount
        f = os.statvfs(path).f_flag
        return (f & (NOSUID | NODEV | NOEXEC | 1024 | 2048)) | ((1 << 21) if f & 4096 else 0)
    def build_root(new):
        # A fresh, empty root: only what R["binds"] names exists in it (read-only unless "rw").
        mount("tmpfs", new, "tmpfs", NOSUID | NODEV, "size=%dm,mode=755" % cfg["tmpfs_mb"])
        os.makedirs(new + "/proc")
        for src, dst, kind in R["binds"]:
            t = new + dst
            if kind == "link":
                os.makedirs(os.path.dirname(t), exist_ok=True); os.symlink(src, t); continue
            if kind == "tmp":
                os.makedirs(t, exist_ok=True)
                mount("tmpfs", t, "tmpfs", NOSUID | NODEV, "size=%dm,mode=1777" % cfg["tmpfs_mb"]); continue
            if kind == "empty":  # covers a folder an earlier bind brought in (site-packages)
                os.makedirs(t, exist_ok=True)
                mount("tmpfs", t, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
                mount(None, t, None, REMOUNT | RDONLY | NOSUID | NODEV); continue
            if os.path.isdir(src):
                os.makedirs(t, exist_ok=True)
            elif not os.path.exists(t):  # a file covered inside an earlier read-only bind exists already
                os.makedirs(os.path.dirname(t), exist_ok=True); open(t, "a").close()
            mount(src, t, None, BIND | REC)
            flags = {"ro": RDONLY | NODEV, "dev": RDONLY, "rw": NODEV}[kind]
            mount(None, t, None, REMOUNT | BIND | NOSUID | flags | locked(src))
        mount(None, new, None, REMOUNT | RDONLY | NOSUID | NODEV)
    def enter_root():
        if R and st["mountns"]:
            os.chroot(R["dir"]); os.chdir("/"); st["root"] = True
    newns = bool(cfg["mountns"]) and libc.unshare(NEWNS) == 0
    if newns and R:
        mount(None, "/", None, REC | PRIV)
        build_root(R["dir"])
        st["mountns"] = True
    elif newns:
        mount(None, "/", None, REC | PRIV)
        keep = [(p, os.open(p, os.O_PATH)) for p in cfg["expose"] + [cfg["workdir"]]]
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(d) and not os.path.islink(d):
                mount("tmpfs", d, "tmpfs", NOSUID | NODEV, "size=%dm,mode=1777" % cfg["tmpfs_mb"])
        st["hidden"] = 0
        for h in cfg["hide"]:
            try:
                if os.path.isdir(h): mount("tmpfs", h, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
                elif os.path.exists(h): mount("/dev/null", h, None, BIND)
                st["hidden"] += 1
            except OSError:
                pass  # reported: `hidden` counts the paths actually covered
        for c in cfg["cover"]:
            mount("tmpfs", c, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
        for p, fd in keep:
            if os.path.isdir("/proc/self/fd/%d" % fd): os.makedirs(p, exist_ok=True)
            mount("/proc/self/fd/%d" % fd, p, None, BIND | REC)
            os.close(fd)
        st["mountns"] = True
    st["pidns"] = bool(cfg["pidns"]) and libc.unshare(NEWPID) == 0
    def wait_for(pid, reap_all):
        while True:
            try:
                got, status = os.waitpid(-1 if reap_all else pid, 0)
            except InterruptedError:
                continue
            if got == pid:
                return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    if st["pidns"]:
        # Three processes: this one waits outside; its child is pid 1 of the new namespace and only
        # reaps (orphans are reparented to it, not to the host's init); the grandchild execs the
        # command. When pid 1 exits or is killed, the kernel kills and reaps the whole namespace.
        reaper = os.fork()
        if reaper:
            os.write(sfd, (json.dumps({"child": reaper}) + "\n").encode()); os.close(sfd)
            code = wait_for(reaper, False)
            if 128 < code < 160:  # the command died of a signal: die of it too, for the exit status
                if code - 128 not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(code - 128, signal.SIG_DFL)
                os.kill(os.getpid(), code - 128)
            os._exit(code)
        libc.prctl(1, 9)
        if st["mountns"]:
            mount("proc", (R["dir"] if R else "") + "/proc", "proc", NOSUID | NODEV | NOEXEC)
        enter_root()
        command = os.fork()
        if command:
            os.close(sfd)
            os._exit(wait_for(command, True))
    else:
        enter_root()
    L = cfg["limits"]
    for name, soft, hard in (("RLIMIT_CPU", L["cpu_s"], L["cpu_s"] + 1), ("RLIMIT_AS", L["as"], L["as"]),
                             ("RLIMIT_FSIZE", L["fsize"], L["fsize"]), ("RLIMIT_CORE", 0, 0),
                             ("RLIMIT_NPROC", L["nproc"], L["nproc"])):
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if cfg["uid"] is not None:
        os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
    st["uid"] = os.getuid()
    if st.get("userns"):
        # uid 0 of its own user namespace: exec would hand the command every capability there
        # (chroot twice to leave its root, umount what covers a hidden path). SECBIT_NOROOT and
        # no ambient raise, both locked: the command execs with none.
        if libc.prctl(28, 0x1 | 0x2 | 0x40 | 0x80, 0, 0, 0) != 0:  # PR_SET_SECUREBITS
            raise OSError(ctypes.get_errno(), "securebits")
        st["no_caps"] = True
    st["no_new_privs"] = libc.prctl(38, 1, 0, 0, 0) == 0
    os.chdir(cfg["cwd"])
    report()
    os.execve(cfg["exe"], cfg["cmd"], cfg["env"])
except BaseException as exc:
    report(error="%s: %s" % (type(exc).__name__, exc))
    os._exit(127)
"""


# ---------------------------------------------------------------- launching


def _limits(cpu_s: int, mem_mb: int, fsize_mb: int, nproc: int) -> dict[str, int]:
    return {"cpu_s": int(cpu_s), "as": int(mem_mb) << 20, "fsize": int(fsize_mb) << 20, "nproc": int(nproc)}


def _launcher_config(argv, work: Path, repo: Path, env, uid, limits, *, netns, mountns, pidns, cgroup, hide,
                     exe, root: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`root` ({"dir": an empty folder, "binds": [[src, dst, kind], ...]}, see `root_binds`): the
    command runs chrooted in a fresh root that holds only those paths; `hide` is then moot. A
    bind's kind is ro, rw, dev (read-only, devices allowed), link (a symlink to src), tmp (a
    private writable tmpfs) or empty (an empty read-only folder over what an earlier bind holds)."""
    expose = _python_paths(exe) if uid is not None and root is None else []
    return {"cmd": list(argv), "exe": exe, "parent": os.getpid(), "env": dict(env), "cwd": str(repo), "workdir": str(work),
            "uid": uid, "limits": limits, "netns": netns, "mountns": mountns, "pidns": pidns, "cgroup": cgroup,
            "hide": hide, "expose": expose if mountns else [],
            "cover": _covers(expose) if mountns else [],
            "tmpfs_mb": max(16, limits["fsize"] >> 20), "root": dict(root) if root else None}


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def root_binds(exe: str, read_only: Sequence[str] = (), writable: Mapping[str, str] | None = None) -> list[list[str]]:
    """The binds of a minimal root for a Python program: the system's programs and libraries, the
    interpreter and its prefixes, harmless /dev nodes, a private /tmp, `read_only` host paths (at
    the same place) and `writable` {host path: path inside}. Nothing else of the host exists in it:
    no /home, /root, /etc, no workspace, no repository checkout."""
    binds: list[list[str]] = []
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            binds.append([os.readlink(top), top, "link"])
        elif os.path.isdir(top):
            binds.append([top, top, "ro"])
    binds += [[f, f, "ro"] for f in _SYSTEM_FILES if os.path.isfile(f)]
    binds += [[d, d, "dev"] for d in _DEVICES if os.path.exists(d)]
    binds.append(["", "/tmp", "tmp"])
    system = tuple(d.rstrip("/") + "/" for d in _SYSTEM_DIRS)
    for p in [*_python_paths(exe), *map(os.path.realpath, read_only)]:
        if not (p + "/").startswith(system) and os.path.exists(p):
            binds.append([p, p, "ro"])
    binds += [[src, dst, "rw"] for src, dst in (writable or {}).items()]
    return binds


def _feed(pipe, data: bytes) -> None:
    try:
        with pipe:
            pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the command exited without reading it all


def _start(cfg: dict[str, Any], work: Path, with_stdin: bool = False, pass_fds: Sequence[int] = (),
           capture: bool = True) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start the launcher; return the process and its status line (read before the command runs).

    `pass_fds` reach the command (the only descriptors it inherits besides 0-2); `capture=False`
    sends its stdout and stderr to /dev/null instead of pipes the caller must drain."""
    rfd, wfd = os.pipe()
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg), str(wfd)],
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL, stdout=out, stderr=out,
            pass_fds=(wfd, *pass_fds), start_new_session=True, env={"PATH": PATH}, cwd=str(work), close_fds=True,
        )
    finally:
        os.close(wfd)
    try:
        # The launcher writes its status and the pipe closes at exec (or exit); it runs no untrusted
        # code before, so a long wait here means the machine is stuck, not the command.
        data = b""
        while True:
            ready, _, _ = select.select([rfd], [], [], 30)
            chunk = os.read(rfd, 65536) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(rfd)
    status: dict[str, Any] = {}
    for line in data.splitlines():  # one line before exec, a second one if exec failed
        try:
            status.update(json.loads(line))
        except ValueError:
            status["error"] = f"launcher status unreadable: {data[:200]!r}"
    if not status:
        status["error"] = "launcher gave no status"
    return proc, status


def _scrubbed_env(home: Path, tmp: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A fresh environment: nothing of ours (tokens, proxies, virtualenv) leaks in."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:{PATH}",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONIOENCODING": "utf-8",
    }
    env.update(extra)
    return env


def _python_paths(exe: str) -> list[str]:
    """The interpreter's files, which the fresh uid must reach even under a private home."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
             os.path.dirname(os.path.realpath(exe))}
    return sorted(p for p in paths if os.path.isdir(p))


def _covers(expose: Sequence[str]) -> list[str]:
    """Ancestors of exposed paths that others cannot traverse (e.g. /root, mode 700).

    The launcher mounts an empty tmpfs (mode 755) over each and binds the exposed paths back, so
    the sandbox uid reaches the interpreter and nothing else that lives there.
    """
    covers: set[str] = set()
    for p in expose:
        parts = Path(p).parts
        for i in range(2, len(parts)):
            anc = str(Path(*parts[:i]))
            if not os.stat(anc).st_mode & stat.S_IXOTH:
                covers.add(anc)
                break
    return sorted(covers)

