"""Fork-server worker of labkit's sandbox (see ``docs/sandbox.md``).

The parent (:class:`labkit.env.sandbox.Sandbox`) starts one of these per core with a minimal
environment and ``python -s -P <this file>`` (``python -I`` works as well, but then the hash
seed is random and set iteration order differs between workers). It imports only the standard
library and ``plain.py``, loaded by path, so a candidate never shares a process with labkit,
torch or the caller's state.

Lifetime of a worker:

1. Read the configuration frame; pre-import the standard library modules candidates commonly
   use. Claim a sandbox uid nobody else uses (an abstract Unix socket named after it serves
   as the lock). If root on Linux, enter an empty network namespace, a private mount
   namespace and a private IPC namespace once, and replace the file system by an
   **allow-list** view: a new root (a read-only tmpfs) holding read-only bind mounts of the
   standard library, the interpreter and the shared libraries it and its extension modules
   link, a few device nodes, ``/proc``, and private tmpfs mounts on ``/tmp`` and
   ``/dev/shm``; then ``pivot_root`` into it and detach the old root. Nothing else of the
   host exists there. Where that cannot be built, fall back to the host's tree made
   read-only with the configured paths hidden (and say so in the notes). Every check forked
   later inherits all of this for free.
2. Freeze the heap for the cycle collector (less copy-on-write in children) and report which
   protections are active.
3. Per job: fork a child that starts a new session, gets a fresh working directory,
   rlimits, a fresh IPC namespace (System V queues, semaphores and shared memory, POSIX
   message queues: nothing carries over between checks), the sandbox uid, ``/dev/null`` as
   stdin and stdout, a pipe as stderr and a separate result pipe; the child executes the candidate module and writes one JSON line
   per test. The worker enforces the wall deadline, caps what it reads, kills the child's
   process group, sweeps whatever the uid left behind, reaps zombies, wipes the private tmp
   directories and replies with the raw result lines. Grading happens in the parent:
   expected values never reach this process.

Channels: jobs arrive on stdin and replies leave on stdout as frames (``struct '>II'``:
header length, payload length; a UTF-8 JSON header; the payload bytes). For a fail-fast job
the result lines are also forwarded as they come (``{"partial": true}`` frames), and the
parent may then write the number of the running job (big-endian ``uint32``; jobs are
numbered 1, 2, ... on both sides) to the control pipe to have it stopped.
"""

# The harness runs untrusted code on purpose (exec) and must survive anything it raises
# (except BaseException), so those two rules do not apply to this file.
# ruff: noqa: S102, BLE001

from __future__ import annotations

import ctypes
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
import shutil
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
MNT_DETACH = 2
# statvfs flags that a bind mount must keep when remounted (they may be locked)
ST_KEEP, ST_RELATIME = 0x2 | 0x4 | 0x8 | 0x400 | 0x800, 0x1000  # nosuid nodev noexec noatime nodiratime
# pivot_root has no libc wrapper; its system call number by machine
SYS_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41,
                  "loongarch64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217, "i386": 217,
                  "i686": 217, "armv7l": 218, "armv6l": 218}
IPC_RMID = 0
DEVICES = ("null", "zero", "full", "random", "urandom")  # the device nodes a check gets
PRIVATE_IN_VIEW = ("/tmp", "/dev", "/proc")  # what the allow-list view mounts itself
MOUNT_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                      "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME,
                      "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

RESULT_FD = 3  # the child's result channel
REAP_GRACE_S = 2.0  # how long to wait for killed processes to be reaped
STREAM_AFTER_S = 0.05  # fail-fast checks forward their lines once they have run this long


def _load_plain():
    """``labkit/env/plain.py`` by path: the codec without importing the rest of labkit."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain.py")
    spec = importlib.util.spec_from_file_location("_labkit_sandbox_plain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plain = _load_plain()
libc = ctypes.CDLL(None, use_errno=True)


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


def read_frame(fd: int) -> tuple[dict, bytes] | None:
    head = read_exact(fd, FRAME.size)
    if head is None:
        return None
    n_header, n_payload = FRAME.unpack(head)
    body = read_exact(fd, n_header + n_payload)
    if body is None:
        return None
    return json.loads(body[:n_header]), body[n_header:]


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
            "hidden_paths": False, "private_tmp": False,
        }
        self.ipc_per_check = False  # children unshare a fresh IPC namespace
        self.private_dirs: list[str] = []  # private tmpfs mounts, wiped after every check
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
        if cfg["use_namespaces"] and self.root:
            self._enter_namespaces()
        elif cfg["use_namespaces"]:
            self.notes.append("not root: no network or mount namespace")
        if not self.protections["mount_namespace"] and self.uid is not None:
            self.shared_tmp_dirs = [d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
                                    if os.path.isdir(d)]
        os.chdir("/")

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

    def wipe(self, workdir: str) -> None:
        """Remove what the check wrote: the private tmpfs contents, or, on shared tmp dirs,
        the top-level entries owned by the sandbox uid, and the working directory."""
        for directory in self.private_dirs:
            for entry in os.scandir(directory):
                _remove(entry.path)
        for directory in self.shared_tmp_dirs:
            for entry in os.scandir(directory):
                try:
                    if entry.stat(follow_symlinks=False).st_uid == self.uid:
                        _remove(entry.path)
                except FileNotFoundError:
                    pass
        if os.path.lexists(workdir):
            _remove(workdir)


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


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


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


# ----------------------------------------------------------------------------- the child


def child_main(job: dict, cfg: dict, uid: int | None, workdir: str, devnull: int, err_w: int,
               res_w: int, new_ipc: bool = False) -> None:
    """Runs in the forked child: confine the process, then run the candidate and its tests.
    With ``new_ipc`` it first enters a fresh IPC namespace of its own (what it creates there
    dies with the check).

    Never returns: the process ends with ``os._exit`` so neither the worker's nor the
    candidate's ``atexit`` handlers run.
    """
    status = 70
    try:
        os.setsid()
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(err_w, 2)
        os.dup2(res_w, RESULT_FD)
        os.closerange(RESULT_FD + 1, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 256))
        os.chdir(workdir)
        if new_ipc:
            _libc_call("unshare", CLONE_NEWIPC)
        limits = cfg["limits"]
        mib = 1 << 20
        for which, soft, hard in (
            (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
            (resource.RLIMIT_AS, limits["memory_mb"] * mib, limits["memory_mb"] * mib),
            (resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]),
            (resource.RLIMIT_FSIZE, limits["fsize_mb"] * mib, limits["fsize_mb"] * mib),
            (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
            (resource.RLIMIT_CORE, 0, 0),
        ):
            resource.setrlimit(which, (soft, hard))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid
        sys.argv = ["candidate"]
        random.seed(0)  # deterministic verdicts whatever worker runs the check
        status = run_tests(job, cfg["max_output_bytes"])
    finally:
        os._exit(status)


def run_tests(job: dict, max_output_bytes: int) -> int:
    """Load the candidate, run its tests, stream one JSON line per test to ``RESULT_FD``.

    Lines: ``{"k":"load","ok":true}`` (or ``"ok":false`` with ``"x"``: why), then for test
    ``i`` either ``{"i":i,"v":<plain-encoded output>}``, ``{"i":i,"x":"<exception>"}``,
    ``{"i":i,"u":"<why the output is not plain>"}`` (IO cases) or ``{"i":i,"ok":true}`` /
    ``{"i":i,"x":...}`` (asserts), and finally ``{"k":"end"}``. Every helper used here is
    bound to a local first, so a candidate rebinding module attributes cannot reach it.
    """
    write, dumps, encode, decode = os.write, json.dumps, plain.encode, plain.decode
    budget = [max_output_bytes - 64]  # keep room for the end line

    def emit(record: dict) -> None:
        try:
            data = (dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        except BaseException as e:
            data = (dumps({"i": record.get("i"), "u": f"cannot serialise: {_describe(e)}"})
                    + "\n").encode()
        if len(data) > budget[0]:
            data = (dumps({"i": record.get("i"), "u": "output larger than the output cap"})
                    + "\n").encode()
        budget[0] -= len(data)
        view = memoryview(data)
        while view:
            view = view[write(RESULT_FD, view):]

    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
        function = namespace.get(job["entry"])
        if not callable(function):
            raise TypeError(f"entry point {job['entry']!r} is not defined or not callable")
    except BaseException as e:
        emit({"k": "load", "ok": False, "x": _describe(e)})
        return 0
    emit({"k": "load", "ok": True})

    index = 0
    for encoded_args in job["args"]:
        try:
            output = function(*decode(encoded_args))
        except BaseException as e:
            emit({"i": index, "x": _describe(e)})
        else:
            try:
                emit({"i": index, "v": encode(output)})
            except BaseException as e:
                emit({"i": index, "u": _describe(e)})
        index += 1

    if job["asserts"]:
        scope = {"__name__": "__test__", "candidate": function}
        try:
            exec(compile(job["setup"], "<test setup>", "exec"), scope)
            setup_error = None
        except BaseException as e:
            setup_error = f"test setup failed: {_describe(e)}"
        scope["candidate"] = function
        for source in job["asserts"]:
            if setup_error is not None:
                emit({"i": index, "x": setup_error})
            else:
                try:
                    exec(compile(source, "<test>", "exec"), scope)
                except BaseException as e:
                    emit({"i": index, "x": _describe(e)})
                else:
                    emit({"i": index, "ok": True})
            index += 1
    emit({"k": "end"})
    return 0


def _describe(exc: BaseException) -> str:
    """``'Type: message'`` of an exception, defensively (its ``__str__`` is candidate code)."""
    try:
        name = type(exc).__name__
        text = str(exc)
        return (f"{name}: {text}" if text else str(name))[:300]
    except BaseException:
        return "exception that cannot be described"


# ----------------------------------------------------------------------------- the worker


class Worker:
    """Runs checks one at a time, each in a fresh child forked from this warm process."""

    def __init__(self, cfg: dict, isolation: Isolation):
        self.cfg = cfg
        self.iso = isolation
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.control: int | None = cfg.get("control_fd")  # "stop check k" messages
        self.checks = 0  # jobs received so far; the parent numbers them the same way
        # One path for every check (recreated empty each time), so that the environment the
        # children inherit is set here once instead of in each child.
        if isolation.private_dirs:
            self.workdir = "/tmp/check"
        else:
            self.workdir = os.path.join(cfg["host_tmp"], f"labkit-sandbox-{os.getpid()}")
        os.environ.clear()
        os.environ.update(cfg["env"], HOME=self.workdir, TMPDIR=self.workdir)

    def run_check(self, job: dict) -> tuple[dict, bytes]:
        """Run one check in a fresh child; return the reply header and the raw result lines."""
        self.checks += 1
        workdir = self.workdir
        if os.path.lexists(workdir):  # only if a previous wipe was interrupted
            _remove(workdir)
        os.mkdir(workdir, 0o700)
        if self.iso.uid is not None:
            os.chown(workdir, self.iso.uid, self.iso.uid)
        res_r, res_w = os.pipe()
        err_r, err_w = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child_main(job, self.cfg, self.iso.uid, workdir, self.devnull, err_w, res_w,
                       self.iso.ipc_per_check)
        os.close(res_w)
        os.close(err_w)
        try:
            stream_from = start + STREAM_AFTER_S if job.get("stream") else None
            test_timeout = job.get("test_timeout")
            header, result = self._supervise(pid, res_r, err_r, start + float(job["timeout"]),
                                             stream_from,
                                             float(test_timeout) if test_timeout else None)
            header["wall_s"] = time.monotonic() - start
        finally:
            os.close(res_r)
            os.close(err_r)
            # Without a subreaper, orphans go to init and only a uid sweep can find them.
            swept = reap_zombies() or (not self.iso.subreaper and self.iso.uid is not None)
            if swept:
                self.iso.sweep()
                reap_all(REAP_GRACE_S)
            self.iso.wipe(workdir)
            if not self.iso.ipc_per_check and self.iso.uid is not None:
                self.iso.remove_ipc_objects()
        header["swept"] = swept
        return header, result

    def _supervise(self, pid: int, res_r: int, err_r: int, deadline: float,
                   stream_from: float | None, test_timeout: float | None = None
                   ) -> tuple[dict, bytes]:
        """Read the child's pipes until it exits, the deadline passes, no result line has come
        for ``test_timeout`` seconds (one test ran too long), output overflows the cap or the
        parent asks to stop this check; then kill its process group and reap it.
        From time ``stream_from`` on (if given), complete result lines are forwarded to the
        parent as they come (``{"partial": true}`` frames) so that it can grade them early;
        most checks end before that and cost no extra frames."""
        cap = self.cfg["max_output_bytes"]
        result = bytearray()
        forwarded = 0  # bytes of ``result`` already streamed to the parent
        stderr = _Tail(self.cfg["stderr_tail_bytes"])
        header: dict = {"exit": None, "signal": None, "timed_out": False, "capped": "",
                        "stopped": False, "test_timed_out": False}
        check_deadline = deadline
        if test_timeout is not None:  # the next result line is due by then
            deadline = min(check_deadline, time.monotonic() + test_timeout)
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # Linux < 5.3: poll waitid every few milliseconds
            pidfd = None
        poller = select.poll()
        for fd in (res_r, err_r) + ((pidfd,) if pidfd is not None else ()):
            poller.register(fd, select.POLLIN)
        if self.control is not None:  # also reports POLLHUP when the parent goes away
            poller.register(self.control, select.POLLIN)
        readers = {res_r: result.extend, err_r: stderr.add}
        exited = False
        try:
            while not (exited or header["stopped"]):
                now = time.monotonic()
                if now >= deadline:
                    header["timed_out"] = True
                    header["test_timed_out"] = deadline < check_deadline
                    break
                wake = deadline if pidfd is not None else min(deadline, now + 0.005)
                if stream_from is not None and now < stream_from and result:
                    wake = min(wake, stream_from)  # lines are waiting to be streamed
                wait_ms = (wake - now) * 1000
                for fd, events in poller.poll(max(1, int(wait_ms))):
                    if fd == pidfd:
                        exited = True
                    elif fd == self.control:
                        header["stopped"] = self._stop_requested(events)
                    elif fd in readers:
                        chunk = os.read(fd, 1 << 16)
                        if chunk:
                            readers[fd](chunk)
                            if test_timeout is not None and fd == res_r and b"\n" in chunk:
                                deadline = min(check_deadline, time.monotonic() + test_timeout)
                        else:
                            poller.unregister(fd)
                            del readers[fd]
                if len(result) > cap or stderr.total > cap:
                    header["capped"] = "result" if len(result) > cap else "stderr"
                    break
                if (stream_from is not None and time.monotonic() >= stream_from
                        and result.rfind(b"\n") >= forwarded):
                    end = result.rfind(b"\n") + 1
                    write_frame(1, {"partial": True}, bytes(result[forwarded:end]))
                    forwarded = end
                if pidfd is None:
                    exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        finally:
            try:
                os.killpg(pid, signal.SIGKILL)  # not reaped yet, so the group id is not reused
            except (ProcessLookupError, PermissionError):
                pass
            if pidfd is not None:
                os.close(pidfd)
        _, wait_status = os.waitpid(pid, 0)
        for fd, add in readers.items():  # what the child wrote just before it ended
            add(_drain(fd, cap + 1))
        if not header["capped"] and (len(result) > cap or stderr.total > cap):
            header["capped"] = "result" if len(result) > cap else "stderr"
        if os.WIFSIGNALED(wait_status):
            header["signal"] = os.WTERMSIG(wait_status)
        else:
            header["exit"] = os.WEXITSTATUS(wait_status)
        header["stderr_tail"] = stderr.text()
        return header, bytes(result[:cap])

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
        try:
            header, result = worker.run_check(frame[0])
            write_frame(1, header, result)
        except (ParentGone, BrokenPipeError):
            break
    isolation.sweep()
    reap_all(REAP_GRACE_S)


if __name__ == "__main__":
    main()
