"""Advantage estimators and losses: hand-computed golden numbers and naive loop versions."""

import math
import random

import pytest
import torch

from labkit.credit.advantages import (ADVANTAGE_ESTIMATORS, AdvantageInput, compute_advantages,
                                      group_stats)
from labkit.credit.losses import agg_loss, entropy_from_logits, kl_penalty, ppo_clip_loss
from labkit.registry import Registry


def _inp(rewards, groups, T=3):
    r = torch.tensor(rewards, dtype=torch.float64)
    return AdvantageInput(r, groups, torch.ones(len(rewards), T, dtype=torch.float64))


# ----------------------------------------------------------------- golden numbers


def test_grpo_golden():
    adv, m = compute_advantages("grpo", _inp([1.0, 0.0, 1.0, 1.0, 3.0], ["a", "a", "b", "b", "c"]))
    s = 0.5 / math.sqrt(0.5)  # |r - mean| / unbiased std for {1, 0}
    assert adv[:, 0].tolist() == pytest.approx([s, -s, 0.0, 0.0, 3.0], rel=1e-5)
    assert (adv == adv[:, :1]).all()  # broadcast to tokens
    assert m["adv/zero_std_frac"] == 0.5  # group b (c has one member and is not counted)


def test_other_estimators_golden():
    inp = _inp([1.0, 0.0, 0.0], ["a", "a", "a"])
    dr, _ = compute_advantages("dr_grpo", inp)
    assert dr[:, 0].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    rl, _ = compute_advantages("rloo", inp)  # r_i - mean of the others
    assert rl[:, 0].tolist() == pytest.approx([1.0, -0.5, -0.5])
    bn, _ = compute_advantages("batch_norm", _inp([2.0, 0.0], ["x", "y"]))
    assert bn[:, 0].tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-5)


def test_masked_tokens_get_zero():
    inp = _inp([1.0, 0.0], ["a", "a"])
    inp.mask[1, 2] = 0
    adv, _ = compute_advantages("grpo", inp)
    assert adv[1, 2] == 0 and adv[1, 1] != 0


# ----------------------------------------------------------------- naive second implementation


def naive_grpo(rewards, groups, eps=1e-6):
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        if len(members) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(members) / len(members)
            std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1))
        out.append((r - mean) / (std + eps))
    return out


def naive_rloo(rewards, groups):
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups)):
        others = [x for j, (x, h) in enumerate(zip(rewards, groups)) if h == g and j != i]
        out.append(r - sum(others) / len(others) if others else 0.0)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_matches_loops(seed):
    rng = random.Random(seed)
    n = 40
    rewards = [rng.choice([0.0, 0.25, 1.0, rng.random()]) for _ in range(n)]
    groups = [rng.randrange(7) for _ in range(n)]
    adv, _ = compute_advantages("grpo", _inp(rewards, groups))
    assert adv[:, 0].tolist() == pytest.approx(naive_grpo(rewards, groups), abs=1e-9)
    adv, _ = compute_advantages("rloo", _inp(rewards, groups))
    assert adv[:, 0].tolist() == pytest.approx(naive_rloo(rewards, groups), abs=1e-9)
    mean, std, count = group_stats(torch.tensor(rewards, dtype=torch.float64), groups)
    assert count.tolist() == [groups.count(g) for g in groups]


def test_registry_rejects_a_second_function_under_one_name():
    reg = Registry("thing")
    reg.register("a")(len)
    reg.register("a")(len)  # the same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(abs)
    with pytest.raises(KeyError, match="unknown thing 'b'"):
        reg.get("b")
    assert {"grpo", "dr_grpo", "rloo", "batch_norm"} <= set(ADVANTAGE_ESTIMATORS.names())


# ----------------------------------------------------------------- losses


def test_ppo_clip_golden():
    logp = torch.log(torch.tensor([[1.5, 0.5, 5.0, 1.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    mask = torch.ones(1, 4)
    loss, m = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip=3.0,
                            agg="token-mean")
    # per token: max(-1.5, -1.2) = -1.2; max(0.5, 0.8) = 0.8; min(max(5, 1.2), 3) = 3; -2
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 2.0) / 4)
    assert m["clip/frac"] == pytest.approx(2 / 4)
    assert m["clip/dual_frac"] == pytest.approx(1 / 4)
    # clip-higher: eps_high 0.28 lets the first token's ratio rise to 1.28
    loss_h, _ = ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    assert loss_h.item() == pytest.approx((-1.28 + 0.8 + 3.0 - 2.0) / 4)


def naive_ppo(logp, old, adv, mask, eps=0.2, c=3.0):
    total, n = 0.0, 0
    for b in range(len(logp)):
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(max(-20, min(20, logp[b][t] - old[b][t])))
            a = adv[b][t]
            loss = max(-a * ratio, -a * min(max(ratio, 1 - eps), 1 + eps))
            if a < 0:
                loss = min(loss, -a * c)
            total, n = total + loss, n + 1
    return total / n


def test_ppo_matches_loop():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    loss, _ = ppo_clip_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(naive_ppo(logp.tolist(), old.tolist(), adv.tolist(),
                                                  mask.tolist()), rel=1e-5)


def test_agg_modes_golden():
    L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    M = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert agg_loss(L, M, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(L, M, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert agg_loss(L, M, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(L, M, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 4) / 2 / 3)
    assert agg_loss(L, M, "seq-mean-token-sum-norm", horizon=10).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        agg_loss(L, M, "sum")


def test_kl_estimators_golden():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(2)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(d * d / 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-100.0]), "k3").item() == pytest.approx(
        math.exp(-20) + 20 - 1 if math.exp(-20) + 20 - 1 < 10 else 10)


def test_entropy():
    z = torch.zeros(1, 1, 4)
    assert entropy_from_logits(z).item() == pytest.approx(math.log(4))
