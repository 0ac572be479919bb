"""Fork-server worker of labkit's sandbox (see ``docs/sandbox.md``).

The parent (:class:`labkit.sandbox.pool.Sandbox`) starts one of these per core with a minimal
environment and ``python -s -P <this file>`` (``python -I`` works as well, but then the hash
seed is random and set iteration order differs between workers). It imports only the standard
library and this folder's worker-side modules, loaded by path as the package ``_labkit_sandbox``
(:data:`PACKAGE`), so a candidate never shares a process with labkit, torch or the caller's
state. This file is the worker loop; the isolation it sets up once is :mod:`.isolation` (with
:mod:`.view` and :mod:`.cgroups`), the child :mod:`.child`, the grader :mod:`.grader`, the
channels :mod:`.wire`.

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

import gc
import importlib.util
import os
import select
import signal
import struct
import sys
import time

PACKAGE = "_labkit_sandbox"
"""The name this folder is loaded under in a worker, by path: not ``labkit.sandbox``, so that
nothing of labkit runs here (the folder's ``__init__`` and its worker-side modules are standard
library only, and import each other relatively)."""


def _load_package() -> None:
    """This folder as the package :data:`PACKAGE`, so that its modules import as
    ``_labkit_sandbox.<name>`` (``python -P`` leaves this folder off ``sys.path``: a
    candidate cannot import its files by name)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package  # dataclasses look their module up there
    spec.loader.exec_module(package)


_load_package()
from _labkit_sandbox import cgroups  # noqa: E402
from _labkit_sandbox.child import child_main  # noqa: E402
from _labkit_sandbox.grader import grader_main  # noqa: E402
from _labkit_sandbox.isolation import (REAP_GRACE_S, Isolation, reap_all,  # noqa: E402
                                       reap_zombies, remove_tree)
from _labkit_sandbox.wire import describe, drain, read_frame, write_frame, zero  # noqa: E402

# Modules candidates commonly import. Importing them here once makes a check's
# ``import math`` a dictionary lookup instead of a file-system walk.
PREIMPORT = (
    "abc", "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "io",
    "itertools", "math", "numbers", "operator", "random", "re", "statistics", "string",
    "textwrap", "time", "typing", "unicodedata",
)


STREAM_AFTER_S = 0.05  # fail-fast checks forward their lines once they have run this long


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
            add(drain(fd, cap + 1))
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
        data = drain(self.control, 1 << 12)
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
            header, result = {"worker_error": describe(e), "retire": "the worker failed"}, b""
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
