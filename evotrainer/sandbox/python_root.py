"""The root a sandboxed Python check runs in: what the interpreter needs, and nothing else of the host.

Policy text that runs (a code solution, a user's verifier reading a completion) must not read the
host: a solution that globs for an installed copy of a public benchmark and returns its reference
solutions passes every task it finds, and /etc, the repository, the workspace or a home folder
hold nothing it needs either. So `run_sandboxed(..., root=...)` chroots the command into a fresh
root built by the launcher (launcher.py `build_root`) from one of two lists of binds:

- `STDLIB`: the interpreter binary, the shared libraries it and its standard library's extension
  modules load (as `ldd` names them), the standard library with its site-packages covered by an
  empty folder, a few /dev nodes and a private /tmp. No /etc, no /usr beyond those libraries, no
  installed package. What a code check needs (HumanEval and MBPP use the stdlib only).
- `PACKAGES`: the harness workers' root (launcher.py `root_binds`): the system's programs and
  libraries, the interpreter and its prefixes with their installed packages. For a user's verifier,
  which may import installed packages; still no /etc, home, workspace or repository checkout.

Either way the run's own folder is bound in read-write at its host path, and any `hide` path that
a bind would bring in is covered (an empty folder, or /dev/null over a file).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from functools import lru_cache

from evotrainer.errors import SandboxError
from evotrainer.sandbox.launcher import _DEVICES, PATH, root_binds

STDLIB = "stdlib"
PACKAGES = "packages"
ROOTS = (STDLIB, PACKAGES)

_PATHS = ("import json, sys, sysconfig; print(json.dumps([sysconfig.get_path('stdlib'), "
          "sysconfig.get_path('platstdlib'), sysconfig.get_path('purelib'), sysconfig.get_path('platlib')]))")
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def python_root(exe: str, kind: str, work: str, hide: Sequence[str] = ()) -> tuple[str, list[list[str]]]:
    """(the interpreter to exec, the binds of the root) for a run of `exe` whose folder is `work`."""
    if kind not in ROOTS:
        raise ValueError(f"sandbox root must be one of {ROOTS}, got {kind!r}")
    if kind == STDLIB:
        exe = os.path.realpath(exe)  # the real binary: a virtualenv's pyvenv.cfg would add its packages
        binds = [list(b) for b in _stdlib_binds(exe)]
    else:
        binds = root_binds(exe)
    binds.append([work, work, "rw"])
    return exe, binds + _covers(binds, hide)


@lru_cache(maxsize=4)
def _stdlib_binds(exe: str) -> tuple[tuple[str, str, str], ...]:
    """The interpreter, its libraries and its stdlib (site-packages covered); probed once per exe."""
    try:
        out = subprocess.run([exe, "-I", "-S", "-c", _PATHS], capture_output=True, text=True, timeout=60,
                             env={"PATH": PATH}, check=True).stdout
        stdlib, platstdlib, purelib, platlib = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxError(f"cannot ask {exe} where its standard library is: {exc}") from None
    libs = {os.path.realpath(d) for d in (stdlib, platstdlib)}
    packages = {os.path.realpath(d) for d in (purelib, platlib)}
    binds: list[tuple[str, str, str]] = [(exe, exe, "ro")]
    binds += [(d, d, "ro") for d in sorted(libs) if os.path.isdir(d)]
    binds += [("", d, "empty") for d in sorted(packages) if os.path.isdir(d) and _under(d, libs)]
    binds += [(f, f, "ro") for f in _shared_libraries(exe, sorted(libs), packages)]
    binds += [(d, d, "dev") for d in _DEVICES if os.path.exists(d)]
    binds.append(("", "/tmp", "tmp"))
    return tuple(binds)


def _shared_libraries(exe: str, libs: Sequence[str], packages: set[str]) -> list[str]:
    """Every shared object the interpreter and the stdlib's extension modules load, at the path the
    loader looks for it and at the file that path resolves to."""
    ldd = shutil.which("ldd", path=PATH)
    if ldd is None:
        raise SandboxError("the Python check's root needs `ldd` (glibc's libc-bin) to list the interpreter's "
                           "libraries, and it is not on " + PATH)
    objects = [exe]
    for top in libs:
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in packages]
            objects += [os.path.join(folder, f) for f in files if f.endswith(".so")]
    found: set[str] = set()
    for start in range(0, len(objects), 64):
        proc = subprocess.run([ldd, *objects[start:start + 64]], capture_output=True, text=True, timeout=120,
                              env={"PATH": PATH}, check=False)
        for path in _LDD_PATH.findall(proc.stdout):
            if os.path.exists(path):
                found.update({os.path.abspath(path), os.path.realpath(path)})
    return sorted(p for p in found if not _under(p, set(libs)))


def _covers(binds: Sequence[Sequence[str]], hide: Sequence[str]) -> list[list[str]]:
    """An empty folder (or /dev/null) over each `hide` path that a bind brought into the root."""
    bound = {os.path.realpath(src) for src, _, kind in binds if kind in ("ro", "rw", "dev") and src}
    out = []
    for path in hide:
        real = os.path.realpath(path)
        if not os.path.exists(real) or not _under(real, bound):
            continue
        out.append(["", real, "empty"] if os.path.isdir(real) else ["/dev/null", real, "ro"])
    return out


def _under(path: str, tops: set[str] | Sequence[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)
