"""Grading in the parent: a worker's report (exit statuses, deadline, caps, the child's
output lines and the grader's verdict lines) turned into a :class:`SandboxResult`.

The expected value of an IO case never leaves this process: the child only sends back what
the candidate returned, as tagged JSON (:mod:`labkit.sandbox.plain`), decoded here with
:func:`~labkit.sandbox.plain.decode_untrusted` (it never raises and costs time linear in the
reply) and compared with :func:`~labkit.sandbox.plain.strict_equal` (or the case's ``approx`` /
``truthy`` / ``falsy`` mode). A line out of place voids the whole check. :func:`grade` is pure.
"""

from __future__ import annotations

import json
import reprlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.sandbox import plain
from labkit.sandbox.hackscan import MAX_SCAN_BYTES, scan
from labkit.sandbox.records import (AssertTest, Candidate, IOCase, SandboxResult, Status,
                                    TestOutcome, TestSuite)
from labkit.sandbox.wire import parse_int

COMPARE_MODES = ("eq", "approx", "truthy", "falsy")

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
    per IO case, end; see :func:`labkit.sandbox.child.run_tests`) or the grader's (one line per assert test,
    end; see :func:`labkit.sandbox.grader.run_asserts`)."""

    loaded: bool = False
    load_error: str = ""
    records: list[dict] = field(default_factory=list)
    ended: bool = False
    corrupt: str = ""


def _json_object(raw: bytes) -> dict | None:
    """One line as a JSON object, or ``None``. Linear in its length: raw integers are capped
    (converting decimal text to an int is quadratic), and nothing here raises."""
    try:
        rec = json.loads(raw, parse_int=parse_int)
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


def fails_by_itself(suite: TestSuite, line: bytes) -> bool:
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


def failure(candidate: Candidate, protections: Mapping[str, bool], status: Status,
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
