"""The file system a check sees, set up once by each worker (root on Linux only).

**The allow-list root**: a new root (a read-only tmpfs) holding read-only bind mounts of the
standard library, the interpreter and the shared libraries it and its extension modules link,
a few device nodes, ``/proc``, and private tmpfs mounts on ``/tmp`` and ``/dev/shm``; the
worker pivots into it and detaches the old root, so nothing else of the host exists there.
:class:`RootPlan` decides its contents on the host before anything is mounted. **The fallback
view**, where that root cannot be built: the host's tree made read-only with the configured
paths hidden. :class:`FileViews` holds both as methods of :class:`~.isolation.Isolation`.

Standard library only: the worker loads it by path (:mod:`labkit.sandbox.worker`).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import stat
import struct
import sys
import sysconfig

from .syscalls import (
    MNT_DETACH,
    MOUNT_OPTION_FLAGS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    bind_readonly,
    libc_call,
    mount,
    pivot_root,
)

DEVICES = ("null", "zero", "full", "random", "urandom")  # the device nodes a check gets
PRIVATE_IN_VIEW = ("/tmp", "/dev", "/proc")  # what the allow-list view mounts itself

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
            private = next((d for d in PRIVATE_IN_VIEW if under(real, d)), None)
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
                     if not any(under(d, e) for e in self.dirs[:i])]
        self.files = [f for f in dict.fromkeys(self.files) if not self._covered(f)]
        self.links = {link: target for link, target in self.links.items()
                      if not self._covered(link)}
        hide = [os.path.realpath(p) for p in cfg["hide_paths"]]
        hide += [os.path.join(d, name) for d in stdlib for name in ("site-packages", "dist-packages")]
        self.masks = sorted({p for p in hide if os.path.isdir(p) and p not in self.dirs
                             and any(under(p, d) for d in self.dirs)})

    def _covered(self, path: str) -> bool:
        """Whether ``path`` is inside a directory the root binds whole."""
        return any(under(path, d) for d in self.dirs)

    def touches(self, directory: str) -> bool:
        """Whether ``directory`` is on the way to, or inside, anything the root uses (then it
        cannot serve as the staging mount point)."""
        return any(under(p, directory) or under(directory, p)
                   for p in [*self.dirs, *self.files, *self.links, *self.links.values()]
                   if p.startswith("/"))




class FileViews:
    """The views as :class:`~.isolation.Isolation` builds them: its ``cfg``, ``notes``,
    ``protections``, ``private_dirs`` and ``_tmpfs_options`` are read and set here."""

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
        mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=4m")
        try:
            self._populate(staging, plan)
            mount(None, staging, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            root_device = os.stat(staging).st_dev
        except OSError:
            libc_call("umount2", staging.encode(), ctypes.c_int(MNT_DETACH))
            raise
        try:
            pivot_root(staging)
        except OSError:
            os.chdir("/")
            libc_call("umount2", staging.encode(), ctypes.c_int(MNT_DETACH))
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
            makedirs(root + directory)
            bind_readonly(directory, root + directory)
        for link, target in sorted(plan.links.items(), key=lambda item: item[0].count("/")):
            makedirs(root + os.path.dirname(link))
            if not os.path.lexists(root + link):
                os.symlink(target, root + link)
        for file in plan.files:
            makedirs(root + os.path.dirname(file))
            os.close(os.open(root + file, os.O_CREAT | os.O_WRONLY, 0o644))
            bind_readonly(file, root + file)
        for path in plan.masks:
            mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k")
        makedirs(root + "/proc")
        bind_readonly("/proc", root + "/proc", recursive=True)
        makedirs(root + "/dev")
        mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
        for name in DEVICES:
            if os.path.exists("/dev/" + name):
                os.close(os.open(f"{root}/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
                bind_readonly("/dev/" + name, f"{root}/dev/{name}", device=True)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"{root}/dev/{name}")
        for path in ("/tmp", "/dev/shm"):
            makedirs(root + path)
            mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{size}")
        mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)

    def _enter_denylist_view(self) -> None:
        """The fallback view: the host's tree, every mount read-only, the configured paths
        hidden behind empty tmpfs mounts, private ``/tmp`` and ``/dev/shm``."""
        self.protections["readonly_root"] = self._remount_readonly()
        keep = self._stdlib_dirs()
        hide = self._hide_targets(keep)
        for path in sorted({*self._blocked_ancestors(keep), *hide}, key=lambda p: p.count("/")):
            try:
                if self._mask(path, [k for k in keep if under(k, path)]):
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
                    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{size}")
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
                mount(None, target, None, flags)
                root_ok |= target == "/"
            except OSError as e:
                self.notes.append(f"cannot make {target} read-only: {e}")
        return root_ok

    @staticmethod
    def _stdlib_dirs() -> list[str]:
        base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}  # not a venv's
        paths = {os.path.realpath(sysconfig.get_path(k, vars=base)) for k in ("stdlib", "platstdlib")}
        paths = sorted(p for p in paths if os.path.isdir(p))
        return [p for p in paths if not any(q != p and under(p, q) for q in paths)]

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
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
            for k, handle in zip(keep, handles):
                os.makedirs(k, exist_ok=True)
                mount(f"/proc/self/fd/{handle}", k, None, MS_BIND | MS_REC)
                mount(None, k, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            for handle in handles:
                os.close(handle)
        return True


def makedirs(path: str) -> None:
    """``os.makedirs`` with every new directory mode 755 whatever the umask, so that the
    sandbox uid can walk through it."""
    if os.path.isdir(path):
        return
    makedirs(os.path.dirname(path))
    os.mkdir(path)
    os.chmod(path, 0o755)


def under(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")
