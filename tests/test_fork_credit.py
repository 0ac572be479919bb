"""didpo_fork: golden numbers on hand-built forks, a naive loop against the vectorised
estimator, a trainer step on the toy model (EMA baseline, KL to it, checkpoint/resume), and
the credit experiment's agreement metrics on constructed cases."""

import math
import random
import statistics

import pytest
import torch

from conftest import toy_tasks
from labkit.credit.advantages import AdvantageInput, compute_advantages, grpo
from labkit.credit.fork_credit import (assign_to_tokens, delta_moments, didpo_fork, fork_sites, hunk_tokens,
                                       needs_forks, normalise_deltas, spread_over_hunks)
from labkit.policy.forking import ForkCreditConfig
from labkit.sandbox.records import SandboxResult, Status
from labkit.experiments.credit import (agreement, average_ranks, hunk_mean, sign_agreement,
                                       spearman)
from labkit.policy.rollout import Rollout

# ----------------------------------------------------------------------------- pieces


def test_normalise_deltas_golden():
    dr = torch.tensor([1.0, 0.0, -1.0, 0.0], dtype=torch.float64)
    # rms = sqrt(2 / 4) = 0.70711: zero stays zero, signs kept
    assert normalise_deltas(dr, "rms").tolist() == pytest.approx([1.414212, 0, -1.414212, 0], abs=1e-5)
    # mean 0, unbiased std sqrt(2 / 3) = 0.81650
    assert normalise_deltas(dr, "meanstd").tolist() == pytest.approx([1.224743, 0, -1.224743, 0], abs=1e-5)
    # [1, 1, 0]: mean 2/3, std sqrt(1/3) = 0.57735 -> the no-effect fork turns negative
    assert normalise_deltas(torch.tensor([1.0, 1.0, 0.0]), "meanstd").tolist() == pytest.approx(
        [0.57735, 0.57735, -1.154700], abs=1e-5)
    assert normalise_deltas(torch.tensor([0.5]), "meanstd").tolist() == [0.5]  # one fork: mean 0, std 1
    assert normalise_deltas(torch.zeros(3), "rms").tolist() == [0, 0, 0]
    assert normalise_deltas(dr, "none").tolist() == dr.tolist()
    with pytest.raises(ValueError, match="normalise must be"):
        normalise_deltas(dr, "zscore")


def test_a_share_of_the_deltas_normalised_with_the_batchs_moments_is_the_batchs_slice():
    """One process's forks, normalised with the moments summed over processes, equal its slice
    of the whole batch normalised at once (rms and meanstd)."""
    rng = random.Random(3)
    parts = [torch.tensor([rng.choice([-1.0, 0.0, 0.5, 1.0]) for _ in range(n)], dtype=torch.float64)
             for n in (5, 0, 7)]
    whole = torch.cat(parts)
    moments = tuple(sum(m) for m in zip(*(delta_moments(d) for d in parts)))
    assert moments == pytest.approx(delta_moments(whole))
    for mode in ("rms", "meanstd"):
        got = torch.cat([normalise_deltas(d, mode, moments=moments) for d in parts])
        assert torch.allclose(got, normalise_deltas(whole, mode), atol=1e-12)
        # against the textbook formulas, written out
        mean, sd = sum(whole.tolist()) / 12, statistics.stdev(whole.tolist())
        rms = math.sqrt(sum(x * x for x in whole.tolist()) / 12)
        naive = [x / (rms + 1e-6) for x in whole.tolist()] if mode == "rms" else \
            [(x - mean) / (sd + 1e-6) for x in whole.tolist()]
        assert got.tolist() == pytest.approx(naive, abs=1e-6)


def test_fork_sites_and_assignment_golden():
    sites = fork_sites([0, 0, 1], [1, 1, 3], [1.0, 1.0, 0.0], [-1.0, -3.0, 1.0])
    assert sites.dr.tolist() == [2.0, 4.0, -1.0] and len(sites) == 3
    a, hit = assign_to_tokens(sites.dr, sites.row, sites.t, (2, 4))
    assert a.tolist() == [[0, 3, 0, 0], [0, 0, 0, -1]]  # two forks of one token average
    assert hit.tolist() == [[False, True, False, False], [False, False, False, True]]
    with pytest.raises(ValueError, match="outside"):
        assign_to_tokens(sites.dr, sites.row, sites.t, (2, 3))
    with pytest.raises(ValueError, match="one entry a fork"):
        fork_sites([0], [1, 2], [1.0], [0.0])


def test_spread_over_hunks_golden():
    values = torch.tensor([[0, 3.0, 0, 0], [0, 0, 0, -1.0]])
    hit = values != 0
    # row 0: hunk {1, 2} holds the fork -> both tokens 3; hunk {3} has none -> 0.
    # row 1: hunk {0, 1, 2} has no fork -> 0; the fork at token 3 is in no hunk -> keeps -1.
    out = spread_over_hunks(values, hit, [[(1, 2), (3,)], [(0, 1, 2)]])
    assert out.tolist() == [[0, 3, 3, 0], [0, 0, 0, -1]]
    # overlapping hunks: token 2 sits in both and gets the mean of their values (2 + 4) / 2
    v = torch.tensor([[0, 2.0, 0, 4.0]])
    assert spread_over_hunks(v, v != 0, [[(1, 2), (2, 3)]]).tolist() == [[0, 2, 3, 4]]
    # two forks in one hunk: their mean over the whole hunk
    v = torch.tensor([[1.0, 0, 3.0, 0]])
    assert spread_over_hunks(v, v != 0, [[(0, 1, 2, 3)]]).tolist() == [[2, 2, 2, 2]]
    assert spread_over_hunks(v, v != 0, [[]]).tolist() == v.tolist()


def _flat(rows):
    return [x for row in rows for x in row]


def _inp(rewards, groups, T, forks):
    return AdvantageInput(torch.tensor(rewards, dtype=torch.float64), groups,
                          torch.ones(len(rewards), T, dtype=torch.float64), forks=forks)


def test_didpo_fork_golden_and_lambda_switch():
    # group a: R = [1, 0] -> A_E = +-0.70711; group b: R = [0.5, 0.5] -> A_E = 0
    forks = fork_sites([0, 2], [1, 0], [1.0, 0.5], [0.0, 1.0])  # dR = [1, -0.5]
    inp = _inp([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], 3, forks)
    # rms = sqrt((1 + 0.25) / 2) = 0.790569 -> A_fork = [1.264911, -0.632456]
    adv, m = didpo_fork(inp)
    assert adv[0].tolist() == pytest.approx([0.707106, 1.972017, 0.707106], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-0.707106] * 3, abs=1e-5)
    assert adv[2].tolist() == pytest.approx([-0.632456, 0, 0], abs=1e-5)
    assert adv[3].tolist() == [0, 0, 0]
    assert m["fork/dr_mean"] == pytest.approx(0.25) and m["fork/dr_nonzero_frac"] == 1.0
    assert m["fork/token_coverage"] == pytest.approx(2 / 12)
    # lambda = 0 is exactly GRPO; lambda = 2 doubles the fork term
    assert torch.equal(didpo_fork(inp, lam=0.0)[0], grpo(inp)[0])
    assert didpo_fork(inp, lam=2.0)[0][0, 1].item() == pytest.approx(0.707106 + 2 * 1.264911, abs=1e-5)
    # without the episode term only the forked tokens carry credit
    local, _ = compute_advantages("didpo_fork_no_ae", inp)
    assert _flat(local.tolist()) == pytest.approx(
        _flat([[0, 1.264911, 0], [0, 0, 0], [-0.632456, 0, 0], [0, 0, 0]]), abs=1e-5)
    # spread over a given hunk: row 0's hunk {1, 2}
    spread, _ = didpo_fork(_inp([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], 3, forks),
                           hunks=[[(1, 2)], [], [], []], spread="hunk", episode=False)
    assert _flat(spread.tolist()) == pytest.approx(
        _flat([[0, 1.264911, 1.264911], [0, 0, 0], [-0.632456, 0, 0], [0, 0, 0]]), abs=1e-5)
    with pytest.raises(ValueError, match="needs forks"):
        compute_advantages("didpo_fork", AdvantageInput(inp.rewards, inp.groups, inp.mask))
    assert needs_forks("didpo_fork") and not needs_forks("didpo") and not needs_forks("grpo")


def _naive_didpo_fork(rewards, groups, mask, rows, ts, dr, hunks, lam, episode):
    """Loop version: GRPO per row, RMS-normalised deltas, per-token means, hunk means."""
    B, T = mask.shape
    by = {}
    for b, g in enumerate(groups):
        by.setdefault(g, []).append(rewards[b])
    rms = math.sqrt(sum(d * d for d in dr) / len(dr)) if dr else 0.0
    per_tok = {}
    for r, t, d in zip(rows, ts, dr):
        per_tok.setdefault((r, t), []).append(d / (rms + 1e-6))
    tok_val = {k: sum(v) / len(v) for k, v in per_tok.items()}
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        g = by[groups[b]]
        mean = sum(g) / len(g) if len(g) > 1 else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1)) if len(g) > 1 else 1.0
        a_e = (rewards[b] - mean) / (std + 1e-6)
        hv = []
        for h in hunks[b]:
            vals = [tok_val[(b, u)] for u in h if (b, u) in tok_val]
            hv.append(sum(vals) / len(vals) if vals else None)
        for u in range(T):
            got = [v for h, v in zip(hunks[b], hv) if v is not None and u in h]
            if got:
                fork = sum(got) / len(got)
            else:
                fork = tok_val.get((b, u), 0.0)
            out[b][u] = ((a_e if episode else 0.0) + lam * fork) * mask[b, u].item()
    return out


def test_vectorised_matches_naive_loop():
    rng = random.Random(7)
    for trial in range(5):
        B, T = 6, 9
        groups = [b // 3 for b in range(B)]
        rewards = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(B)]
        mask = torch.zeros(B, T, dtype=torch.float64)
        hunks = []
        for b in range(B):
            n = rng.randint(3, T)
            mask[b, :n] = 1
            hunks.append([tuple(sorted(rng.sample(range(n), rng.randint(1, 3))))
                          for _ in range(rng.randint(0, 2))])
        F = 8
        rows = [rng.randrange(B) for _ in range(F)]
        ts = [rng.randrange(int(mask[r].sum())) for r in rows]
        r_cf = [rng.choice([0.0, 0.5, 1.0]) for _ in range(F)]
        sites = fork_sites(rows, ts, [rewards[r] for r in rows], r_cf)
        lam, episode = rng.choice([0.5, 1.0, 2.0]), trial % 2 == 0
        inp = AdvantageInput(torch.tensor(rewards, dtype=torch.float64), groups, mask, forks=sites)
        fast, _ = didpo_fork(inp, lam=lam, episode=episode, spread="hunk", hunks=hunks)
        slow = _naive_didpo_fork(rewards, groups, mask, rows, ts, sites.dr.tolist(), hunks,
                                 lam, episode)
        assert _flat(fast.tolist()) == pytest.approx(_flat(slow), abs=1e-9)


def test_hunk_tokens_match_hunk_effects():
    from labkit.loops.hunks import hunk_effects

    task = toy_tasks()[0]  # def inc(x): return x - 1
    code = "def inc(x):\n    y = x\n    return x + 1\n"
    completion = "```python\n" + code + "```"
    offsets = [(m.start(), m.end()) for m in __import__("re").finditer(r"\s*\S{1,3}", completion)]
    r = Rollout(task_id=task.task_id, sample=0, prompt="", prompt_ids=[],
                completion_ids=[5] * len(offsets), logprobs=[0.0] * len(offsets),
                completion=completion, code=code, code_start=completion.index(code),
                offsets=offsets, finished=True)
    toks = hunk_tokens(r, task.buggy_code)
    assert len(toks) == 1 and toks[0]
    ok = SandboxResult(status=Status.PASSED, passed=4, total=4)
    eff = hunk_effects([r], {task.task_id: task}, run=lambda cands: [ok] * len(cands))
    assert [e.tokens for e in eff] == toks
    covered = "".join(completion[a:b] for a, b in (offsets[u] for u in toks[0]))
    assert "y = x" in covered.replace("\n", " ") and "x + 1" in covered


def test_fork_credit_config_validation():
    from labkit.config import ConfigError, from_dict

    with pytest.raises(ValueError, match="position strategy"):
        from_dict(ForkCreditConfig, {"strategy": "middle"})
    with pytest.raises(ConfigError):
        from_dict(ForkCreditConfig, {"baseline": "old"})
    assert from_dict(ForkCreditConfig, {"beta": 0.9}).beta == 0.9


# ----------------------------------------------------------------------------- trainer


def _length_reward(tasks, rollouts):
    """A stand-in for the sandbox: reward from the completion length, so groups and forks
    differ without a trained model."""
    out = []
    for r in rollouts:
        score = (len(r.completion_ids) % 4) / 3
        out.append({"r_test": score, "r_pass": float(score == 1.0)})
    return out


def _fork_cfg(tmp_path, model_dir, *overrides):
    from labkit.config import apply_overrides
    from test_trainer import _cfg

    cfg = _cfg(tmp_path / "run", model_dir, steps=2)
    return apply_overrides(cfg, ["estimator=didpo_fork", "fork.fraction=0.3", "fork.budget=3",
                                 "estimator_options={lam: 1.0, spread: hunk}", *overrides])


def test_trainer_step_with_didpo_fork_ema_kl_and_resume(random_model_dir, tmp_path):
    from labkit.loops.trainer import Trainer

    cfg = _fork_cfg(tmp_path, random_model_dir, "fork.beta=0.5", "fork.kl_to_baseline=true")
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[], reward_fn=_length_reward)
    start = [p.detach().clone() for p in tr.policy.baseline().parameters()]
    rows = tr.train(progress=False)
    tr.close()
    for key in ("fork/n", "fork/tokens_generated", "fork/exec_s", "fork/gen_s", "time/fork",
                "fork/extra_cost", "fork/dr_mean", "fork/token_coverage", "kl/k3"):
        assert key in rows[0], key
    assert rows[0]["fork/n"] > 0 and rows[0]["fork/tokens_generated"] > 0
    assert rows[0]["time/fork"] > 0 and rows[0]["fork/extra_cost"] > 0
    assert max(r["fork/dr_nonzero_frac"] for r in rows) > 0  # forks changed some rewards
    # step 1: the baseline is the starting policy = the policy -> KL 0; step 2: it lags
    assert rows[0]["kl/k3"] == pytest.approx(0.0, abs=1e-6)
    assert rows[1]["kl/k3"] > 0
    # EMA with beta 0.5: the baseline moved, but is not the policy
    base = list(tr.policy.baseline().parameters())
    assert any(not torch.equal(a, b) for a, b in zip(start, base))
    assert any(not torch.equal(a, b) for a, b in zip(base, tr.policy.model.parameters()))
    # checkpoint keeps the baseline; a fresh trainer restores it exactly
    tr2 = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[], reward_fn=_length_reward)
    assert tr2.load_checkpoint() == 2
    for a, b in zip(base, tr2.policy.baseline().parameters()):
        assert torch.equal(a, b)
    tr2.close()


def test_trainer_forks_run_in_the_sandbox_and_frozen_baseline_stays(random_model_dir, tmp_path):
    from labkit.loops.trainer import Trainer

    cfg = _fork_cfg(tmp_path, random_model_dir, "steps=1", "tasks_per_step=1",
                    "sampling.group_size=2", "fork.baseline=frozen")
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[])
    start = [p.detach().clone() for p in tr.policy.baseline().parameters()]
    row = tr.train_step()
    tr.close()
    assert row["fork/n"] > 0 and row["fork/exec_s"] > 0 and "fork/extra_cost" in row
    assert all(torch.equal(a, b) for a, b in zip(start, tr.policy.baseline().parameters()))


# ----------------------------------------------------------------------------- experiment


def test_agreement_metrics_on_constructed_cases():
    assert average_ranks([3, 1, 1, 2]) == [4, 1.5, 1.5, 3]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties: ranks [1, 2.5, 2.5, 4] vs [1, 2, 3, 4] -> 4.5 / sqrt(4.5 * 5) = 0.948683
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.948683, abs=1e-6)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert sign_agreement([1.0, -2.0, 0.0, 5.0], [0.5, 1.0, 1.0, 0.0]) == pytest.approx(1 / 3)
    # credit = 2 x value through a per-token advantage: perfect agreement
    values = [1.0, -0.5, 0.0, 0.25, -1.0]
    adv = torch.zeros(len(values), 4, dtype=torch.float64)
    records = []
    for i, e in enumerate(values):
        adv[i, 1:3] = 2 * e
        adv[i, 0] = 99.0  # outside the hunk: must not count
        records.append({"split": "d", "task_id": f"t{i % 3}", "round": 0, "sample": i, "value": e,
                        "credit": {"aligned": hunk_mean(adv, i, (1, 2)),
                                   "reversed": -hunk_mean(adv, i, (1, 2)), "uniform": 1.0}})
    assert hunk_mean(adv, 0, (0, 1)) == pytest.approx((99 + 2) / 2)
    a = agreement(records, "aligned", n_boot=200, seed=0)
    assert a["spearman"] == pytest.approx(1.0) and a["sign"] == 1.0
    assert a["spearman_ci95"][0] == pytest.approx(1.0)
    r = agreement(records, "reversed", n_boot=50, seed=0)
    assert r["spearman"] == pytest.approx(-1.0) and r["sign"] == 0.0
    u = agreement(records, "uniform", n_boot=50, seed=0)
    assert math.isnan(u["spearman"]) and u["sign"] == pytest.approx(2 / 4)


def test_cli_overrides_select_didpo_fork():
    from labkit.config import ConfigError
    from labkit.loops.trainer import load_config

    cfg = load_config(None, ["estimator=didpo_fork", "fork.strategy=diff", "fork.baseline=frozen",
                             "estimator_options={lam: 0.5, normalise: meanstd}"])
    assert cfg.estimator == "didpo_fork" and cfg.fork.strategy == "diff"
    assert cfg.fork.baseline == "frozen" and cfg.estimator_options == {"lam": 0.5, "normalise": "meanstd"}
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(None, ["fork.fractoin=0.1"])


def test_within_rollout_agreement_removes_between_rollout_signal():
    from labkit.experiments.credit import centred

    # two rollouts, uniform credit per rollout (GRPO-like): no within-rollout signal
    recs = [{"split": "d", "task_id": "t", "round": 0, "sample": s, "value": e,
             "credit": {"uniform": u, "local": e}}
            for s, u, effs in ((0, 0.7, (1.0, 0.0)), (1, -0.7, (0.0, -1.0))) for e in effs]
    w = centred(recs, "uniform")
    assert [r["c"] for r in w] == [0, 0, 0, 0] and [r["v"] for r in w] == [0.5, -0.5, 0.5, -0.5]
    assert math.isnan(agreement(recs, "uniform", n_boot=10, seed=0)["within"])
    assert agreement(recs, "local", n_boot=10, seed=0)["within"] == pytest.approx(1.0)


def test_credit_intervals_resample_whole_tasks():
    """Hunks of one task share its rollouts: the interval resamples tasks (clusters), which
    is wider than resampling hunks one by one when the hunks of a task agree."""
    from labkit.experiments.credit import cluster_interval

    x = [0.0, 0.1, 0.2, 1.0, 1.1, 1.2, 0.5, 0.6, 0.7, 2.0, 2.1, 2.2]
    y = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 2.0, 2.1, 2.2, 0.9, 1.0, 1.1]

    def recs(cluster):
        return [{"split": "d", "task_id": cluster(i), "value": b, "credit": {"x": a}}
                for i, (a, b) in enumerate(zip(x, y))]

    def rho(rs):
        return spearman([r["credit"]["x"] for r in rs], [r["value"] for r in rs])

    pairs = cluster_interval(recs(lambda i: i), rho, 400, 1)
    clustered = cluster_interval(recs(lambda i: i // 3), rho, 400, 1)
    assert clustered[1] - clustered[0] > pairs[1] - pairs[0]
