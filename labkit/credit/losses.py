"""Policy-gradient losses: PPO-clip, KL estimators, entropy, and explicit aggregation.

Conventions follow verl's ``core_algos`` (``compute_policy_loss_vanilla``,
``kl_penalty``, ``agg_loss``) so numbers compare with the most used open trainer.
All functions are pure; tensors are ``[B, T]`` over completion tokens with mask ``M``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from labkit.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_loss(loss: torch.Tensor, mask: torch.Tensor, mode: AggMode = "token-mean",
             horizon: int | None = None) -> torch.Tensor:
    """Reduce a ``[B, T]`` loss matrix ``L`` with mask ``M`` to a scalar.

    * ``token-mean``: ``sum(L*M) / sum(M)``: every token weighs the same, so long
      sequences weigh more in total (DAPO's choice);
    * ``seq-mean-token-mean``: mean over non-empty sequences of ``sum_t(L*M) / n_b``:
      every sequence weighs the same, so a token of a short answer weighs more (GRPO's
      original length bias: short correct / long wrong answers are favoured);
    * ``seq-mean-token-sum``: mean over non-empty sequences of ``sum_t(L*M)``;
    * ``seq-mean-token-sum-norm``: ``seq-mean-token-sum / T`` with ``T`` a constant
      (``horizon``, default the padded length), Dr. GRPO's unbiased normaliser.
    """
    seq_sum = (loss * mask).sum(-1)  # [B]
    n_tok = mask.sum(-1)  # [B]
    nonempty = n_tok > 0  # [B]
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum[nonempty] / n_tok[nonempty]
        return per_seq.mean() if per_seq.numel() else seq_sum.sum() * 0
    if mode == "seq-mean-token-sum":
        return seq_sum[nonempty].mean() if nonempty.any() else seq_sum.sum() * 0
    if mode == "seq-mean-token-sum-norm":
        T = horizon if horizon is not None else loss.shape[-1]
        return (seq_sum[nonempty].mean() if nonempty.any() else seq_sum.sum() * 0) / T
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {list(AggMode.__args__)}")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimators of ``KL(pi || pi_ref)`` from samples of ``pi`` (Schulman 2020).

    With ``d = logp - ref_logp``: ``k1 = d``; ``k2 = d^2 / 2``;
    ``k3`` (low_var_kl) ``= exp(x) - x - 1`` with ``x = clamp(ref_logp - logp, -20, 20)``,
    clamped to ``[-10, 10]``.
    """
    d = logp - ref_logp  # [B, T]
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        x = torch.clamp(-d, -20, 20)
        return torch.clamp(torch.exp(x) - x - 1, -10, 10)
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``H = logsumexp(z) - sum softmax(z) * z`` per position, ``[B, T]``."""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  *, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = 3.0,
                  agg: AggMode = "token-mean", horizon: int | None = None) -> tuple[torch.Tensor, dict]:
    """PPO-clip with asymmetric bounds (clip-higher, DAPO) and dual clip (Ye et al. 2020).

    ``ratio = exp(clamp(logp - old_logp, -20, 20))``;
    ``L = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))``;
    for ``A < 0`` additionally ``L = min(L, -A * c)`` (dual clip, ``c = 3``).
    Returns the aggregated loss and ``clip/frac`` (share of tokens where the clipped
    branch is active), ``clip/dual_frac``, ``ratio/mean|max|min``, ``kl/approx`` (k1 vs old).
    """
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    loss1 = -adv * ratio  # [B, T]
    loss2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)  # [B, T]
    clipped = torch.maximum(loss1, loss2)  # [B, T]
    clip_frac = masked_mean((loss2 > loss1).float(), mask)
    if dual_clip is not None:
        loss3 = -adv * dual_clip  # [B, T]
        dual = torch.minimum(clipped, loss3)
        dual_frac = masked_mean(((clipped > loss3) & (adv < 0)).float(), mask)
        per_tok = torch.where(adv < 0, dual, clipped)  # [B, T]
    else:
        dual_frac = torch.zeros(())
        per_tok = clipped
    loss = agg_loss(per_tok, mask, agg, horizon)
    m = mask.bool()
    r = ratio.detach()[m] if m.any() else torch.ones(1)
    metrics = {"clip/frac": clip_frac.item(), "clip/dual_frac": dual_frac.item(),
               "ratio/mean": r.mean().item(), "ratio/max": r.max().item(), "ratio/min": r.min().item(),
               "kl/approx_old": masked_mean(-log_ratio.detach(), mask).item()}
    return loss, metrics


# ----------------------------------------------------------------------------- config


@dataclass
class LossConfig:
    """The policy-gradient objective."""

    policy_loss: str = "ppo_clip"
    """Policy loss by name in ``labkit.credit.losses.POLICY_LOSSES``."""
    eps_low: float = 0.2
    """PPO clip below: the ratio of a token with ``A < 0`` stops paying under ``1 - eps_low``."""
    eps_high: float = 0.2
    """PPO clip above: the ratio of a token with ``A > 0`` stops paying over ``1 + eps_high``.
    Set above ``eps_low`` (e.g. 0.28) for DAPO's clip-higher, which keeps rare tokens of good
    samples rising for longer (more exploration)."""
    dual_clip: float | None = 3.0
    """Dual clip ``c`` (Ye et al. 2020): for ``A < 0`` the per-token loss is capped at ``-A c``,
    so a token whose ratio blew up cannot dominate the batch. ``None``: off."""
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                 "seq-mean-token-sum-norm"] = "token-mean"
    """token-mean: long completions weigh more; seq-mean-token-mean: short ones do (GRPO's
    length bias); seq-mean-token-sum-norm: Dr. GRPO's constant normaliser (unbiased)."""
    kl_coef: float = 0.0
    """beta: coefficient of the KL to the reference policy (0 = no reference forward)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (k1 ``d``, k2 ``d^2/2``, k3 ``exp(-d) + d - 1``, ``d = logp -
    ref``): k3 is unbiased and never negative (verl's ``low_var_kl``); k1 is unbiased but noisy."""
    entropy_coef: float = 0.0
    """Coefficient of an entropy bonus (subtracted from the loss); > 0 slows the policy's
    collapse onto few completions, at the price of noisier samples."""
    epochs: int = 1
    """Policy updates per rollout batch (1 = on-policy: ratio starts at 1)."""
    micro_batch_size: int = 32
    """Sequences per forward/backward; gradients accumulate to the whole batch."""
    engine: Literal["lean", "model"] = "lean"
    """How the update's completions attend their shared prompt
    (:func:`labkit.policy.rollout.sequence_logprobs`): ``lean`` reads each prompt's keys in
    place with a split attention (:mod:`labkit.policy.tail`; CPU Llama-family models, else
    the model's forward); ``model`` runs the model's own forward with the prompt's keys copied
    to each row. The same function to float rounding (the journal's earlier runs used
    ``model``)."""
    horizon: int | None = None
    """The constant ``T`` that ``seq-mean-token-sum-norm`` divides by (Dr. GRPO). ``None``:
    ``sampling.max_new_tokens``, the same on every step and every data-parallel rank (never
    the batch's longest completion, which would rescale each step's loss)."""
