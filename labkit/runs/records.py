"""The rollout record: one line of a run's ``rollouts.jsonl``, and one item of ``records`` in
the trainer's ``on_step_end`` event.

The trainer writes it (:meth:`RolloutRecord.to_dict`), the widgets read it
(:func:`read_rollouts` checks every row), a learner can load it with pandas. Rows are plain
JSON so a run folder outlives the code that wrote it; a row missing a field is an error
naming the file, the line and the field.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from labkit.runs.events import RunFolder


@dataclass(frozen=True)
class RolloutRecord:
    """One sampled repair at one step, with what the trainer made of it."""

    step: int
    """Update step the rollout was sampled at (1-based: the step it fed)."""
    task_id: str
    """The task (``source/problem/bugk``); the rows of one task at one step form its group."""
    sample: int
    """Index of the sample inside its group (0..G-1)."""
    buggy_code: str
    """The program the policy was asked to repair."""
    completion: str
    """The decoded completion."""
    code: str
    """The program extracted from the completion (what the sandbox ran)."""
    code_start: int
    """Character offset of ``code`` in ``completion`` (-1 when not a substring)."""
    offsets: list[list[int]]
    """``[start, end)`` characters of each completion token in ``completion``."""
    completion_ids: list[int]
    """Completion token ids (:attr:`labkit.policy.rollout.Rollout.completion_ids`)."""
    logprobs: list[float]
    """Sampling log-probabilities of the completion tokens."""
    components: dict[str, float]
    """The feedback components (:class:`labkit.env.records.Components`, as a dict)."""
    reward: float
    """The reshaped scalar reward the estimator read."""
    advantages: list[float]
    """Per-token advantages the update used (one per completion token)."""
    status: str
    """Sandbox status (``passed``, ``failed``, ``error``, ``timeout`` ...; ``custom`` when a
    user ``reward_fn`` scored it)."""
    # optional: absent from hand-made records and custom rewards
    buggy_r_test: float | None = None
    """Fraction of hidden tests the buggy code itself passes (``None`` with a custom reward)."""
    tests: list[list[Any]] = field(default_factory=list)
    """``[name, ok]`` per hidden test case the sandbox graded."""
    tests_total: int | None = None
    """Number of hidden test cases (``None`` with a custom reward)."""
    public_tests: list[str] = field(default_factory=list)
    """Names of the cases shown to the policy in the prompt."""
    flags: list[str] = field(default_factory=list)
    """Reward-hack flags of the sandbox's scan (empty for honest attempts)."""

    def to_dict(self) -> dict:
        """The record as a plain dict, equal to ``dataclasses.asdict(self)`` and sharing no
        list or dict with it. Built field by field: the fields hold numbers, strings and lists
        of them at most two deep, and ``asdict`` deep-copies every number one call at a time
        (about a millisecond per record of 60 tokens, a step's 128 of them every step)."""
        return {f.name: _copied(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "record") -> "RolloutRecord":
        """The record of a row; extra keys are ignored, a missing required field is a
        ``ValueError``. Rows of older run folders name the completion ids ``token_ids``."""
        d = _current(d)
        names = [f.name for f in fields(cls)]
        missing = [f.name for f in fields(cls) if f.name not in d
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"{where}: not a rollout record, missing {missing} (written by an "
                             f"older labkit? train the run again)")
        return cls(**{n: d[n] for n in names if n in d})


def _current(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """``row`` with the field names of today's record (``token_ids`` -> ``completion_ids``)."""
    if "token_ids" in row and "completion_ids" not in row:
        row = {("completion_ids" if k == "token_ids" else k): v for k, v in row.items()}
    return row


def _copied(value: Any) -> Any:
    """A list (of values or of lists) or a dict, copied two levels down; anything else as is."""
    if isinstance(value, list):
        return [list(v) if isinstance(v, list) else v for v in value]
    if isinstance(value, dict):
        return dict(value)
    return value


def read_rollouts(run: RunFolder | str | Path) -> list[dict]:
    """The rollout records of a run folder, each checked against :class:`RolloutRecord`;
    returned as dicts, the form the widgets index (``widgets.records.at_step`` picks a step)."""
    folder = run if isinstance(run, RunFolder) else RunFolder(run)
    rows = [dict(_current(row)) for row in folder.read("rollouts.jsonl")]
    for i, row in enumerate(rows, 1):
        RolloutRecord.from_dict(row, where=f"{folder.file('rollouts.jsonl')}:{i}")
    return rows
