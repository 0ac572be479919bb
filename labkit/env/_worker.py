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
   namespace and a private IPC namespace once, make every mount read-only, hide the
   configured paths behind empty tmpfs mounts (keeping the standard library reachable for
   the sandbox uid), and mount private tmpfs over ``/tmp`` and ``/dev/shm``. Every check
   forked later inherits all of this for free.
2. Freeze the heap for the cycle collector (less copy-on-write in children) and report which
   protections are active.
3. Per job: fork a child that starts a new session, gets a fresh working directory,
   rlimits, the sandbox uid, ``/dev/null`` as stdin and stdout, a pipe as stderr and a
   separate result pipe; the child executes the candidate module and writes one JSON line
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
import gc
import importlib.util
import json
import os
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
            "ipc_namespace": False, "readonly_root": False, "hidden_paths": False,
            "private_tmp": False,
        }
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
        self.protections.update(net_namespace=True, ipc_namespace=True)
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates to the host
        except OSError as e:
            self.notes.append(f"cannot make mounts private: {e}")
            return
        self.protections["mount_namespace"] = True
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
               res_w: int) -> None:
    """Runs in the forked child: confine the process, then run the candidate and its tests.

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
            child_main(job, self.cfg, self.iso.uid, workdir, self.devnull, err_w, res_w)
        os.close(res_w)
        os.close(err_w)
        try:
            stream_from = start + STREAM_AFTER_S if job.get("stream") else None
            header, result = self._supervise(pid, res_r, err_r, start + float(job["timeout"]),
                                             stream_from)
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
        header["swept"] = swept
        return header, result

    def _supervise(self, pid: int, res_r: int, err_r: int, deadline: float,
                   stream_from: float | None) -> tuple[dict, bytes]:
        """Read the child's pipes until it exits, the deadline passes, output overflows the
        cap or the parent asks to stop this check; then kill its process group and reap it.
        From time ``stream_from`` on (if given), complete result lines are forwarded to the
        parent as they come (``{"partial": true}`` frames) so that it can grade them early;
        most checks end before that and cost no extra frames."""
        cap = self.cfg["max_output_bytes"]
        result = bytearray()
        forwarded = 0  # bytes of ``result`` already streamed to the parent
        stderr = _Tail(self.cfg["stderr_tail_bytes"])
        header: dict = {"exit": None, "signal": None, "timed_out": False, "capped": "",
                        "stopped": False}
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
