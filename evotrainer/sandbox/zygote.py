"""The warm pytest worker that runs inside the sandbox (shipped as a file, run as a script; it
imports nothing of evotrainer). warm.py starts it through the launcher and talks to it on its
stdin/stdout, one JSON line per job each way.

The zygote runs as root of its own network, mount and pid namespaces (the launcher made them)
and only ever runs trusted code: it imports pytest, pytest's built-in plugins and the standard
library modules the repository imports, and then forks once per job:

    zygote -> S (per task, root): compiles the task's own files once (see warm_up)
           -> G (per job, root): new mount and pid namespaces; private /tmp, /var/tmp,
              /dev/shm; the job's hidden paths covered; supervises the wall clock and the
              process budget
           -> P1 (pid 1 of the job's pid namespace): joins the job's pids cgroup, reaps orphans
           -> T (the test run): rlimits, the job's fresh uid, no_new_privs, parent-death signal,
              only fds 0-2, a scrubbed environment; then pytest in-process, as `python -m pytest`

Killing P1 kills every process the job started (the kernel empties a pid namespace with its
init), so a background thread or a forked grandchild never outlives its job. T is a fork: what
the code under test does to pytest, to our guard plugin or to any module lives in T's memory
only, and the next job forks from the untouched zygote. The library under test is never
imported here: T imports it from the job's own copy of the repository, so no module state of a
previous job (edited code, monkeypatches, caches) can be seen.
"""

import ast
import ctypes
import gc
import hashlib
import json
import os
import re
import signal
import sys
import time

NEWNS, NEWPID = 0x00020000, 0x20000000
REC, PRIV, BIND, NOSUID, NODEV = 16384, 1 << 18, 4096, 2, 4
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
libc = ctypes.CDLL(None, use_errno=True)


def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount " + dst)


def preload(names):
    """pytest, its built-in plugins and the standard library modules the repository imports
    (`names`, found by the parent): stable code, shared by every job through fork. Nothing of the
    repository itself is imported here."""
    import pytest  # noqa: F401
    from _pytest.config import default_plugins

    for name in default_plugins:
        try:
            __import__("_pytest." + name)
        except Exception:
            pass
    import_stdlib(names)
    rehearse()
    prebuild()
    # Everything alive now is shared with the runs: out of the collector's sight, so a run's
    # collections neither scan it nor copy its pages (the fork-server use gc.freeze exists for).
    gc.freeze()


def import_stdlib(names):
    """The standard library modules among `names` (nothing else: they are trusted and stable)."""
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    for name in names:
        if name.split(".")[0] in stdlib and name not in sys.modules:
            try:
                __import__(name)
            except Exception:
                pass


REHEARSAL = """import pytest


@pytest.mark.parametrize("x", [1, 2])
def test_rehearsal(x, tmp_path, monkeypatch, capsys):
    assert x in (1, 2)
"""


PREBUILT = []  # [(the "-p no:..." arguments it was made with, a Config)]
PLUGIN_ARGS = ["-p", "no:cacheprovider"]


def excluded(args):
    """The `-p no:NAME` arguments, which pytest applies before it loads its own plugins."""
    out, args = [], list(args or ())
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "-p" and i + 1 < len(args) else arg[2:] if arg.startswith("-p") else ""
        if value.strip().startswith("no:"):
            out.append(value.strip())
    return out


def prebuild():
    """pytest's first step of every run, done once: a plugin manager with the built-in plugins
    imported and registered and their options declared (`_pytest.config.get_config`). Nothing of
    it depends on the run but the `-p no:` arguments and the invocation record, which the run
    checks and fills in (see `use_prebuilt`)."""
    from _pytest.config import get_config

    try:
        PREBUILT.append((excluded(PLUGIN_ARGS), get_config(PLUGIN_ARGS, None, prog="pytest.main()")))
    except Exception:
        pass


def use_prebuilt():
    """In T: the first get_config call with the same `-p no:` arguments gets the prebuilt one."""
    import pathlib

    from _pytest import config as cfgmod

    original = cfgmod.get_config

    def get_config(args=None, plugins=None, *, prog=None):
        if PREBUILT and PREBUILT[0][0] == excluded(args) and prog == "pytest.main()":
            config = PREBUILT.pop()[1]
            config.invocation_params = cfgmod.Config.InvocationParams(args=args or (), plugins=plugins,
                                                                      dir=pathlib.Path.cwd())
            return config
        return original(args, plugins, prog=prog)

    cfgmod.get_config = get_config


def plugin_objects(args):
    """`-p MODULE` arguments as imported modules (pytest.main's `plugins`), the way pytest would
    import them: no entry point has these names (plugin autoload is off), and looking one up
    reads every installed distribution's metadata. A module that does not import stays an
    argument, for pytest to report as it would."""
    import importlib

    rest, plugins, i = [], [], 0
    while i < len(args):
        if args[i] == "-p" and i + 1 < len(args) and not args[i + 1].startswith("no:"):
            try:
                plugins.append(importlib.import_module(args[i + 1]))
                i += 2
                continue
            except Exception:
                pass
        rest.append(args[i])
        i += 1
    return rest, plugins


def rehearse():
    """One pytest session on a throwaway test, as the runs will hold theirs: what pytest imports
    lazily, compiles (its regular expressions) and caches (the installed distributions it looks
    plugins up in) is then shared by every run. What the session leaves in sys.path, sys.meta_path
    and sys.modules (the throwaway module) is put back."""
    import tempfile

    import pytest

    path, meta, modules = list(sys.path), list(sys.meta_path), set(sys.modules)
    cwd, tempdir = os.getcwd(), tempfile.tempdir
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_rehearsal.py"), "w") as f:
            f.write(REHEARSAL)
        with open(os.path.join(tmp, "evo_rehearsal_plugin.py"), "w") as f:
            f.write("def pytest_collection_modifyitems(items):\n    pass\n")
        sys.path.insert(0, tmp)
        os.chdir(tmp)
        env = dict(os.environ)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        try:
            pytest.main(["-p", "no:cacheprovider", "-p", "evo_rehearsal_plugin", "-q", "--rootdir", tmp,
                         "--continue-on-collection-errors", "--junitxml=" + os.path.join(tmp, "j.xml"),
                         "test_rehearsal.py"])
        except BaseException:
            pass
        finally:
            os.chdir(cwd)
            tempfile.tempdir = tempdir
            os.environ.clear()
            os.environ.update(env)
            sys.path[:] = path
            sys.meta_path[:] = meta
            for name in set(sys.modules) - modules:
                if name in ("test_rehearsal", "evo_rehearsal_plugin", "conftest"):
                    del sys.modules[name]


COMPILED = {}  # (path, digest of the source) -> code: what T would compile, made once
REWRITTEN = {}  # the same for test modules, with pytest's assertion rewriting
MEMO_CAP = 4096
TEST_NAME = re.compile(r"^(test_.*|.*_test|conftest)\.py$")


def digest(data):
    return hashlib.blake2b(data, digest_size=20).digest()


def warm_up(job):
    """Compile the job's trusted files (the task's own: never a file the candidate's patch wrote)
    as they will be compiled in the run, at the fixed path the run sees them at. Each run is a new
    copy, so without this every run compiled the whole library and its tests again."""
    if len(COMPILED) + len(REWRITTEN) > MEMO_CAP:
        COMPILED.clear()
        REWRITTEN.clear()
    for rel in job.get("trusted", ()):
        with open(os.path.join(job["repo"], rel), "rb") as f:
            source = f.read()
        path = os.path.join(job["cwd"], rel)
        key = (path, digest(source))
        if key not in COMPILED:
            COMPILED[key] = compile(source, path, "exec", dont_inherit=True, optimize=-1)
        if TEST_NAME.match(os.path.basename(rel)) and key not in REWRITTEN:
            from _pytest.assertion.rewrite import rewrite_asserts

            tree = ast.parse(source, filename=path)
            rewrite_asserts(tree, source, path, None)
            REWRITTEN[key] = compile(tree, path, "exec", dont_inherit=True)


def use_compiled():
    """In T: look compiled code up by path and source digest before compiling (a miss compiles as
    usual, so a changed file is always compiled from what is on disk)."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    from _pytest.assertion import rewrite

    plain = SourceFileLoader.source_to_code

    def source_to_code(self, data, path, *, _optimize=-1):
        co = COMPILED.get((path, digest(data))) if _optimize == -1 and isinstance(data, bytes) else None
        return co if co is not None else plain(self, data, path, _optimize=_optimize)

    original = rewrite._rewrite_test

    def rewrite_test(fn, config):
        source = fn.read_bytes()
        co = REWRITTEN.get((str(fn), digest(source)))
        if co is None or (config is not None and config.getini("enable_assertion_pass_hook")):
            return original(fn, config)
        return importlib.util.source_hash(source), co

    SourceFileLoader.source_to_code = source_to_code
    rewrite._rewrite_test = rewrite_test


def main():
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = open(os.devnull, "w")
    setup = json.loads(requests.readline())
    preload(setup["preload"])
    sys.dont_write_bytecode = True
    replies.write(b'{"ready": true}\n')
    task = None
    for line in requests:
        job = json.loads(line)
        if any(name not in sys.modules for name in job.get("preload", ())):  # a repository not seen yet
            import_stdlib(job["preload"])
            gc.freeze()
        if task is not None and (task[0] != job.get("task") or not task_alive(task)):
            stop_task(task)
            task = None
        if task is None:
            task = start_task(job.get("task"), requests, replies)
        try:
            task[2].write(line if line.endswith(b"\n") else line + b"\n")
            reply = task[3].readline()
        except OSError:
            reply = b""
        if not reply.endswith(b"\n"):
            stop_task(task)
            task = None
            reply = json.dumps({"error": "the task's worker died"}).encode() + b"\n"
        replies.write(reply)


def start_task(key, *keep_closed):
    """S: a fork that serves one task's jobs, with that task's files compiled. The zygote itself
    never reads a task's files, so no run can find another task's code in its memory (another
    task's copy of a module may hold this task's fix)."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_w)
            os.close(from_r)
            for f in keep_closed:
                f.close()
            serve_task(os.fdopen(to_r, "rb"), os.fdopen(from_w, "wb", buffering=0))
        finally:
            os._exit(0)
    os.close(to_r)
    os.close(from_w)
    return key, pid, os.fdopen(to_w, "wb", buffering=0), os.fdopen(from_r, "rb")


def task_alive(task):
    try:
        return os.waitpid(task[1], os.WNOHANG)[0] == 0
    except ChildProcessError:
        return False


def stop_task(task):
    for f in task[2:]:
        try:
            f.close()
        except OSError:
            pass
    try:
        os.kill(task[1], signal.SIGKILL)
        os.waitpid(task[1], 0)
    except OSError:
        pass


def serve_task(jobs, out):
    for line in jobs:
        job = json.loads(line)
        try:
            warm_up(job)
            gc.freeze()
        except Exception:
            pass  # a cold compile in the run costs time, never correctness
        reply = run_job(job, jobs, out)
        out.write((json.dumps(reply) + "\n").encode())


def run_job(job, *keep_closed):
    r, w = os.pipe()
    g = os.fork()
    if g == 0:
        code = 70
        try:
            os.close(r)
            for f in keep_closed:
                f.close()
            report = supervise(job)
            os.write(w, json.dumps(report).encode())
            code = 0
        except BaseException as exc:
            try:
                os.write(w, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(g, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"error": "the job's supervisor reported nothing"}


def supervise(job):
    """G: the job's namespaces and mounts, then P1 and T; wait with the deadline and budget."""
    start = time.monotonic()
    # No network namespace per job: the zygote's own (loopback only) already separates every job
    # from the host, and a job's sockets die with its processes before the next job starts.
    if libc.unshare(NEWNS | NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    mount(None, "/", None, REC | PRIV)
    # The pids cgroup is reached through a descriptor: its folder is covered below (the private
    # /tmp, the hidden paths; the run must not list the other runs' cgroups), and P1 closes it
    # before T starts.
    cgfd = os.open(job["cgroup"], os.O_PATH | os.O_DIRECTORY) if job.get("cgroup") else None
    keep = [(p, os.open(p, os.O_PATH)) for p in [job["dir"], *job["expose"]]
            if any(p == d or p.startswith(d + "/") for d in PRIVATE_TMP)]
    for d in PRIVATE_TMP:
        if os.path.isdir(d) and not os.path.islink(d):
            mount("tmpfs", d, "tmpfs", NOSUID | NODEV, f"size={job['tmpfs_mb']}m,mode=1777")
    for p, fd in keep:
        os.makedirs(p, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", p, None, BIND | REC)
        os.close(fd)
    for h in job["hide"]:  # the run's answers (the task's repo, its task file) and the protected stores
        if os.path.isdir(h):
            mount("tmpfs", h, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
        elif os.path.exists(h):
            mount("/dev/null", h, None, BIND)
    # Every run sees its copy at the same path, so code compiled once matches every run's files.
    os.makedirs(job["cwd"], exist_ok=True)
    mount(job["repo"], job["cwd"], None, BIND | REC)
    p1 = os.fork()
    if p1 == 0:
        try:
            os._exit(init(job, cgfd))
        finally:
            os._exit(71)
    timed_out = over_budget = False
    deadline = start + job["timeout_s"]
    uid, nproc = job["uid"], job["nproc"]
    try:
        pidfd = os.pidfd_open(p1)
    except (AttributeError, OSError):
        pidfd = None
    import select

    usage = None
    while True:
        got, status, usage = os.wait4(p1, os.WNOHANG)
        if got:
            break
        if time.monotonic() > deadline:
            timed_out = True
        elif count(uid, cgfd) >= nproc:
            over_budget = True
        if timed_out or over_budget:
            os.kill(p1, signal.SIGKILL)
            got, status, usage = os.wait4(p1, 0)
            break
        if pidfd is not None:
            select.select([pidfd], [], [], min(0.05, max(0.0, deadline - time.monotonic()) + 0.001))
        else:
            time.sleep(0.005)
    leftover = sweep(uid)
    if os.WIFSIGNALED(status):
        rc = -os.WTERMSIG(status)
    else:
        rc = os.WEXITSTATUS(status)
        if 128 < rc < 160:  # P1 passes on T's death by signal as 128 + signal, like a shell
            rc = 128 - rc
    return {"returncode": rc, "timed_out": timed_out, "nproc_exceeded": over_budget,
            "killed": timed_out or over_budget or leftover, "duration_s": time.monotonic() - start,
            "cpu_s": usage.ru_utime + usage.ru_stime if usage else None,
            "isolation": {"warm": True, "mountns": True, "pidns": True,
                          "uid": uid, "no_new_privs": True, "cgroup": cgfd is not None}}


def count(uid, cgfd):
    if cgfd is not None:
        try:
            with open(os.open("pids.current", os.O_RDONLY, dir_fd=cgfd)) as f:
                return int(f.read()) - 1  # P1
        except (OSError, ValueError):
            pass
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                n += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return n


def sweep(uid):
    """Kill what is left of the uid (nothing should be: its pid namespace died with P1)."""
    found = False
    for _ in range(100):
        alive = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat("/proc/" + name).st_uid == uid:
                        with open(f"/proc/{name}/stat", "rb") as f:
                            if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                                alive.append(int(name))
                except (OSError, IndexError):
                    pass
        if not alive:
            return found
        found = True
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)
    return found


def init(job, cgfd):
    """P1: pid 1 of the job's namespace. Reaps every orphan; exits with T's status."""
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if cgfd is not None:
        with open(os.open("cgroup.procs", os.O_WRONLY, dir_fd=cgfd), "w") as f:
            f.write(str(os.getpid()))
        os.close(cgfd)
    mount("proc", "/proc", "proc", NOSUID | NODEV | 8)
    t = os.fork()
    if t == 0:
        code = 1
        try:
            code = run_tests(job)
        finally:
            os._exit(code)
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1
        if got == t:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def run_tests(job):
    """T: drop to the job's uid and limits, then run pytest in-process as `python -m pytest` would."""
    import resource

    out = os.open(os.path.join(job["log"], "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(os.path.join(job["log"], "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.closerange(3, 1 << 16)  # the zygote's request and reply pipes above all
    libc.prctl(1, signal.SIGKILL)
    lim = job["limits"]
    for name, soft, hard in (("RLIMIT_CPU", lim["cpu_s"], lim["cpu_s"] + 1), ("RLIMIT_AS", lim["as"], lim["as"]),
                             ("RLIMIT_FSIZE", lim["fsize"], lim["fsize"]), ("RLIMIT_CORE", 0, 0),
                             ("RLIMIT_NPROC", lim["nproc"], lim["nproc"])):
        resource.setrlimit(getattr(resource, name), (soft, hard))
    uid = job["uid"]
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return 126
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    os.umask(0o022)
    # sys.path as `python -m pytest` has it: the working folder, PYTHONPATH, then the interpreter's.
    extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [job["cwd"], *extra, *(p for p in sys.path if p != here)]
    import io

    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False), encoding="utf-8")
    import random
    import tempfile

    import pytest

    random.seed()  # a fresh interpreter's state, not the zygote's (every run would draw the same numbers)
    tempfile.tempdir = None  # found again from this run's TMPDIR
    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *job["args"]]
    use_compiled()
    use_prebuilt()
    del job
    code = 1
    try:
        args, plugins = plugin_objects(sys.argv[1:])
        code = pytest.main(args, plugins)
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException:
        import traceback

        traceback.print_exc()
    # The interpreter's own exit: wait for non-daemon threads, run atexit handlers, flush.
    import atexit
    import threading

    try:
        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return int(code) if isinstance(code, int) else 1


def exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
