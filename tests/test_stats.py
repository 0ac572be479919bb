"""Intervals over seeds for paired changes: golden numbers and a naive second implementation."""

import math
import random
import statistics

import pytest

from labkit.experiments import stats


def test_t_interval_golden():
    m, ci = stats.t_interval([0.023, 0.022, 0.006])  # raw GRPO's three paired changes
    assert m == pytest.approx(0.017)
    h = 4.303 * statistics.stdev([0.023, 0.022, 0.006]) / math.sqrt(3)
    assert ci == pytest.approx([0.017 - h, 0.017 + h]) and ci[0] < 0  # includes 0: not shown
    assert stats.t_interval([0.4]) == (0.4, None)
    assert stats.t_quantile(40) == 1.96 and stats.t_quantile(11) == 2.228


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
