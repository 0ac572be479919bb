"""Plain records that flow up the house: tasks, rollouts and feedback components.

Everything here is a dataclass of plain Python values, so a learner can stop at any floor,
print what came out, and write it to JSON (``to_dict`` / ``from_dict``). A task's tests and
what the sandbox makes of a program (:class:`~labkit.sandbox.records.TestSuite`,
:class:`~labkit.sandbox.records.SandboxResult`) are the sandbox's records,
:mod:`labkit.sandbox.records`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from collections.abc import Mapping
from typing import Any

from labkit.sandbox.records import TestSuite


class BugKind(str, enum.Enum):
    """Bug families of HumanEvalFix (Muennighoff et al. 2023) plus the lab's extras."""

    OPERATOR_MISUSE = "operator_misuse"
    BOUNDARY = "boundary"  # off-by-one: range bounds, slice ends, < vs <=
    VALUE_MISUSE = "value_misuse"
    VARIABLE_MISUSE = "variable_misuse"
    MISSING_LOGIC = "missing_logic"
    EXCESS_LOGIC = "excess_logic"
    FUNCTION_MISUSE = "function_misuse"
    ARGUMENT_SWAP = "argument_swap"
    WRONG_RETURN = "wrong_return"
    SYNTAX = "syntax"  # opt-in family: missing colon, bad indentation


class Split(str, enum.Enum):
    """Where a problem belongs. For synthetic problems ``val`` and ``test`` hold out whole
    templates; ``in_template`` holds out instances of training templates (new constants and
    names, a shape training has seen), the in-distribution check."""

    TRAIN = "train"
    VAL = "val"
    TEST = "test"
    IN_TEMPLATE = "in_template"


# ----------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class BugSpan:
    """One injected (or human-written) bug: its kind, the operator that made it and the
    1-based, inclusive line span it occupies in the buggy code."""

    kind: str
    operator: str
    start_line: int
    end_line: int
    description: str = ""


@dataclass(frozen=True)
class RepairTask:
    """A buggy program to repair.

    ``prompt`` is what the policy may see of the problem (signature + docstring);
    ``buggy_code`` and ``reference_code`` are whole modules (helpers included);
    ``reference_code`` is used only to validate the task and is never shown to a policy.
    ``public_tests`` is the subset a multi-turn agent may run between turns; ``tests``
    are the hidden tests that decide the reward.
    """

    task_id: str
    problem_id: str
    source: str
    prompt: str
    buggy_code: str
    reference_code: str
    tests: TestSuite
    entry_point: str
    bugs: tuple[BugSpan, ...] = ()
    difficulty: int = 1
    split: str = Split.TRAIN.value
    public_tests: TestSuite = field(default_factory=TestSuite)
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bug_kinds(self) -> tuple[str, ...]:
        return tuple(sorted({b.kind for b in self.bugs}))

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("task_id", "problem_id", "source", "prompt",
                                           "buggy_code", "reference_code", "entry_point",
                                           "difficulty", "split")}
        d["tests"] = self.tests.to_dict()
        d["public_tests"] = self.public_tests.to_dict()
        d["bugs"] = [asdict(b) for b in self.bugs]
        d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RepairTask":
        missing = [k for k in ("task_id", "prompt", "buggy_code", "reference_code",
                               "tests", "entry_point") if k not in d]
        if missing:
            raise ValueError(
                f"task {d.get('task_id', '<unknown>')!r}: missing field(s) {missing}; "
                "a task record needs task_id, prompt, buggy_code, reference_code, tests, "
                "entry_point")
        return cls(
            task_id=d["task_id"],
            problem_id=d.get("problem_id", d["task_id"]),
            source=d.get("source", "unknown"),
            prompt=d["prompt"],
            buggy_code=d["buggy_code"],
            reference_code=d["reference_code"],
            tests=TestSuite.from_dict(d["tests"]),
            entry_point=d["entry_point"],
            bugs=tuple(BugSpan(**b) for b in d.get("bugs", ())),
            difficulty=int(d.get("difficulty", 1)),
            split=d.get("split", Split.TRAIN.value),
            public_tests=TestSuite.from_dict(d.get("public_tests", {})),
            meta=dict(d.get("meta", {})),
        )


# ----------------------------------------------------------------------------- rollouts


@dataclass
class Rollout:
    """One sampled completion for one task: the record the policy floor makes
    (:func:`labkit.policy.rollout.sample`) and the credit floor reads (token ids, the
    sampling log-probs, each token's character span), so credit never needs the sampler.
    ``to_dict`` for JSONL."""

    task_id: str
    sample: int
    prompt: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    completion: str
    code: str
    code_start: int
    """Character offset of ``code`` inside ``completion`` (-1 when not a substring)."""
    offsets: list[tuple[int, int]]
    """``offsets[i]`` = (start, end) characters of completion token i in ``completion``."""
    finished: bool
    """True when the completion ended with EOS or a stop string (not cut by max_new_tokens)."""
    temperature: float = 1.0
    meta: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.completion_ids)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["offsets"] = [list(o) for o in self.offsets]
        return d

    def tokens_in_span(self, start: int, end: int) -> list[int]:
        """Indices of completion tokens overlapping characters ``[start, end)`` of the completion."""
        return [i for i, (a, b) in enumerate(self.offsets) if a < end and b > start and b > a]


# ----------------------------------------------------------------------------- feedback


@dataclass(frozen=True)
class Components(Mapping):
    """The named feedback components of one candidate, made by
    :func:`labkit.env.feedback.evaluate_many` and read by the reshaping floor, the trainer's
    metrics and the widgets (the table of ``labkit.env.feedback``'s docstring defines each).

    It is also a read-only mapping (``c["r_test"]``, ``dict(c)``, ``**c``) in
    :data:`COMPONENT_NAMES` order, so a user ``reward_fn`` may return plain dicts:
    :meth:`from_dict` needs ``r_test`` and ``r_pass`` and fills the rest with the values that
    leave the reward as the raw test term (``r_feedback = r_test``, ``r_compile = 1``, the
    bonuses 0)."""

    r_test: float
    """Fraction of the hidden tests passed."""
    r_pass: float
    """1 if every hidden test passed, else 0."""
    r_feedback: float | None = None
    """What the learner is told under the feedback regime; ``None`` means ``r_test`` (dense)."""
    r_compile: float = 1.0
    """1 if the candidate parses and its module loads."""
    r_precision: float = 0.0
    """``exp(-lambda d)``, the closeness of the edit to the buggy code."""
    r_style: float = 0.0
    """``exp(-alpha v)`` over style violations."""
    r_progress: float = 0.0
    """One-off bonus for a bug kind finally fixed."""
    hack: float = 0.0
    """1 if the syntax-tree scan raised a hack flag."""
    noop: float = 0.0
    """1 if the candidate is the buggy code unchanged."""

    def __post_init__(self) -> None:
        if self.r_feedback is None:
            object.__setattr__(self, "r_feedback", self.r_test)
        for name in COMPONENT_NAMES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"feedback component {name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))

    def __getitem__(self, name: str) -> float:
        if name not in COMPONENT_NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(COMPONENT_NAMES)

    def __len__(self) -> int:
        return len(COMPONENT_NAMES)

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in COMPONENT_NAMES}

    @classmethod
    def from_dict(cls, d: Mapping[str, float]) -> "Components":
        if isinstance(d, Components):
            return d
        unknown = sorted(set(d) - set(COMPONENT_NAMES))
        if unknown:
            raise ValueError(f"unknown feedback components {unknown}; the known ones are "
                             f"{list(COMPONENT_NAMES)} (put other numbers in your own records)")
        missing = [k for k in ("r_test", "r_pass") if k not in d]
        if missing:
            raise ValueError(f"feedback components need {missing} (got {sorted(d)})")
        return cls(**d)


COMPONENT_NAMES = ("r_test", "r_pass", "r_feedback", "r_compile", "r_precision", "r_style",
                   "r_progress", "hack", "noop")
"""The fields of :class:`Components`, in display order."""
