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


def split_hunks(before: str, after: str) -> list[Hunk]:
    """The hunks of ``after`` against ``before``: ``difflib.SequenceMatcher`` on lines (line
    ends kept, no junk heuristic), adjacent non-equal opcodes merged into one hunk."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    hunks: list[Hunk] = []
    run: list[int] | None = None  # [a0, a1, b0, b1] of the hunk being built
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            run = [run[0], a1, run[2], b1] if run else [a0, a1, b0, b1]
            continue
        if run:
            hunks.append(_hunk(a, b, run))
            run = None
    if run:
        hunks.append(_hunk(a, b, run))
    return hunks


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
