"""A seccomp-BPF syscall filter for sandboxed Python workers: no new processes, programs, ptrace, mounts or sockets.

`install(own_pid)` loads the filter into the calling process (all its threads, TSYNC) and returns
True, or False where the kernel or the architecture does not allow it. The process must already
have `no_new_privs` (the launcher sets it). The filter is built here, by hand, from the kernel's
classic-BPF instruction format (linux/filter.h, linux/seccomp.h): no third-party library.

What it refuses, killing the whole process (SECCOMP_RET_KILL_PROCESS, so harness code cannot catch
it and carry on): creating processes (fork, vfork, clone without CLONE_THREAD; threads stay
allowed, numpy and Python's threading need them), running programs (execve, execveat), debugging
or reading other processes (ptrace, process_vm_*), sockets of any family but AF_UNIX, signals to
any process but itself, namespace and mount changes (unshare, setns, mount, umount2, pivot_root,
chroot), kernel interfaces that widen the attack surface (bpf, perf_event_open, userfaultfd,
io_uring_*, keyctl, modules, kexec), and any x32-ABI syscall. clone3 answers ENOSYS instead, so
glibc's pthread_create falls back to clone, where the CLONE_THREAD check can read the flags.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# linux/audit.h architectures, and each one's syscall numbers for what we refuse.
_ARCHES = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "socket": 41,
        "socketpair": 53, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250,
        "add_key": 248, "request_key": 249, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "open_by_handle_at": 304,
        "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
        "personality": 135, "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169,
    }),
    "aarch64": (0xC00000B7, {
        "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "socket": 198, "socketpair": 199,
        "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "unshare": 97, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "open_by_handle_at": 265, "fsopen": 430, "fsmount": 432,
        "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "personality": 92, "acct": 89,
        "swapon": 224, "swapoff": 225, "reboot": 142,
    }),
}
_X32_BIT = 0x40000000
CLONE_THREAD = 0x00010000
AF_UNIX = 1

# classic BPF opcodes and seccomp return values
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0: its low 32 bits, little endian)

_SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # arg0 is a pid: only our own
_ALWAYS = ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
           "socketpair", "tkill", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "unshare", "setns",
           "mount", "umount2", "pivot_root", "chroot", "bpf", "perf_event_open", "userfaultfd",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key",
           "request_key", "init_module", "finit_module", "delete_module", "kexec_load",
           "kexec_file_load", "open_by_handle_at", "fsopen", "fsmount", "move_mount", "open_tree",
           "mount_setattr", "personality", "acct", "swapon", "swapoff", "reboot")


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def program(own_pid: int, machine: str | None = None) -> bytes | None:
    """The filter as raw `struct sock_filter` instructions, or None for an unknown architecture."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nr = arch
    kill, allow = _op(_RET_K, _RET_KILL_PROCESS), _op(_RET_K, _RET_ALLOW)
    out = [_op(_LD_W_ABS, _ARCH), _op(_JEQ_K, audit_arch, 1, 0), kill,  # another ABI: refuse all
           _op(_LD_W_ABS, _NR), _op(_JGE_K, _X32_BIT, 0, 1), kill]
    for name in _ALWAYS:
        if name in nr:
            out += [_op(_JEQ_K, nr[name], 0, 1), kill]
    # clone3 passes its flags in memory that BPF cannot read: ENOSYS makes glibc use clone.
    out += [_op(_JEQ_K, nr["clone3"], 0, 1), _op(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    # clone: a thread (CLONE_THREAD set) is allowed, anything else is a new process.
    out += [_op(_JEQ_K, nr["clone"], 0, 4), _op(_LD_W_ABS, _ARG0), _op(_JSET_K, CLONE_THREAD, 0, 1), allow, kill]
    # socket: only AF_UNIX (arg0 is the family).
    out += [_op(_JEQ_K, nr["socket"], 0, 4), _op(_LD_W_ABS, _ARG0), _op(_JEQ_K, AF_UNIX, 0, 1), allow, kill]
    # signals: only to ourselves (abort() and raise() signal their own process).
    for name in _SIGNALS:
        out += [_op(_JEQ_K, nr[name], 0, 4), _op(_LD_W_ABS, _ARG0), _op(_JEQ_K, own_pid, 0, 1), allow, kill]
    out.append(allow)
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_GET_NO_NEW_PRIVS = 22, 2, 39


def install(own_pid: int | None = None) -> bool:
    """Load the filter into this process (every thread). False where the kernel refuses or the
    architecture is unknown; raises nothing. Requires no_new_privs (else the kernel refuses)."""
    code = program(os.getpid() if own_pid is None else own_pid)
    if code is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    if libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        return False
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    sys_seccomp = _SYS_SECCOMP.get(platform.machine())
    if sys_seccomp is not None and libc.syscall(sys_seccomp, _SECCOMP_SET_MODE_FILTER,
                                                _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog)) == 0:
        return True
    # An older kernel without the seccomp syscall: this thread only (the worker has no others yet).
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def active() -> bool:
    """Whether this process runs under a seccomp filter (the Seccomp field of /proc/self/status)."""
    try:
        with open("/proc/self/status") as f:
            return any(line.split() == ["Seccomp:", "2"] for line in f)
    except OSError:
        return False
