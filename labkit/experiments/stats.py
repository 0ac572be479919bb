"""Intervals for paired changes that include seed-to-seed variance.

A training run's effect on held-out pass@1 is measured *paired*: the start policy and the
run's checkpoint on the same tasks with the same sampling seed, ``d_{s,i} = end_{s,i} -
start_i`` for training seed ``s`` and task ``i``. Two sources of noise matter: which tasks
were drawn, and which training seed ran. An interval over tasks alone (what a single run
gives) says nothing about the second, which on the tiny model is the larger one. So:

* :func:`t_interval`: per seed the mean change ``d_s = mean_i d_{s,i}``; the 95% Student-t
  interval of the ``d_s`` over seeds (``n - 1`` degrees of freedom). This is the headline.
* :func:`hierarchical_bootstrap`: resample seeds, then tasks within each drawn seed; the
  percentile interval of the grand mean. It uses the task-level spread too.
* :func:`task_bootstrap`: tasks only, pooled over seeds, labelled as such wherever shown.

:func:`paired_change` bundles them in the record every ``docs/results/<name>.json`` uses:
``{"mean", "ci95": [lo, hi], "over": "seeds", "per_seed": {...}, ...}``. With one seed there
is no interval over seeds: ``ci95`` is ``None``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

# two-sided 95% Student t quantiles, df -> t
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_quantile(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (table, then the
    nearest smaller tabulated df, 1.96 beyond 30)."""
    if df < 1:
        raise ValueError("a t interval needs at least two values")
    if df > 30:
        return 1.96
    return _T95[max(d for d in _T95 if d <= df)]


def t_interval(xs: Sequence[float]) -> tuple[float, list[float] | None]:
    """Mean and 95% t-interval ``mean ± t_{n-1} s / sqrt(n)``; ``None`` for one value."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    h = t_quantile(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, [m - h, m + h]


def _percentiles(values: list[float]) -> list[float]:
    values = sorted(values)
    n = len(values)
    return [values[int(0.025 * n)], values[min(n - 1, int(math.ceil(0.975 * n)) - 1)]]


def hierarchical_bootstrap(deltas: Sequence[Sequence[float]], n_boot: int = 2000,
                           seed: int = 0) -> list[float] | None:
    """95% percentile interval of the grand mean of per-seed, per-task changes, resampling
    seeds with replacement and then tasks within each drawn seed (``None`` for one seed)."""
    if len(deltas) < 2:
        return None
    rng = random.Random(seed)
    means = []
    for _ in range(n_boot):
        seeds = [deltas[rng.randrange(len(deltas))] for _ in deltas]
        means.append(statistics.fmean(statistics.fmean(d[rng.randrange(len(d))] for _ in d)
                                      for d in seeds))
    return _percentiles(means)


def task_bootstrap(deltas: Sequence[Sequence[float]], n_boot: int = 2000,
                   seed: int = 0) -> list[float]:
    """95% percentile interval over *tasks only*: each task's change averaged over seeds,
    tasks resampled. Ignores seed-to-seed variance; shown beside the others, labelled."""
    per_task = [statistics.fmean(col) for col in zip(*deltas)]
    rng = random.Random(seed)
    n = len(per_task)
    return _percentiles([statistics.fmean(per_task[rng.randrange(n)] for _ in range(n))
                         for _ in range(n_boot)])


def paired_change(per_seed: Mapping[int | str, Sequence[float]], n_boot: int = 2000) -> dict:
    """The results-file record of a method's paired change from per-seed, per-task
    changes (every seed on the same tasks, in the same order)."""
    if not per_seed:
        raise ValueError("paired_change needs at least one seed")
    lengths = {len(v) for v in per_seed.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every seed needs the same, non-zero number of tasks; got {sorted(lengths)}")
    deltas = [list(v) for v in per_seed.values()]
    means = [statistics.fmean(d) for d in deltas]
    mean, ci = t_interval(means)
    return {"mean": mean, "ci95": ci, "over": "seeds",
            "per_seed": {str(s): m for s, m in zip(per_seed, means)},
            "seeds": len(deltas), "tasks": lengths.pop(),
            "hierarchical_ci95": hierarchical_bootstrap(deltas, n_boot),
            "task_bootstrap_ci95": task_bootstrap(deltas, n_boot),
            "shown": ci is not None and (ci[0] > 0 or ci[1] < 0)}


def seed_difference(a: Mapping, b: Mapping) -> dict | None:
    """``b - a`` of two :func:`paired_change` records, seed by seed on the seeds both have
    (same seed = same tasks, start and sampling seed), with the t-interval over those seeds;
    ``None`` when they share no seed."""
    seeds = [s for s in a["per_seed"] if s in b["per_seed"]]
    if not seeds:
        return None
    diffs = [b["per_seed"][s] - a["per_seed"][s] for s in seeds]
    mean, ci = t_interval(diffs)
    return {"mean": mean, "ci95": ci, "over": "seeds", "per_seed": dict(zip(seeds, diffs)),
            "seeds": len(seeds), "shown": ci is not None and (ci[0] > 0 or ci[1] < 0)}


def describe(change: Mapping) -> str:
    """``+0.052 [+0.031, +0.073] over 3 seeds`` / ``+0.012, one seed: no interval``."""
    m = change["mean"]
    if change["ci95"] is None:
        return f"{m:+.3f}, one seed: no interval"
    lo, hi = change["ci95"]
    verdict = "" if change["shown"] else " (not shown: the interval includes 0)"
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] over {change['seeds']} seeds{verdict}"
