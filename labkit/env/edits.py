"""Text edits between two versions of a program: hunks, and putting hunks back.

A *hunk* is one maximal run of changed lines between a buggy program and a candidate (or a
reference and its buggy version). Reverting hunks one at a time is how the lab measures what
each region of an edit does: the edit-level counterfactuals credit estimators are compared
against (:mod:`labkit.credit`), and the multi-hunk repair tasks, whose bugs are validated
hunk by hunk (:mod:`labkit.env.tasks`). Pure text functions; no sandbox, no torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Hunk:
    """One maximal run of changed lines between a buggy program and a candidate.

    Line ranges are 0-based and half-open: the candidate's ``after`` lines replaced the
    buggy ``before`` lines (an insertion has an empty ``before``, a deletion an empty ``after``).
    """

    before: tuple[int, int]
    after: tuple[int, int]
    before_lines: tuple[str, ...]
    after_lines: tuple[str, ...]

    @property
    def kind(self) -> str:
        if not self.before_lines:
            return "insert"
        return "delete" if not self.after_lines else "replace"


def line_runs(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """``(a0, a1, b0, b1)`` of every maximal run of changed lines between line sequences ``a``
    and ``b``: ``difflib.SequenceMatcher`` opcodes (no junk heuristic), adjacent non-equal
    ones merged. The one line diff of the lab: text hunks (:func:`split_hunks`, raw lines) and
    DiDPO's root diffs (:func:`labkit.credit.diffs.root_diff`, normalised lines) both use it."""
    runs: list[tuple[int, int, int, int]] = []
    run: list[int] | None = None  # [a0, a1, b0, b1] of the run being built
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            run = [run[0], a1, run[2], b1] if run else [a0, a1, b0, b1]
            continue
        if run:
            runs.append(tuple(run))
            run = None
    if run:
        runs.append(tuple(run))
    return runs


def split_hunks(before: str, after: str) -> list[Hunk]:
    """The hunks of ``after`` against ``before``: :func:`line_runs` over their lines (line
    ends kept)."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    return [_hunk(a, b, list(run)) for run in line_runs(a, b)]


def _hunk(a: list[str], b: list[str], run: list[int]) -> Hunk:
    a0, a1, b0, b1 = run
    return Hunk(before=(a0, a1), after=(b0, b1), before_lines=tuple(a[a0:a1]),
                after_lines=tuple(b[b0:b1]))


def revert_hunks(after: str, hunks: Sequence[Hunk], revert: Collection[int]) -> str:
    """``after`` with ``hunks[k]`` put back to its buggy lines for every ``k`` in ``revert``.

    ``revert_hunks(after, h, ()) == after`` and ``revert_hunks(after, h, range(len(h)))``
    is the buggy program, for ``h = split_hunks(buggy, after)``.
    """
    lines = after.splitlines(keepends=True)
    for k in sorted(revert, key=lambda k: hunks[k].after[0], reverse=True):
        b0, b1 = hunks[k].after
        lines[b0:b1] = hunks[k].before_lines
    return "".join(lines)


def hunk_char_span(text: str, hunk: Hunk) -> tuple[int, int]:
    """Characters ``[start, end)`` of the hunk's lines in the candidate ``text``; a deletion
    gives the empty span where the deleted lines were."""
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:hunk.after[0]])
    return start, start + sum(len(line) for line in lines[hunk.after[0]:hunk.after[1]])


# ----------------------------------------------------------------------------- on rollouts


@dataclass(frozen=True)
class RolloutHunk:
    """One hunk of a rollout's code against the buggy code, located in the completion."""

    hunk: Hunk
    char_span: tuple[int, int]
    """The hunk's characters in ``rollout.code``."""
    tokens: tuple[int, ...]
    """Completion tokens overlapping the hunk; a deletion marks the token where the deleted
    lines were; empty when the code is not a substring of the completion."""


def _touching(span: tuple[int, int], length: int) -> tuple[int, int]:
    """A non-empty character span: an empty one widened to the character at its place."""
    a, b = span
    return (a, b) if b > a else (min(a, max(length - 1, 0)), min(a, max(length - 1, 0)) + 1)


def rollout_hunks(rollout, buggy_code: str) -> list[RolloutHunk]:
    """The hunks of ``rollout.code`` against ``buggy_code`` (:func:`split_hunks`) with their
    character spans and completion tokens (``rollout``: a
    :class:`labkit.env.records.Rollout`). The one mapping from hunks to tokens that fork
    positions, fork credit and the edit-level ground truth all use."""
    code = rollout.code
    out = []
    for hunk in split_hunks(buggy_code, code):
        span = hunk_char_span(code, hunk)
        tokens: tuple[int, ...] = ()
        if rollout.code_start >= 0:
            a, b = _touching(span, len(code.rstrip("\n")))
            tokens = tuple(rollout.tokens_in_span(rollout.code_start + a, rollout.code_start + b))
        out.append(RolloutHunk(hunk, span, tokens))
    return out
