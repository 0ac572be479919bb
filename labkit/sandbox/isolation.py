"""What a sandbox worker sets up once, at start, and tears down after every check.

:class:`Isolation` claims a sandbox uid no other worker on the host holds, creates the cgroup
the checks run in (:mod:`.cgroups`), loads and probes the seccomp filter, and, if root on
Linux, enters an empty network namespace, a private mount namespace and a private IPC namespace
and builds the file system the checks see (:mod:`.view`); it probes whether a check can start
as pid 1 of a PID namespace of its own. After every check it sweeps the uid's processes, wipes
what the check wrote (:func:`remove_tree`) and, without an IPC namespace per check, its System V
objects. :attr:`Isolation.protections` says which protections hold.

Standard library only: the worker loads it by path (:mod:`labkit.sandbox.worker`).
"""

# Code here must survive anything a candidate or a probe raises (except BaseException), so
# that rule does not apply to this file.
# ruff: noqa: BLE001

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import stat
import time

from . import cgroups
from .syscalls import (
    CHECK_NAMESPACES,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    IPC_RMID,
    MNT_DETACH,
    MS_PRIVATE,
    MS_REC,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_NO_NEW_PRIVS,
    SYS_CLONE,
    SockFprog,
    clear_keyrings,
    clone_process,
    install_filter,
    libc,
    libc_call,
    mount,
    mount_proc,
    pids_in_proc,
    prctl,
)
from .view import FileViews

REAP_GRACE_S = 2.0  # how long to wait for killed processes to be reaped


class Isolation(FileViews):
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
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            self.subreaper = True
        except OSError as e:
            self.subreaper = False
            self.notes.append(f"no child subreaper: {e}")
        try:
            prctl(PR_SET_NO_NEW_PRIVS, 1)  # inherited by every child
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
                    code = 0 if os.getpid() == 1 and pids_in_proc() == [1] else 4
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
            libc_call("unshare", CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
        except OSError as e:
            self.notes.append(f"unshare failed, no namespaces: {e}")
            return
        self.protections["net_namespace"] = True
        self.ipc_per_check = self.protections["ipc_namespace"] = True  # see child_main
        try:
            mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates to the host
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
                libc_call("umount2", directory.encode(), ctypes.c_int(MNT_DETACH))
                mount("tmpfs", directory, "tmpfs", flags, options)
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
