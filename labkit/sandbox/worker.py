"""Fork-server worker of labkit's sandbox (see ``docs/sandbox.md``).

The parent (:class:`labkit.sandbox.pool.Sandbox`) starts one of these per core with a minimal
environment and ``python -s -P <this file>`` (``python -I`` works as well, but then the hash
seed is random and set iteration order differs between workers). It imports only the standard
library and ``plain.py``, loaded by path, so a candidate never shares a process with labkit,
torch or the caller's state.

Lifetime of a worker:

1. Read the configuration frame; pre-import the standard library modules candidates commonly
   use. Claim a sandbox uid nobody else uses (an abstract Unix socket named after it serves
   as the lock), and create the cgroup its checks will run in. If root on Linux, enter an
   empty network namespace, a private mount namespace and a private IPC namespace once, and
   replace the file system by an **allow-list** view: a new root (a read-only tmpfs)
   holding read-only bind mounts of the standard library, the interpreter and the shared
   libraries it and its extension modules link, a few device nodes, ``/proc``, and private
   tmpfs mounts on ``/tmp`` and ``/dev/shm``; then ``pivot_root`` into it and detach the old
   root. Nothing else of the host exists there. Where that cannot be built, fall back to the
   host's tree made read-only with the configured paths hidden (and say so in the notes).
   Every check forked later inherits all of this for free.
2. Freeze the heap for the cycle collector (less copy-on-write in children) and report which
   protections are active.
3. Per job: when the job has assert tests (the frame's payload), fork the **grader** with
   them, then zero the only copy here; clone the **child** into new PID, mount and IPC
   namespaces (it is pid 1 of its PID namespace and mounts a ``/proc`` for it; System V
   queues, semaphores and shared memory, POSIX message queues: nothing carries over
   between checks), and it starts a new session, joins the worker's cgroup (the memory and
   process maxima of a check), gets a fresh working directory, rlimits, the sandbox uid,
   its own session keyring and its uid's keyrings emptied, ``/dev/null`` as stdin and
   stdout, a pipe as stderr and a separate output pipe, and then the seccomp filter; the
   child executes the candidate module, writes one JSON line per IO case, and answers the
   grader's calls. The grader runs the assert tests with ``candidate`` bound to
   a proxy of those calls and writes its verdicts on a pipe of its own. The worker enforces
   the wall deadline, caps what it reads, kills both process groups, sweeps whatever the uid
   left behind, reaps zombies, gives the private tmp directories a new tmpfs and replies
   with the raw lines. Expected values of IO cases never reach this process; the parent
   grades them.

Channels: jobs arrive on stdin and replies leave on stdout as frames (``struct '>II'``:
header length, payload length; a UTF-8 JSON header; the payload bytes). For a fail-fast job
the child's result lines are also forwarded as they come (``{"partial": true}`` frames), and
the parent may then write the number of the running job (big-endian ``uint32``; jobs are
numbered 1, 2, ... on both sides) to the control pipe to have it stopped, which it does only
at a failure the candidate made itself (never at a wrong answer: that would tell it).
"""

# The harness runs untrusted code on purpose (exec) and must survive anything it raises
# (except BaseException), so those two rules do not apply to this file.
# ruff: noqa: S102, BLE001

from __future__ import annotations

import builtins
import ctypes
import fcntl
import functools
import gc
import glob
import importlib.util
import json
import os
import platform
import random
import re
import resource
import select
import signal
import socket
import stat
import struct
import sys
import sysconfig
import time

# Modules candidates commonly import. Importing them here once makes a check's
# ``import math`` a dictionary lookup instead of a file-system walk.
PREIMPORT = (
    "abc", "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "io",
    "itertools", "math", "numbers", "operator", "random", "re", "statistics", "string",
    "textwrap", "time", "typing", "unicodedata",
)

FRAME = struct.Struct(">II")

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
DEVICES = ("null", "zero", "full", "random", "urandom")  # the device nodes a check gets
PRIVATE_IN_VIEW = ("/tmp", "/dev", "/proc")  # what the allow-list view mounts itself
MOUNT_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                      "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME,
                      "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

RESULT_FD = 3  # the child's output channel: load, one line per IO case, end
CALL_FD, REPLY_FD = 4, 5  # the child's end of the grader's calls: requests in, outputs out
VERDICT_FD = 3  # the grader's verdict channel (in the grader process)
GRADER_CALL_FD, GRADER_REPLY_FD = 4, 5  # the grader's ends of the call pipes
MAX_REQUEST_INT_DIGITS = 20  # raw JSON ints an honest peer writes are below 2**53
REAP_GRACE_S = 2.0  # how long to wait for killed processes to be reaped
STREAM_AFTER_S = 0.05  # fail-fast checks forward their lines once they have run this long


def _load_sibling(name: str):
    """``labkit/env/<name>.py`` by path (a standard-library-only module: the codec, the
    cgroup helpers) without importing the rest of labkit."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_labkit_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


plain = _load_sibling("plain")
cgroups = _load_sibling("cgroups")
libc = ctypes.CDLL(None, use_errno=True)
libc_holding_gil = ctypes.PyDLL(None, use_errno=True)  # for clone: no thread may run meanwhile


def _libc_call(name: str, *args) -> None:
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args!r}: {os.strerror(errno)}")


def _prctl(option: int, arg: int = 0) -> None:
    # variadic in C, and the kernel reads unsigned longs: pass every argument at full width
    _libc_call("prctl", *(ctypes.c_ulong(v) for v in (option, arg, 0, 0, 0)))


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    _libc_call("mount", source and source.encode(), target.encode(), fstype and fstype.encode(),
               ctypes.c_ulong(flags), data and data.encode())


def _bind_readonly(source: str, target: str, device: bool = False, recursive: bool = False) -> None:
    """Bind-mount ``source`` on ``target`` (which must exist) and make that mount read-only,
    nosuid and (unless ``device``) nodev, keeping the flags the source's mount may lock."""
    _mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    kept = os.statvfs(target).f_flag
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (kept & ST_KEEP)
    if not device:
        flags |= MS_NODEV
    if kept & ST_RELATIME:
        flags |= MS_RELATIME
    _mount(None, target, None, flags)


def _pivot_root(new_root: str) -> None:
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
        _libc_call("umount2", b".", ctypes.c_int(MNT_DETACH))  # the old root, stacked on "/"
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
    _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, options or None)


def _pids_in_proc() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


# ----------------------------------------------------------------------------- framing


def read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or ``None`` at end of file."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_into(fd: int, size: int) -> bytearray | None:
    """``size`` bytes from ``fd`` read straight into a new ``bytearray`` (no other copy is
    made in this process, so that zeroing it erases them), or ``None`` at end of file."""
    buffer = bytearray(size)
    done = 0
    with memoryview(buffer) as view:
        while done < size:
            with view[done:] as rest:
                n = os.readv(fd, [rest])
            if n == 0:
                return None
            done += n
    return buffer


def zero(buffer: bytearray) -> None:
    """Overwrite ``buffer`` in place."""
    buffer[:] = bytes(len(buffer))


def read_frame(fd: int) -> tuple[dict, bytearray] | None:
    """A frame from ``fd``: its JSON header and its payload (a ``bytearray``, see
    :func:`read_into`), or ``None`` at end of file."""
    head = read_exact(fd, FRAME.size)
    if head is None:
        return None
    n_header, n_payload = FRAME.unpack(head)
    header = read_exact(fd, n_header)
    payload = read_into(fd, n_payload) if header is not None else None
    if payload is None:
        return None
    return json.loads(header), payload


def write_frame(fd: int, header: dict, payload: bytes = b"") -> None:
    data = json.dumps(header, separators=(",", ":")).encode()
    view = memoryview(FRAME.pack(len(data), len(payload)) + data + payload)
    while view:
        view = view[os.write(fd, view):]


# ----------------------------------------------------------------------------- the allow-list view

# A few files of the host's /etc and /usr/share that the standard library reads: the dynamic
# loader's cache (for extension modules imported later) and the time zone.
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
SYSTEM_DIRS = ("/usr/share/zoneinfo",)
# Libraries glibc loads with dlopen rather than through DT_NEEDED (thread cancellation).
DLOPENED = ("libgcc_s.so.1",)


@functools.cache
def _elf(path: str) -> tuple[int, list[str], list[str], str | None] | None:
    """``(class, needed, search dirs, interpreter)`` of an ELF file: its ELF class (1: 32-bit,
    2: 64-bit), its ``DT_NEEDED`` libraries, the directories of its ``DT_RUNPATH`` (else
    ``DT_RPATH``) with ``$ORIGIN`` expanded, and its ``PT_INTERP``. ``None`` when ``path`` is
    not a readable ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2):
                return None
            bits, order = head[4], "<" if head[5] == 1 else ">"
            if bits == 2:
                (phoff,), (phentsize, phnum) = struct.unpack_from(order + "Q", head, 32), \
                    struct.unpack_from(order + "HH", head, 54)
                header, fields, dyn = order + "IIQQQQQQ", (0, 2, 3, 5), order + "qQ"
            else:
                (phoff,), (phentsize, phnum) = struct.unpack_from(order + "I", head, 28), \
                    struct.unpack_from(order + "HH", head, 42)
                header, fields, dyn = order + "IIIIIIII", (0, 1, 2, 4), order + "iI"
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            segments = []  # (type, file offset, virtual address, size in the file)
            for k in range(phnum):
                values = struct.unpack_from(header, table, k * phentsize)
                segments.append(tuple(values[i] for i in fields))

            def read(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(min(size, 1 << 24))

            interp = next((read(off, size).rstrip(b"\0").decode() for kind, off, _, size
                           in segments if kind == 3), None)  # PT_INTERP
            dynamic = next(((off, size) for kind, off, _, size in segments if kind == 2), None)
            if dynamic is None:  # static
                return bits, [], [], interp
            raw, entries = read(*dynamic), {}
            for k in range(0, len(raw) - struct.calcsize(dyn) + 1, struct.calcsize(dyn)):
                tag, value = struct.unpack_from(dyn, raw, k)
                if tag == 0:  # DT_NULL
                    break
                entries.setdefault(tag, []).append(value)
            strtab = (entries.get(5) or [None])[0]  # DT_STRTAB, a virtual address
            offset = next((strtab - vaddr + off for kind, off, vaddr, size in segments
                           if kind == 1 and strtab is not None and vaddr <= strtab < vaddr + size),
                          None)  # PT_LOAD holding it
            if offset is None:
                return bits, [], [], interp
            strings = read(offset, (entries.get(10) or [1 << 20])[0])  # DT_STRSZ

            def text(index: int) -> str:
                return strings[index:strings.index(b"\0", index)].decode()

            origin = os.path.dirname(os.path.realpath(path))
            paths = [text(i) for i in entries.get(29) or entries.get(15) or []]  # RUNPATH, RPATH
            dirs = [d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                    for joined in paths for d in joined.split(":") if d]
            return bits, [text(i) for i in entries.get(1, [])], dirs, interp  # DT_NEEDED
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None


def _loader_dirs(mapped: list[str]) -> list[str]:
    """Where the dynamic loader looks for a library, roughly in its order: the directories of
    the libraries already loaded, those of ``/etc/ld.so.conf`` (and its includes), then the
    default multiarch and plain library directories."""
    dirs = [os.path.dirname(p) for p in mapped]
    pending, seen = ["/etc/ld.so.conf"], set()
    while pending:
        conf = pending.pop(0)
        if conf in seen:
            continue
        seen.add(conf)
        try:
            with open(conf) as f:
                lines = [line.split("#")[0].strip() for line in f]
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            if line.startswith("include "):
                pattern = os.path.join(os.path.dirname(conf), line.split(None, 1)[1])
                pending += sorted(glob.glob(pattern))
            elif line.startswith("/"):
                dirs.append(line)
    triplet = sysconfig.get_config_var("MULTIARCH") or ""
    if triplet:
        dirs += [f"/lib/{triplet}", f"/usr/lib/{triplet}"]
    dirs += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return list(dict.fromkeys(dirs))


def _mapped_files() -> list[str]:
    """The regular files mapped into this process (the interpreter, its libraries and those of
    every extension module imported so far), from ``/proc/self/maps``."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                path = fields[5].rstrip("\n")
                if os.path.isfile(path):
                    found.append(path)
    return list(dict.fromkeys(found))


def shared_libraries(stdlib: list[str], interpreter: str) -> list[str]:
    """The shared objects a check may need: the files mapped now, and the closure over
    ``DT_NEEDED`` of the interpreter, of those, and of every extension module of the
    standard library (so that ``import sqlite3`` works later), with the dynamic loader and
    the libraries glibc opens itself. Names the loader would not find are left out."""
    mapped = _mapped_files()
    dirs = _loader_dirs(mapped)
    first = _elf(interpreter)
    bits = first[0] if first else 2

    def locate(name: str, runpath: list[str]) -> str | None:
        if "/" in name:
            return name if os.path.isfile(name) else None
        for directory in [*runpath, *dirs]:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate) and (_elf(candidate) or (0,))[0] == bits:
                return candidate
        return None

    pending = [interpreter, *mapped, *filter(None, (locate(name, []) for name in DLOPENED))]
    for directory in stdlib:
        pending += sorted(glob.glob(os.path.join(directory, "lib-dynload", "*.so")))
    found: dict[str, None] = {}
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found[path] = None
        info = _elf(path)
        if info is None:  # a mapped data file (locale), kept as it is
            continue
        _, needed, runpath, interp = info
        pending += [hit for hit in (locate(name, runpath) for name in needed) if hit]
        if interp:
            pending.append(interp)
    return list(found)


def _symlink_chain(path: str) -> tuple[list[tuple[str, str]], str]:
    """The symbolic links met on the way to ``path`` (each as ``(link, target)``, to recreate
    in the new root) and the real path at the end."""
    links: list[tuple[str, str]] = []
    current, parts, hops = "/", path.strip("/").split("/"), 0
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        step = os.path.normpath(os.path.join(current, name))
        if os.path.islink(step):
            hops += 1
            if hops > 40:
                raise OSError(f"too many symbolic links on the way to {path}")
            target = os.readlink(step)
            links.append((step, target))
            resolved = os.path.normpath(os.path.join(current, target))
            current, parts = "/", resolved.strip("/").split("/") + parts
            continue
        current = step
    return links, current


class RootPlan:
    """What the allow-list root holds, decided on the host before anything is mounted:
    directories and files to bind read-only (real paths), symbolic links to recreate, and
    paths inside those to mask with an empty tmpfs."""

    def __init__(self, cfg: dict, stdlib: list[str]):
        interpreter = os.path.realpath(sys.executable)
        self.links: dict[str, str] = {}
        self.dirs: list[str] = []
        self.files: list[str] = []
        self.notes: list[str] = []
        extra = list(cfg.get("extra_paths", ()))
        wanted = [*stdlib, *SYSTEM_DIRS, *extra, interpreter,
                  *shared_libraries(stdlib, interpreter), *SYSTEM_FILES]
        for path in wanted:
            if not os.path.lexists(path):
                continue
            links, real = _symlink_chain(os.path.abspath(path))
            private = next((d for d in PRIVATE_IN_VIEW if _under(real, d)), None)
            if private is not None:  # the view mounts its own /tmp, /dev and /proc there
                if path in extra:
                    self.notes.append(f"extra path {path} is inside {private}, which checks "
                                      "get private: left out")
                    continue
                raise OSError(f"{path} is inside {private}, which the allow-list view "
                              "replaces")
            self.links.update(links)
            if os.path.isdir(real):
                self.dirs.append(real)
            elif os.path.isfile(real):
                self.files.append(real)
        self.dirs = sorted(set(self.dirs), key=lambda p: (p.count("/"), p))
        self.dirs = [d for i, d in enumerate(self.dirs)
                     if not any(_under(d, e) for e in self.dirs[:i])]
        self.files = [f for f in dict.fromkeys(self.files) if not self._covered(f)]
        self.links = {link: target for link, target in self.links.items()
                      if not self._covered(link)}
        hide = [os.path.realpath(p) for p in cfg["hide_paths"]]
        hide += [os.path.join(d, name) for d in stdlib for name in ("site-packages", "dist-packages")]
        self.masks = sorted({p for p in hide if os.path.isdir(p) and p not in self.dirs
                             and any(_under(p, d) for d in self.dirs)})

    def _covered(self, path: str) -> bool:
        """Whether ``path`` is inside a directory the root binds whole."""
        return any(_under(path, d) for d in self.dirs)

    def touches(self, directory: str) -> bool:
        """Whether ``directory`` is on the way to, or inside, anything the root uses (then it
        cannot serve as the staging mount point)."""
        return any(_under(p, directory) or _under(directory, p)
                   for p in [*self.dirs, *self.files, *self.links, *self.links.values()]
                   if p.startswith("/"))


# ----------------------------------------------------------------------------- isolation


class Isolation:
    """What the worker set up once, at start, and which protections it amounts to."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.root = os.geteuid() == 0
        self.uid: int | None = None
        self.notes: list[str] = []
        self.protections = {
            "rlimits": True, "session": True, "wall_deadline": True, "output_cap": True,
            "minimal_env": True, "process_sweep": True, "non_root_uid": False,
            "no_new_privs": False, "net_namespace": False, "mount_namespace": False,
            "ipc_namespace": False, "allowlist_root": False, "readonly_root": False,
            "hidden_paths": False, "private_tmp": False, "seccomp": False,
            "pid_namespace": False, "cgroup": False,
        }
        self.ipc_per_check = False  # every check gets a fresh IPC namespace
        self.check_namespaces = 0  # clone flags of every check's first process (PID, mount, IPC)
        self.proc_options = ""  # how that process mounts its own /proc
        self.cgroup = None  # the leaf cgroup (cgroups.CheckCgroup) every check joins
        self.private_dirs: list[str] = []  # private tmpfs mounts, new for every check
        self._tmpfs_options: dict[str, tuple[int, str]] = {}  # their flags and options
        self.seccomp: SockFprog | None = None  # the filter every check's processes install
        self.shared_tmp_dirs: list[str] = []  # host tmp dirs to clean of the uid's files
        self._uid_lock: socket.socket | None = None
        try:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            self.subreaper = True
        except OSError as e:
            self.subreaper = False
            self.notes.append(f"no child subreaper: {e}")
        try:
            _prctl(PR_SET_NO_NEW_PRIVS, 1)  # inherited by every child
            self.protections["no_new_privs"] = True
        except OSError as e:
            self.notes.append(f"no_new_privs unavailable: {e}")
        if cfg["drop_privileges"] and self.root:
            self._claim_uid(cfg["uid_base"])
        elif cfg["drop_privileges"]:
            self.notes.append("not root: checks run as the caller's uid")
        self.protections["process_sweep"] = self.subreaper or self.uid is not None
        if cfg.get("use_cgroup", True) and self.root:
            self._make_cgroup()  # before the view shrinks: it needs the host's /sys
        elif cfg.get("use_cgroup", True):
            self.notes.append("not root: no cgroup for the checks")
        if cfg["use_namespaces"] and self.root:
            self._enter_namespaces()
        elif cfg["use_namespaces"]:
            self.notes.append("not root: no network or mount namespace")
        if self.protections["mount_namespace"] and cfg.get("use_pid_namespace", True):
            self._probe_pid_namespace()
        if not self.protections["mount_namespace"] and self.uid is not None:
            self.shared_tmp_dirs = [d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
                                    if os.path.isdir(d)]
        os.chdir("/")
        if cfg.get("seccomp_bpf"):
            self._load_filter(bytes.fromhex(cfg["seccomp_bpf"]))
        else:
            self.notes.append(cfg.get("seccomp_note") or "no seccomp filter was sent")

    def _load_filter(self, program: bytes) -> None:
        """Keep the BPF program for the children, after checking in a throwaway child that it
        installs and denies what it should (a new user namespace, ``personality``)."""
        self._bpf = ctypes.create_string_buffer(program, len(program))
        fprog = SockFprog(len(program) // 8, ctypes.addressof(self._bpf))
        probe = os.fork()
        if probe == 0:
            code = 3
            try:
                install_filter(fprog)
                denied = (libc.unshare(CLONE_NEWUSER) != 0 and ctypes.get_errno() == 1
                          and libc.personality(ctypes.c_ulong(0xFFFFFFFF)) == -1)
                code = 0 if denied else 4
            except BaseException:
                code = 5
            finally:
                os._exit(code)
        _, status = os.waitpid(probe, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            self.seccomp = fprog
            self.protections["seccomp"] = True
        else:
            self.notes.append(f"the seccomp filter did not load or deny in a probe (status "
                              f"{status}): checks run without it")

    def _make_cgroup(self) -> None:
        """One leaf cgroup for this worker's checks, with the memory maximum of a check
        (``check_memory_mb``, by default ``memory_mb``) and its process maximum (``nproc``),
        named after the uid (unique on the host) or, without one, after this worker."""
        limits = self.cfg["limits"]
        name = (f"labkit-sandbox-{self.uid}" if self.uid is not None
                else f"labkit-sandbox-w{os.getpid()}")
        memory_mb = self.cfg.get("check_memory_mb") or limits["memory_mb"]
        group, why = cgroups.create(name, memory_mb << 20, limits["nproc"])
        if group is None:
            self.notes.append(f"no cgroup for the checks: {why}")
            return
        self.cgroup = group
        self.protections["cgroup"] = True

    def release_cgroup(self) -> None:
        """Close the cgroup's files and remove it (every process of it has been killed)."""
        if self.cgroup is not None:
            cgroups.close(self.cgroup, remove=True)
            self.cgroup = None

    def _probe_pid_namespace(self) -> None:
        """Check in a throwaway child that a check can start as pid 1 of a new PID namespace
        (with a mount and an IPC namespace of its own) and mount a ``/proc`` for it that
        lists nothing else; with ``subset=pid`` (Linux 5.8) that ``/proc`` has the process
        directories only, none of the host-wide files (``loadavg``, ``meminfo``, ``sys``)."""
        if platform.machine() not in SYS_CLONE:
            self.notes.append(f"no PID namespace per check: clone's arguments on "
                              f"{platform.machine()} are not known here")
            return
        for options in ("subset=pid", ""):
            try:
                probe = clone_process(CHECK_NAMESPACES)
            except OSError as e:
                self.notes.append(f"no PID namespace per check: {e}")
                return
            if probe == 0:
                code = 3
                try:
                    mount_proc(options)
                    code = 0 if os.getpid() == 1 and _pids_in_proc() == [1] else 4
                except BaseException:
                    code = 5
                finally:
                    os._exit(code)
            if os.waitpid(probe, 0)[1] == 0:
                self.check_namespaces, self.proc_options = CHECK_NAMESPACES, options
                self.protections["pid_namespace"] = True
                return
        self.notes.append("no PID namespace per check: a new one could not mount its /proc")

    def fork_check(self) -> int:
        """Fork a check's first process: into new PID, mount and IPC namespaces where the
        probe allowed it, else a plain fork. Returns as :func:`os.fork` does."""
        return clone_process(self.check_namespaces) if self.check_namespaces else os.fork()

    def _claim_uid(self, base: int) -> None:
        """Take the first uid from ``base`` that no other sandbox worker on this host holds."""
        for uid in range(base, base + 1000):
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                lock.bind(f"\0labkit-sandbox-uid-{uid}")
            except OSError:
                lock.close()
                continue
            self._uid_lock, self.uid = lock, uid
            self.protections["non_root_uid"] = True
            self.sweep()  # processes a crashed predecessor may have left
            return
        self.notes.append(f"no free sandbox uid in [{base}, {base + 1000})")

    def _enter_namespaces(self) -> None:
        try:
            _libc_call("unshare", CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
        except OSError as e:
            self.notes.append(f"unshare failed, no namespaces: {e}")
            return
        self.protections["net_namespace"] = True
        self.ipc_per_check = self.protections["ipc_namespace"] = True  # see child_main
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates to the host
        except OSError as e:
            self.notes.append(f"cannot make mounts private: {e}")
            return
        self.protections["mount_namespace"] = True
        # (a setup frame with "allowlist_root": false goes straight to the fallback: for tests)
        if self.cfg.get("allowlist_root", True):
            try:
                self._enter_allowlist_root()
                return
            except OSError as e:
                self.notes.append(f"no allow-list root ({e}); checks see the host's files, "
                                  "read-only, with the configured paths hidden")
        self._enter_denylist_view()

    def _enter_allowlist_root(self) -> None:
        """Build the allow-list root on a tmpfs and pivot into it. Raises OSError (with
        nothing changed) when it cannot be built; RuntimeError if the pivot half-happened."""
        stdlib = self._stdlib_dirs()
        plan = RootPlan(self.cfg, stdlib)
        self.notes += plan.notes
        staging = next((d for d in ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var/tmp")
                        if os.path.isdir(d) and not os.path.islink(d) and not plan.touches(d)),
                       None)
        if staging is None:
            raise OSError("no directory to build the new root on")
        _mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=4m")
        try:
            self._populate(staging, plan)
            _mount(None, staging, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            root_device = os.stat(staging).st_dev
        except OSError:
            _libc_call("umount2", staging.encode(), ctypes.c_int(MNT_DETACH))
            raise
        try:
            _pivot_root(staging)
        except OSError:
            os.chdir("/")
            _libc_call("umount2", staging.encode(), ctypes.c_int(MNT_DETACH))
            raise
        if os.stat("/").st_dev != root_device:
            raise RuntimeError("pivot_root did not leave the new root at /")
        self.private_dirs = ["/tmp", "/dev/shm"]
        options = f"mode=1777,size={self.cfg['tmpfs_mb']}m"
        self._tmpfs_options = {path: (MS_NOSUID | MS_NODEV, options) for path in self.private_dirs}
        self.protections.update(allowlist_root=True, readonly_root=True, hidden_paths=True,
                                private_tmp=True)

    def _populate(self, root: str, plan: RootPlan) -> None:
        """Fill the new root (a tmpfs mounted at ``root``): the planned binds, links and masks,
        ``/proc``, a ``/dev`` with a few device nodes, and private tmpfs mounts on ``/tmp``
        and ``/dev/shm``."""
        size = f"size={self.cfg['tmpfs_mb']}m"
        for directory in plan.dirs:
            _makedirs(root + directory)
            _bind_readonly(directory, root + directory)
        for link, target in sorted(plan.links.items(), key=lambda item: item[0].count("/")):
            _makedirs(root + os.path.dirname(link))
            if not os.path.lexists(root + link):
                os.symlink(target, root + link)
        for file in plan.files:
            _makedirs(root + os.path.dirname(file))
            os.close(os.open(root + file, os.O_CREAT | os.O_WRONLY, 0o644))
            _bind_readonly(file, root + file)
        for path in plan.masks:
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k")
        _makedirs(root + "/proc")
        _bind_readonly("/proc", root + "/proc", recursive=True)
        _makedirs(root + "/dev")
        _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
        for name in DEVICES:
            if os.path.exists("/dev/" + name):
                os.close(os.open(f"{root}/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
                _bind_readonly("/dev/" + name, f"{root}/dev/{name}", device=True)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"{root}/dev/{name}")
        for path in ("/tmp", "/dev/shm"):
            _makedirs(root + path)
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{size}")
        _mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)

    def _enter_denylist_view(self) -> None:
        """The fallback view: the host's tree, every mount read-only, the configured paths
        hidden behind empty tmpfs mounts, private ``/tmp`` and ``/dev/shm``."""
        self.protections["readonly_root"] = self._remount_readonly()
        keep = self._stdlib_dirs()
        hide = self._hide_targets(keep)
        for path in sorted({*self._blocked_ancestors(keep), *hide}, key=lambda p: p.count("/")):
            try:
                if self._mask(path, [k for k in keep if _under(k, path)]):
                    self.protections["hidden_paths"] |= path in hide
            except OSError as e:
                self.notes.append(f"cannot mask {path}: {e}")
        writable = ["/tmp", "/dev/shm"]
        if not self.protections["readonly_root"]:
            writable += ["/var/tmp", "/run/lock"]
        size = f"size={self.cfg['tmpfs_mb']}m"
        for path in writable:
            if os.path.isdir(path) and not os.path.islink(path):
                try:
                    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{size}")
                    self.private_dirs.append(path)
                    self._tmpfs_options[path] = (MS_NOSUID | MS_NODEV, f"mode=1777,{size}")
                except OSError as e:
                    self.notes.append(f"cannot mount a private tmpfs on {path}: {e}")
        self.protections["private_tmp"] = "/tmp" in self.private_dirs

    def _remount_readonly(self) -> bool:
        """Make every mount of this namespace read-only; True when ``/`` is."""
        root_ok = False
        with open("/proc/self/mountinfo", "rb") as f:
            mounts = [line.split() for line in f]
        for fields in mounts:
            # mount points escape space, tab, newline and backslash as octal (\040)
            target = os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]),
                                        fields[4]))
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY
            for option in fields[5].decode().split(","):
                flags |= MOUNT_OPTION_FLAGS.get(option, 0)
            try:
                _mount(None, target, None, flags)
                root_ok |= target == "/"
            except OSError as e:
                self.notes.append(f"cannot make {target} read-only: {e}")
        return root_ok

    @staticmethod
    def _stdlib_dirs() -> list[str]:
        base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}  # not a venv's
        paths = {os.path.realpath(sysconfig.get_path(k, vars=base)) for k in ("stdlib", "platstdlib")}
        paths = sorted(p for p in paths if os.path.isdir(p))
        return [p for p in paths if not any(q != p and _under(p, q) for q in paths)]

    @staticmethod
    def _blocked_ancestors(keep: list[str]) -> list[str]:
        """The outermost directory above each kept path that others may not search (e.g. a
        Python installed under ``/root``, mode 0700): masking it and binding the kept path
        back makes the standard library reachable for the sandbox uid."""
        blocked = []
        for path in keep:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                ancestor = "/" + "/".join(parts[:i])
                if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                    blocked.append(ancestor)
                    break
        return blocked

    def _hide_targets(self, keep: list[str]) -> list[str]:
        """The configured paths to hide, minus ``/`` and the standard library itself (hiding
        an ancestor of it is fine: the library is bound back in)."""
        targets = []
        for path in self.cfg["hide_paths"]:
            real = os.path.realpath(path)
            if real != "/" and real not in keep and os.path.isdir(real):
                targets.append(real)
        return targets

    def _mask(self, path: str, keep: list[str]) -> bool:
        """Mount an empty read-only tmpfs over ``path``, bind-mounting ``keep`` (paths inside
        it) back read-only. False when ``path`` is already invisible."""
        if not os.path.isdir(path):
            return False
        handles = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in keep]
        try:
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
            for k, handle in zip(keep, handles):
                os.makedirs(k, exist_ok=True)
                _mount(f"/proc/self/fd/{handle}", k, None, MS_BIND | MS_REC)
                _mount(None, k, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            _mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            for handle in handles:
                os.close(handle)
        return True

    # ------------------------------------------------------------------------- cleanup

    def sweep(self) -> None:
        """Kill every process of the sandbox uid (also ones that left the check's session).

        A helper forked from this worker becomes the uid and sends SIGKILL to -1: the kernel
        signals all of them while holding the task list lock, so a fork bomb cannot slip
        through. Without a uid of our own, kill this worker's descendants instead.
        """
        if self.uid is None:
            self._kill_descendants()
            return
        helper = os.fork()
        if helper == 0:
            try:
                os.setuid(self.uid)
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                clear_keyrings(user=True)  # the uid's own keyrings (when it could write them)
                os._exit(0)
        os.waitpid(helper, 0)

    def _kill_descendants(self) -> None:
        for _ in range(100):
            pids = _descendants(os.getpid())
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            reap_all(REAP_GRACE_S)

    def wipe(self, workdir: str, tick=None) -> str:
        """Remove what the check wrote: each private tmpfs is replaced by a new, empty one
        (the old one is detached, whatever it holds); on shared tmp dirs the top-level
        entries the sandbox uid owns are removed, and the working directory. Never raises:
        returns ``""``, or why something could not be removed (the worker then retires, so
        that nothing carries over to another check). ``tick`` is called now and then while
        a large tree is removed from a disk (see :func:`remove_tree`)."""
        problems = []
        for directory in self.private_dirs:
            flags, options = self._tmpfs_options[directory]
            try:
                _libc_call("umount2", directory.encode(), ctypes.c_int(MNT_DETACH))
                _mount("tmpfs", directory, "tmpfs", flags, options)
            except OSError as e:
                problems.append(f"cannot renew the tmpfs on {directory}: {e}")
        for directory in self.shared_tmp_dirs:
            try:
                entries = [e for e in os.scandir(directory)
                           if _owner(e) == self.uid]
            except OSError as e:
                problems.append(f"cannot list {directory}: {e}")
                continue
            for entry in entries:
                problems += remove_tree(entry.path, tick)
        problems += remove_tree(workdir, tick)
        return "; ".join(problems)[:500]

    def remove_ipc_objects(self) -> None:
        """Without an IPC namespace per check: remove the System V message queues, semaphore
        sets and shared memory segments the sandbox uid owns or created, so that the next
        check cannot read them. (POSIX message queues cannot be listed this way.)"""
        for kind, id_column, remove in (
                ("msg", "msqid", lambda i: libc.msgctl(i, IPC_RMID, None)),
                ("shm", "shmid", lambda i: libc.shmctl(i, IPC_RMID, None)),
                ("sem", "semid", lambda i: libc.semctl(i, 0, IPC_RMID))):
            try:
                with open(f"/proc/sysvipc/{kind}") as f:
                    header, *rows = [line.split() for line in f]
            except (OSError, ValueError):
                continue
            columns = {name: k for k, name in enumerate(header)}
            for row in rows:
                try:
                    owners = {int(row[columns["uid"]]), int(row[columns["cuid"]])}
                    if self.uid in owners:
                        remove(int(row[columns[id_column]]))
                except (KeyError, IndexError, ValueError):
                    continue


def _makedirs(path: str) -> None:
    """``os.makedirs`` with every new directory mode 755 whatever the umask, so that the
    sandbox uid can walk through it."""
    if os.path.isdir(path):
        return
    _makedirs(os.path.dirname(path))
    os.mkdir(path)
    os.chmod(path, 0o755)


def _under(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def _owner(entry: os.DirEntry) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return None


def remove_tree(path: str, tick=None) -> list[str]:
    """Remove ``path`` and everything under it, however deep, without recursion and without
    building long paths: descend one directory at a time through file descriptors, unlinking
    the files met on the way, and climb back through ``..`` (every process that could change
    the tree has been killed). Memory grows with the depth (one name per level), time with
    the number of entries (on a disk, removing a directory can take milliseconds: ``tick``
    is called every 256 entries, so that the worker can tell the parent it is alive).
    Never raises: returns what could not be removed."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return []
        top = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [f"cannot remove {path}: {e}"]
    names = [os.path.basename(path)]  # from the top down to the directory being emptied
    fd, count = -1, 0
    try:
        fd = _open_dir(names[0], top)
        while True:
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    count += 1
                    if tick is not None and count % 256 == 0:
                        tick()
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            if sub is not None:  # go down
                inner = _open_dir(sub, fd)
                os.close(fd)
                fd = inner
                names.append(sub)
                continue
            name = names.pop()  # this directory is empty now
            if not names:
                os.close(fd)
                fd = -1
                os.rmdir(name, dir_fd=top)
                return []
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(name, dir_fd=fd)
    except (OSError, MemoryError) as e:
        return [f"cannot remove {path} ({len(names)} levels down): {e}"]
    finally:
        if fd >= 0:
            os.close(fd)
        os.close(top)


def _open_dir(name: str, dir_fd: int) -> int:
    """Open the directory ``name`` inside ``dir_fd`` without following a link, making it
    searchable first if a check left it mode 000."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)
        return os.open(name, flags, dir_fd=dir_fd)


def _descendants(root: int) -> list[int]:
    """All live descendants of ``root``, read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, stack = [], list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def reap_zombies() -> bool:
    """Reap exited children without blocking; True when live children remain."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def reap_all(grace_s: float) -> None:
    """Reap children until there are none (they were all sent SIGKILL) or ``grace_s`` ends."""
    end = time.monotonic() + grace_s
    while reap_zombies() and time.monotonic() < end:
        time.sleep(0.001)


# ----------------------------------------------------------------------------- both processes


class SockFprog(ctypes.Structure):
    """``struct sock_fprog``: a BPF program for ``PR_SET_SECCOMP``."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(fprog: SockFprog) -> None:
    """Install the seccomp filter in this process (for good: it is inherited and cannot be
    removed). Needs ``no_new_privs``, which the worker set."""
    _libc_call("prctl", ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
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


def _place_fds(targets: dict[int, int]) -> None:
    """``dup2`` each source descriptor onto its target number (targets are small numbers),
    whatever numbers the sources have, then close every other descriptor."""
    moved = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 64) for target, source in targets.items()}
    for target, source in moved.items():
        os.dup2(source, target)
    os.closerange(max(targets) + 1, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 256))


def _set_limits(limits: dict, nproc: bool) -> None:
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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LineReader:
    """Reads newline-terminated lines from a descriptor, each at most ``cap`` bytes."""

    def __init__(self, fd: int, cap: int):
        self.fd, self.cap = fd, cap
        self.buffer = bytearray()

    def line(self) -> bytes | None:
        """The next line (without its newline), ``None`` at end of file. Raises
        :class:`ValueError` for a line longer than the cap."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[:end + 1]
                return line
            if len(self.buffer) > self.cap:
                raise ValueError(f"a line longer than {self.cap} bytes")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk


def _parse_int(text: str) -> int:
    if len(text) > MAX_REQUEST_INT_DIGITS:
        raise ValueError("a raw JSON integer this long is never written by the peer")
    return int(text)


# ----------------------------------------------------------------------------- the child


def child_main(job: dict, cfg: dict, iso: Isolation, workdir: str, devnull: int, err_w: int,
               res_w: int, calls: tuple[int, int] | None) -> None:
    """Runs in the forked child: confine the process, then run the candidate: its IO cases,
    then (with ``calls``, the read end of the grader's requests and the write end of the
    replies) the calls the grader makes for the assert tests.

    Confinement, in order: a new session; a ``/proc`` of its own when it is pid 1 of a new
    PID namespace (it was cloned into that, a mount and an IPC namespace), else a fresh IPC
    namespace; the worker's cgroup (the memory and process maxima of the check); the
    descriptors it needs and no other; rlimits, the sandbox uid, a session keyring of its
    own (and its uid's keyrings emptied), then the seccomp filter. Never returns: the
    process ends with ``os._exit`` so neither the worker's nor the candidate's ``atexit``
    handlers run.
    """
    status = 70
    try:
        os.setsid()
        if iso.check_namespaces:
            mount_proc(iso.proc_options)
        elif iso.ipc_per_check:
            _libc_call("unshare", CLONE_NEWIPC)
        if iso.cgroup is not None:
            cgroups.join(iso.cgroup)
        fds = {0: devnull, 1: devnull, 2: err_w, RESULT_FD: res_w}
        if calls is not None:
            fds.update({CALL_FD: calls[0], REPLY_FD: calls[1]})
        _place_fds(fds)  # also closes the cgroup's files: no process of the check holds one
        os.chdir(workdir)
        _set_limits(cfg["limits"], nproc=True)
        if iso.uid is not None:
            os.setgroups([])
            os.setgid(iso.uid)
            os.setuid(iso.uid)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid
        clear_keyrings(user=iso.uid is not None)
        if iso.seccomp is not None:
            install_filter(iso.seccomp)
        sys.argv = ["candidate"]
        random.seed(0)  # deterministic verdicts whatever worker runs the check
        status = run_tests(job, cfg["max_output_bytes"], serve=calls is not None)
    finally:
        os._exit(status)


def run_tests(job: dict, max_output_bytes: int, serve: bool = False) -> int:
    """Load the candidate, call it on every IO case, stream one JSON line per case to
    ``RESULT_FD``; then, with ``serve``, answer the grader's calls until it hangs up.

    Lines: ``{"k":"load","ok":true}`` (or ``"ok":false`` with ``"x"``: why), then for case
    ``i`` either ``{"i":i,"v":<plain-encoded output>}``, ``{"i":i,"x":"<exception>"}`` or
    ``{"i":i,"u":"<why the output is not plain>"}``, and finally ``{"k":"end"}``. These are
    outputs, not verdicts: whatever the candidate writes here is graded in the parent as
    what it returned. Every helper used here is bound to a local first, so a candidate
    rebinding module attributes cannot reach it.
    """
    write, dumps, loads = os.write, json.dumps, json.loads
    encode, decode = plain.encode, plain.decode
    describe, reader = _describe, LineReader

    def emitter(fd: int, budget: int):
        left = [budget - 64]  # keep room for the end line

        def emit(record: dict) -> None:
            try:
                data = (dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
            except BaseException as e:
                data = (dumps({"i": record.get("i"), "u": f"cannot serialise: {describe(e)}"})
                        + "\n").encode()
            if len(data) > left[0]:
                data = (dumps({"i": record.get("i"), "u": "output larger than the output cap"})
                        + "\n").encode()
            left[0] -= len(data)
            view = memoryview(data)
            while view:
                view = view[write(fd, view):]
        return emit

    emit = emitter(RESULT_FD, max_output_bytes)
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
        function = namespace.get(job["entry"])
        if not callable(function):
            raise TypeError(f"entry point {job['entry']!r} is not defined or not callable")
    except BaseException as e:
        emit({"k": "load", "ok": False, "x": describe(e)})
        return 0
    emit({"k": "load", "ok": True})

    def call(index: int | None, args: tuple, kwargs: dict, out) -> None:
        try:
            output = function(*args, **kwargs)
        except BaseException as e:
            out({"i": index, "x": describe(e)})
        else:
            try:
                out({"i": index, "v": encode(output)})
            except BaseException as e:
                out({"i": index, "u": describe(e)})

    for index, encoded_args in enumerate(job["args"]):
        call(index, decode(encoded_args), {}, emit)
    emit({"k": "end"})
    if serve:  # the grader's calls: one request line in, one reply line out, in order
        requests = reader(CALL_FD, 1 << 26)
        while True:
            try:
                line = requests.line()
            except BaseException:
                break
            if line is None:
                break
            args, kwargs = decode(loads(line))
            call(None, args, kwargs, emitter(REPLY_FD, max_output_bytes))
    return 0


def _describe(exc: BaseException) -> str:
    """``'Type: message'`` of an exception, defensively (its ``__str__`` is candidate code)."""
    try:
        name = type(exc).__name__
        text = str(exc)
        return (f"{name}: {text}" if text else str(name))[:300]
    except BaseException:
        return "exception that cannot be described"


# ----------------------------------------------------------------------------- the grader


class CandidateError(Exception):
    """The candidate raised an exception in a call (its type is not a builtin exception),
    its process is gone, or its output is not a plain value."""


class CandidateProxy:
    """What an assert test calls ``candidate``: each call's arguments go to the sandboxed
    child as plain-encoded data (so the child gets copies), the child calls the entry point,
    and its output comes back decoded to exact builtin values (``plain.decode``). A call in
    which the candidate raised re-raises the builtin exception of that name (``ValueError``,
    ...) or :class:`CandidateError`. No object of the candidate ever exists here."""

    def __init__(self, call_fd: int, reply_fd: int, cap: int):
        self.call_fd = call_fd
        self.replies = LineReader(reply_fd, cap)
        self.gone = ""

    def __call__(self, *args, **kwargs):
        if self.gone:
            raise CandidateError(self.gone)
        try:
            request = json.dumps(plain.encode((args, kwargs)), separators=(",", ":"))
        except (plain.NotPlain, ValueError) as e:
            raise TypeError(f"the test passed a value that cannot be sent to the candidate: "
                            f"{e}") from None
        try:
            write_all(self.call_fd, request.encode() + b"\n")
            line = self.replies.line()
        except (OSError, ValueError) as e:
            line, self.gone = None, f"the candidate's output could not be read: {e}"
        if line is None:
            self.gone = self.gone or "the candidate's process ended during a call"
            raise CandidateError(self.gone)
        try:
            reply = json.loads(line, parse_int=_parse_int)
            kind = next(k for k in ("v", "x", "u") if type(reply) is dict and k in reply)
        except (ValueError, RecursionError, StopIteration):
            raise CandidateError("the candidate's reply is not a plain value") from None
        if kind == "v":
            try:
                return plain.decode(reply["v"])
            except plain.NotPlain as e:
                raise CandidateError(f"output is not a plain value: {e}") from None
        if kind == "u":
            raise CandidateError(f"output is not a plain value: {str(reply['u'])[:300]}")
        raise _as_exception(str(reply["x"]))


def _as_exception(description: str) -> BaseException:
    """The exception a test sees for a call that raised ``description`` (``'Type: text'``)."""
    name, _, text = description.partition(": ")
    kind = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(text)
        except BaseException:  # a builtin exception that needs other arguments
            return CandidateError(description)
    return CandidateError(description)


def grader_main(secret: bytearray, job: dict, cfg: dict, iso: Isolation, devnull: int,
                call_w: int, reply_r: int, verdict_w: int) -> None:
    """Runs in the grader, a trusted process forked from the worker before the child: it
    never runs candidate code. It runs the suite's setup and assert tests with ``candidate``
    bound to a :class:`CandidateProxy`, and writes the verdicts on its own channel, which
    no process of the check holds. It keeps the worker's uid, is not dumpable (no process
    of the sandbox uid can trace it or read its memory), and runs under the rlimits and the
    seccomp filter. Never returns."""
    status = 70
    try:
        os.setsid()
        _place_fds({0: devnull, 1: devnull, 2: devnull, VERDICT_FD: verdict_w,
                    GRADER_CALL_FD: call_w, GRADER_REPLY_FD: reply_r})
        _set_limits(cfg["limits"], nproc=False)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _prctl(PR_SET_DUMPABLE, 0)
        if iso.seccomp is not None:
            install_filter(iso.seccomp)
        tests = json.loads(bytes(secret))
        zero(secret)
        random.seed(0)  # the tests' own random draws are the same in every check
        status = run_asserts(tests, int(job["first_assert"]), cfg["max_output_bytes"])
    finally:
        os._exit(status)


def run_asserts(tests: dict, first: int, max_output_bytes: int) -> int:
    """Run ``tests["setup"]`` once, then each source of ``tests["asserts"]``, with
    ``candidate`` bound to the proxy; write ``{"i":k,"ok":true}`` or ``{"i":k,"x":...}`` for
    each (``k`` counts on from ``first``, after the IO cases), then ``{"k":"end"}``."""
    proxy = CandidateProxy(GRADER_CALL_FD, GRADER_REPLY_FD, max_output_bytes + 1024)

    def emit(record: dict) -> None:
        write_all(VERDICT_FD, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    scope = {"__name__": "__test__", "candidate": proxy}
    try:
        exec(compile(tests["setup"], "<test setup>", "exec"), scope)
        setup_error = None
    except BaseException as e:
        setup_error = f"test setup failed: {_describe(e)}"
    scope["candidate"] = proxy
    for k, source in enumerate(tests["asserts"]):
        if setup_error is not None:
            emit({"i": first + k, "x": setup_error})
            continue
        try:
            exec(compile(source, "<test>", "exec"), scope)
        except BaseException as e:
            emit({"i": first + k, "x": _describe(e)})
        else:
            emit({"i": first + k, "ok": True})
    emit({"k": "end"})
    os.close(GRADER_CALL_FD)  # the child's calls end: it exits
    return 0


# ----------------------------------------------------------------------------- the worker


class Worker:
    """Runs checks one at a time, each in a fresh child forked from this warm process."""

    def __init__(self, cfg: dict, isolation: Isolation):
        self.cfg = cfg
        self.iso = isolation
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.control: int | None = cfg.get("control_fd")  # "stop check number k" messages
        self.checks = 0  # jobs received so far; the parent numbers them the same way
        self._last_alive = 0.0  # when the last keep-alive frame went out
        # One path for every check (recreated empty each time), so that the environment the
        # children inherit is set here once instead of in each child.
        if isolation.private_dirs:
            self.workdir = "/tmp/check"
        else:
            self.workdir = os.path.join(cfg["host_tmp"], f"labkit-sandbox-{os.getpid()}")
        os.environ.clear()
        os.environ.update(cfg["env"], HOME=self.workdir, TMPDIR=self.workdir)

    def run_check(self, job: dict, secret: bytearray) -> tuple[dict, bytes]:
        """Run one check; return the reply header and the payload: the child's output lines,
        then the grader's verdict lines (``header["grader_bytes"]`` of them).

        ``secret`` holds the assert tests (the frame's payload). A grader is forked with it,
        then it is zeroed, and only then is the child forked: the child's copy of this
        process holds no byte of the tests."""
        self.checks += 1
        workdir = self.workdir
        problem = remove_tree(workdir)  # only if a previous wipe failed
        if problem:
            raise OSError(problem[0])
        os.mkdir(workdir, 0o700)
        if self.iso.uid is not None:
            os.chown(workdir, self.iso.uid, self.iso.uid)
        res_r, res_w = os.pipe()
        err_r, err_w = os.pipe()
        grader: tuple[int, int] | None = None
        calls: tuple[int, int] | None = None
        start = time.monotonic()
        try:
            if secret:
                call_r, call_w = os.pipe()
                reply_r, reply_w = os.pipe()
                verdict_r, verdict_w = os.pipe()
                gpid = os.fork()
                if gpid == 0:
                    grader_main(secret, job, self.cfg, self.iso, self.devnull, call_w, reply_r,
                                verdict_w)
                for fd in (call_w, reply_r, verdict_w):
                    os.close(fd)
                grader, calls = (gpid, verdict_r), (call_r, reply_w)
        finally:
            zero(secret)
        oom_kills = cgroups.oom_kills(self.iso.cgroup) if self.iso.cgroup else 0
        pid = self.iso.fork_check()
        if pid == 0:
            child_main(job, self.cfg, self.iso, workdir, self.devnull, err_w, res_w, calls)
        for fd in (res_w, err_w, *(calls or ())):
            os.close(fd)
        try:
            stream_from = start + STREAM_AFTER_S if job.get("stream") else None
            test_timeout = job.get("test_timeout")
            header, result = self._supervise(pid, grader, res_r, err_r,
                                             start + float(job["timeout"]), stream_from,
                                             float(test_timeout) if test_timeout else None)
            header["wall_s"] = time.monotonic() - start
            if self.iso.cgroup and cgroups.oom_kills(self.iso.cgroup) > oom_kills:
                header["memory_capped"] = True  # the kernel killed a process of this check
        finally:
            for fd in (res_r, err_r, *((grader[1],) if grader else ())):
                os.close(fd)
            # Without a subreaper, orphans go to init and only a uid sweep can find them.
            swept = reap_zombies() or (not self.iso.subreaper and self.iso.uid is not None)
            if swept:
                self.iso.sweep()
                reap_all(REAP_GRACE_S)
            wipe_error = self.iso.wipe(workdir, self._keep_alive)
            if not self.iso.ipc_per_check and self.iso.uid is not None:
                self.iso.remove_ipc_objects()
        header["swept"] = swept
        if wipe_error:  # something could carry over: this worker must not run another check
            header["retire"] = f"the wipe after the check failed: {wipe_error}"
        return header, result

    def _keep_alive(self) -> None:
        """Tell the parent, at most once a second, that this worker is busy cleaning up (a
        slow wipe must not look like a hung worker)."""
        now = time.monotonic()
        if now - self._last_alive >= 1.0:
            write_frame(1, {"alive": True})
            self._last_alive = now

    def _supervise(self, pid: int, grader: tuple[int, int] | None, res_r: int, err_r: int,
                   deadline: float, stream_from: float | None,
                   test_timeout: float | None = None) -> tuple[dict, bytes]:
        """Read the pipes of the child (and of the grader, ``(pid, verdict pipe)``) until both
        have exited, the deadline passes, no result line has come for ``test_timeout``
        seconds (one test ran too long), output overflows the cap or the parent asks to stop
        this check; then kill both process groups and reap them.
        From time ``stream_from`` on (if given), the child's complete lines are forwarded to
        the parent as they come (``{"partial": true}`` frames) so that it can stop the check
        at a failure the candidate made itself (an exception, an output that is not plain);
        most checks end before that and cost no extra frames. The grader's verdicts are
        never forwarded: whether an answer was right must not decide when a check ends."""
        cap = self.cfg["max_output_bytes"]
        result, verdicts = bytearray(), bytearray()
        stderr = _Tail(self.cfg["stderr_tail_bytes"])
        header: dict = {"exit": None, "signal": None, "timed_out": False, "capped": "",
                        "stopped": False, "test_timed_out": False}
        check_deadline = deadline
        if test_timeout is not None:  # the next result line is due by then
            deadline = min(check_deadline, time.monotonic() + test_timeout)
        pids = [pid] + ([grader[0]] if grader else [])
        pidfds: dict[int, int] = {}  # pidfd -> pid
        for p in pids:
            try:
                pidfds[os.pidfd_open(p)] = p
            except (AttributeError, OSError):  # Linux < 5.3: poll waitid every few ms
                pass
        poller = select.poll()
        readers = {res_r: result.extend, err_r: stderr.add}
        lines = {res_r}  # streams whose lines count as tests (for the per-test limit)
        if grader:
            readers[grader[1]] = verdicts.extend
            lines.add(grader[1])
        forwarded = 0  # bytes of the child's lines already sent to the parent
        for fd in (*readers, *pidfds):
            poller.register(fd, select.POLLIN)
        if self.control is not None:  # also reports POLLHUP when the parent goes away
            poller.register(self.control, select.POLLIN)
        running = set(pids)
        try:
            while running and not header["stopped"]:
                now = time.monotonic()
                if now >= deadline:
                    header["timed_out"] = True
                    header["test_timed_out"] = deadline < check_deadline
                    break
                wake = deadline if len(pidfds) == len(pids) else min(deadline, now + 0.005)
                if stream_from is not None and now < stream_from and result:
                    wake = min(wake, stream_from)  # lines are waiting to be streamed
                for fd, events in poller.poll(max(1, int((wake - now) * 1000))):
                    if fd in pidfds:
                        running.discard(pidfds[fd])
                        poller.unregister(fd)
                    elif fd == self.control:
                        header["stopped"] = self._stop_requested(events)
                    elif fd in readers:
                        chunk = os.read(fd, 1 << 16)
                        if chunk:
                            readers[fd](chunk)
                            if test_timeout is not None and fd in lines and b"\n" in chunk:
                                deadline = min(check_deadline, time.monotonic() + test_timeout)
                        else:
                            poller.unregister(fd)
                            del readers[fd]
                if len(result) > cap or len(verdicts) > cap or stderr.total > cap:
                    header["capped"] = "stderr" if stderr.total > cap else "result"
                    break
                if stream_from is not None and time.monotonic() >= stream_from:
                    end = result.rfind(b"\n") + 1
                    if end > forwarded:
                        write_frame(1, {"partial": True}, bytes(result[forwarded:end]))
                        forwarded = end
                for p in running - set(pidfds.values()):
                    if os.waitid(os.P_PID, p, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                        running.discard(p)
        finally:
            for p in pids:
                try:
                    os.killpg(p, signal.SIGKILL)  # not reaped yet: the group id is not reused
                except (ProcessLookupError, PermissionError):
                    pass
            for fd in pidfds:
                os.close(fd)
        statuses = [os.waitpid(p, 0)[1] for p in pids]
        for fd, add in readers.items():  # what was written just before the end
            add(_drain(fd, cap + 1))
        if not header["capped"] and (len(result) > cap or len(verdicts) > cap
                                     or stderr.total > cap):
            header["capped"] = "stderr" if stderr.total > cap else "result"
        for prefix, wait_status in zip(("", "grader_"), statuses):
            if os.WIFSIGNALED(wait_status):
                header[prefix + "signal"] = os.WTERMSIG(wait_status)
                header[prefix + "exit"] = None
            else:
                header[prefix + "exit"] = os.WEXITSTATUS(wait_status)
                header[prefix + "signal"] = None
        header["stderr_tail"] = stderr.text()
        header["grader_bytes"] = len(verdicts[:cap])
        return header, bytes(result[:cap]) + bytes(verdicts[:cap])

    def _stop_requested(self, events: int) -> bool:
        """Read the control pipe: big-endian numbers of checks the parent wants stopped (it
        has seen a failing test). Numbers of checks already finished are stale and ignored."""
        data = _drain(self.control, 1 << 12)
        if not data and events & (select.POLLHUP | select.POLLERR):
            raise ParentGone
        return self.checks in struct.unpack(f">{len(data) // 4}I", data[: len(data) // 4 * 4])


class _Tail:
    """The last ``size`` bytes of a stream, and how many bytes went by."""

    def __init__(self, size: int):
        self.size = size
        self.total = 0
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk[-self.size:]
        del self.data[:-self.size]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _drain(fd: int, limit: int) -> bytes:
    """Whatever is readable on ``fd`` right now (up to ``limit`` bytes), without blocking:
    a process that outlived the child may still hold the pipe's write end."""
    os.set_blocking(fd, False)
    data = bytearray()
    while len(data) < limit:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data[:limit])


class ParentGone(Exception):
    """The parent closed the control pipe (it is closing the pool, or died): abandon the
    current check, clean up and exit."""


def main() -> None:
    frame = read_frame(0)
    if frame is None:
        return
    cfg = frame[0]
    for name in PREIMPORT:  # before the file-system view shrinks
        __import__(name)
    isolation = Isolation(cfg)
    gc.collect()
    gc.freeze()  # forked children then do not touch the worker's objects when collecting
    worker = Worker(cfg, isolation)
    write_frame(1, {"ready": True, "pid": os.getpid(), "uid": isolation.uid,
                    "protections": isolation.protections, "notes": isolation.notes})
    while True:
        frame = read_frame(0)
        if frame is None:  # no more jobs
            break
        job, secret = frame
        try:
            header, result = worker.run_check(job, secret)
        except (ParentGone, BrokenPipeError):
            break
        except Exception as e:  # confined to this check; the parent retires this worker
            zero(secret)
            header, result = {"worker_error": _describe(e), "retire": "the worker failed"}, b""
        try:
            write_frame(1, header, result)
        except BrokenPipeError:
            break
        if header.get("retire"):
            break
    isolation.sweep()
    reap_all(REAP_GRACE_S)
    isolation.release_cgroup()


if __name__ == "__main__":
    main()
