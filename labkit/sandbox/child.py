"""The sandboxed child: the process a check forks for the candidate's code.

It confines itself (:func:`child_main`), then runs the candidate (:func:`run_tests`): loads
it, calls it on every IO case and writes one line per case, then answers the grader's calls
for the assert tests. What it writes are outputs, never verdicts: the parent grades the IO
cases (:mod:`labkit.sandbox.grading`) and the grader the asserts (:mod:`.grader`).

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
import sys

from . import cgroups, plain, wire
from .isolation import Isolation
from .syscalls import (
    CLONE_NEWIPC,
    PR_SET_PDEATHSIG,
    clear_keyrings,
    install_filter,
    libc_call,
    mount_proc,
    place_fds,
    prctl,
    set_limits,
)

RESULT_FD = 3  # the child's output channel: load, one line per IO case, end
CALL_FD, REPLY_FD = 4, 5  # the child's end of the grader's calls: requests in, outputs out


def child_main(job: dict, cfg: dict, iso: Isolation, workdir: str, devnull: int, err_w: int,
               res_w: int, calls: tuple[int, int] | None) -> None:
    """Runs in the forked child: confine the process, then run the candidate: its IO cases,
    then (with ``calls``, the read end of the grader's requests and the write end of the
    replies) the calls the grader makes for the assert tests.

    Confinement, in order: a new session; a ``/proc`` of its own when it is pid 1 of a new
    PID namespace (it was cloned into that, a mount and an IPC namespace), else a fresh IPC
    namespace; the worker's cgroup (the memory and process maxima of the check); the
    descriptors it needs and no other; rlimits, the sandbox uid, a session keyring of its
    own (and its uid's keyrings emptied), then the seccomp filter. Never returns: the
    process ends with ``os._exit`` so neither the worker's nor the candidate's ``atexit``
    handlers run.
    """
    status = 70
    try:
        os.setsid()
        if iso.check_namespaces:
            mount_proc(iso.proc_options)
        elif iso.ipc_per_check:
            libc_call("unshare", CLONE_NEWIPC)
        if iso.cgroup is not None:
            cgroups.join(iso.cgroup)
        fds = {0: devnull, 1: devnull, 2: err_w, RESULT_FD: res_w}
        if calls is not None:
            fds.update({CALL_FD: calls[0], REPLY_FD: calls[1]})
        place_fds(fds)  # also closes the cgroup's files: no process of the check holds one
        os.chdir(workdir)
        set_limits(cfg["limits"], nproc=True)
        if iso.uid is not None:
            os.setgroups([])
            os.setgid(iso.uid)
            os.setuid(iso.uid)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid
        clear_keyrings(user=iso.uid is not None)
        if iso.seccomp is not None:
            install_filter(iso.seccomp)
        sys.argv = ["candidate"]
        random.seed(0)  # deterministic verdicts whatever worker runs the check
        status = run_tests(job, cfg["max_output_bytes"], serve=calls is not None)
    finally:
        os._exit(status)


def run_tests(job: dict, max_output_bytes: int, serve: bool = False) -> int:
    """Load the candidate, call it on every IO case, stream one JSON line per case to
    ``RESULT_FD``; then, with ``serve``, answer the grader's calls until it hangs up.

    Lines: ``{"k":"load","ok":true}`` (or ``"ok":false`` with ``"x"``: why), then for case
    ``i`` either ``{"i":i,"v":<plain-encoded output>}``, ``{"i":i,"x":"<exception>"}`` or
    ``{"i":i,"u":"<why the output is not plain>"}``, and finally ``{"k":"end"}``. These are
    outputs, not verdicts: whatever the candidate writes here is graded in the parent as
    what it returned. Every helper used here is bound to a local first, so a candidate
    rebinding module attributes cannot reach it.
    """
    write, dumps, loads = os.write, json.dumps, json.loads
    encode, decode = plain.encode, plain.decode
    describe, reader = wire.describe, wire.LineReader

    def emitter(fd: int, budget: int):
        left = [budget - 64]  # keep room for the end line

        def emit(record: dict) -> None:
            try:
                data = (dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
            except BaseException as e:
                data = (dumps({"i": record.get("i"), "u": f"cannot serialise: {describe(e)}"})
                        + "\n").encode()
            if len(data) > left[0]:
                data = (dumps({"i": record.get("i"), "u": "output larger than the output cap"})
                        + "\n").encode()
            left[0] -= len(data)
            view = memoryview(data)
            while view:
                view = view[write(fd, view):]
        return emit

    emit = emitter(RESULT_FD, max_output_bytes)
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
        function = namespace.get(job["entry"])
        if not callable(function):
            raise TypeError(f"entry point {job['entry']!r} is not defined or not callable")
    except BaseException as e:
        emit({"k": "load", "ok": False, "x": describe(e)})
        return 0
    emit({"k": "load", "ok": True})

    def call(index: int | None, args: tuple, kwargs: dict, out) -> None:
        try:
            output = function(*args, **kwargs)
        except BaseException as e:
            out({"i": index, "x": describe(e)})
        else:
            try:
                out({"i": index, "v": encode(output)})
            except BaseException as e:
                out({"i": index, "u": describe(e)})

    for index, encoded_args in enumerate(job["args"]):
        call(index, decode(encoded_args), {}, emit)
    emit({"k": "end"})
    if serve:  # the grader's calls: one request line in, one reply line out, in order
        requests = reader(CALL_FD, 1 << 26)
        while True:
            try:
                line = requests.line()
            except BaseException:
                break
            if line is None:
                break
            args, kwargs = decode(loads(line))
            call(None, args, kwargs, emitter(REPLY_FD, max_output_bytes))
    return 0
