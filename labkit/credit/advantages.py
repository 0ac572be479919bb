"""Advantage estimators: pure functions from rewards (and groups) to per-token advantages.

Every estimator returns a ``[B, T]`` tensor over completion tokens (sequence-level
estimators broadcast their value to every unmasked token) plus a dict of metrics, so
per-token estimators (DiDPO) plug into the same trainer. Conventions follow verl's
``core_algos`` (``compute_grpo_outcome_advantage`` and friends):

* a one-member group uses mean 0 and std 1;
* the std is the unbiased one (``n - 1``);
* a group whose scores are all equal gets advantage 0 and is counted in
  ``adv/zero_std_frac``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from labkit.credit.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
EPS = 1e-6


@dataclass
class AdvantageInput:
    """What an estimator may look at. ``rewards[b]`` is sequence b's scalar score,
    ``groups[b]`` its group id (one task's G samples share an id)."""

    rewards: torch.Tensor  # [B]
    groups: Sequence  # len B, hashable ids
    mask: torch.Tensor  # [B, T] completion mask
    extra: dict | None = None  # estimator-specific inputs (e.g. DiDPO anchors)


def group_stats(rewards: torch.Tensor, groups: Sequence) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence group mean, unbiased std and group size (``[B]`` each).

    A one-member group gets mean 0, std 1 (verl's convention).
    """
    ids: dict = {}
    gidx = torch.tensor([ids.setdefault(g, len(ids)) for g in groups], dtype=torch.long)  # [B]
    n_groups = len(ids)
    r = rewards.double()
    count = torch.zeros(n_groups, dtype=torch.double).index_add_(0, gidx, torch.ones_like(r))
    total = torch.zeros(n_groups, dtype=torch.double).index_add_(0, gidx, r)
    mean = total / count  # [G]
    sq = torch.zeros(n_groups, dtype=torch.double).index_add_(0, gidx, (r - mean[gidx]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G]
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gidx].to(rewards.dtype), std[gidx].to(rewards.dtype), count[gidx]


def _zero_std_frac(rewards: torch.Tensor, groups: Sequence) -> float:
    by: dict = {}
    for r, g in zip(rewards.tolist(), groups):
        by.setdefault(g, []).append(r)
    multi = [v for v in by.values() if len(v) > 1]
    return sum(max(v) - min(v) < 1e-12 for v in multi) / max(1, len(multi))


def _broadcast(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1) * mask  # [B, T]


def _metrics(adv_seq: torch.Tensor, inp: AdvantageInput) -> dict:
    return {"adv/mean": adv_seq.mean().item(), "adv/std": adv_seq.std().item() if adv_seq.numel() > 1 else 0.0,
            "adv/max": adv_seq.max().item(), "adv/min": adv_seq.min().item(),
            "adv/zero_frac": (adv_seq.abs() < 1e-12).double().mean().item(),
            "adv/zero_std_frac": _zero_std_frac(inp.rewards, inp.groups)}


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(inp: AdvantageInput, eps: float = EPS) -> tuple[torch.Tensor, dict]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath):

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``, std unbiased, broadcast to tokens.
    """
    mean, std, _ = group_stats(inp.rewards, inp.groups)
    adv = (inp.rewards - mean) / (std + eps)  # [B]
    return _broadcast(adv, inp.mask), _metrics(adv, inp)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(inp: AdvantageInput) -> tuple[torch.Tensor, dict]:
    """Dr. GRPO (Liu et al. 2025): no std division, ``A_i = r_i - mean_g(r)``."""
    mean, _, _ = group_stats(inp.rewards, inp.groups)
    adv = inp.rewards - mean  # [B]
    return _broadcast(adv, inp.mask), _metrics(adv, inp)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(inp: AdvantageInput) -> tuple[torch.Tensor, dict]:
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline,
    ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g(r))`` (0 for n = 1)."""
    mean, _, n = group_stats(inp.rewards, inp.groups)
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n)).to(inp.rewards.dtype)
    adv = factor * (inp.rewards - mean)  # [B]
    return _broadcast(adv, inp.mask), _metrics(adv, inp)


@ADVANTAGE_ESTIMATORS.register("batch_norm")
def batch_norm(inp: AdvantageInput, eps: float = EPS) -> tuple[torch.Tensor, dict]:
    """REINFORCE with a batch baseline: ``A_i = (r_i - mean_B(r)) / (std_B(r) + eps)``."""
    r = inp.rewards
    std = r.std() if r.numel() > 1 else torch.ones((), dtype=r.dtype)
    adv = (r - r.mean()) / (std + eps)  # [B]
    return _broadcast(adv, inp.mask), _metrics(adv, inp)


def compute_advantages(name: str, inp: AdvantageInput, **kwargs) -> tuple[torch.Tensor, dict]:
    """Look up estimator ``name`` and apply it: ``[B, T]`` advantages and metrics."""
    return ADVANTAGE_ESTIMATORS.get(name)(inp, **kwargs)
