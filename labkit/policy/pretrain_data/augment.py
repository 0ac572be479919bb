"""Training-data augmentation for repair tasks: the same bug under other names.

A small model trained on generated functions can learn to write a function from its
description alone, ignoring the buggy code it is shown: with a handful of spellings per
variable, the description says everything. It then fails on shapes it has not seen, because
it never learnt the one skill a repair needs everywhere, copying the code it is given and
changing only the bug. :func:`rename_identifiers` renames the function, its parameters and
its local variables to fresh random names, consistently in the prompt (signature, docstring,
examples), the buggy code and the reference: the fix is unchanged, but the names can only
come from the input. :func:`relabel_strings` does the same for the string labels a function
returns (``"above"``, ``"below"``): a model that has learnt one template's labels by heart
writes them into another's, unless the labels, too, could only ever be copied.
:func:`flip_comparisons` varies the code's shape instead of its words: ``k > 14`` becomes
``14 < k`` in some copies, in the buggy code and the fix alike, so which way a comparison
faces can only be read off the code shown, never recalled from the template.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import random
import re
from typing import Iterable, Sequence

import libcst as cst

from labkit.env.records import RepairTask
from labkit.sandbox.records import TestSuite

_CONSONANTS = "bcdfghjklmnprstvwxz"
_VOWELS = "aeiou"
_RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}


def identifiers(code: str) -> list[str]:
    """The names ``code`` defines, in order of first appearance: function names,
    parameters, and every name assigned or bound by a loop (dunder names and builtins left
    out). Empty when the code does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    found: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name)
            for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                found.setdefault(a.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.setdefault(node.id)
    return [n for n in found if not (n.startswith("__") or n in _RESERVED)]


def _words_of(task: RepairTask) -> set[str]:
    """Every identifier-like word of the task's prompt, buggy code and reference: what a
    fresh name or label must not collide with."""
    texts = (task.prompt, task.buggy_code, task.reference_code)
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(texts)))


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3)))


def fresh_name(rng: random.Random, taken: set[str], *, parts: int = 1,
               words: Sequence[str] = ()) -> str:
    """A new identifier not in ``taken``. One part: a pronounceable pseudo-word (``kavo``,
    ``tiz``, ``rul2``). Several parts: snake case (``kavo_total_miz``), each part a word drawn
    from ``words`` half the time (when given), else a pseudo-word: the long, many-token names
    real code has, which a model can only get right by copying them."""
    while True:
        if parts <= 1:
            name = _pseudo_word(rng)
            if rng.random() < 0.5:
                name += rng.choice(_CONSONANTS)
            if rng.random() < 0.2:
                name += str(rng.randint(0, 9))
        else:
            name = "_".join(rng.choice(words) if words and rng.random() < 0.5 else _pseudo_word(rng)
                            for _ in range(parts))
        if name not in taken and name not in _RESERVED:
            taken.add(name)
            return name


RENAME_STYLES = ("short", "compound")
"""``short``: every name one pseudo-word. ``compound``: the function two to four snake-case
parts, every other name one part (60%) or two, so held-out names of several words (``reverse_
without_vowels``) are a copying skill the model has practised."""


def name_words(texts: Iterable[str]) -> list[str]:
    """The lower-case words (3-10 letters) of ``texts``, sorted: a pool of name parts for
    ``rename_identifiers(style="compound")`` taken from the training data itself."""
    return sorted({w for t in texts for w in re.findall(r"\b[a-z]{3,10}\b", t)} - _RESERVED)


def rename_identifiers(task: RepairTask, rng: random.Random, *, style: str = "short",
                       words: Sequence[str] = ()) -> RepairTask:
    """``task`` with its defined names replaced by fresh ones, consistently in the prompt,
    the buggy code and the reference (whole words only; other words of the text are never
    used as new names). The tests are positional, so they still hold; the task id gets a
    ``~renamed`` suffix. ``style`` is one of :data:`RENAME_STYLES`; ``words`` the pool of
    real words compound names draw half their parts from (:func:`name_words`)."""
    if style not in RENAME_STYLES:
        raise ValueError(f"rename style {style!r}: expected one of {', '.join(RENAME_STYLES)}")
    names = list(dict.fromkeys(identifiers(task.reference_code) + identifiers(task.buggy_code)))
    if not names:
        return task
    taken = _words_of(task)
    if style == "short":
        mapping = {n: fresh_name(rng, taken) for n in names}
    else:
        mapping = {n: fresh_name(rng, taken, words=words,
                                 parts=rng.randint(2, 4) if n == task.entry_point else 1 + (rng.random() < 0.4))
                   for n in names}
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")

    def sub(text: str) -> str:
        return pattern.sub(lambda m: mapping[m.group(1)], text)

    return dataclasses.replace(
        task, task_id=f"{task.task_id}~renamed", prompt=sub(task.prompt),
        buggy_code=sub(task.buggy_code), reference_code=sub(task.reference_code),
        entry_point=mapping.get(task.entry_point, task.entry_point))


_LABEL = re.compile(r"[a-z][a-z_]{1,15}")


def string_labels(code: str) -> list[str]:
    """The word-like string constants ``code`` returns (``return "near"``), in order of first
    appearance: the labels of a classifier. Empty when the code does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    found: dict[str, None] = {}
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Return)),
                       key=lambda n: (n.lineno, n.col_offset)):
        if (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                and _LABEL.fullmatch(node.value.value)):
            found.setdefault(node.value.value)
    return list(found)


def relabel_strings(task: RepairTask, rng: random.Random, *, words: Sequence[str] = ()) -> RepairTask:
    """``task`` with the string labels its reference returns (:func:`string_labels`) replaced
    by fresh words, wherever they appear quoted (``"near"`` or ``'near'``) in the prompt, the
    buggy code and the reference, and in the expected values of its tests, so the relabelled
    reference passes the relabelled tests (checked by execution in the tests). A label counts
    only if the prompt quotes it: the description must still say what to return. New labels
    are a word of ``words`` half the time (:func:`name_words`), else a pseudo-word. Tasks
    without such labels come back unchanged; others get a ``~relabelled`` suffix."""
    labels = [w for w in string_labels(task.reference_code)
              if f'"{w}"' in task.prompt or f"'{w}'" in task.prompt]
    if not labels:
        return task
    taken = _words_of(task) | set(labels)
    mapping = {}
    for w in labels:
        new = rng.choice(words) if words and rng.random() < 0.5 else _pseudo_word(rng)
        while new in taken or new in _RESERVED:
            new = _pseudo_word(rng)
        taken.add(new)
        mapping[w] = new
    pattern = re.compile(r"""(["'])(""" + "|".join(re.escape(w) for w in sorted(labels, key=len, reverse=True))
                         + r")\1")

    def sub(text: str) -> str:
        return pattern.sub(lambda m: m.group(1) + mapping[m.group(2)] + m.group(1), text)

    def suite(s: TestSuite) -> TestSuite:
        cases = tuple(dataclasses.replace(c, expected=mapping[c.expected])
                      if isinstance(c.expected, str) and c.expected in mapping else c for c in s.cases)
        return dataclasses.replace(s, cases=cases, asserts=tuple(
            dataclasses.replace(a, source=sub(a.source)) for a in s.asserts))

    return dataclasses.replace(
        task, task_id=f"{task.task_id}~relabelled", prompt=sub(task.prompt),
        buggy_code=sub(task.buggy_code), reference_code=sub(task.reference_code),
        tests=suite(task.tests), public_tests=suite(task.public_tests))


_FLIPPED = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
            cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual,
            cst.Equal: cst.Equal, cst.NotEqual: cst.NotEqual}


class _Flipper(cst.CSTTransformer):
    """Mirrors the i-th flippable comparison of a module when ``flips[i]`` is true."""

    def __init__(self, flips: Sequence[bool] | None):
        self.flips, self.seen = flips, 0

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        if len(updated.comparisons) != 1 or type(updated.comparisons[0].operator) not in _FLIPPED:
            return updated
        i, self.seen = self.seen, self.seen + 1
        if self.flips is None or not self.flips[i]:
            return updated
        target = updated.comparisons[0]
        op = target.operator
        mirrored = _FLIPPED[type(op)](whitespace_before=op.whitespace_before,
                                      whitespace_after=op.whitespace_after)
        return updated.with_changes(left=target.comparator, comparisons=[
            target.with_changes(operator=mirrored, comparator=updated.left)])


def flippable_comparisons(code: str) -> int:
    """How many comparisons of ``code`` :func:`flip_comparisons` could mirror: those with one
    operator among ``< <= > >= == !=`` (``a < b < c``, ``in`` and ``is`` are left alone)."""
    counter = _Flipper(None)
    cst.parse_module(code).visit(counter)
    return counter.seen


def flip_comparisons(task: RepairTask, rng: random.Random, *, p: float = 0.5) -> RepairTask:
    """``task`` with each flippable comparison mirrored with probability ``p``, the same
    ones in the buggy code and the reference: ``a OP b`` -> ``b OP' a`` with ``<`` <-> ``>``,
    ``<=`` <-> ``>=``, ``==`` and ``!=`` kept, an identity for the values these functions
    compare, so the tests still hold. Comparisons are paired by their order in the code; when
    the bug changed how many there are, one coin decides for all of them. Formatting is kept
    (libcst). Unparsable code or no flip drawn: the task comes back unchanged; else the id gets
    a ``~flipped`` suffix. The prompt (signature, docstring, examples) holds no code and stays;
    the bug spans keep their old offsets (as after renaming): the copy is for SFT text only."""
    try:
        n_ref, n_bug = flippable_comparisons(task.reference_code), flippable_comparisons(task.buggy_code)
    except cst.ParserSyntaxError:
        return task
    if n_ref == n_bug:
        flips = [rng.random() < p for _ in range(n_ref)]
        ref_flips = bug_flips = flips
    else:
        coin = rng.random() < p
        ref_flips, bug_flips = [coin] * n_ref, [coin] * n_bug
    if not any(ref_flips) and not any(bug_flips):
        return task

    def flipped(code: str, flips: Sequence[bool]) -> str:
        return cst.parse_module(code).visit(_Flipper(flips)).code

    return dataclasses.replace(task, task_id=f"{task.task_id}~flipped",
                               buggy_code=flipped(task.buggy_code, bug_flips),
                               reference_code=flipped(task.reference_code, ref_flips))
