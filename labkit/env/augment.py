"""Training-data augmentation for repair tasks: the same bug under other names.

A small model trained on generated functions can learn to write a function from its
description alone, ignoring the buggy code it is shown: with a handful of spellings per
variable, the description says everything. It then fails on shapes it has not seen, because
it never learnt the one skill a repair needs everywhere, copying the code it is given and
changing only the bug. :func:`rename_identifiers` renames the function, its parameters and
its local variables to fresh random names, consistently in the prompt (signature, docstring,
examples), the buggy code and the reference: the fix is unchanged, but the names can only
come from the input.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import random
import re
from typing import Iterable, Sequence

from labkit.env.records import RepairTask

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
    texts = (task.prompt, task.buggy_code, task.reference_code)
    taken = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(texts)))
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
