"""One path from feedback to credit: the trainer, the RewardTuner, the TRL/verl scorer and
the DiDPO adapter give the same rewards and advantages on the same batch, and the pipeline's
pieces match golden numbers and a naive second implementation."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import pytest
import torch

from conftest import toy_tasks
from labkit.config import from_dict
from labkit.credit.advantages import AdvantageInput, HunkValues, compute_advantages
from labkit.credit.oracle import shapley_values
from labkit.credit.pipeline import Credit, CreditInput, match_grpo_rms
from labkit.credit.reshaping import RECIPES, recipe
from labkit.loops.trainer import TrainConfig, Trainer


def _one_step(tmp_path, model_dir, name: str, estimator: str):
    cfg = from_dict(TrainConfig, {
        "run_dir": str(tmp_path / f"{name}-{estimator}"), "seed": 4, "steps": 1, "tasks_per_step": 3,
        "estimator": estimator, "policy": {"spec": str(model_dir), "reference": "none"},
        "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 24},
        "tasks": {"source": "records", "eval_tasks": 0}, "feedback": {"progress_patience": 1000},
        "loss": {"micro_batch_size": 6}, "optim": {"lr": 1e-3},
        "eval_every": 0, "checkpoint_every": 5, "log_rollouts": -1})
    cfg.reshape = recipe(name)
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[])
    tr.train(progress=False)
    tr.close()
    path = tmp_path / f"{name}-{estimator}" / "rollouts.jsonl"
    return cfg, [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "estimator"), list(itertools.product(sorted(RECIPES), ["grpo", "rloo", "batch_norm"])))
def test_trainer_tuner_and_scorer_agree(name, estimator, toy_model_dir, tmp_path):
    from labkit.integrations.scoring import SandboxScorer
    from widgets.tuner import recompute

    cfg, records = _one_step(tmp_path, toy_model_dir, name, estimator)
    frame = recompute(records, cfg.reshape, estimator)
    assert frame["reward"].tolist() == pytest.approx([r["reward"] for r in records], abs=1e-12)
    for r, a in zip(records, frame["advantage"]):  # a sequence estimator: every token the same
        assert r["advantages"] == pytest.approx([a] * len(r["advantages"]), abs=1e-9)
    by_id = {t.task_id: t for t in toy_tasks()}
    scorer = SandboxScorer(cfg.feedback, cfg.reshape)
    rewards, _ = scorer.rewards([by_id[r["task_id"]] for r in records], [r["code"] for r in records])
    assert rewards == pytest.approx([r["reward"] for r in records], abs=1e-12)


@pytest.mark.slow
def test_the_didpo_adapter_gives_the_trainer_s_token_credit(toy_model_dir, tmp_path):
    from labkit.integrations.credit import didpo_credit
    from labkit.policy.loading import load_policy

    _, records = _one_step(tmp_path, toy_model_dir, "raw", "didpo")
    tok = load_policy(str(toy_model_dir), reference="none").tokenizer
    n = max(len(r["completion_ids"]) for r in records)
    ids = torch.zeros(len(records), n, dtype=torch.long)
    mask = torch.zeros(len(records), n)
    for b, r in enumerate(records):
        ids[b, :len(r["completion_ids"])] = torch.tensor(r["completion_ids"])
        mask[b, :len(r["completion_ids"])] = 1
    by_id = {t.task_id: t for t in toy_tasks()}
    out, _ = didpo_credit(tok, ids, mask, torch.tensor([r["reward"] for r in records]),
                          [r["task_id"] for r in records], [by_id[r["task_id"]] for r in records])
    for b, r in enumerate(records):  # the adapter computes in float64, the trainer in float32
        assert out.advantages[b, :len(r["advantages"])].tolist() == pytest.approx(r["advantages"], abs=1e-6)


def test_credit_keeps_every_stage_and_matches_the_stages_run_by_hand():
    comps = [{"r_test": x, "r_pass": float(x == 1.0), "r_precision": 0.5, "r_style": 1.0, "noop": 0.0}
             for x in (1.0, 0.5, 0.0, 0.25, 0.75, 0.75)]
    groups = ["a", "a", "a", "b", "b", "b"]
    mask = torch.ones(6, 3, dtype=torch.float64)
    cfg = RECIPES["reshaped"]()
    rec = Credit(cfg, "grpo")(CreditInput(comps, groups, mask, [0.0] * 6))
    # by hand: composite, then the first batch normalised with its own statistics, GRPO, clip
    r = [1.0 * c["r_test"] + 0.2 * (c["r_test"] > 0) * 0.5 + 0.1 for c in comps]
    assert rec.rewards.tolist() == pytest.approx(r)
    assert rec.terms[2]["precision"] == 0.0  # the gate: no tests improved over the buggy code
    assert rec.norm_info["reshape/norm"] == "skipped" or rec.normalised.tolist() != r
    a = compute_advantages("grpo", AdvantageInput(rec.normalised, groups, mask)).advantages
    assert torch.allclose(rec.advantages, a.clamp(-5, 5))
    assert rec.metrics["adv/abs_token_mean"] == pytest.approx(float(rec.advantages.abs().mean()))


def test_match_grpo_rms_golden_and_naive():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5], dtype=torch.float64)
    groups = ["g", "g", "g", "h"]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([[3.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
                       dtype=torch.float64)
    got = match_grpo_rms(adv, rewards, groups, mask)
    # naive: GRPO's advantages of group g: (r - 1/3) / (std + eps), std unbiased = 0.57735
    s = statistics.stdev([1.0, 0.0, 0.0])
    a_g = [(x - 1 / 3) / (s + 1e-6) for x in (1.0, 0.0, 0.0)]
    want_sq = sum(a ** 2 * n for a, n in zip(a_g, (2, 3, 1)))
    have_sq = 3 ** 2 + 1 + 3 * 1 + 2 ** 2
    k = math.sqrt(want_sq / have_sq)
    assert torch.allclose(got[:3], adv[:3] * k)
    assert got[3].tolist() == [0.0, 0.0, 0.0]  # an all-zero group stays zero
    scaled_sq = float((got[:3] ** 2 * mask[:3]).sum())
    assert scaled_sq == pytest.approx(want_sq)


def test_shapley_golden_and_a_naive_permutation_average():
    # two hunks that only work together: each gets half the joint effect
    v = {frozenset(): 0.0, frozenset({0}): 0.0, frozenset({1}): 0.0, frozenset({0, 1}): 1.0}
    assert shapley_values(v, 2) == pytest.approx([0.5, 0.5])
    # three hunks, an arbitrary value function: the mean marginal effect over all orderings
    v3 = {frozenset(s): (len(s) ** 2 + 3 * (0 in s) - 2 * (2 in s)) / 10.0
          for n in range(4) for s in itertools.combinations(range(3), n)}
    naive = [0.0, 0.0, 0.0]
    orders = list(itertools.permutations(range(3)))
    for order in orders:
        have: frozenset = frozenset()
        for h in order:
            naive[h] += (v3[have | {h}] - v3[have]) / len(orders)
            have = have | {h}
    got = shapley_values(v3, 3)
    assert got == pytest.approx(naive)
    assert sum(got) == pytest.approx(v3[frozenset({0, 1, 2})] - v3[frozenset()])  # efficiency
    with pytest.raises(ValueError, match="every subset"):
        shapley_values({frozenset(): 0.0}, 1)


def test_oracle_puts_each_hunk_value_on_its_tokens_scaled_as_grpo():
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.float64)
    hunks = HunkValues([[((0, 1), 0.6), ((3,), 0.4)], [((2,), -0.2)]])
    inp = AdvantageInput(rewards, ["g", "g"], mask, hunks=hunks)
    std = statistics.stdev([1.0, 0.0]) + 1e-6
    only = compute_advantages("oracle_hunk", inp, episode=False).advantages
    want = torch.tensor([[0.6 / std, 0.6 / std, 0, 0.4 / std], [0, 0, -0.2 / std, 0]], dtype=torch.float64)
    assert torch.allclose(only, want)
    full = compute_advantages("oracle_hunk", inp).advantages
    a_e = compute_advantages("grpo", inp).advantages
    assert torch.allclose(full, a_e + only)
    shuffled = compute_advantages("oracle_hunk_shuffled", inp, episode=False).advantages
    assert sorted(round(x, 9) for x in shuffled[shuffled != 0].tolist()) != [] and \
        sorted(round(v * std, 6) for v in set(shuffled[shuffled != 0].tolist())) == \
        sorted(round(v, 6) for v in {0.6, 0.4, -0.2})  # the same values, permuted


def test_oracle_gives_a_tied_group_no_hunk_credit():
    """A tied group (every rollout repaired the same bug) has std 0: GRPO gives it nothing, and
    so does the oracle's hunk term (dividing by eps alone made a hunk worth 0.5 into 5e5);
    the untied group beside it keeps its credit."""
    rewards = torch.tensor([0.5, 0.5, 1.0, 0.0], dtype=torch.float64)
    mask = torch.ones(4, 3, dtype=torch.float64)
    hunks = HunkValues([[((0,), 0.5)], [((1,), 0.5)], [((0,), 0.5), ((2,), 0.5)], []])
    inp = AdvantageInput(rewards, ["tied", "tied", "g", "g"], mask, hunks=hunks)
    out = compute_advantages("oracle_hunk", inp).advantages
    assert torch.equal(out[:2], torch.zeros(2, 3, dtype=torch.float64))
    assert out.abs().max() < 10 and out[2, 0] > compute_advantages("grpo", inp).advantages[2, 0]
