"""The sandbox's worker pool: candidates checked on warm fork-server workers, each check a
``fork`` (a ``clone`` into new PID, mount and IPC namespaces) of a worker started once
(:mod:`labkit.sandbox.worker`), so there is no interpreter start and no re-import per check.

:class:`Sandbox` starts the workers, sends each check's job, reads the reports and grades them
here (:mod:`labkit.sandbox.grading`); :func:`run_many` and :func:`run_distinct` are the ways in
the rest of labkit uses. The design and its protections: :mod:`labkit.sandbox`;
``docs/sandbox.md`` holds the threat model.

Typical use::

    with Sandbox(SandboxConfig(timeout_s=3)) as sandbox:
        results = sandbox.run_many(candidates, progress=True)

or :func:`run_many` over a process-wide :func:`default_sandbox`.
"""

from __future__ import annotations

import atexit
import os
import selectors
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Self

from labkit.sandbox import jobs, wire
from labkit.sandbox.config import SandboxConfig, default_hide_paths
from labkit.sandbox.grading import failure, fails_by_itself, grade
from labkit.sandbox.records import Candidate, SandboxResult, Status
from labkit.sandbox.syscall_filter import compile_filter

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
_WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0"}  # the only environment a worker (and /proc/*/environ) has
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # plus HOME, TMPDIR
_START_TIMEOUT_S = 60.0  # a worker must be up by then
_RETIRE_GRACE_S = 1.0  # a worker we hang up on must have cleaned up and exited by then
_REPLY_GRACE_S = 15.0  # beyond a check's deadline before a silent worker is replaced
_MAX_ATTEMPTS = 2  # a check whose worker died is run once more on a fresh worker
_PIPELINE = 2  # jobs sent to a worker ahead, so it never waits for this process between checks
_PIPELINE_MAX_BYTES = 32 << 10  # a queued job must fit in the pipe (64 KiB) next to a frame


# ----------------------------------------------------------------------------- workers


class WorkerError(RuntimeError):
    """A worker process could not be started or stopped answering."""


class _Worker:
    """Parent-side handle of one fork-server worker process.

    Jobs go in on its stdin and replies come back on its stdout, as frames; a separate
    control pipe carries "stop check number k" requests. Both sides number the jobs
    1, 2, 3, ... in the order they are sent.
    """

    def __init__(self, setup: dict):
        control_r, self.control = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", "-P", str(WORKER_SCRIPT)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_WORKER_ENV, cwd="/",
                start_new_session=True, bufsize=0, pass_fds=(control_r,))
        finally:
            os.close(control_r)
        self.buffer = bytearray()
        self.info: dict = {}
        self.sent = 0
        self._write(wire.encode_frame({**setup, "control_fd": control_r}))

    @property
    def out_fd(self) -> int:
        return self.proc.stdout.fileno()

    def _write(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            view = view[os.write(self.proc.stdin.fileno(), view):]

    def submit(self, frame: bytes) -> int:
        """Send a job frame; its number for :meth:`stop`. Raises OSError if the worker died."""
        self._write(frame)
        self.sent += 1
        return self.sent

    def stop(self, number: int) -> None:
        """Ask the worker to kill check ``number`` now (ignored if it already finished)."""
        try:
            os.write(self.control, struct.pack(">I", number))
        except OSError:  # the worker is gone; the reply loop will notice
            pass

    def wait_ready(self, deadline: float) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.out_fd, selectors.EVENT_READ)
            replies: list[tuple[dict, bytes]] = []
            while not replies:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    raise WorkerError(f"sandbox worker {self.proc.pid} did not start in time")
                try:
                    replies = self.receive()
                except EOFError:
                    raise WorkerError(f"sandbox worker exited at start (code "
                                      f"{self.proc.wait()}); see its stderr") from None
        if not replies[0][0].get("ready"):
            raise WorkerError(f"sandbox worker failed to start: {replies[0][0]}")
        self.info = replies[0][0]

    def receive(self) -> list[tuple[dict, bytes]]:
        """Read what is available (call when readable) and return the complete frames
        (several when the worker answered queued jobs quickly). Raises :class:`EOFError`
        when the worker is gone."""
        chunk = os.read(self.out_fd, 1 << 20)
        if not chunk:
            raise EOFError
        self.buffer += chunk
        return wire.take_frames(self.buffer)

    def hang_up(self) -> None:
        """Close both pipes to the worker: it abandons a running check, sweeps its uid and
        exits."""
        self.proc.stdin.close()
        if self.control >= 0:
            os.close(self.control)
            self.control = -1

    def close(self, grace_s: float) -> None:
        """:meth:`hang_up` and wait up to ``grace_s`` for the worker; kill it after that."""
        self.hang_up()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()



@cache
def _seccomp_program() -> tuple[str | None, str]:
    """The filter as hex for the workers' setup frame (compiled once per process), or
    ``None`` and why not."""
    program, why = compile_filter()
    return (program.hex() if program else None), why


def _shutdown(workers: list[_Worker | None], owner_pid: int) -> None:
    """Stop every worker: close its stdin (it sweeps its uid and exits), kill stragglers.
    A no-op in a forked copy of the owning process, which must not touch the pool."""
    if os.getpid() != owner_pid:
        return
    live = [w for w in workers if w is not None]
    for w in live:  # all of them start shutting down before we wait for any
        w.hang_up()
    deadline = time.monotonic() + 5.0
    for w in live:
        w.close(max(0.01, deadline - time.monotonic()))
    workers[:] = [None] * len(workers)


# ----------------------------------------------------------------------------- the pool


class Sandbox:
    """A pool of fork-server workers that run candidates against their tests.

    A context manager; the workers start lazily on first use and :meth:`close` (also run at
    interpreter exit and when the object is collected) stops them and everything they
    started. Safe to share between threads: concurrent calls split the idle workers.
    """

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self._cv = threading.Condition()
        self._workers: list[_Worker | None] = []
        self._idle: list[int] = []
        self._started = False
        self._closed = False
        self._protections: Mapping[str, bool] = MappingProxyType({})
        self._finalizer: weakref.finalize | None = None

    # ------------------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Start the workers (idempotent). Raises on platforms without ``fork``/Linux."""
        with self._cv:
            if self._closed:
                raise RuntimeError("this Sandbox is closed")
            if self._started:
                return self
            if not sys.platform.startswith("linux"):
                raise RuntimeError(f"labkit's sandbox needs Linux (fork server, rlimits, "
                                   f"namespaces); this is {sys.platform}")
            workers: list[_Worker | None] = [None] * self.config.workers
            self._finalizer = weakref.finalize(self, _shutdown, workers, os.getpid())
            deadline = time.monotonic() + _START_TIMEOUT_S
            for i in range(len(workers)):
                workers[i] = _Worker(self._setup_frame())
            for w in workers:
                w.wait_ready(deadline)
            self._workers = workers
            self._idle = list(range(len(workers)))
            combined = {k: all(w.info["protections"][k] for w in workers)
                        for k in workers[0].info["protections"]}
            self._protections = MappingProxyType({"parent_grading": True, **combined})
            self._started = True
            if self.config.use_seccomp and not combined.get("seccomp"):
                notes = {n for w in workers for n in w.info.get("notes", ()) if "seccomp" in n}
                warnings.warn(f"labkit sandbox: checks run WITHOUT the seccomp system-call "
                              f"filter: {'; '.join(sorted(notes))}", RuntimeWarning,
                              stacklevel=3)
            if self.config.use_cgroup and not combined.get("cgroup"):
                notes = {n for w in workers for n in w.info.get("notes", ()) if "cgroup" in n}
                warnings.warn(f"labkit sandbox: a check's memory is capped per process only "
                              f"(no cgroup): {'; '.join(sorted(notes))}", RuntimeWarning,
                              stacklevel=3)
        return self

    def close(self) -> None:
        """Stop all workers; every process a check started is gone afterwards."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def protections(self) -> dict[str, bool]:
        """Which protections are really active (starts the pool): ``parent_grading``,
        ``rlimits``, ``session``, ``wall_deadline``, ``output_cap``, ``minimal_env``,
        ``process_sweep``, ``non_root_uid``, ``no_new_privs``, ``net_namespace``,
        ``mount_namespace``, ``ipc_namespace`` (a fresh one per check), ``pid_namespace`` (a
        fresh one per check, with its own ``/proc``), ``allowlist_root`` (the file system
        holds only the allow-list), ``readonly_root``, ``hidden_paths``, ``private_tmp``,
        ``seccomp`` (the system-call filter), ``cgroup`` (memory and processes capped over
        all of a check's processes); :attr:`notes` says why one is off."""
        self.start()
        return dict(self._protections)

    @property
    def uids(self) -> list[int]:
        """The sandbox uids the workers run checks as (empty without privilege dropping)."""
        self.start()
        return [w.info["uid"] for w in self._workers if w is not None and w.info.get("uid")]

    @property
    def notes(self) -> list[str]:
        """Why a protection is off, or what a worker left out, as each worker reported it at
        start (starts the pool)."""
        self.start()
        return list(dict.fromkeys(note for w in self._workers if w is not None
                                  for note in w.info.get("notes", ())))

    def _setup_frame(self) -> dict:
        c = self.config
        program, why = _seccomp_program() if c.use_seccomp else (None, "use_seccomp=False")
        return {
            "seccomp_bpf": program, "seccomp_note": why,
            "uid_base": c.uid_base, "use_namespaces": c.use_namespaces,
            "use_pid_namespace": c.use_pid_namespace, "use_cgroup": c.use_cgroup,
            "check_memory_mb": c.check_memory_mb,
            "drop_privileges": c.drop_privileges, "tmpfs_mb": c.tmpfs_mb,
            "limits": {"cpu_s": c.cpu_s, "memory_mb": c.memory_mb, "nproc": c.nproc,
                       "nofile": c.nofile, "fsize_mb": c.fsize_mb},
            "max_output_bytes": c.max_output_bytes, "stderr_tail_bytes": c.stderr_tail_bytes,
            "hide_paths": list(default_hide_paths() if c.hide_paths is None else c.hide_paths),
            "extra_paths": [os.path.abspath(p) for p in c.extra_paths],
            "env": _CHILD_ENV, "host_tmp": tempfile.gettempdir(),
        }

    def _spawn(self, slot: int) -> _Worker:
        if self._closed:
            raise RuntimeError("this Sandbox is closed")
        worker = _Worker(self._setup_frame())
        self._workers[slot] = worker
        worker.wait_ready(time.monotonic() + _START_TIMEOUT_S)
        return worker

    def _retire(self, slot: int) -> None:
        """Stop the worker of ``slot`` (hung, dead, or out of step with us): hang up so that it
        abandons its check and sweeps its uid, kill it if it has not exited within a second.
        A new one is started when the slot is next used."""
        worker = self._workers[slot]
        if worker is not None:
            worker.close(_RETIRE_GRACE_S)
            self._workers[slot] = None

    def _lease(self, want: int, block: bool) -> list[int]:
        with self._cv:
            while block and not self._idle:
                if self._closed:
                    raise RuntimeError("this Sandbox is closed")
                self._cv.wait()
            taken, self._idle = self._idle[:want], self._idle[want:]
            return taken

    def _release(self, slots: list[int]) -> None:
        with self._cv:
            self._idle.extend(slots)
            self._cv.notify_all()

    # ------------------------------------------------------------------------- running

    def run(self, candidate: Candidate) -> SandboxResult:
        """Check one candidate."""
        return self.run_many([candidate])[0]

    def run_many(self, candidates: Sequence[Candidate], progress: bool = False) -> list[SandboxResult]:
        """Check candidates on all idle workers at once; results come back in input order.

        Verdicts do not depend on scheduling: every check is a fresh child with the same
        seeds. A check whose worker dies is retried once on a fresh worker.
        """
        candidates = list(candidates)
        if not candidates:
            return []
        self.start()
        return _Batch(self, candidates, progress).run()


@dataclass
class _SlotState:
    """What one leased worker is doing for a batch."""

    queue: deque[tuple[int, int]] = field(default_factory=deque)
    """(candidate index, job number) of the jobs sent, the running one first."""
    deadline: float = 0.0  # when the running check must have answered
    stop_sent: bool = False  # fail-fast: the running check was asked to stop


class _Batch:
    """One :meth:`Sandbox.run_many` call: feeds the leased workers, collects and grades.

    Each worker gets up to ``_PIPELINE`` jobs at a time, so it starts the next check as soon
    as it has replied, without waiting for this process (a second job is only queued when it
    fits in the pipe, so a write never blocks on a busy worker).
    """

    def __init__(self, sandbox: Sandbox, candidates: list[Candidate], progress: bool):
        self.sandbox = sandbox
        self.config = sandbox.config
        self.candidates = candidates
        cap = self.config.max_code_bytes
        sizes = [jobs.code_bytes(c.code, cap) for c in candidates]
        self.frames = [jobs.job_frame(c, self.config) if size <= cap else b""
                       for c, size in zip(candidates, sizes)]
        self.timeouts = [jobs.timeout(c, self.config) for c in candidates]
        self.results: list[SandboxResult | None] = [None] * len(candidates)
        self.pending = deque(jobs.schedule(candidates, [i for i, size in enumerate(sizes) if size <= cap]))
        self.attempts = [0] * len(candidates)
        self.slots: dict[int, _SlotState] = {}
        self.selector = selectors.DefaultSelector()
        self.bar = _progress_bar(len(candidates)) if progress else None
        for i, size in enumerate(sizes):
            if size > cap:  # neither parsed nor run: parsing it could take gigabytes
                self.finish(i, failure(
                    candidates[i], sandbox._protections, Status.ERROR,
                    f"the code has at least {size} bytes, more than max_code_bytes ({cap}); it was "
                    "not parsed or run (raise SandboxConfig.max_code_bytes to allow it)",
                    flags=("too_large",)))

    def run(self) -> list[SandboxResult]:
        if not self.pending:  # every candidate was refused before running
            if self.bar is not None:
                self.bar.close()
            return self.results  # type: ignore[return-value]
        held = self.sandbox._lease(len(self.pending), block=True)
        try:
            for slot in held:
                self.fill(slot)
            while any(state.queue for state in self.slots.values()):
                busy = [state.deadline for state in self.slots.values() if state.queue]
                ready = self.selector.select(max(0.0, min(busy) - time.monotonic()))
                polled = time.monotonic()  # before grading: its time is never held against
                answered = {key.data for key, _ in ready}  # a worker whose reply is waiting
                for slot in answered:
                    self.receive(slot)
                for slot, state in list(self.slots.items()):
                    if state.queue and slot not in answered and polled > state.deadline:
                        self.lose(slot, Status.TIMEOUT, "the sandbox worker stopped answering")
                        self.fill(slot)
                if self.pending:  # workers another caller has given back meanwhile
                    for slot in self.sandbox._lease(len(self.pending), block=False):
                        held.append(slot)
                        self.fill(slot)
        finally:
            self.selector.close()
            for slot, state in self.slots.items():
                if state.queue:  # interrupted: this worker is mid-check, out of step with us
                    self.sandbox._retire(slot)
            self.sandbox._release(held)
            if self.bar is not None:
                self.bar.close()
        return self.results  # type: ignore[return-value]

    def finish(self, i: int, result: SandboxResult) -> None:
        self.results[i] = result
        if self.bar is not None:
            self.bar.update(1)

    def fill(self, slot: int) -> None:
        """Send pending jobs to ``slot`` until it has ``_PIPELINE`` of them."""
        state = self.slots.setdefault(slot, _SlotState())
        while self.pending and len(state.queue) < _PIPELINE:
            i = self.pending[0]
            if state.queue and len(self.frames[i]) > _PIPELINE_MAX_BYTES:
                return  # sent when the worker is idle and reading
            worker = self.sandbox._workers[slot] or self.sandbox._spawn(slot)
            try:
                number = worker.submit(self.frames[i])
            except OSError:  # the worker is gone
                self.lose(slot, Status.CRASHED, "the sandbox worker died during this check")
                state = self.slots.setdefault(slot, _SlotState())
                continue
            self.pending.popleft()
            if not state.queue:
                self.selector.register(worker.out_fd, selectors.EVENT_READ, slot)
                self.start_clock(state, i)
            state.queue.append((i, number))
            self.attempts[i] += 1

    def start_clock(self, state: _SlotState, i: int) -> None:
        state.deadline = time.monotonic() + self.timeouts[i] + _REPLY_GRACE_S
        state.stop_sent = False

    def receive(self, slot: int) -> None:
        state, worker = self.slots[slot], self.sandbox._workers[slot]
        try:
            frames = worker.receive()
        except EOFError:
            self.lose(slot, Status.CRASHED, "the sandbox worker died during this check")
            self.fill(slot)
            return
        for header, payload in frames:
            if not state.queue:  # a frame nobody asked for: the worker is out of step
                self.lose(slot, Status.CRASHED, "the sandbox worker broke the protocol")
                self.fill(slot)
                return
            i, number = state.queue[0]
            if header.get("alive"):  # busy cleaning up after the check: not hung
                state.deadline = max(state.deadline, time.monotonic() + _REPLY_GRACE_S)
                continue
            if header.get("partial"):
                self.stream(state, worker, i, number, payload)
                continue
            state.queue.popleft()
            self.finish(i, self.grade(i, header, payload))
            if header.get("retire"):  # it cannot run another check safely: replace it
                self.lose(slot, Status.CRASHED, str(header["retire"]))
                self.fill(slot)
                return
            if state.queue:
                self.start_clock(state, state.queue[0][0])
        if not state.queue:
            self.unwatch(worker)
        self.fill(slot)

    def grade(self, i: int, header: Mapping, payload: bytes) -> SandboxResult:
        """:func:`grade` for candidate ``i``, confined: a failure of the grading (or of the
        worker on this check) makes this one result CRASHED, never the batch."""
        candidate, protections = self.candidates[i], self.sandbox._protections
        if header.get("worker_error"):
            return failure(candidate, protections, Status.CRASHED,
                            f"the sandbox worker failed during this check: "
                            f"{header['worker_error']}", max_code_bytes=self.config.max_code_bytes)
        try:
            return grade(candidate, header, payload, protections, self.config.fail_fast,
                         self.config.max_code_bytes)
        except Exception as e:  # noqa: BLE001 (confined to this check, and said so)
            return failure(candidate, protections, Status.CRASHED,
                            f"grading failed: {type(e).__name__}: {str(e)[:200]}", flags=(),
                            max_code_bytes=self.config.max_code_bytes)

    def unwatch(self, worker: _Worker | None) -> None:
        if worker is not None and worker.out_fd in self.selector.get_map():
            self.selector.unregister(worker.out_fd)

    def stream(self, state: _SlotState, worker: _Worker, i: int, number: int,
               lines: bytes) -> None:
        """Fail-fast: read the running check's streamed lines (the child's outputs) and stop
        it at a failure the candidate made itself (:func:`fails_by_itself`), never at a
        wrong answer."""
        if state.stop_sent:
            return
        suite = self.candidates[i].tests
        if any(fails_by_itself(suite, line) for line in lines.splitlines()):
            worker.stop(number)
            state.stop_sent = True

    def lose(self, slot: int, status: Status, error: str) -> None:
        """The worker of ``slot`` died or hung: retire it (the next :meth:`fill` starts a new
        one). Its running check is retried once if the worker died, else reported with
        ``status``; queued ones go back to the pending jobs."""
        state = self.slots.pop(slot, _SlotState())
        self.unwatch(self.sandbox._workers[slot])
        self.sandbox._retire(slot)
        if state.queue:
            (running, _), *queued = state.queue
            for i, _ in reversed(queued):
                self.attempts[i] -= 1  # never started
                self.pending.appendleft(i)
            if status is Status.CRASHED and self.attempts[running] < _MAX_ATTEMPTS:
                self.pending.appendleft(running)
            else:
                self.finish(running, failure(self.candidates[running],
                                              self.sandbox._protections, status, error,
                                              max_code_bytes=self.config.max_code_bytes))


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="sandbox", unit="check")


# ----------------------------------------------------------------------------- module level

_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox (default config), created on first use, closed at exit."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Sandbox()
            atexit.register(_default.close)
        return _default


def run_many(candidates: Sequence[Candidate], config: SandboxConfig | None = None) -> list[SandboxResult]:
    """Check candidates on :func:`default_sandbox`, or on a temporary pool built from
    ``config`` (started and stopped around the call)."""
    if config is None:
        return default_sandbox().run_many(candidates)
    with Sandbox(config) as sandbox:
        return sandbox.run_many(candidates)


def run_distinct(sandbox, candidates: Sequence[Candidate]) -> list[SandboxResult]:
    """``sandbox.run_many(candidates)`` with each distinct candidate checked once.

    A GRPO group or an evaluation's k samples often hold the same program several times (a
    training step's 128 samples at the experiments' T = 1.6 hold about 83 programs). A check
    is a function of its candidate: a fresh child with the same seeds, whatever the
    scheduling. So the copies of a program (same code, entry point and deadline, against the
    same test-suite object) share the one result, in input order. The exception is a program
    whose verdict depends on the clock (one that ends near a time limit): its copies now
    share one draw of that chance instead of each drawing their own.
    """
    keys = [(c.code, id(c.tests), c.entry_point, c.timeout_s) for c in candidates]
    slot: dict[tuple, int] = {}  # key -> its place among the distinct candidates
    distinct: list[Candidate] = []
    for key, c in zip(keys, candidates):
        if key not in slot:
            slot[key] = len(distinct)
            distinct.append(c)
    if len(distinct) == len(keys):
        return sandbox.run_many(candidates)
    results = sandbox.run_many(distinct)
    return [results[slot[key]] for key in keys]


__all__ = ["Sandbox", "WorkerError", "default_sandbox", "run_distinct", "run_many"]
