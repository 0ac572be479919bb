"""Counterfactual forks as the loops floor makes them: measured once, used by the trainer,
the credit experiment and notebook 03.

:func:`measure_forks` chooses fork positions, lets a baseline policy propose an alternative
token at each, lets the current policy continue (reusing the factual prefix caches when
given), scores every fork with the caller's ``score`` function and returns the
:class:`~labkit.credit.advantages.ForkSites` an estimator reads
(``dR = R(factual) - R(fork)``), with the forks themselves and their cost.

:class:`ForkStage` is the rollout stage (:mod:`labkit.loops.stages`) a trainer runs when
its estimator needs forks: the baseline (EMA or frozen), sampling that keeps the caches, the
measurement, the KL target, the EMA update and its checkpoint state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit.credit.advantages import ForkSites
from labkit.credit.fork_credit import fork_sites
from labkit.env.records import RepairTask, Rollout
from labkit.loops.stages import Score, Stage, StepContext, register_stage
from labkit.policy import forking as fk
from labkit.policy.forking import ForkCreditConfig


@dataclass
class ForkMeasurement:
    """Forks of one batch, executed and scored."""

    sites: ForkSites
    """What the estimator reads: row, token and ``dR`` of every fork."""
    batch: fk.ForkBatch
    """The forks themselves (tokens, lineage, cost statistics)."""
    rows: list[int]
    """The parent row of every fork."""
    counterfactual: list[float]
    """``R(fork)`` of every fork."""
    positions: list[list[int]]
    """The positions chosen in each rollout."""
    gen_s: float
    exec_s: float

    def metrics(self) -> dict[str, float]:
        """``fork/*`` metrics of the trainer's log."""
        n = len(self.batch.forks)
        return {"fork/n": float(n), "fork/tokens_generated": float(self.batch.stats.generated_tokens),
                "fork/differs_frac": sum(f.differs for f in self.batch.forks) / max(n, 1),
                "fork/recomputed_fraction": self.batch.stats.recomputed_fraction,
                "fork/gen_s": self.gen_s, "fork/exec_s": self.exec_s}


def measure_forks(policy, rollouts: Sequence[Rollout], tasks: Sequence[RepairTask],
                  factual: Sequence[float], score: Score, positions: fk.PositionConfig,
                  fork_config: fk.ForkConfig, *, kv=None, baseline=None,
                  entropy: Sequence[Sequence[float]] | None = None) -> ForkMeasurement:
    """Fork ``rollouts`` (row ``b`` for task ``tasks[b]``, factual reward ``factual[b]``) at
    positions chosen by ``positions``, continue each fork with the current policy, score the
    forks with ``score`` (:func:`labkit.policy.forking.fork_and_score`) and return
    ``dR = factual - R(fork)`` per fork.

    ``baseline`` proposes the alternatives (default ``policy.baseline()``); ``kv`` are the
    factual prefix caches of :func:`labkit.policy.rollout.sample_with_cache`; ``entropy`` the
    per-token entropies the ``entropy`` position strategy needs (computed when missing)."""
    got = fk.fork_and_score(policy, rollouts, tasks, score, positions, fork_config, kv=kv,
                            baseline=baseline, entropy=entropy)
    sites = fork_sites(got.rows, [f.t for f in got.batch.forks], [factual[b] for b in got.rows],
                       got.counterfactual)
    return ForkMeasurement(sites, got.batch, got.rows, got.counterfactual, got.positions,
                           got.gen_s, got.exec_s)


# ============================================================================= the stage


@register_stage
class ForkStage(Stage):
    """The rollout stage of an estimator that needs forks (``TrainConfig.fork``): sampling
    that keeps the prefix caches, the forks measured on the step's rollouts, the KL target,
    the EMA baseline's update, its cost and its checkpoint state."""

    need, name = "forks", "fork"
    keeps_caches = True

    def __init__(self, cfg, policy):
        self.fork: ForkCreditConfig = cfg.fork
        self.last: ForkMeasurement | None = None
        policy.baseline()  # the starting policy: frozen, or the EMA's first value

    def measure(self, ctx: StepContext) -> ForkSites:
        """Fork this step's rollouts; the sites are what the estimator reads."""
        fc, scfg = self.fork, ctx.sampling
        entropy = None
        if fc.strategy == "entropy":
            entropy = fk.token_entropy(ctx.policy.model, ctx.rollouts, ctx.policy.tokenizer.pad_token_id,
                                       scfg.temperature)
        self.last = measure_forks(
            ctx.policy, ctx.rollouts, ctx.tasks, ctx.factual(), ctx.score,
            fk.PositionConfig(fc.strategy, fc.fraction, fc.budget, seed=ctx.seed("fork-positions")),
            fk.ForkConfig.from_sampling(scfg, batch_size=fc.batch_size, seed=ctx.seed("fork")),
            kv=ctx.kv, baseline=ctx.policy.baseline(), entropy=entropy)
        return self.last.sites

    def metrics(self, value) -> dict[str, float]:
        return self.last.metrics() if self.last is not None else {}

    def cost_metrics(self, seconds: float, step_s: float) -> dict[str, float]:
        """``fork/extra_cost``: what forking adds to a step without it."""
        return {"fork/extra_cost": seconds / max(step_s - seconds, 1e-9)}

    @contextlib.contextmanager
    def kl_target(self, policy):
        """The baseline when ``kl_to_baseline``, else the reference policy."""
        if self.fork.kl_to_baseline:
            yield policy.baseline()
        else:
            with policy.reference() as ref:
                yield ref

    def after_update(self, policy) -> None:
        if self.fork.baseline == "ema":
            policy.update_baseline(self.fork.beta)  # theta_b <- beta theta_b + (1-beta) theta

    def save(self, policy, folder: Path) -> None:
        """The baseline's parameters whose policy counterpart is trainable (the others never
        move, so the EMA leaves them equal to the loaded weights)."""
        trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
        torch.save({n: p.detach().cpu() for n, p in policy.baseline().named_parameters()
                    if n in trainable}, folder / "baseline.pt")

    def load(self, policy, folder: Path) -> None:
        path = folder / "baseline.pt"
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {folder} has no baseline.pt: it was not saved by "
                                    "a forking run, but this estimator forks")
        base = dict(policy.baseline().named_parameters())
        with torch.no_grad():
            for n, v in torch.load(path, weights_only=True).items():
                base[n].copy_(v)
