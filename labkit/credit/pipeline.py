"""The one path from a batch's feedback components to token advantages.

Every caller that turns rewards into credit (the trainer, the ``RewardTuner``, the TRL and
verl adapters, the experiments) calls :class:`Credit`; nobody else sequences the stages:

1. **composite reward** ``R_b`` of each row from its components and its task's buggy-code
   baseline (:func:`labkit.credit.reshaping.composite_reward`; ``terms`` keeps each term);
2. **normalisation** ``R~ = normalise(R)`` with running statistics and the EMA baseline
   (:class:`labkit.credit.reshaping.Reshaper`, the pipeline's state);
3. **estimator** ``A = f(R~, groups, mask, records) [B, T]``
   (:data:`labkit.credit.advantages.ADVANTAGE_ESTIMATORS`), optionally rescaled per group to
   the RMS GRPO's advantages would have (``match_scale``: equal step size across estimators);
4. **advantage transforms** ``A' = clip(focus(amplify(A))) * mask``
   (:func:`labkit.credit.reshaping.transform_advantages`).

:class:`CreditRecord` keeps every intermediate, so a learner (or the tuner) can stop at any
stage. Pure apart from the running statistics, which :meth:`Credit.state_dict` holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.credit.advantages import EPS, AdvantageInput, compute_advantages, group_stats
from labkit.credit.reshaping import Reshaper, ReshapeConfig, test_term, transform_advantages

Baseline = Mapping[str, float] | float | None
"""A row's buggy-code baseline: the buggy code's components under the run's regime (the test
term is read from them), or that test term itself, or ``None`` (0)."""


@dataclass
class CreditInput:
    """One batch as the credit floor reads it (row ``b`` of every field is one completion)."""

    components: Sequence[Mapping[str, float]]
    """Feedback components per row (:class:`labkit.env.records.Components` or plain dicts)."""
    groups: Sequence
    """Group id per row (a task's G samples share one)."""
    mask: torch.Tensor  # [B, T]
    """Completion mask (``[B, 1]`` for sequence-level views such as the tuner's)."""
    baselines: Sequence[Baseline] | None = None
    """Per row, its task's buggy-code baseline (the precision gate compares with it)."""
    rollouts: Sequence | None = None
    tasks: Sequence | None = None
    measured: Mapping[str, Any] = field(default_factory=dict)
    """What the rollout stages measured on these rows, by need: ``forks``
    (:class:`~labkit.credit.advantages.ForkSites`), ``hunks``
    (:class:`~labkit.credit.advantages.HunkValues`), or a need registered with its stage
    later (:data:`labkit.loops.stages.STAGES`)."""


@dataclass
class CreditRecord:
    """Every stage's output for one batch."""

    rewards: torch.Tensor  # [B] composite
    terms: list[dict[str, float]]
    """Each row's weighted reward terms (``test``, ``precision``, ``style``, ``progress``, ``hack``)."""
    normalised: torch.Tensor  # [B]
    norm_info: dict[str, Any]
    estimated: torch.Tensor  # [B, T] the estimator's advantages (after ``match_scale``)
    advantages: torch.Tensor  # [B, T] after the transforms, 0 at masked tokens
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)


def baseline_term(baseline: Baseline, cfg: ReshapeConfig) -> float | None:
    """The test term of a buggy-code baseline (:func:`labkit.credit.reshaping.test_term`)."""
    if baseline is None or isinstance(baseline, (int, float)):
        return baseline
    return test_term(baseline, cfg)


def match_grpo_rms(adv: torch.Tensor, rewards: torch.Tensor, groups: Sequence,
                   mask: torch.Tensor) -> torch.Tensor:
    """Rescale each group's token advantages to the RMS GRPO's would have on the same tokens:
    ``A_g <- A_g * sqrt(sum_{b in g,t} m A_grpo^2 / sum_{b in g,t} m A^2)``, with
    ``A_grpo(b, t) = (R_b - mean_g R) / (std_g R + eps)``; a group whose ``A`` is all 0 stays 0.
    Adding ``lambda A_D`` or fork credit changes the advantages' size; rescaled, a difference
    between estimators is not a step-size difference."""
    mean, std, _ = group_stats(rewards, groups)
    a_grpo = ((rewards - mean) / (std + EPS)).unsqueeze(-1) * mask  # [B, T]
    ids: dict = {}
    gidx = torch.tensor([ids.setdefault(g, len(ids)) for g in groups], dtype=torch.long)  # [B]
    n = len(ids)
    m = mask.to(adv.dtype)
    want = torch.zeros(n, dtype=adv.dtype).index_add_(0, gidx, (a_grpo.to(adv.dtype) ** 2 * m).sum(-1))
    have = torch.zeros(n, dtype=adv.dtype).index_add_(0, gidx, (adv ** 2 * m).sum(-1))
    scale = torch.where(have > 0, torch.sqrt(want / have.clamp(min=1e-300)), torch.zeros_like(have))  # [G]
    return adv * scale[gidx].unsqueeze(-1)  # [B, T]


class Credit:
    """Components -> rewards -> normalised rewards -> ``[B, T]`` advantages, one batch at a
    time, keeping the running statistics of normalisation between batches."""

    def __init__(self, reshape: ReshapeConfig, estimator: str = "grpo",
                 options: Mapping[str, Any] | None = None, match_scale: bool = False):
        reshape.validate()
        self.reshape = reshape
        self.estimator = estimator
        self.options = dict(options or {})
        self.match_scale = match_scale
        self.reshaper = Reshaper(reshape)

    @property
    def step(self) -> int:
        return self.reshaper.step

    @step.setter
    def step(self, value: int) -> None:
        self.reshaper.step = value

    def rewards(self, components: Sequence[Mapping[str, float]],
                baselines: Sequence[Baseline] | None = None) -> tuple[torch.Tensor, list[dict]]:
        """Stage 1 alone: composite rewards ``[B]`` and their terms (no state changes)."""
        base = [baseline_term(b, self.reshape) for b in baselines] if baselines is not None else None
        return self.reshaper.rewards(components, base)

    def __call__(self, inp: CreditInput) -> CreditRecord:
        rewards, terms = self.rewards(inp.components, inp.baselines)  # [B]
        normalised, info = self.reshaper.normalise(rewards)  # [B]
        mask = inp.mask
        out = compute_advantages(
            self.estimator, AdvantageInput(normalised.to(mask.dtype), list(inp.groups), mask.cpu(),
                                           rollouts=inp.rollouts, tasks=inp.tasks
                                           ).supplied(inp.measured),
            **self.options)
        estimated = out.advantages  # [B, T]
        if self.match_scale:
            estimated = match_grpo_rms(estimated, normalised.to(estimated.dtype), inp.groups,
                                       mask.cpu().to(estimated.dtype))
        adv = transform_advantages(estimated, self.reshape).to(mask.device) * mask  # [B, T]
        m = mask.to(adv.dtype)
        metrics = {**out.metrics, "adv/abs_token_mean": float((adv.abs() * m).sum() / m.sum().clamp(min=1)),
                   **{k: v for k, v in info.items() if k != "reshape/norm"}}
        return CreditRecord(rewards, terms, normalised, info, estimated, adv, metrics, out.artifacts)

    def advance(self) -> None:
        """After the update: the next batch is the next step (weight schedules, warm-up)."""
        self.reshaper.advance()

    def state_dict(self) -> dict:
        return self.reshaper.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.reshaper.load_state_dict(state)
