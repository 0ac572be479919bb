"""Intervals over seeds for paired changes: golden numbers and a naive second implementation."""

import math
import random
import statistics

import pytest

from labkit.experiments import stats


def test_t_interval_golden():
    m, ci = stats.t_interval([0.023, 0.022, 0.006])  # raw GRPO's three paired changes
    assert m == pytest.approx(0.017)
    h = 4.3027 * statistics.stdev([0.023, 0.022, 0.006]) / math.sqrt(3)
    assert ci == pytest.approx([0.017 - h, 0.017 + h], abs=1e-5) and ci[0] < 0  # includes 0
    assert stats.t_interval([0.4]) == (0.4, None)
    # printed tables: t(0.975, 11) = 2.201, t(0.975, 40) = 2.021, t(0.80, 4) = 0.941
    assert stats.t_quantile(0.975, 11) == pytest.approx(2.201, abs=1e-3)
    assert stats.t_quantile(0.975, 40) == pytest.approx(2.021, abs=1e-3)
    assert stats.t_quantile(0.80, 4) == pytest.approx(0.941, abs=1e-3)


def test_t_quantile_matches_the_closed_form_at_two_degrees_of_freedom():
    # a second implementation: with 2 df, t_p = (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.6, 0.8, 0.9, 0.975, 0.995):
        assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)))


def test_minimum_detectable_effect_golden():
    # (t_{0.975,2} + t_{0.80,2}) * sd / sqrt(3) = (4.3027 + 1.0607) * 0.01 / 1.7321
    assert stats.mde(0.01, 3) == pytest.approx(5.3634 * 0.01 / math.sqrt(3), abs=1e-5)
    assert stats.mde(0.01, 1) is None
    assert stats.mde(0.01, 10) < stats.mde(0.01, 3)  # more seeds detect smaller changes


def test_one_verdict_rule_with_the_design_s_reach_beside_a_null():
    up = stats.paired_change({0: [0.1, 0.2], 1: [0.15, 0.15], 2: [0.2, 0.1]}, n_boot=200)
    assert stats.shown(up) and stats.verdict(up) == "significant over seeds (up)"
    null = stats.paired_change({0: [0.1, 0.0], 1: [-0.1, 0.0], 2: [0.05, 0.0]}, n_boot=200)
    assert not stats.shown(null) and null["shown"] is False
    assert stats.verdict(null) == f"not shown; this design detects differences of at least {null['mde']:.3f}"
    assert null["mde"] == pytest.approx(stats.mde(statistics.stdev([0.05, -0.05, 0.025]), 3))
    assert "one seed" in stats.verdict(stats.paired_change({0: [0.3, 0.3]}))


def test_difference_of_two_methods_is_paired_by_seed_and_task():
    a = stats.paired_change({0: [0.0, 0.5], 1: [0.25, 0.25]}, n_boot=200)
    b = stats.paired_change({0: [0.25, 0.5], 1: [0.5, 0.5]}, n_boot=200)
    d = stats.difference(a, b)
    assert d["per_task"] == {"0": [0.25, 0.0], "1": [0.25, 0.25]}
    assert d["per_seed"] == {"0": pytest.approx(0.125), "1": pytest.approx(0.25)}
    assert d["hierarchical_ci95"] is not None and d["seeds"] == 2
    assert stats.difference(a, stats.paired_change({7: [0.1, 0.1]})) is None  # no shared seed


def test_percentile_rule_and_bootstrap_against_a_naive_loop():
    values = list(range(1, 201))
    assert stats.percentile_interval(values) == [6, 195]  # v[floor(5)], v[ceil(195) - 1]
    data = [0.1, 0.4, 0.2, 0.9, 0.5]
    got = stats.bootstrap(lambda rng: statistics.fmean(stats.resample(data, rng)), n_boot=100, seed=2)
    r = random.Random(2)
    means = sorted(statistics.fmean(data[r.randrange(5)] for _ in range(5)) for _ in range(100))
    assert got == [means[2], means[97]]


def test_paired_change_record():
    per_seed = {0: [0.0, 0.25, 0.5], 1: [0.25, 0.25, 0.25], 2: [0.5, 0.0, 0.25]}
    rec = stats.paired_change(per_seed, n_boot=500)
    assert rec["over"] == "seeds" and rec["seeds"] == 3 and rec["tasks"] == 3
    assert rec["per_seed"] == {"0": 0.25, "1": 0.25, "2": 0.25}
    assert rec["mean"] == pytest.approx(0.25) and rec["ci95"] == pytest.approx([0.25, 0.25])
    assert rec["shown"] is True
    one = stats.paired_change({0: [0.1, 0.3]})
    assert one["ci95"] is None and one["hierarchical_ci95"] is None and one["shown"] is False
    assert "one seed: no interval" in stats.describe(one)
    with pytest.raises(ValueError, match="same, non-zero number of tasks"):
        stats.paired_change({0: [0.1], 1: [0.1, 0.2]})


def test_hierarchical_bootstrap_matches_a_naive_loop():
    rng = random.Random(3)
    deltas = [[rng.choice([-0.25, 0.0, 0.25, 0.5]) for _ in range(20)] for _ in range(4)]
    got = stats.hierarchical_bootstrap(deltas, n_boot=300, seed=7)
    r = random.Random(7)  # the same draws, written out
    means = []
    for _ in range(300):
        picked = [deltas[r.randrange(4)] for _ in range(4)]
        means.append(sum(sum(d[r.randrange(20)] for _ in range(20)) / 20 for d in picked) / 4)
    means.sort()
    assert got == pytest.approx([means[int(0.025 * 300)], means[math.ceil(0.975 * 300) - 1]])
    # the seed-resampling interval is wider than the task-only one when seeds disagree
    apart = [[0.3] * 20, [0.0] * 20, [-0.2] * 20]
    hier, task = stats.hierarchical_bootstrap(apart, 400), stats.task_bootstrap(apart, 400)
    assert hier[1] - hier[0] > task[1] - task[0]
