"""Rollout stages: measurements an estimator's declared needs switch on, registered by need.

Most estimators read rewards and groups only. Some read more, declared in their registry
metadata ``needs`` (:data:`labkit.credit.advantages.ADVANTAGE_ESTIMATORS`). The step itself
supplies the rollouts and their tasks (:data:`STEP_NEEDS`); every other need is measured by
the rollout stage registered for it in :data:`STAGES`: ``forks`` (counterfactual forks,
:class:`labkit.loops.forks.ForkStage`) and ``hunks`` (each diff hunk's measured value,
:class:`labkit.loops.hunks.HunkStage`). The trainer builds the stages its estimator needs
(:func:`stages_for`) and never asks which estimator it runs, so a new need is one stage class::

    @register_stage
    class LengthStage(Stage):
        need, name = "lengths", "length"

        def measure(self, ctx):
            return [r.n_tokens for r in ctx.rollouts]

and an estimator registered with ``needs=("lengths",)`` reads it as ``inp.need("lengths")``.

A stage measures its need on the step's rollouts; it may also keep the sampling caches (forks
reuse the prefixes), change the KL target, follow the policy after each update, report its
cost and keep state in checkpoints; :class:`Stage` does none of these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.credit.advantages import needs
from labkit.env.records import RepairTask, Rollout
from labkit.policy.rollout import SamplingConfig
from labkit.registry import Registry

Score = Callable[[Sequence[RepairTask], Sequence[str]], Sequence[float]]
"""``score(tasks, programs) -> rewards``: programs (code, one per task) executed and rewarded
like a step's own (the step's recipe and regime, without the one-off progress bonus). Forks,
hunk subsets and anything else a stage runs are scored through it."""

STAGES: Registry = Registry("rollout stage")
"""The rollout stage class of each need, by the need's name (:func:`register_stage`).
Registering another class under a need that has one is an error."""

STEP_NEEDS = ("rollouts", "tasks")
"""Needs the step supplies itself: no stage measures them."""


@dataclass
class StepContext:
    """What a stage may read of one training step."""

    step: int
    policy: Any
    rollouts: Sequence[Rollout]
    tasks: Sequence[RepairTask]
    """Row ``b``'s task."""
    factual: Callable[[], Sequence[float]]
    """The rows' own rewards (computed on first call), as :data:`Score` rewards them."""
    baseline: Callable[[], Sequence[float]]
    """The rows' buggy code's rewards, as :data:`Score` rewards them."""
    score: Score
    sampling: SamplingConfig
    seed: Callable[..., int]
    """``seed(*names)``: a seed derived from the run's seed, the step and ``names``."""
    kv: Any = None
    """Sampling caches, when a stage asked to keep them."""


class Stage:
    """A stage that measures nothing: every hook a no-op (the trainer's default). A stage is
    built from the run's training config and policy: ``Stage(cfg, policy)``."""

    need: str = ""
    """The need it measures (its name in :data:`STAGES`, and in the estimator's input)."""
    name: str = ""
    """The stage's name in the metrics (``time/<name>``)."""
    keeps_caches: bool = False
    """Sample with the prefix caches kept (``labkit.policy.rollout.sample_with_cache``)."""

    def __init__(self, cfg=None, policy=None):
        self.cfg = cfg

    def measure(self, ctx: StepContext) -> Any:
        return None

    def metrics(self, value: Any) -> dict[str, float]:
        return {}

    def cost_metrics(self, seconds: float, step_s: float) -> dict[str, float]:
        """Metrics of what the stage's ``seconds`` added to a step of ``step_s`` seconds."""
        return {}

    @contextlib.contextmanager
    def kl_target(self, policy):
        """The policy the KL term is measured against (the reference policy)."""
        with policy.reference() as ref:
            yield ref

    def after_update(self, policy) -> None:
        return None

    def save(self, policy, folder: Path) -> None:
        return None

    def load(self, policy, folder: Path) -> None:
        return None


def register_stage(cls: type[Stage]) -> type[Stage]:
    """Class decorator: ``cls`` is the rollout stage of the need ``cls.need``."""
    if not cls.need or cls.need in STEP_NEEDS:
        raise ValueError(f"stage {cls.__name__} needs a need of its own, not {cls.need!r}")
    return STAGES.add(cls.need, cls)


def stages_for(cfg, policy) -> list[Stage]:
    """The rollout stages the estimator of training config ``cfg`` needs, built from ``cfg``
    and ``policy``: one per declared need the step does not supply, in the order declared.
    A need no stage is registered for is an error naming it."""
    out: list[Stage] = []
    for need in needs(cfg.estimator):
        if need in STEP_NEEDS:
            continue
        if need not in STAGES:
            raise ValueError(f"estimator {cfg.estimator!r} needs {need!r}, which no rollout stage "
                             f"measures (registered: {STAGES.names()}); register one with "
                             "labkit.loops.stages.register_stage")
        out.append(STAGES.get(need)(cfg, policy))
    return out
