"""The Linux calls the sandbox's worker side makes that Python has no wrapper for, or that it
must make at full width: ``prctl``, ``mount``, ``pivot_root``, ``clone`` into new namespaces,
``keyctl``, the seccomp filter's installation, rlimits and descriptor placement.

Standard library only: the worker loads it by path (:mod:`labkit.sandbox.worker`), and every
check's processes run it after they are forked.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import platform
import resource
import signal

# Linux constants (include/uapi/linux/sched.h, mount.h, prctl.h).
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
# clone has no Python wrapper; its system call number by machine, on the machines whose
# argument order starts (flags, stack, ...) (not s390, which swaps the first two)
SYS_CLONE = {"x86_64": 56, "amd64": 56, "aarch64": 220, "arm64": 220, "riscv64": 220,
             "loongarch64": 220, "ppc64le": 120, "ppc64": 120}
CHECK_NAMESPACES = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC  # new for every check
MNT_DETACH = 2
# statvfs flags that a bind mount must keep when remounted (they may be locked)
ST_KEEP, ST_RELATIME = 0x2 | 0x4 | 0x8 | 0x400 | 0x800, 0x1000  # nosuid nodev noexec noatime nodiratime
# pivot_root has no libc wrapper; its system call number by machine
SYS_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41,
                  "loongarch64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217, "i386": 217,
                  "i686": 217, "armv7l": 218, "armv6l": 218}
IPC_RMID = 0
# keyctl (include/uapi/linux/keyctl.h) has no libc wrapper either
SYS_KEYCTL = {"x86_64": 250, "amd64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219,
              "loongarch64": 219, "ppc64le": 271, "ppc64": 271, "s390x": 280, "i386": 288,
              "i686": 288, "armv7l": 311, "armv6l": 311}
KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 0, 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5
MOUNT_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                      "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME,
                      "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

libc = ctypes.CDLL(None, use_errno=True)
libc_holding_gil = ctypes.PyDLL(None, use_errno=True)  # for clone: no thread may run meanwhile


def libc_call(name: str, *args) -> None:
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args!r}: {os.strerror(errno)}")


def prctl(option: int, arg: int = 0) -> None:
    # variadic in C, and the kernel reads unsigned longs: pass every argument at full width
    libc_call("prctl", *(ctypes.c_ulong(v) for v in (option, arg, 0, 0, 0)))


def mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    libc_call("mount", source and source.encode(), target.encode(), fstype and fstype.encode(),
               ctypes.c_ulong(flags), data and data.encode())


def bind_readonly(source: str, target: str, device: bool = False, recursive: bool = False) -> None:
    """Bind-mount ``source`` on ``target`` (which must exist) and make that mount read-only,
    nosuid and (unless ``device``) nodev, keeping the flags the source's mount may lock."""
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    kept = os.statvfs(target).f_flag
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (kept & ST_KEEP)
    if not device:
        flags |= MS_NODEV
    if kept & ST_RELATIME:
        flags |= MS_RELATIME
    mount(None, target, None, flags)


def pivot_root(new_root: str) -> None:
    """Make ``new_root`` (a mount point) this namespace's root and detach the old root, so
    that no path leads back to it."""
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {platform.machine()}")
    os.chdir(new_root)
    if libc.syscall(ctypes.c_long(number), b".", b".") != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"pivot_root: {os.strerror(errno)}")
    try:
        libc_call("umount2", b".", ctypes.c_int(MNT_DETACH))  # the old root, stacked on "/"
    except OSError as e:  # the host's root is still reachable: never run a check like that
        raise RuntimeError(f"cannot detach the old root after pivot_root: {e}") from None
    os.chdir("/")


def clone_process(flags: int) -> int:
    """``os.fork()`` into new namespaces: the child starts in those of ``flags`` (with
    ``CLONE_NEWPID`` as pid 1 of a new PID namespace, which ``unshare`` cannot give the
    calling process itself, only its next child). Returns 0 in the child and the child's pid
    in the parent, and runs Python's fork hooks, as :func:`os.fork` does. The C library's own
    fork handlers do not run, so call it from a single-threaded process (the worker is); the
    child's C library still holds the parent's thread id, which only the ``pthread``
    functions aimed at the main thread by id read (``raise`` asks the kernel)."""
    number = SYS_CLONE.get(platform.machine())
    if number is None:
        raise OSError(f"clone: unknown system call on {platform.machine()}")
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = libc_holding_gil.syscall(ctypes.c_long(number), ctypes.c_ulong(flags | signal.SIGCHLD),
                                   None, None, None, None)
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    errno = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(errno, f"clone: {os.strerror(errno)}")
    return pid


def mount_proc(options: str) -> None:
    """Mount a ``/proc`` for this process's PID namespace over the view's ``/proc`` (in this
    process's own mount namespace), read-only."""
    mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, options or None)


def pids_in_proc() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())



class SockFprog(ctypes.Structure):
    """``struct sock_fprog``: a BPF program for ``PR_SET_SECCOMP``."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(fprog: SockFprog) -> None:
    """Install the seccomp filter in this process (for good: it is inherited and cannot be
    removed). Needs ``no_new_privs``, which the worker set."""
    libc_call("prctl", ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
               ctypes.c_void_p(ctypes.addressof(fprog)), ctypes.c_ulong(0), ctypes.c_ulong(0))


def clear_keyrings(user: bool) -> None:
    """Give this process a session keyring of its own (so it does not share the worker's),
    and with ``user`` empty the user and user-session keyrings of its uid, which the kernel
    keeps per uid after every process of it has ended. Only for a uid of the sandbox's own:
    never empty the keyrings of a user who runs other things. Best effort, silent."""
    number = SYS_KEYCTL.get(platform.machine())
    if number is None:
        return
    keyctl = functools.partial(libc.syscall, ctypes.c_long(number))
    keyctl(ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None))
    if not user:
        return
    for spec in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        serial = keyctl(ctypes.c_int(KEYCTL_GET_KEYRING_ID), ctypes.c_int(spec), ctypes.c_int(0))
        if serial > 0:  # it exists (asking does not create it)
            keyctl(ctypes.c_int(KEYCTL_CLEAR), ctypes.c_int(serial))


def place_fds(targets: dict[int, int]) -> None:
    """``dup2`` each source descriptor onto its target number (targets are small numbers),
    whatever numbers the sources have, then close every other descriptor."""
    moved = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 64) for target, source in targets.items()}
    for target, source in moved.items():
        os.dup2(source, target)
    os.closerange(max(targets) + 1, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 256))


def set_limits(limits: dict, nproc: bool) -> None:
    mib = 1 << 20
    for which, soft, hard in (
        (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib, limits["memory_mb"] * mib),
        (resource.RLIMIT_FSIZE, limits["fsize_mb"] * mib, limits["fsize_mb"] * mib),
        (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
        (resource.RLIMIT_CORE, 0, 0),
        *([(resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"])] if nproc else []),
    ):
        resource.setrlimit(which, (soft, hard))
