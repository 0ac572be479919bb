"""The experiments' statistics, each written once: Student-t quantiles, the t-interval over
training seeds, one bootstrap, the verdict rule and the minimum detectable effect.

A training run's effect on held-out pass@1 is measured *paired*: for training seed ``s`` and
task ``i``, ``d_{s,i} = end_{s,i} - start_{s,i}``, the start policy and the run's final
checkpoint evaluated on the same task with the same sampling seed (a sampling seed of its own
per training seed, so the start's sampling noise varies between seeds and the interval over
seeds covers it). Two sources of noise matter: which tasks were drawn and which training seed
ran; on the tiny model the second is the larger one. So:

* :func:`t_interval`: per seed the mean change ``d_s = mean_i d_{s,i}``; the 95% Student-t
  interval ``mean(d_s) +- t_{0.975, n-1} sd(d_s) / sqrt(n)`` over the ``n`` seeds.
* :func:`hierarchical_bootstrap`: seeds resampled, then tasks within each drawn seed; the
  percentile interval of the grand mean (the seed-and-task interval, printed beside the
  t-interval).
* :func:`task_bootstrap`: tasks only (each task's change averaged over seeds), labelled as
  such wherever shown: it ignores seed-to-seed variance.

**The verdict** (:func:`shown`, one rule for every page, the README, the lab report and the
notebooks): a change is *shown* when its 95% t-interval over training seeds excludes 0.
With one seed nothing is shown. A change that is not shown is always printed with the
design's **minimum detectable effect** (:func:`mde`): the smallest true change the same
design (seeds, their spread) finds with 80% power at two-sided 5%,
``MDE = (t_{0.975, n-1} + t_{0.80, n-1}) sd / sqrt(n)``.

Every resampling interval goes through :func:`bootstrap` (one percentile rule,
:func:`percentile_interval`); every t quantile through :func:`t_quantile` (scipy's exact
Student t).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence

LEVEL = 0.95
"""Two-sided confidence level of every interval."""
POWER = 0.80
"""Power of the minimum detectable effect."""
N_BOOT = 2000
"""Bootstrap resamples."""


# ----------------------------------------------------------------------------- t


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (exact, scipy)."""
    if df < 1:
        raise ValueError(f"a t quantile needs at least one degree of freedom (two values), got df={df}")
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(xs: Sequence[float], level: float = LEVEL) -> tuple[float, list[float] | None]:
    """Mean and t-interval ``mean +- t_{(1+level)/2, n-1} sd / sqrt(n)``; ``None`` for one value
    (one seed says nothing about the spread between seeds)."""
    if not xs:
        raise ValueError("t_interval needs at least one value")
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    h = t_quantile((1 + level) / 2, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, [m - h, m + h]


def mde(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float | None:
    """Minimum detectable effect of a paired design over ``n`` seeds with seed-to-seed standard
    deviation ``sd`` (two-sided ``1 - level``, power ``power``):
    ``(t_{(1+level)/2, n-1} + t_{power, n-1}) sd / sqrt(n)``; ``None`` for one seed."""
    if n < 2:
        return None
    df = n - 1
    return (t_quantile((1 + level) / 2, df) + t_quantile(power, df)) * sd / math.sqrt(n)


# ----------------------------------------------------------------------------- bootstrap


def percentile_interval(values: Sequence[float], level: float = LEVEL) -> list[float]:
    """The percentile interval of resampled statistics: with ``v`` sorted and ``n`` values,
    ``[v[floor(a n)], v[ceil((1 - a) n) - 1]]``, ``a = (1 - level) / 2``."""
    v = sorted(values)
    n = len(v)
    if not n:
        raise ValueError("percentile_interval needs at least one value")
    a = (1 - level) / 2
    return [v[int(math.floor(a * n))], v[min(n - 1, int(math.ceil((1 - a) * n)) - 1)]]


def bootstrap_draws(draw: Callable[[random.Random], float], n_boot: int = N_BOOT,
                    seed: int = 0) -> list[float]:
    """``n_boot`` statistics, each ``draw(rng)`` on one resample that ``draw`` makes with
    ``rng`` (a ``random.Random(seed)`` shared by all draws, so they are reproducible); draws
    that return NaN (a statistic undefined on that resample) are left out."""
    rng = random.Random(seed)
    return [x for x in (draw(rng) for _ in range(n_boot)) if x == x]


def bootstrap(draw: Callable[[random.Random], float], n_boot: int = N_BOOT, seed: int = 0,
              level: float = LEVEL) -> list[float]:
    """The percentile interval (:func:`percentile_interval`) of :func:`bootstrap_draws`;
    ``[nan, nan]`` when every draw is undefined."""
    values = bootstrap_draws(draw, n_boot, seed)
    return percentile_interval(values, level) if values else [math.nan, math.nan]


def resample(items: Sequence, rng: random.Random) -> list:
    """``len(items)`` items drawn with replacement."""
    n = len(items)
    return [items[rng.randrange(n)] for _ in range(n)]


def hierarchical_bootstrap(deltas: Sequence[Sequence[float]], n_boot: int = N_BOOT,
                           seed: int = 0) -> list[float] | None:
    """Interval of the grand mean of per-seed, per-task changes ``deltas[s][i]``, resampling
    seeds with replacement, then tasks within each drawn seed (``None`` for one seed)."""
    if len(deltas) < 2:
        return None
    return bootstrap(lambda rng: statistics.fmean(statistics.fmean(resample(d, rng))
                                                  for d in resample(deltas, rng)), n_boot, seed)


def task_bootstrap(deltas: Sequence[Sequence[float]], n_boot: int = N_BOOT,
                   seed: int = 0) -> list[float]:
    """Interval over *tasks only*: each task's change averaged over seeds, tasks resampled.
    Ignores seed-to-seed variance; shown beside the others, labelled."""
    per_task = [statistics.fmean(col) for col in zip(*deltas)]
    return bootstrap(lambda rng: statistics.fmean(resample(per_task, rng)), n_boot, seed)


# ----------------------------------------------------------------------------- changes


def paired_change(per_seed: Mapping[int | str, Sequence[float]], n_boot: int = N_BOOT) -> dict:
    """The results-file record of a paired change from per-seed, per-task changes (every seed
    on the same tasks, in the same order):

    ``mean``, ``ci95`` (t over seeds), ``per_seed`` (each seed's mean), ``per_task`` (the
    per-seed, per-task changes the page and every difference are computed from), ``sd_seeds``,
    ``hierarchical_ci95`` (seeds and tasks), ``task_bootstrap_ci95``, ``mde`` and ``shown``
    (:func:`shown`)."""
    if not per_seed:
        raise ValueError("paired_change needs at least one seed")
    lengths = {len(v) for v in per_seed.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every seed needs the same, non-zero number of tasks; got {sorted(lengths)}")
    deltas = [list(map(float, v)) for v in per_seed.values()]
    means = [statistics.fmean(d) for d in deltas]
    mean, ci = t_interval(means)
    sd = statistics.stdev(means) if len(means) > 1 else None
    rec = {"mean": mean, "ci95": ci, "over": "seeds",
           "per_seed": {str(s): m for s, m in zip(per_seed, means)},
           "per_task": {str(s): d for s, d in zip(per_seed, deltas)},
           "seeds": len(deltas), "tasks": lengths.pop(), "sd_seeds": sd,
           "hierarchical_ci95": hierarchical_bootstrap(deltas, n_boot),
           "task_bootstrap_ci95": task_bootstrap(deltas, n_boot),
           "mde": mde(sd, len(deltas)) if sd is not None else None}
    rec["shown"] = shown(rec)
    return rec


def difference(a: Mapping, b: Mapping, n_boot: int = N_BOOT) -> dict | None:
    """``b - a`` of two :func:`paired_change` records, seed by seed and task by task on the
    seeds both have (same seed = same tasks, start and sampling seed): a :func:`paired_change`
    record of the differences, so it carries the t-interval over seeds, the seed-and-task
    bootstrap and the minimum detectable effect. ``None`` when they share no seed."""
    seeds = [s for s in a["per_seed"] if s in b["per_seed"]]
    if not seeds:
        return None
    if "per_task" in a and "per_task" in b:
        per = {s: [y - x for x, y in zip(a["per_task"][s], b["per_task"][s], strict=True)]
               for s in seeds}
    else:  # records without per-task changes: the seeds' means only
        per = {s: [b["per_seed"][s] - a["per_seed"][s]] for s in seeds}
    return paired_change(per, n_boot)


def shown(change: Mapping) -> bool:
    """The one verdict rule: the 95% t-interval over training seeds excludes 0."""
    ci = change.get("ci95")
    return ci is not None and (ci[0] > 0 or ci[1] < 0)


def verdict(change: Mapping, unit: str = "") -> str:
    """The verdict in words: ``significant over seeds`` (and its direction), or ``not shown;
    this design detects differences of at least X``, or ``one seed: no interval``."""
    if change.get("ci95") is None:
        return "one seed: no interval, not shown"
    if shown(change):
        return f"significant over seeds ({'up' if change['mean'] > 0 else 'down'})"
    m = change.get("mde")
    detect = f"; this design detects differences of at least {m:.3f}{unit}" if m is not None else ""
    return f"not shown{detect}"


def interval_text(lo_hi: Sequence[float] | None, digits: int = 3) -> str:
    """``[+0.031, +0.073]``, or ``n/a``."""
    if lo_hi is None or any(x != x for x in lo_hi):
        return "n/a"
    return f"[{lo_hi[0]:+.{digits}f}, {lo_hi[1]:+.{digits}f}]"


def describe(change: Mapping, digits: int = 3) -> str:
    """``+0.052 [+0.031, +0.073] over 3 seeds (seeds and tasks [+0.028, +0.075]):
    significant over seeds (up)``; a change that is not shown carries the design's MDE."""
    m = change["mean"]
    if change.get("ci95") is None:
        return f"{m:+.{digits}f}, {verdict(change)}"
    h = change.get("hierarchical_ci95")
    beside = f" (seeds and tasks {interval_text(h, digits)})" if h else ""
    return (f"{m:+.{digits}f} {interval_text(change['ci95'], digits)} over {change['seeds']} seeds"
            f"{beside}: {verdict(change)}")


def summary(xs: Sequence[float]) -> dict:
    """``{"mean", "ci95"}`` of per-seed values (:func:`t_interval`), for the periodic readings."""
    mean, ci = t_interval(list(xs))
    return {"mean": mean, "ci95": ci}


def compact(change: Mapping | None) -> dict | None:
    """A paired-change record without its per-task lists: what a `controls` object keeps."""
    if not change:
        return None
    keep = ("mean", "ci95", "hierarchical_ci95", "per_seed", "seeds", "tasks", "sd_seeds", "mde", "shown")
    return {k: change[k] for k in keep if k in change}


def controls(positive: Mapping | None, negative: Mapping | None = None,
             claim: Mapping | None = None) -> dict:
    """The ``controls`` record of an experiment: ``positive`` (the positive control's paired
    change against the baseline: a variant known to be better, e.g. oracle credit),
    ``negative`` (one with no signal, when there is one), ``claim`` (the claimed method's),
    ``mde`` (the design's minimum detectable effect: the claim's when measured, else the
    positive control's) and ``sensitive``: could this testbed see the claimed effect? Yes
    when the positive control is shown up over seeds and larger than the MDE; otherwise
    ``shortfall`` says by how much its mean falls short of the MDE (absent when the mean
    exceeds the MDE but its interval over seeds includes 0)."""
    mde_of = (claim or positive or {}).get("mde")
    pos_mean = positive["mean"] if positive else None
    sensitive = bool(positive and shown(positive) and positive["mean"] > 0
                     and mde_of is not None and positive["mean"] > mde_of)
    out = {"positive": compact(positive), "negative": compact(negative), "claim": compact(claim),
           "mde": mde_of, "sensitive": sensitive}
    if not sensitive and pos_mean is not None and mde_of is not None and pos_mean < mde_of:
        out["shortfall"] = mde_of - pos_mean
    return out
