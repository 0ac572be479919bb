"""A memory and process cap per check, summed over its processes: one cgroup per sandbox worker.

RLIMIT_AS caps each process and RLIMIT_NPROC their number, but nothing in the rlimits caps
their total: a check that forks could hold ``nproc x memory_mb``. A cgroup does. Each sandbox
worker creates one leaf cgroup, sets its memory maximum and its process maximum, and the
first process of every check joins it (as root, before it drops its privileges); only one
check runs on a worker at a time, so the leaf holds exactly one check's processes. When the
check's processes together pass the memory maximum the kernel reclaims within the cgroup and
then kills one of *its* processes (the largest): nothing else on the host is touched.

Both cgroup versions are handled: v2 (``memory.max``, ``memory.swap.max``, ``pids.max``) and
v1, where each controller is its own hierarchy (``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes``, ``pids.max``). The leaf is created under the cgroup this
process already belongs to, so limits set above it still apply (on v2 that cgroup must
delegate the memory and pids controllers, or be the root). Where no cgroup can be written,
:func:`create` says why and the sandbox keeps only the per-process limits.

Standard library only: the sandbox's worker loads this file by path (it imports nothing of
labkit). The parsing helpers are pure functions of the two ``/proc`` files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

CONTROLLERS = ("memory", "pids")
"""The controllers a check's cgroup needs."""


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy and where this process sits in it."""

    version: int
    """1 or 2."""
    mount: str
    """Where the hierarchy is mounted (e.g. ``/sys/fs/cgroup/memory``)."""
    path: str
    """This process's cgroup in it, from the hierarchy's root (``/`` or ``/a/b``)."""
    controllers: tuple[str, ...]
    """The controllers it offers (for v2, those listed in the root's ``cgroup.controllers``)."""

    def directory(self, *parts: str) -> str:
        """The directory of this process's cgroup, or of ``parts`` below it."""
        return os.path.join(self.mount, self.path.strip("/"), *parts).rstrip("/") or "/"


@dataclass
class CheckCgroup:
    """The leaf cgroup a worker's checks run in (one per hierarchy on v1)."""

    version: int
    """1 or 2."""
    memory_bytes: int
    """The memory maximum of all the check's processes together."""
    pids: int
    """The most processes and threads the check may hold at once."""
    procs_fds: list[int] = field(default_factory=list)
    """Open ``cgroup.procs`` files (write-only): a check's first process writes ``0`` to each."""
    oom_fd: int = -1
    """Open file (read-only) whose ``oom_kill`` line counts the kills of the memory maximum."""
    leaves: list[tuple[int, str]] = field(default_factory=list)
    """``(directory descriptor of the parent, leaf name)`` of each leaf, to remove it later
    from a process that no longer sees the host's ``/sys``."""


# ----------------------------------------------------------------------------- pure helpers


def _unescape(path: str) -> str:
    """Mount points in ``mountinfo`` escape space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str, str, str]]:
    """``(root, mount point, file-system type, super options)`` of every cgroup mount in a
    ``/proc/self/mountinfo`` text (``root`` is the part of the hierarchy mounted there)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 4 or dash < 5:
            continue
        fstype = fields[dash + 1]
        if fstype in ("cgroup", "cgroup2"):
            mounts.append((_unescape(fields[3]), _unescape(fields[4]), fstype, fields[dash + 3]))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller name (``""`` for the v2 hierarchy) to this process's cgroup path, from a
    ``/proc/self/cgroup`` text (``4:memory:/a`` or ``0::/b``)."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def hierarchies(mountinfo: str, proc_cgroup: str,
                v2_controllers: tuple[str, ...] = ()) -> dict[str, Hierarchy]:
    """For each controller of :data:`CONTROLLERS`, the hierarchy that offers it: the v2 one
    when its root lists the controller (``v2_controllers``, read by the caller from its
    ``cgroup.controllers``), else the v1 hierarchy mounted with it. A hierarchy mounted from
    below its root (a container's view) is used where this process's path lies inside it."""
    paths = parse_proc_cgroup(proc_cgroup)
    found: dict[str, Hierarchy] = {}
    for root, mount, fstype, options in parse_mountinfo(mountinfo):
        if fstype == "cgroup2":
            offered, path = tuple(c for c in CONTROLLERS if c in v2_controllers), paths.get("")
        else:
            offered = tuple(c for c in CONTROLLERS if c in options.split(","))
            path = next((paths[c] for c in offered if c in paths), None)
        if not offered or path is None or not _inside(path, root):
            continue
        relative = "/" + path[len(root.rstrip("/")):].lstrip("/")
        for controller in offered:
            if controller not in found or (fstype == "cgroup2" and found[controller].version == 1):
                found[controller] = Hierarchy(2 if fstype == "cgroup2" else 1, mount,
                                              relative, offered)
    return found


def _inside(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def oom_kill_count(text: str) -> int:
    """The ``oom_kill`` counter of a ``memory.events`` (v2) or ``memory.oom_control`` (v1)
    text, 0 when it has none."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


# ----------------------------------------------------------------------------- the leaf


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def create(name: str, memory_bytes: int, pids: int) -> tuple[CheckCgroup | None, str]:
    """Create (or take over) the leaf cgroup ``name`` under this process's cgroup, with its
    memory and process maxima; return it and ``""``, or ``None`` and why it cannot be done
    here. Needs root; opens every file the worker needs later, so that it keeps working
    after the worker has left the host's file-system view."""
    try:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
        with open("/proc/self/cgroup") as f:
            proc_cgroup = f.read()
    except OSError as e:
        return None, f"cannot read this process's cgroups: {e}"
    v2 = next((m for _, m, t, _ in parse_mountinfo(mountinfo) if t == "cgroup2"), None)
    try:
        v2_controllers = tuple(_read(os.path.join(v2, "cgroup.controllers")).split()) if v2 else ()
    except OSError:
        v2_controllers = ()
    found = hierarchies(mountinfo, proc_cgroup, v2_controllers)
    missing = [c for c in CONTROLLERS if c not in found]
    if missing:
        return None, f"no cgroup hierarchy offers the {' and '.join(missing)} controller"
    versions = {h.version for h in found.values()}
    if len(versions) > 1:
        return None, "the memory and pids controllers are in different cgroup versions"
    group = CheckCgroup(version=versions.pop(), memory_bytes=memory_bytes, pids=pids)
    try:
        if group.version == 2:
            _create_v2(group, found["memory"], name)
        else:
            for controller in CONTROLLERS:
                _create_v1(group, found[controller], controller, name)
    except OSError as e:
        close(group)
        return None, f"cannot set up a cgroup for the checks: {e}"
    return group, ""


def _leaf(group: CheckCgroup, parent: str, name: str) -> str:
    """Make (or reuse) ``parent/name`` and remember how to remove it."""
    leaf = os.path.join(parent, name)
    try:
        os.mkdir(leaf, 0o755)
    except FileExistsError:  # left by a worker of the same name that was killed
        pass
    group.leaves.append((os.open(parent, os.O_PATH | os.O_DIRECTORY), name))
    return leaf


def _create_v2(group: CheckCgroup, hierarchy: Hierarchy, name: str) -> None:
    """On v2 the leaf goes under this process's cgroup if that one delegates the memory and
    pids controllers to its children (or can be made to), else under the hierarchy's root
    when the root already does; a cgroup that holds processes cannot delegate them."""
    wanted = {"memory", "pids"}
    problems = []
    for parent in dict.fromkeys([hierarchy.directory(), hierarchy.mount]):
        enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
        if not wanted <= enabled and parent != hierarchy.mount:
            try:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
                enabled |= wanted
            except OSError as e:
                problems.append(f"{parent} does not delegate memory and pids ({e.strerror})")
                continue
        if not wanted <= enabled:
            problems.append(f"{parent} does not delegate memory and pids")
            continue
        leaf = _leaf(group, parent, name)
        _write(os.path.join(leaf, "memory.max"), str(group.memory_bytes))
        if os.path.exists(os.path.join(leaf, "memory.swap.max")):
            _write(os.path.join(leaf, "memory.swap.max"), "0")
        _write(os.path.join(leaf, "pids.max"), str(group.pids))
        group.procs_fds.append(os.open(os.path.join(leaf, "cgroup.procs"), os.O_WRONLY))
        group.oom_fd = os.open(os.path.join(leaf, "memory.events"), os.O_RDONLY)
        return
    raise OSError("; ".join(problems))


def _create_v1(group: CheckCgroup, hierarchy: Hierarchy, controller: str, name: str) -> None:
    leaf = _leaf(group, hierarchy.directory(), name)
    if controller == "memory":
        _write(os.path.join(leaf, "memory.limit_in_bytes"), str(group.memory_bytes))
        swap = os.path.join(leaf, "memory.memsw.limit_in_bytes")  # memory plus swap
        if os.path.exists(swap):
            _write(swap, str(group.memory_bytes))
        group.oom_fd = os.open(os.path.join(leaf, "memory.oom_control"), os.O_RDONLY)
    else:
        _write(os.path.join(leaf, "pids.max"), str(group.pids))
    group.procs_fds.append(os.open(os.path.join(leaf, "cgroup.procs"), os.O_WRONLY))


# ----------------------------------------------------------------------------- use


def join(group: CheckCgroup) -> None:
    """Move the calling process into the leaf (in every hierarchy). For the check's first
    process, while it is still root; its children inherit the cgroup."""
    for fd in group.procs_fds:
        os.write(fd, b"0")


def oom_kills(group: CheckCgroup) -> int:
    """How many processes the kernel has killed so far for passing the memory maximum."""
    if group.oom_fd < 0:
        return 0
    try:
        return oom_kill_count(os.pread(group.oom_fd, 4096, 0).decode("ascii", "replace"))
    except OSError:
        return 0


def close(group: CheckCgroup, remove: bool = False) -> None:
    """Close the leaf's files; with ``remove``, remove the leaf too (it must hold no process
    by then; a leaf that cannot be removed is left for the next worker of the same name)."""
    for fd in [*group.procs_fds, *([group.oom_fd] if group.oom_fd >= 0 else [])]:
        os.close(fd)
    group.procs_fds, group.oom_fd = [], -1
    for parent, name in group.leaves:
        if remove:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                pass
        os.close(parent)
    group.leaves = []


__all__ = ["CONTROLLERS", "CheckCgroup", "Hierarchy", "close", "create", "hierarchies", "join",
           "oom_kill_count", "oom_kills", "parse_mountinfo", "parse_proc_cgroup"]
