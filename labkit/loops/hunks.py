"""Each diff hunk's measured value: the rollout stage of the ``oracle_hunk`` estimators, and
the ground truth of the credit experiment.

For a rollout whose code differs from its buggy code in hunks ``H`` (``K = |H|``,
:func:`labkit.env.edits.rollout_hunks`), every subset ``S`` of the hunks is applied to the
buggy code (:func:`subset_program`) and rewarded like the step's own rollouts; the exact
Shapley value of each hunk follows (:func:`labkit.credit.oracle.shapley_values`). ``R(H)``
is the rollout's own reward and ``R({})`` its buggy code's, so a rollout costs ``2^K - 2``
new programs (none for one hunk), each distinct program run once per step. Rollouts with
more than ``max_hunks`` hunks get no hunk credit (``hunks/skipped_rows``). The cost is
logged as ``hunks/programs`` and ``time/hunk``.

:func:`hunk_effects` is the simpler edit-level counterfactual notebook 03 teaches: each hunk
reverted alone, ``effect_k = R(c) - R(c without h_k)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from labkit.credit.advantages import HunkValues
from labkit.credit.oracle import shapley_values
from labkit.env.edits import Hunk, revert_hunks, rollout_hunks
from labkit.sandbox.records import Candidate, SandboxResult
from labkit.env.records import RepairTask, Rollout
from labkit.sandbox.pool import run_many
from labkit.loops.stages import Score, Stage, StepContext, register_stage


@dataclass
class HunkConfig:
    """How the hunk values of the ``oracle_hunk`` estimators are measured (``TrainConfig.hunks``)."""

    max_hunks: int = 4
    """Rollouts with more hunks than this get no hunk credit: ``2^K - 2`` programs each (14 at
    4 hunks) would dominate the step."""

    def validate(self) -> None:
        if self.max_hunks < 1:
            raise ValueError(f"hunks.max_hunks must be >= 1, got {self.max_hunks}")


def subset_program(code: str, hunks: Sequence[Hunk], keep: Sequence[int]) -> str:
    """The buggy code with only the hunks ``keep`` of ``code`` applied: ``code`` with every
    other hunk put back (:func:`labkit.env.edits.revert_hunks`)."""
    return revert_hunks(code, hunks, [k for k in range(len(hunks)) if k not in set(keep)])


def hunk_values(rollouts: Sequence, tasks: Sequence, score: Score, own: Sequence[float],
                buggy: Sequence[float], max_hunks: int = 4) -> tuple[HunkValues, dict[str, float]]:
    """Shapley value of every hunk of every rollout (row ``b``: ``rollouts[b]`` for
    ``tasks[b]``, own reward ``own[b]``, buggy code's reward ``buggy[b]``), the subset
    programs scored with one ``score`` call; and the cost's metrics."""
    plans, programs, keys = [], [], {}
    for r, t in zip(rollouts, tasks):
        located = rollout_hunks(r, t.buggy_code)
        k = len(located)
        if k == 0 or k > max_hunks:
            plans.append((located, None))
            continue
        hunks = [h.hunk for h in located]
        need = {}
        for n in range(1, k):
            for keep in itertools.combinations(range(k), n):
                code = subset_program(r.code, hunks, keep)
                key = (t.task_id, code)
                if key not in keys:
                    keys[key] = len(programs)
                    programs.append((t, code))
                need[frozenset(keep)] = keys[key]
        plans.append((located, need))
    scores = list(score([t for t, _ in programs], [c for _, c in programs])) if programs else []
    rows, skipped = [], 0
    for b, (located, need) in enumerate(plans):
        if need is None:
            skipped += len(located) > max_hunks
            rows.append([])
            continue
        k = len(located)
        value = {frozenset(): buggy[b], frozenset(range(k)): own[b],
                 **{s: scores[i] for s, i in need.items()}}
        phi = shapley_values(value, k)
        rows.append([(h.tokens, v) for h, v in zip(located, phi)])
    return HunkValues(rows), {"hunks/programs": float(len(programs)),
                              "hunks/skipped_rows": float(skipped),
                              "hunks/per_row": sum(len(r) for r in rows) / max(len(rows), 1)}


@register_stage
class HunkStage(Stage):
    """The rollout stage of an estimator that needs ``hunks``: each rollout's hunk values,
    measured by running its hunk subsets (``TrainConfig.hunks``)."""

    need, name = "hunks", "hunk"

    def __init__(self, cfg, policy=None):
        self.hunks: HunkConfig = cfg.hunks
        self.last_metrics: dict[str, float] = {}

    def measure(self, ctx: StepContext) -> HunkValues:
        values, self.last_metrics = hunk_values(ctx.rollouts, ctx.tasks, ctx.score, ctx.factual(),
                                                ctx.baseline(), self.hunks.max_hunks)
        return values

    def metrics(self, value) -> dict[str, float]:
        return dict(self.last_metrics)


# ============================================================================= revert one hunk


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


def hunk_effects(rollouts: Sequence[Rollout], tasks: Mapping[str, RepairTask], *,
                 run: Callable[[Sequence[Candidate]], list[SandboxResult]] | None = None,
                 reward: Callable[[SandboxResult], float] = SandboxResult.fraction.fget) -> list[HunkEffect]:
    """Edit-level counterfactuals of every hunk of every rollout.

    ``effect_k = R(c) - R(c without h_k)``, ``R = reward(result)`` on the task's hidden tests.
    Every distinct program runs once, all in one ``run`` batch (default
    :func:`labkit.sandbox.pool.run_many`).
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
