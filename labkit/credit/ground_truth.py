"""Edit-level counterfactuals: the ground truth credit estimators are compared against.

For a candidate ``c`` with hunks ``h_1..h_K`` against its task's buggy code
(:func:`labkit.env.edits.split_hunks`), the effect of hunk ``k`` is
``effect_k = R(c) - R(c without h_k)``: put that hunk back to the buggy lines
(:func:`labkit.env.edits.revert_hunks`) and run the tests again. A credit estimator is right
about a hunk when the credit it gives the hunk's tokens agrees with the effect
(``python -m labkit experiment credit``). Pure apart from running programs, which goes
through a ``run`` function (the sandbox by default).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from labkit.env.edits import Hunk, revert_hunks, rollout_hunks
from labkit.env.records import Candidate, RepairTask, Rollout, SandboxResult
from labkit.env.sandbox import run_many


@dataclass(frozen=True)
class HunkEffect:
    """The effect of one hunk of a candidate: ``R(candidate) - R(candidate without hunk k)``."""

    task_id: str
    sample: int
    k: int
    hunk: Hunk
    char_span: tuple[int, int]
    """The hunk's characters in the candidate code (``rollout.code``)."""
    tokens: tuple[int, ...]
    """Completion tokens overlapping the hunk (empty when the code is not a substring)."""
    reward: float
    reward_without: float
    effect: float


def pass_fraction(result: SandboxResult) -> float:
    """The default reward: ``passed / total`` of the hidden tests."""
    return result.fraction


def hunk_effects(rollouts: Sequence[Rollout], tasks: Mapping[str, RepairTask], *,
                 run: Callable[[Sequence[Candidate]], list[SandboxResult]] | None = None,
                 reward: Callable[[SandboxResult], float] = pass_fraction) -> list[HunkEffect]:
    """Edit-level counterfactuals of every hunk of every rollout.

    ``effect_k = R(c) - R(c without h_k)``, ``R = reward(result)`` on the task's hidden tests.
    Every distinct program runs once, all in one ``run`` batch (default
    :func:`labkit.env.sandbox.run_many`).
    """
    run = run or run_many
    plans = []
    programs: dict[tuple[str, str], Candidate] = {}
    for r in rollouts:
        task = tasks[r.task_id]
        located = rollout_hunks(r, task.buggy_code)
        hunks = [h.hunk for h in located]
        variants = [r.code] + [revert_hunks(r.code, hunks, [k]) for k in range(len(hunks))]
        for code in variants:
            programs.setdefault((r.task_id, code), Candidate(
                code=code, tests=task.tests, entry_point=task.entry_point,
                id=f"{r.task_id}#{len(programs)}"))
        plans.append((r, located, variants))
    keys = list(programs)
    results = dict(zip(keys, run([programs[key] for key in keys])))
    out = []
    for r, located, variants in plans:
        full = reward(results[(r.task_id, variants[0])])
        for k, h in enumerate(located):
            without = reward(results[(r.task_id, variants[k + 1])])
            out.append(HunkEffect(task_id=r.task_id, sample=r.sample, k=k, hunk=h.hunk,
                                  char_span=h.char_span, tokens=h.tokens, reward=full,
                                  reward_without=without, effect=full - without))
    return out
