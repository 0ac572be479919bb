"""The sandbox's plain records: tests, candidates and results.

A :class:`Candidate` (a program and its :class:`TestSuite`) goes in, a :class:`SandboxResult`
(status, per-test :class:`TestOutcome`) comes out. Every record is a frozen dataclass of plain
Python values with ``to_dict`` / ``from_dict``; test arguments and expected values may hold
tuples, sets, floats such as ``nan``: they go through :mod:`labkit.sandbox.plain`, a tagged
JSON codec that keeps exact types. The environment's records (tasks, rollouts, feedback
components) are in :mod:`labkit.env.records`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from labkit.sandbox import plain

# ----------------------------------------------------------------------------- tests


@dataclass(frozen=True)
class IOCase:
    """Call ``entry_point(*args)`` in the child; compare the returned value in the parent.

    ``compare`` is ``eq`` (exact type and value), ``approx`` (``abs(got - expected) < tol``),
    ``truthy`` or ``falsy`` (``assert candidate(...)`` / ``assert not candidate(...)``).
    The expected value never enters the sandboxed child.
    """

    args: tuple
    expected: Any = None
    compare: str = "eq"
    tol: float = 0.0
    name: str = ""

    def to_dict(self) -> dict:
        return {
            "args": plain.encode(tuple(self.args)),
            "expected": plain.encode(self.expected),
            "compare": self.compare,
            "tol": self.tol,
            "name": self.name,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "IOCase":
        return cls(
            args=tuple(plain.decode(d["args"])),
            expected=plain.decode(d["expected"]),
            compare=d.get("compare", "eq"),
            tol=float(d.get("tol", 0.0)),
            name=d.get("name", ""),
        )


@dataclass(frozen=True)
class AssertTest:
    """Test source run in the sandbox's grader, a trusted process, with ``candidate`` bound
    to a proxy of the entry point: each call runs in the sandboxed child, and its output
    comes back as plain data (exact builtin types) before the test compares anything.
    Outcomes are reported as graded in the ``grader``.
    """

    source: str
    name: str = ""


@dataclass(frozen=True)
class TestSuite:
    """The tests of one task: parent-graded cases, grader-run asserts, and trusted setup
    code (imports, helpers of the test module) run in the grader before the asserts."""

    __test__ = False  # not a pytest class

    cases: tuple[IOCase, ...] = ()
    asserts: tuple[AssertTest, ...] = ()
    setup: str = ""

    @property
    def total(self) -> int:
        return len(self.cases) + len(self.asserts)

    def to_dict(self) -> dict:
        return {
            "cases": [c.to_dict() for c in self.cases],
            "asserts": [asdict(a) for a in self.asserts],
            "setup": self.setup,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "TestSuite":
        return cls(
            cases=tuple(IOCase.from_dict(c) for c in d.get("cases", ())),
            asserts=tuple(AssertTest(**a) for a in d.get("asserts", ())),
            setup=d.get("setup", ""),
        )


# ----------------------------------------------------------------------------- sandbox


class Status(str, enum.Enum):
    PASSED = "passed"  # every test collected and passed
    FAILED = "failed"  # ran, at least one test failed
    ERROR = "error"  # did not compile / load (syntax error, exception at import)
    TIMEOUT = "timeout"  # the parent's wall-clock deadline was hit
    CRASHED = "crashed"  # died by a signal or exited before reporting every test
    KILLED = "killed"  # stopped for a resource limit (CPU, output, file size, memory)


@dataclass(frozen=True)
class Candidate:
    """One program to check: the code (a whole module) and the tests to run it against."""

    code: str
    tests: TestSuite
    entry_point: str
    timeout_s: float | None = None  # None: the sandbox config's default
    id: str = ""


@dataclass(frozen=True)
class TestOutcome:
    """One test's verdict. ``graded_in`` is ``parent`` (IOCase) or ``grader`` (AssertTest)."""

    __test__ = False

    name: str
    ok: bool
    graded_in: str = "parent"
    detail: str = ""  # e.g. "expected 3 (int), got 4 (int)" or the exception's last line


@dataclass(frozen=True)
class SandboxResult:
    status: Status
    passed: int
    total: int
    outcomes: tuple[TestOutcome, ...] = ()
    stderr_tail: str = ""
    wall_s: float = 0.0
    flags: tuple[str, ...] = ()  # hack flags from the syntax-tree scan
    protections: Mapping[str, bool] = field(default_factory=dict)
    error: str = ""  # one line: why it did not pass, when it did not

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return self.status == Status.PASSED

    def to_dict(self) -> dict:
        return {
            "status": self.status.value,
            "passed": self.passed,
            "total": self.total,
            "outcomes": [asdict(o) for o in self.outcomes],
            "stderr_tail": self.stderr_tail,
            "wall_s": round(self.wall_s, 6),
            "flags": list(self.flags),
            "protections": dict(self.protections),
            "error": self.error,
        }
