"""A check as a worker receives it: the job frame (the code, the entry point and the IO cases'
arguments; the assert tests as its payload, for the grader only), its deadline, and the order
a batch's checks go out to the workers in (:func:`schedule`). Expected values of IO cases are
never part of a job: they stay with the parent's grading (:mod:`labkit.sandbox.grading`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from labkit.sandbox import plain, wire
from labkit.sandbox.config import SandboxConfig
from labkit.sandbox.grading import COMPARE_MODES
from labkit.sandbox.records import Candidate

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


def code_bytes(code: str, cap: int) -> int:
    """The UTF-8 size of ``code``, or just ``len(code)`` when that is already over ``cap``
    (a character is at least one byte), so that a huge string is not copied to be measured."""
    if len(code) > cap:
        return len(code)
    return len(code.encode("utf-8", "surrogatepass"))


def timeout(candidate: Candidate, config: SandboxConfig) -> float:
    return float(candidate.timeout_s if candidate.timeout_s is not None else config.timeout_s)


def job_frame(candidate: Candidate, config: SandboxConfig) -> bytes:
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
    return wire.encode_frame({
        "timeout": timeout(candidate, config), "test_timeout": config.test_timeout_s,
        "entry": candidate.entry_point, "code": candidate.code, "stream": config.fail_fast,
        "args": [plain.encode(tuple(case.args)) for case in suite.cases],
        "first_assert": len(suite.cases),
    }, tests)
