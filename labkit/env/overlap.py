"""How far a held-out split is from training: the checks behind "held out means held out".

A held-out problem can leak through training in three ways, each measured here over
synthetic problems (their references are code the generator wrote, so they run in-process):

``solved_by_train_frac``  share of held-out problems whose hidden tests *all* pass with some
                          training reference (same parameter list): the held-out answer is in
                          the training data, whatever the text looks like
``max_similarity``,       normalised text similarity of each held-out reference to its nearest
``median_similarity``     training reference (rapidfuzz ``ratio`` / 100 over
                          :func:`labkit.env.feedback.normalise_code`, comments and layout gone)
``shared_names_frac``     share of held-out problems whose function name a training problem has
``shared_templates``      held-out templates that a training problem has (0 on a template split)

:func:`overlap_report` takes problems; ``python -m labkit tasks overlap`` builds them for a
split and prints the report (its last line one JSON object).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rapidfuzz import fuzz, process

from labkit.env.code import normalise_code
from labkit.env.synthetic import SyntheticProblem


def compile_reference(problem: SyntheticProblem) -> Callable[..., Any]:
    return _compile(problem.reference_code, problem.entry_point, problem.problem_id)


def _compile(code: str, entry_point: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(code, f"<train {name}>", "exec"), namespace)  # noqa: S102 (generated code)
    return namespace[entry_point]


def pool_entries(problems: Sequence[SyntheticProblem]) -> list[tuple[str, str, str, str]]:
    """What a :class:`ReferencePool` keeps of each problem, as plain data (to cache):
    ``(parameter types, reference code, entry point, problem id)``."""
    return [(param_types(p), p.reference_code, p.entry_point, p.problem_id) for p in problems]


def passes_all(fn: Callable[..., Any], problem: SyntheticProblem) -> bool:
    """Every hidden test of ``problem`` gives its expected value, of exactly its type."""
    for case in problem.tests.cases:
        args = [list(a) if type(a) is list else a for a in case.args]
        try:
            out = fn(*args)
        except Exception:  # noqa: BLE001 - a reference that raises on foreign inputs fails
            return False
        if type(out) is not type(case.expected) or out != case.expected:
            return False
    return True


def param_types(problem: SyntheticProblem) -> str:
    """The parameter annotations of the signature (names differ between spellings)."""
    return _annotations(problem.signature)


def _annotations(signature: str) -> str:
    inside = signature[signature.index("(") + 1: signature.rindex(")")]
    return ",".join(p.split(":", 1)[1].strip() if ":" in p else "" for p in inside.split(","))


def _def_line(code: str, entry_point: str) -> str:
    """The ``def`` line of ``entry_point`` in ``code`` (a synthetic task's signature)."""
    for line in code.splitlines():
        if line.lstrip().startswith(f"def {entry_point}("):
            return line.strip()
    raise ValueError(f"no `def {entry_point}(` line in the reference code")


class ReferencePool:
    """Training references grouped by parameter types, compiled once: ``solves(problem)``
    says whether one of them passes every hidden test of ``problem``."""

    def __init__(self, problems: Sequence[SyntheticProblem] = (),
                 entries: Sequence[Sequence[str]] | None = None):
        """From ``problems``, or from their :func:`pool_entries` (``entries``)."""
        self.by_params: dict[str, list[Callable[..., Any]]] = defaultdict(list)
        for types, code, entry_point, name in (pool_entries(problems) if entries is None else entries):
            self.by_params[types].append(_compile(code, entry_point, name))

    def solves(self, problem: SyntheticProblem) -> bool:
        return any(passes_all(fn, problem) for fn in self.by_params[param_types(problem)])

    def solves_task(self, task) -> bool:
        """:meth:`solves` for a synthetic :class:`~labkit.env.records.RepairTask`: its hidden
        tests are its problem's, its signature the reference's ``def`` line."""
        types = _annotations(_def_line(task.reference_code, task.entry_point))
        return any(passes_all(fn, task) for fn in self.by_params[types])


def overlap_report(train: Sequence[SyntheticProblem], held: Sequence[SyntheticProblem],
                   split: str = "") -> dict:
    """The leak measures of the module docstring for ``held`` against ``train``, plus
    ``problems`` (held-out), ``train_problems`` and ``solved_by_train`` (the problem ids)."""
    if not train or not held:
        raise ValueError(f"overlap needs training and held-out problems; got {len(train)} and "
                         f"{len(held)}")
    pool = ReferencePool(train)
    solved = [h.problem_id for h in held if pool.solves(h)]

    choices = [normalise_code(p.reference_code) for p in train]
    sims = [process.extractOne(normalise_code(h.reference_code), choices, scorer=fuzz.ratio)[1] / 100
            for h in held]
    names = {p.entry_point for p in train}
    train_templates = {p.template for p in train}
    held_templates = {h.template for h in held}
    return {
        "split": split,
        "problems": len(held),
        "train_problems": len(train),
        "solved_by_train_frac": round(len(solved) / len(held), 4),
        "max_similarity": round(max(sims), 4),
        "median_similarity": round(statistics.median(sims), 4),
        "shared_names_frac": round(sum(h.entry_point in names for h in held) / len(held), 4),
        "held_templates": len(held_templates),
        "shared_templates": len(held_templates & train_templates),
        "solved_by_train": solved,
    }
