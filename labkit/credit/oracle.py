"""Oracle credit: each diff hunk's true effect on the reward, as a training positive control.

A rollout's code differs from its buggy code in hunks ``H = {h_1..h_K}``
(:func:`labkit.env.edits.split_hunks`). Applying a subset ``S`` of them to the buggy code
gives a program with reward ``R(S)`` (``R({})``: the buggy code, ``R(H)``: the rollout). The
**Shapley value** of hunk ``h`` is its mean marginal effect over all orderings of the hunks,

    phi_h = sum_{S subset H \\ {h}} |S|! (K - |S| - 1)! / K! * (R(S + {h}) - R(S)),

which credits a hunk that only works together with another (reverting one hunk alone
misses that) and sums to ``R(H) - R({})`` (efficiency). With 2 hunks
``phi_1 = (R({1}) - R({}) + R({1, 2}) - R({2})) / 2``.

The ``oracle_hunk`` estimator puts ``phi`` on the hunk's tokens, scaled per group as GRPO
scales (divided by the group's reward std), beside GRPO's episode advantage:

    A(i, t) = A_E(i) + lambda * phi_{h(t)}(i) / (std_g(R) + eps),

``0`` extra credit at tokens outside every hunk and in tied groups (``std_g(R) = 0``, where
GRPO and DiDPO's ``A_D`` give none either). It is the ceiling a diff-level credit
estimator (DiDPO's ``A_D``, fork credit) could reach on this testbed; ``oracle_hunk_shuffled``
permutes each group's hunk values among its hunks (a seeded permutation), the floor that
looks like credit but carries no information. Pure: the loops floor runs the subsets
(:mod:`labkit.loops.hunks`) and hands the values over as :class:`HunkValues`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping

import torch

from labkit.credit.advantages import (ADVANTAGE_ESTIMATORS, EPS, AdvantageInput, AdvantageOutput,
                                      HunkValues, group_stats, grpo)


TIED_STD = 1e-9
"""A group whose reward std is at most this is tied: :func:`oracle_hunk` gives it no hunk credit."""


def shapley_values(value: Mapping[frozenset[int], float], k: int) -> list[float]:
    """Exact Shapley values of ``k`` players from the value of every coalition
    (``value[frozenset(S)]`` for every ``S`` of ``range(k)``; see the module docstring)."""
    if k == 0:
        return []
    missing = [s for n in range(k + 1) for s in itertools.combinations(range(k), n)
               if frozenset(s) not in value]
    if missing:
        raise ValueError(f"shapley_values needs the value of every subset; missing {missing[:3]}")
    out = []
    for h in range(k):
        others = [j for j in range(k) if j != h]
        total = 0.0
        for n in range(k):
            w = math.factorial(n) * math.factorial(k - n - 1) / math.factorial(k)
            for s in itertools.combinations(others, n):
                total += w * (value[frozenset(s) | {h}] - value[frozenset(s)])
        out.append(total)
    return out


def hunk_credit(hunks: HunkValues, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: each hunk's value divided by its row's ``scale`` on the hunk's tokens (a token
    in two hunks gets the later one), 0 elsewhere and at masked tokens."""
    out = torch.zeros_like(mask, dtype=torch.float64)  # [B, T]
    for b, row in enumerate(hunks.rows):
        for tokens, phi in row:
            idx = [t for t in tokens if t < mask.shape[1]]
            if idx:
                out[b, idx] = phi / float(scale[b])
    return out * mask


def _shuffled(hunks: HunkValues, groups, seed: int) -> HunkValues:
    """Each group's hunk values permuted among the group's hunks (seeded by the group id)."""
    by: dict = {}
    for b, g in enumerate(groups):
        by.setdefault(g, []).extend((b, j) for j in range(len(hunks.rows[b])))
    rows = [list(r) for r in hunks.rows]
    for g, slots in by.items():
        values = [hunks.rows[b][j][1] for b, j in slots]
        random.Random(f"{seed}:{g}").shuffle(values)
        for (b, j), v in zip(slots, values):
            rows[b][j] = (rows[b][j][0], v)
    return HunkValues(rows)


def _oracle(inp: AdvantageInput, lam: float, episode: bool, hunks: HunkValues) -> AdvantageOutput:
    a_e, metrics = grpo(inp)  # [B, T]
    _, std, _ = group_stats(inp.rewards, inp.groups)
    # A tied group (std 0) gets no hunk credit, as GRPO (and DiDPO's A_D) give it none:
    # dividing by eps alone would turn a hunk worth 0.5 into 5e5 and swamp every update.
    scale = torch.where(std > TIED_STD, std + EPS, torch.full_like(std, math.inf))
    a_h = hunk_credit(hunks, inp.mask, scale).to(a_e.dtype)  # [B, T]
    adv = (a_e if episode else torch.zeros_like(a_e)) + lam * a_h
    n = sum(len(r) for r in hunks.rows)
    metrics = {**metrics, "oracle/hunks": float(n),
               "oracle/abs_phi_mean": sum(abs(v) for r in hunks.rows for _, v in r) / max(n, 1),
               "oracle/nonzero_frac": sum(abs(v) > 1e-12 for r in hunks.rows for _, v in r) / max(n, 1)}
    return AdvantageOutput(adv, metrics)


@ADVANTAGE_ESTIMATORS.register("oracle_hunk", needs=("hunks",), credit="token")
def oracle_hunk(inp: AdvantageInput, lam: float = 1.0, episode: bool = True) -> AdvantageOutput:
    """``A(i, t) = A_E(i) + lambda * phi_{h(t)}(i) / (std_g(R) + eps)``: GRPO plus each hunk's
    exact Shapley value on its tokens, none in a tied group (module docstring).
    ``episode=False`` drops ``A_E``."""
    return _oracle(inp, lam, episode, inp.hunks)


@ADVANTAGE_ESTIMATORS.register("oracle_hunk_shuffled", needs=("hunks",), credit="token")
def oracle_hunk_shuffled(inp: AdvantageInput, lam: float = 1.0, episode: bool = True,
                         seed: int = 0) -> AdvantageOutput:
    """:func:`oracle_hunk` with each group's hunk values permuted among its hunks: the same
    amount of credit, none of its information (a negative control)."""
    return _oracle(inp, lam, episode, _shuffled(inp.hunks, inp.groups, seed))
