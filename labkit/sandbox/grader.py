"""The grader: a trusted process a check forks before the child, which runs the assert tests.

It never runs candidate code: ``candidate`` is a :class:`CandidateProxy` whose calls go to the
sandboxed child (:mod:`.child`) as plain data and come back decoded to exact builtin values.
Its verdicts travel on a pipe no process of the check holds, and the child never holds the
tests' source.

Standard library only: the worker loads it by path (:mod:`labkit.sandbox.worker`).
"""

# The harness runs untrusted code on purpose (exec) and must survive anything it raises
# (except BaseException), so those two rules do not apply to this file.
# ruff: noqa: S102, BLE001

from __future__ import annotations

import builtins
import json
import os
import random
import signal

from . import plain
from .isolation import Isolation
from .syscalls import (
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    install_filter,
    place_fds,
    prctl,
    set_limits,
)
from .wire import LineReader, describe, parse_int, write_all, zero

VERDICT_FD = 3  # the grader's verdict channel (in the grader process)
GRADER_CALL_FD, GRADER_REPLY_FD = 4, 5  # the grader's ends of the call pipes


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
            reply = json.loads(line, parse_int=parse_int)
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
        place_fds({0: devnull, 1: devnull, 2: devnull, VERDICT_FD: verdict_w,
                    GRADER_CALL_FD: call_w, GRADER_REPLY_FD: reply_r})
        set_limits(cfg["limits"], nproc=False)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        prctl(PR_SET_DUMPABLE, 0)
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
        setup_error = f"test setup failed: {describe(e)}"
    scope["candidate"] = proxy
    for k, source in enumerate(tests["asserts"]):
        if setup_error is not None:
            emit({"i": first + k, "x": setup_error})
            continue
        try:
            exec(compile(source, "<test>", "exec"), scope)
        except BaseException as e:
            emit({"i": first + k, "x": describe(e)})
        else:
            emit({"i": first + k, "ok": True})
    emit({"k": "end"})
    os.close(GRADER_CALL_FD)  # the child's calls end: it exits
    return 0
