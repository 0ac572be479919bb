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
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import random
import re
from typing import Iterable, Sequence

from labkit.env.records import RepairTask, TestSuite

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
