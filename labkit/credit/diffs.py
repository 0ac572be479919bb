"""Root diffs: the lines of a candidate program that are its edit, and where they sit in the text.

DiDPO (arXiv 2608.07147; ``docs/didpo.md``) makes the code diff the
unit of credit. Here every completion is a whole fixed program (the paper's *overwrite*
action), so a rollout's **root diff** is the candidate's changed and added lines:

* **normalisation**: comments and layout (indentation, spacing, blank lines) are dropped
  and a line's remaining Python tokens are joined by one space, so ``y=x+1  # fix`` and
  ``y = x + 1`` are the same line;
* ``difflib.SequenceMatcher`` line opcodes between the normalised buggy and candidate
  lines mark the candidate side of every ``replace`` and ``insert`` block as changed
  (deleted buggy lines have no tokens in the completion, so they carry no local credit);
* the **diff gate**: code that is re-emitted unchanged gets no local credit. A changed line
  whose normalised text equals a line of the buggy program (a moved or duplicated line)
  is dropped, and a candidate equal to the buggy program up to
  :func:`labkit.env.code.normalise_code` (the ``noop`` feedback signal) has an empty root;
* **hunks**: root lines with no unchanged line between them form one hunk.

Every line keeps the character span of its code in the *completion* (``code_start`` plus
its offset inside the extracted code), so :mod:`labkit.credit.anchors` maps it onto tokens
exactly through ``Rollout.offsets``.
"""

from __future__ import annotations

import functools
import io
import tokenize
from dataclasses import dataclass
from labkit.env.edits import line_runs
from labkit.env.code import normalise_code

_LAYOUT = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                     tokenize.DEDENT, tokenize.ENDMARKER})


# ----------------------------------------------------------------------------- lines


@functools.lru_cache(maxsize=1 << 16)
def code_tokens(line: str) -> tuple[tuple[str, int, int], ...]:
    """``(text, start, end)`` of the code tokens of one physical line (columns in ``line``),
    memoised: re-emitted lines repeat across a group (:func:`clear_caches` empties the memo).

    The line is tokenised on its own, comments and layout dropped. A tail the tokenizer
    cannot take (the start of a multi-line string, say) is kept as one raw token, so no
    code is ever lost to normalisation.
    """
    toks: list[tuple[str, int, int]] = []
    seen = 0  # end column of the last token read, comments included
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.start[0] > 1:
                break
            end = tok.end[1] if tok.end[0] == 1 else len(line)
            seen = max(seen, end)
            if tok.type not in _LAYOUT and tok.string.strip():
                toks.append((tok.string, tok.start[1], end))
    except (tokenize.TokenError, SyntaxError):
        tail = line[seen:]
        if tail.strip():
            start = seen + len(tail) - len(tail.lstrip())
            toks.append((tail.strip(), start, len(line.rstrip())))
    return tuple(toks)


@functools.lru_cache(maxsize=4096)
def _program(code: str) -> str:
    """``normalise_code`` memoised: the buggy program and copied candidates repeat in a group."""
    return normalise_code(code)


def clear_caches() -> None:
    """Empty the memos of this module (for cold timings)."""
    code_tokens.cache_clear()
    _program.cache_clear()


def normalise_line(line: str) -> str:
    """``line`` without comments and layout: its code tokens joined by one space."""
    return " ".join(text for text, _, _ in code_tokens(line))


@dataclass(frozen=True)
class Line:
    """One non-blank line of a program after normalisation."""

    index: int
    """Line number (0-based) in the program text."""
    text: str
    """Normalised text (:func:`normalise_line`)."""
    span: tuple[int, int]
    """Characters ``[start, end)`` from the line's first to its last code token, shifted by
    the ``base`` given to :func:`normalised_lines` (indentation and comments excluded)."""


def normalised_lines(code: str, base: int = 0) -> list[Line]:
    """The lines of ``code`` that hold code, normalised, with their character spans.

    ``span = (base + o_i + c_first, base + o_i + c_last_end)`` where ``o_i`` is the offset of
    line i in ``code``; with ``base = code_start`` the spans index the completion that
    holds ``code``. Blank and comment-only lines are left out.
    """
    out: list[Line] = []
    start = base
    for i, raw in enumerate(code.split("\n")):
        toks = code_tokens(raw)
        if toks:
            text = " ".join(t for t, _, _ in toks)
            out.append(Line(i, text, (start + toks[0][1], start + toks[-1][2])))
        start += len(raw) + 1
    return out


# ----------------------------------------------------------------------------- root diff


@dataclass(frozen=True)
class DiffLine:
    """One line of a root diff: a changed or added line of the candidate that passed the gate."""

    index: int
    """Line number (0-based) in the candidate code."""
    text: str
    """Normalised text."""
    span: tuple[int, int]
    """Characters ``[start, end)`` of the line's code in the completion."""
    hunk: int
    """Hunk number within the root (0, 1, ...): consecutive changed lines share one."""


@dataclass(frozen=True)
class RootDiff:
    """A rollout's edit of the buggy program: its gated changed lines, in program order."""

    lines: tuple[DiffLine, ...] = ()

    @property
    def texts(self) -> tuple[str, ...]:
        """The normalised lines: the sequence that sub-diff alignment and hashing work on."""
        return tuple(line.text for line in self.lines)

    def hunks(self) -> list[tuple[int, int]]:
        """``[start, stop)`` positions in :attr:`lines` of each hunk."""
        bounds: list[tuple[int, int]] = []
        for p, line in enumerate(self.lines):
            if bounds and self.lines[bounds[-1][0]].hunk == line.hunk:
                bounds[-1] = (bounds[-1][0], p + 1)
            else:
                bounds.append((p, p + 1))
        return bounds


def root_diff(code: str, buggy_code: str, code_start: int = 0) -> RootDiff:
    """The root diff of candidate ``code`` against ``buggy_code``.

    ``root = [c_j for c_j in changed(SequenceMatcher(buggy, candidate)) if c_j not in buggy]``
    over normalised lines (the diff gate drops re-emitted lines); empty when the candidate
    is the buggy program up to ``normalise_code`` or cannot be located in its completion
    (``code_start < 0``). Spans are completion characters: ``code`` starts at ``code_start``.
    """
    if code_start < 0 or not code.strip():
        return RootDiff()
    cand = normalised_lines(code, code_start)
    buggy = [line.text for line in normalised_lines(buggy_code)]
    re_emitted = set(buggy)
    # the candidate side of every changed run (its replace and insert lines)
    changed = [j for _, _, j1, j2 in line_runs(buggy, [line.text for line in cand])
               for j in range(j1, j2) if cand[j].text not in re_emitted]
    if not changed or _program(code) == _program(buggy_code):
        return RootDiff()
    lines, hunk = [], -1
    for k, j in enumerate(changed):
        if k == 0 or j != changed[k - 1] + 1:
            hunk += 1
        lines.append(DiffLine(cand[j].index, cand[j].text, cand[j].span, hunk))
    return RootDiff(tuple(lines))
