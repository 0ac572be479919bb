"""Counterfactual-fork credit: the ``didpo_fork`` advantage estimator.

The "counterfactual forking" reading of DiDPO (from the blog post the
project started from; *not* in the paper's released code, see ``docs/didpo.md``). At selected steps ``t`` of
rollout ``i`` (:mod:`labkit.policy.forking` chooses them and makes the forks: a baseline
policy ``b`` proposes ``a != y_t``, the current policy continues), the step's credit is

    dR_{i,t} = R(y_i) - R(y_i,<t a y'),

the factual return minus the counterfactual one. The estimator:

1. **normalises** the F deltas of the batch (:func:`normalise_deltas`), by default
   ``dR_hat = dR / (sqrt(mean_F dR^2) + eps)`` (``rms``: a fork that changed nothing keeps
   credit 0, and the sign says whether the factual token beat the baseline's
   alternative); ``meanstd`` is the seed's ``(dR - mean_F dR) / (std_F dR + eps)``;
2. **assigns** ``dR_hat`` to token ``t`` of row ``i`` (:func:`assign_to_tokens`; two forks of
   one token average), optionally **spreading** it over the diff hunk holding ``t``
   (:func:`spread_over_hunks`): every token of a hunk gets the mean of the hunk's forks;
3. **combines** with the GRPO episode advantage like DiDPO:
   ``A(i, t) = A_E(i) + lambda * A_fork(i, t)``, ``A_fork = 0`` at unforked tokens
   (``episode=False`` drops ``A_E``).

Everything here is a pure function of tensors and records; :func:`labkit.loops.forks.
measure_forks` makes the forks, runs them and builds ``AdvantageInput.forks``
(:func:`fork_sites`); :class:`labkit.policy.forking.ForkCreditConfig` holds how the trainer
makes them (``TrainConfig.fork``); the estimator's own options (``lam``, ``episode``,
``normalise``, ``spread``) go in ``TrainConfig.estimator_options``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Literal

import torch

from labkit.credit.advantages import (ADVANTAGE_ESTIMATORS, EPS, AdvantageInput, AdvantageOutput,
                                      ForkSites, grpo, needs)
from labkit.env.edits import rollout_hunks
from labkit.env.records import Rollout

Normalise = Literal["rms", "meanstd", "none"]
Spread = Literal["token", "hunk"]


# ============================================================================= pieces


def fork_sites(rows: Sequence[int], ts: Sequence[int], r_factual: Sequence[float],
               r_counterfactual: Sequence[float]) -> ForkSites:
    """What the estimator reads (``AdvantageInput.forks``): ``row [F]``, ``t [F]`` and
    ``dr [F] = R(factual) - R(counterfactual)``."""
    if not len(rows) == len(ts) == len(r_factual) == len(r_counterfactual):
        raise ValueError("fork_sites: rows, ts and both reward lists must have one entry a fork")
    dr = (torch.tensor(list(r_factual), dtype=torch.float64)
          - torch.tensor(list(r_counterfactual), dtype=torch.float64))  # [F]
    return ForkSites(row=torch.tensor(list(rows), dtype=torch.long),
                     t=torch.tensor(list(ts), dtype=torch.long), dr=dr)


def delta_moments(dr: torch.Tensor) -> tuple[float, float, float]:
    """``(F, sum_F dR, sum_F dR^2)`` of fork deltas ``dr [F]``: what :func:`normalise_deltas`
    reads of a batch, additive over its parts (one process's forks: summed over processes,
    the batch's)."""
    dr = dr.to(torch.float64)
    return float(dr.numel()), float(dr.sum()), float(dr.pow(2).sum())


def normalise_deltas(dr: torch.Tensor, mode: Normalise = "rms", eps: float = EPS,
                     moments: tuple[float, float, float] | None = None) -> torch.Tensor:
    """Batch normalisation of the fork deltas ``dr [F]``:

    * ``rms`` (default): ``dR / (sqrt(mean_F dR^2) + eps)``. Scale only: zero stays zero and
      signs are kept, so forks that changed nothing do not turn negative when most forks
      helped. All-zero deltas stay 0.
    * ``meanstd`` (the seed's ``(dR - mean) / std``): ``(dR - mean_F) / (std_F + eps)``,
      unbiased std; one fork uses mean 0, std 1; equal deltas give 0. Centring makes a fork
      with no effect negative whenever the batch mean is positive: a bias towards
      penalising ineffective steps.
    * ``none``: ``dR`` as is (the reward scale).

    ``moments``: the batch's :func:`delta_moments` when ``dr`` is a part of it (one process's
    forks); the mean, RMS and std are then the batch's, ``mean = S_1 / F``,
    ``rms = sqrt(S_2 / F)``, ``std = sqrt((S_2 - F mean^2) / (F - 1))``.
    """
    if mode not in ("rms", "meanstd", "none"):
        raise ValueError(f"normalise must be 'rms', 'meanstd' or 'none', not {mode!r}")
    if dr.numel() == 0 or mode == "none":
        return dr.clone()
    n, s1, s2 = delta_moments(dr) if moments is None else moments
    if mode == "rms":
        return dr / (math.sqrt(max(s2, 0.0) / n) + eps)  # [F]
    if n <= 1:
        return dr.clone()
    mean = s1 / n
    return (dr - mean) / (math.sqrt(max(s2 - n * mean * mean, 0.0) / (n - 1)) + eps)  # [F]


def assign_to_tokens(values: torch.Tensor, row: torch.Tensor, t: torch.Tensor,
                     shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter fork values onto their tokens: ``A[i, t] = mean of the values of the forks at
    (i, t)``, 0 elsewhere. ``values, row, t [F]`` -> ``(A [B, T], hit [B, T] bool)``."""
    B, T = shape
    if values.numel() and (row.max() >= B or t.max() >= T or row.min() < 0 or t.min() < 0):
        raise ValueError(f"fork sites fall outside the [{B}, {T}] token grid")
    total = torch.zeros(B * T, dtype=values.dtype).index_add_(0, row * T + t, values)  # [B*T]
    count = torch.zeros(B * T, dtype=values.dtype).index_add_(0, row * T + t,
                                                                torch.ones_like(values))
    hit = count > 0  # [B*T]
    return (total / count.clamp(min=1)).view(B, T), hit.view(B, T)


def spread_over_hunks(values: torch.Tensor, hit: torch.Tensor,
                      hunks: Sequence[Sequence[Sequence[int]]]) -> torch.Tensor:
    """Spread per-token fork credit over diff hunks.

    ``hunks[i]`` lists row i's hunks, each a sequence of completion token indices. For a
    hunk h holding forked tokens, ``v_h = mean_{u in h, hit} values[i, u]``; every token of
    a hunk with forks gets the mean of ``v_h`` over such hunks containing it, a forked token
    in no hunk keeps its own value, every other token 0:

        A[i, u] = mean_{h ∋ u, h has forks} v_h   (u in a hunk with forks)
                = values[i, u]                    (u forked, in no hunk with forks)

    ``values [B, T]``, ``hit [B, T]`` -> ``[B, T]``; one ``[H, B*T]`` membership matrix.
    """
    B, T = values.shape
    flat = [(i * T + u) for i, rows in enumerate(hunks) for h in rows for u in h if u < T]
    hunk_id = [k for k, h in enumerate(h for rows in hunks for h in rows) for u in h if u < T]
    n_h = sum(len(rows) for rows in hunks)
    if n_h == 0:
        return values * hit
    M = torch.zeros(n_h, B * T, dtype=values.dtype)  # [H, B*T] membership
    if flat:
        M[torch.tensor(hunk_id), torch.tensor(flat)] = 1.0
    v, h = (values * hit).reshape(-1), hit.reshape(-1).to(values.dtype)  # [B*T]
    n_forks = M @ h  # [H]
    has = (n_forks > 0).to(values.dtype)  # [H]
    v_h = (M @ v) / n_forks.clamp(min=1)  # [H]
    num, den = M.T @ (v_h * has), M.T @ has  # [B*T]
    out = torch.where(den > 0, num / den.clamp(min=1), v)  # [B*T]
    return out.view(B, T)


def hunk_tokens(rollout: Rollout, buggy_code: str) -> list[tuple[int, ...]]:
    """The completion tokens of each hunk of ``rollout.code`` against ``buggy_code``
    (:func:`labkit.env.edits.rollout_hunks`, the mapping the ground truth uses); none when
    the code is not a substring of the completion."""
    if rollout.code_start < 0:
        return []
    return [h.tokens for h in rollout_hunks(rollout, buggy_code)]


# ============================================================================= estimator


@ADVANTAGE_ESTIMATORS.register("didpo_fork", needs=("forks",), credit="token")
def didpo_fork(inp: AdvantageInput, lam: float = 1.0, episode: bool = True,
               normalise: Normalise = "rms", spread: Spread = "token", eps: float = EPS,
               hunks: Sequence[Sequence[Sequence[int]]] | None = None,
               moments: tuple[float, float, float] | None = None) -> AdvantageOutput:
    """Counterfactual-fork credit combined with the episode advantage:

    ``A(i, t) = [episode] A_E(i) + lambda * A_fork(i, t)``, ``A_E`` the GRPO advantage
    (:func:`labkit.credit.advantages.grpo`), ``A_fork = normalise(dR)`` at forked tokens
    (spread over their diff hunk with ``spread="hunk"``), 0 elsewhere;
    ``dR = R(factual) - R(counterfactual)``.

    Reads ``inp.forks`` (:func:`fork_sites`: ``row``, ``t``, ``dr`` of every fork);
    ``spread="hunk"`` also needs each row's hunks: ``hunks`` (per row, token tuples), or
    ``inp.rollouts`` and ``inp.tasks`` to compute them (:func:`hunk_tokens`). ``lam = 0`` is
    exactly ``grpo``. ``moments``: the whole batch's :func:`delta_moments` when these rows
    are one process's share of it (the normalisation is then the batch's).
    """
    a_e, metrics = grpo(inp)  # [B, T]
    if inp.forks is None:
        raise ValueError("didpo_fork needs AdvantageInput.forks (fork_sites(rows, ts, R_factual, "
                         "R_counterfactual)); the trainer makes them for an estimator that needs them")
    t0 = time.perf_counter()
    forks = inp.forks
    B, T = inp.mask.shape
    dr = forks.dr.to(torch.float64)  # [F]
    a_hat = normalise_deltas(dr, normalise, eps, moments)  # [F]
    a_fork, hit = assign_to_tokens(a_hat, forks.row, forks.t, (B, T))  # [B, T]
    if spread == "hunk":
        if hunks is None:
            if inp.rollouts is None or inp.tasks is None:
                raise ValueError("didpo_fork(spread='hunk') needs hunks=... or "
                                 "AdvantageInput.rollouts and .tasks")
            hunks = [hunk_tokens(r, t.buggy_code) for r, t in zip(inp.rollouts, inp.tasks)]
        a_fork = spread_over_hunks(a_fork, hit, hunks)  # [B, T]
    elif spread != "token":
        raise ValueError(f"spread must be 'token' or 'hunk', not {spread!r}")
    a_fork = a_fork.to(a_e.dtype) * inp.mask  # [B, T]
    adv = ((a_e if episode else torch.zeros_like(a_e)) + lam * a_fork) * inp.mask  # [B, T]
    vals = adv[inp.mask.bool()]
    credited = (a_fork != 0) & inp.mask.bool()
    metrics.update({
        "adv/mean": vals.mean().item() if vals.numel() else 0.0,
        "adv/std": vals.std().item() if vals.numel() > 1 else 0.0,
        "adv/max": vals.max().item() if vals.numel() else 0.0,
        "adv/min": vals.min().item() if vals.numel() else 0.0,
        "adv/zero_frac": (vals.abs() < 1e-12).double().mean().item() if vals.numel() else 0.0,
        "fork/dr_mean": dr.mean().item() if dr.numel() else 0.0,
        "fork/dr_abs_mean": dr.abs().mean().item() if dr.numel() else 0.0,
        "fork/dr_nonzero_frac": (dr != 0).double().mean().item() if dr.numel() else 0.0,
        "fork/token_coverage": (credited.sum() / inp.mask.sum().clamp(min=1)).item(),
        "fork/credit_s": time.perf_counter() - t0,
    })
    return AdvantageOutput(adv, metrics)


@ADVANTAGE_ESTIMATORS.register("didpo_fork_no_ae", needs=("forks",), credit="token",
                               options="didpo_fork", fixed=("episode",))
def didpo_fork_no_ae(inp: AdvantageInput, **opts) -> AdvantageOutput:
    """Ablation: fork credit alone, ``A(i, t) = lambda * A_fork(i, t)``."""
    return didpo_fork(inp, episode=False, **opts)


def needs_forks(estimator: str) -> bool:
    """True when ``estimator`` declares it needs forks (the trainer must make them)."""
    return "forks" in needs(estimator)
