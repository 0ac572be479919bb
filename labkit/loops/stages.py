"""Rollout stages: measurements an estimator's declared needs switch on.

Most estimators read rewards and groups only. Some read more, declared in their registry
metadata ``needs`` (:data:`labkit.credit.advantages.INPUTS`): ``forks`` (counterfactual forks,
:class:`labkit.loops.forks.ForkStage`) or ``hunks`` (each diff hunk's measured value,
:class:`labkit.loops.hunks.HunkStage`). A stage measures its field of
:class:`~labkit.credit.advantages.AdvantageInput` on the step's rollouts; the trainer runs
the stages its estimator needs and never asks which estimator it runs. A stage may also keep
the sampling caches (forks reuse the prefixes), change the KL target, follow the policy after
each update and keep state in checkpoints; :class:`Stage` does none of these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.env.records import RepairTask, Rollout
from labkit.policy.rollout import SamplingConfig

Score = Callable[[Sequence[RepairTask], Sequence[str]], Sequence[float]]
"""``score(tasks, programs) -> rewards``: programs executed and rewarded like a step's own
(the step's recipe and regime, without the one-off progress bonus)."""


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
    """A stage that measures nothing: every hook a no-op (the trainer's default)."""

    field: str = ""
    """The :class:`~labkit.credit.advantages.AdvantageInput` field the stage fills."""
    name: str = ""
    """The stage's name in the metrics (``time/<name>``)."""
    keeps_caches: bool = False
    """Sample with the prefix caches kept (``labkit.policy.rollout.sample_with_cache``)."""

    def measure(self, ctx: StepContext) -> Any:
        return None

    def metrics(self, value: Any) -> dict[str, float]:
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
