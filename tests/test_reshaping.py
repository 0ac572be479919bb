"""Reward reshaping: golden numbers for every transform, the copying trap, running state."""

import random

import pytest
import torch

from labkit.credit import reshaping as rs
from labkit.env.task_sampling import CurriculumSampler

COPY = {"r_test": 0.8, "r_pass": 0.0, "r_precision": 1.0, "r_style": 1.0, "r_progress": 0.0,
        "hack": 0.0, "noop": 1.0}
FIX = {"r_test": 1.0, "r_pass": 1.0, "r_precision": 0.7, "r_style": 1.0, "r_progress": 1.0,
       "hack": 0.0, "noop": 0.0}
WRONG_EDIT = {"r_test": 0.5, "r_pass": 0.0, "r_precision": 0.9, "r_style": 1.0, "r_progress": 0.0,
              "hack": 0.0, "noop": 0.0}


def test_composite_golden():
    cfg = rs.ReshapeConfig(w_test=1.0, w_precision=0.2, w_style=0.1, w_progress=0.05, w_hack=1.0)
    r, terms = rs.composite_reward(FIX, cfg, buggy_r_test=0.8)
    assert r == pytest.approx(1.0 + 0.2 * 0.7 + 0.1 + 0.05)
    assert terms["precision"] == pytest.approx(0.14)
    hack = dict(FIX, hack=1.0)
    assert rs.composite_reward(hack, cfg, buggy_r_test=0.8)[0] == pytest.approx(r - 1.0)
    binary = rs.ReshapeConfig.raw()
    binary.test_reward = "binary"
    assert rs.composite_reward(WRONG_EDIT, binary)[0] == 0.0


def test_the_copying_trap_and_its_gate():
    trap = rs.ReshapeConfig(w_precision=0.5, w_style=0.0, w_progress=0.0, gate_precision="none")
    # ungated: copying the buggy code (0.8 + 0.5) beats a wrong edit (0.5 + 0.45)
    assert rs.composite_reward(COPY, trap)[0] > rs.composite_reward(WRONG_EDIT, trap)[0]
    gated = rs.ReshapeConfig(w_precision=0.5, w_style=0.0, w_progress=0.0, gate_precision="improved")
    assert rs.composite_reward(COPY, gated, buggy_r_test=0.8)[0] == pytest.approx(0.8)
    assert rs.composite_reward(WRONG_EDIT, gated, buggy_r_test=0.8)[0] == pytest.approx(0.5)
    edit = rs.ReshapeConfig(w_precision=0.5, w_style=0.0, w_progress=0.0, gate_precision="edit")
    assert rs.composite_reward(WRONG_EDIT, edit, buggy_r_test=0.8)[0] == pytest.approx(0.95)


def test_weight_schedule():
    s = rs.WeightSchedule(start=0.0, end=0.3, begin=10, finish=20)
    assert [s.at(t) for t in (0, 10, 15, 20, 99)] == pytest.approx([0.0, 0.0, 0.15, 0.3, 0.3])
    cfg = rs.ReshapeConfig(style_schedule=s)
    assert rs.composite_reward(FIX, cfg, step=15, buggy_r_test=0.8)[1]["style"] == pytest.approx(0.15)


def test_advantage_transforms_golden():
    a = torch.tensor([-8.0, -2.0, -0.25, 0.0, 0.04, 4.0])
    assert rs.clip_advantages(a, 5.0).tolist() == pytest.approx([-5.0, -2.0, -0.25, 0.0, 0.04, 4.0])
    assert rs.amplify(a, "signed_power", power=0.5).tolist() == pytest.approx(
        [-8 ** 0.5, -2 ** 0.5, -0.5, 0.0, 0.2, 2.0])
    assert rs.amplify(a, "piecewise", scale=2.0).tolist() == pytest.approx(
        [-16.0, -4.0, -0.25, 0.0, 0.04, 8.0])
    assert rs.focus(a, 0.5, 0.1).tolist() == pytest.approx([-8.0, -2.0, -0.025, 0.0, 0.004, 4.0])
    cfg = rs.ReshapeConfig(amplify="piecewise", amplify_scale=2.0, focus_threshold=0.5,
                           focus_damping=0.1, adv_clip=5.0)
    assert rs.transform_advantages(a, cfg).tolist() == pytest.approx(
        [-5.0, -4.0, -0.025, 0.0, 0.004, 5.0])


def test_normalisation_warmup_uses_running_stats():
    sh = rs.Reshaper(rs.ReshapeConfig(normalise="batch", warmup_steps=2, min_batch_std=1e-3,
                                      running_momentum=0.5))
    r0, info0 = sh.normalise(torch.tensor([1.0, 1.0, 1.0]))  # no spread, no history
    assert info0["reshape/norm"] == "skipped" and r0.tolist() == [1.0, 1.0, 1.0]
    sh.advance()
    # warm-up: running stats; the mean is 1 from the first batch, the variance still its
    # initial 1 (a batch without spread does not update it)
    r1, info1 = sh.normalise(torch.tensor([0.0, 2.0]))
    assert info1["reshape/norm"] == "running"
    assert r1.tolist() == pytest.approx([-1.0, 1.0], rel=1e-5)
    sh.advance()
    sh.advance()
    r3, info3 = sh.normalise(torch.tensor([0.0, 2.0]))  # past warm-up: batch stats
    assert info3["reshape/norm"] == "batch"
    assert r3.tolist() == pytest.approx([-1 / 2 ** 0.5, 1 / 2 ** 0.5], rel=1e-5)
    state = sh.state_dict()
    sh2 = rs.Reshaper(sh.cfg)
    sh2.load_state_dict(state)
    assert sh2.state_dict() == state


def test_ema_baseline():
    sh = rs.Reshaper(rs.ReshapeConfig(ema_baseline=0.5))
    r, _ = sh.normalise(torch.tensor([1.0, 3.0]))  # first baseline = batch mean 2
    assert r.tolist() == [-1.0, 1.0]
    r, _ = sh.normalise(torch.tensor([4.0, 4.0]))  # ema = 0.5 * 2 + 0.5 * 2 = 2
    assert r.tolist() == [2.0, 2.0]


def test_ema_baseline_is_in_the_units_of_the_normalised_rewards():
    """With batch normalisation the baseline tracks the standardised batch means (about 0),
    not the raw means: a batch of raw rewards near 0.9 comes out centred, not at -0.9."""
    sh = rs.Reshaper(rs.ReshapeConfig(normalise="batch", warmup_steps=0, ema_baseline=0.9))
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        raw = 0.9 + 0.05 * torch.randn(16, generator=gen, dtype=torch.float64)
        out, info = sh.normalise(raw)
        sh.advance()
        assert info["reshape/norm"] == "batch" and abs(out.mean().item()) < 1e-6
        assert abs(out.std().item() - 1) < 1e-4


def test_curriculum_prefers_learnable_buckets_and_unlocks_in_order():
    cur = CurriculumSampler(beta=0.0, eps=0.0)
    cur.update("easy", 1.0)
    cur.update("mid", 0.5)
    cur.update("hard", 0.0)
    assert cur.weights(["easy", "mid", "hard"]) == {"easy": 0.0, "mid": 0.25, "hard": 0.0}
    ordered = CurriculumSampler(order=("easy", "hard"), unlock_at=0.3, beta=0.0)
    ordered.update("easy", 0.1)
    assert ordered.weights(["easy", "hard"])["hard"] == 0.0
    ordered.update("easy", 0.6)
    assert ordered.weights(["easy", "hard"])["hard"] > 0.0
    tasks = [("mid", i) for i in range(5)] + [("easy", 9)]
    picks = cur.sample(tasks, key=lambda t: t[0], n=20, rng=random.Random(0))
    assert all(p[0] == "mid" for p in picks)


def test_curriculum_draws_without_replacement_on_a_small_pool():
    """One batch never holds a task twice (groups merge by task; fork parents collide)."""
    cur = CurriculumSampler()
    cur.update("a", 0.5)
    tasks = [("a", i) for i in range(3)] + [("b", i) for i in range(2)]
    for seed in range(50):
        picks = cur.sample(tasks, key=lambda t: t[0], n=5, rng=random.Random(seed))
        assert sorted(picks) == sorted(tasks)
        four = cur.sample(tasks, key=lambda t: t[0], n=4, rng=random.Random(seed))
        assert len(set(four)) == 4
    assert len(cur.sample(tasks, key=lambda t: t[0], n=9, rng=random.Random(0))) == 5
