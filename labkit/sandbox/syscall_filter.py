"""The sandbox's system-call filter: what a repair candidate never needs, denied by seccomp.

Every check's child (and the trusted grader process of its assert tests) runs under a
seccomp-BPF filter that lets every system call through except those in :data:`DENIED`,
which fail with ``EPERM`` (``clone3`` fails with ``ENOSYS``, so that the C library falls back
to ``clone``, whose flags the filter can read, and threads keep working). Three calls are
denied only with some arguments: ``clone`` with a namespace flag (:data:`NAMESPACE_FLAGS`),
``socket`` and ``socketpair`` with any family but :data:`SOCKET_FAMILIES`, ``preadv2`` and
``pwritev2`` with :data:`RWF_NOWAIT`, and ``ioctl`` with two terminal requests. A call made
through another architecture's system-call table (``int 0x80`` or the x32 ABI on x86-64)
kills the process: the filter only knows the native numbers.

The filter is compiled here, in the parent, with libseccomp (through ``pyseccomp``, a
``ctypes`` binding of ``libseccomp.so.2``) and sent to the workers as raw BPF, which they
install in each child with one ``prctl`` call; the workers import no third-party module.
Where libseccomp or ``pyseccomp`` is missing, :func:`compile_filter` says why and the
sandbox reports the ``seccomp`` protection as off (``docs/sandbox.md``).
"""

from __future__ import annotations

import errno
import os
import platform
import tempfile

_KEYS = "the kernel's key retention service: keys outlive the process and are per uid, a "\
        "channel from one check to the next"
_TRACE = "reads or writes another process's memory or file descriptors"
_MOUNT = "changes the file-system view (needs privileges the check does not have)"
_KERNEL = "changes the running kernel or the machine"
_NS = "creates or joins namespaces: a user namespace gives the process capabilities in it"
_CACHE = "evicts, loads or reads the residency of pages of a file in the host's page cache, "\
         "which every check shares: bits one check leaves and the next one reads"
_AIO = "Linux AIO: its reads take RWF_NOWAIT (is this page cached?) in memory the filter " \
       "cannot read"

DENIED: dict[str, str] = {
    "add_key": _KEYS, "request_key": _KEYS, "keyctl": _KEYS,
    "ptrace": _TRACE, "process_vm_readv": _TRACE, "process_vm_writev": _TRACE,
    "pidfd_getfd": _TRACE, "kcmp": _TRACE, "process_madvise": _TRACE,
    "mount": _MOUNT, "umount": _MOUNT, "umount2": _MOUNT, "pivot_root": _MOUNT,
    "chroot": _MOUNT, "move_mount": _MOUNT, "open_tree": _MOUNT, "fsopen": _MOUNT,
    "fsconfig": _MOUNT, "fsmount": _MOUNT, "fspick": _MOUNT, "mount_setattr": _MOUNT,
    "unshare": _NS, "setns": _NS,
    "clone3": "its flags are in memory the filter cannot read; fails with ENOSYS so that "
              "the C library uses clone, whose namespace flags are denied",
    "bpf": "loads programs into the kernel",
    "perf_event_open": "performance counters: a side channel and a large kernel surface",
    "userfaultfd": "user-space page-fault handling: a common kernel-exploit primitive",
    "io_uring_setup": "io_uring runs system calls the filter never sees",
    "io_uring_enter": "io_uring runs system calls the filter never sees",
    "io_uring_register": "io_uring runs system calls the filter never sees",
    "init_module": _KERNEL, "finit_module": _KERNEL, "delete_module": _KERNEL,
    "create_module": _KERNEL, "query_module": _KERNEL, "get_kernel_syms": _KERNEL,
    "kexec_load": _KERNEL, "kexec_file_load": _KERNEL, "reboot": _KERNEL,
    "swapon": _KERNEL, "swapoff": _KERNEL, "acct": _KERNEL, "quotactl": _KERNEL,
    "quotactl_fd": _KERNEL, "syslog": "reads the kernel log",
    "settimeofday": _KERNEL, "clock_settime": _KERNEL, "clock_adjtime": _KERNEL,
    "adjtimex": _KERNEL, "stime": _KERNEL, "sethostname": _KERNEL, "setdomainname": _KERNEL,
    "iopl": _KERNEL, "ioperm": _KERNEL, "vhangup": _KERNEL, "uselib": _KERNEL,
    "lookup_dcookie": _KERNEL, "nfsservctl": _KERNEL, "_sysctl": _KERNEL, "ustat": _KERNEL,
    "sysfs": _KERNEL, "vm86": _KERNEL, "vm86old": _KERNEL,
    "open_by_handle_at": "opens files by handle, bypassing the mount view",
    "name_to_handle_at": "file handles for open_by_handle_at",
    "fanotify_init": "watches the whole file system",
    "personality": "changes the execution domain (e.g. no address-space randomisation)",
    "mbind": "NUMA memory policy of the machine", "set_mempolicy": "NUMA memory policy",
    "migrate_pages": "moves other processes' pages", "move_pages": "moves other processes' pages",
    "fadvise64": _CACHE, "fadvise64_64": _CACHE, "arm_fadvise64_64": _CACHE,
    "readahead": _CACHE, "cachestat": _CACHE,
    "io_setup": _AIO, "io_submit": _AIO, "io_getevents": _AIO, "io_pgetevents": _AIO,
    "io_cancel": _AIO, "io_destroy": _AIO,
    "memfd_create": "anonymous files that can be mapped executable",
    "seccomp": "installs filters, with user-notification listeners; the sandbox installs its "
               "own with prctl before the candidate runs",
    "socketcall": "multiplexes the socket calls with their arguments in memory the filter "
                  "cannot read (so the family allow-list could be bypassed)",
}
"""Denied system calls and why. Names that do not exist on this machine's architecture are
left out of the filter."""

NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
                   "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000,
                   "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}
"""``clone`` with any of these flags is denied: a new namespace of any kind."""

TIOCSTI, TIOCLINUX = 0x5412, 0x541C
"""``ioctl`` requests denied: pushing input into a terminal, and the Linux console's."""

SOCKET_FAMILIES = {"AF_UNIX": 1}
"""The only socket family ``socket`` and ``socketpair`` may create. Every other one fails with
``EPERM``: ``AF_VSOCK`` (the empty network namespace does not cover it; on a virtual machine
the hypervisor listens there), ``AF_NETLINK`` (``sock_diag`` lists the host's sockets,
``uevent`` its devices), ``AF_PACKET``, and ``AF_INET``/``AF_INET6``, which no test needs (and
which reach nothing from the empty network namespace)."""

RWF_NOWAIT = 0x8
"""``preadv2`` and ``pwritev2`` with this flag are denied: a buffered read that must not wait
fails with ``EAGAIN`` exactly when the page is not in the page cache."""

NEW_SYSCALL_NUMBERS = {"cachestat": 451}
"""Numbers of denied calls newer than some libseccomp releases know (the same on every
architecture but alpha, whose table is offset): used when libseccomp cannot resolve the
name, so that an older library still denies them."""


def compile_filter() -> tuple[bytes | None, str]:
    """The filter as raw BPF (``struct sock_filter`` array, native byte order) and ``""``; or
    ``None`` and why it cannot be built here (no Linux, no ``pyseccomp``, no libseccomp)."""
    if os.uname().sysname != "Linux":
        return None, f"seccomp needs Linux, not {os.uname().sysname}"
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as e:  # RuntimeError: no libseccomp.so.2
        return None, (f"no seccomp filter: pyseccomp cannot load libseccomp ({e}); install "
                      "libseccomp2 (Debian/Ubuntu) and the pyseccomp package")
    try:
        deny = sc.ERRNO(errno.EPERM)
        rules = sc.SyscallFilter(sc.ALLOW)
        for name in DENIED:
            number = sc.resolve_syscall(sc.Arch.NATIVE, name)
            if number < 0 and name in NEW_SYSCALL_NUMBERS and platform.machine() != "alpha":
                number = NEW_SYSCALL_NUMBERS[name]
            if number < 0:  # not a system call of this architecture
                continue
            rules.add_rule(sc.ERRNO(errno.ENOSYS) if name == "clone3" else deny, number)
        flags_arg = 1 if platform.machine() in ("s390x", "s390") else 0  # clone's flags
        for flag in NAMESPACE_FLAGS.values():
            rules.add_rule(deny, "clone", sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag))
        for request in (TIOCSTI, TIOCLINUX):
            rules.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
        (allowed_family,) = SOCKET_FAMILIES.values()
        for call in ("socket", "socketpair"):  # the family is the first argument of both
            rules.add_rule(deny, call, sc.Arg(0, sc.NE, allowed_family))
        for call in ("preadv2", "pwritev2"):  # fd, iov, count, pos_l, pos_h, flags
            rules.add_rule(deny, call, sc.Arg(5, sc.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT))
        with tempfile.TemporaryFile() as out:
            rules.export_bpf(out)
            out.seek(0)
            program = out.read()
    except OSError as e:
        return None, f"no seccomp filter: libseccomp refused it ({e})"
    if not program or len(program) % 8:
        return None, "no seccomp filter: libseccomp exported an empty or malformed program"
    return program, ""


__all__ = ["DENIED", "NAMESPACE_FLAGS", "RWF_NOWAIT", "SOCKET_FAMILIES", "compile_filter"]
