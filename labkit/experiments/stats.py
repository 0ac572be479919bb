"""The experiments' statistics, each written once: the paired change with seeds and tasks both
random, its minimum detectable effect, method against method, the probability of improvement,
Holm's correction, and how a claim and a control are read.

A training run's effect on held-out pass@1 is measured *paired*: for training seed ``s`` and
task ``i``, ``d_si = end_si - start_si``, the start policy and the run's final checkpoint
evaluated on the same task with the same sampling seed (one sampling seed per training seed).
Three noises sit in ``d``: which training seed ran (``u_s``), which tasks were drawn (``t_i``:
the held-out list is a sample of the tasks the claim is about), and the evaluation's own
sampling plus the seed-by-task interaction (``e_si``). The lab treats seeds and tasks both as
random (Clark 1973's crossed design, "the language-as-fixed-effect fallacy"):

``d_si = mu + u_s + t_i + e_si``, ``u ~ (0, s_u^2)``, ``t ~ (0, s_t^2)``, ``e ~ (0, s_e^2)``.

:func:`crossed` estimates it from the two-way table of ``n`` seeds by ``m`` tasks (one cell
each) by the mean squares of the ANOVA:

* ``MS_seed = m * var_s(dbar_s.)``, expected ``s_e^2 + m s_u^2``;
* ``MS_task = n * var_i(dbar_.i)``, expected ``s_e^2 + n s_t^2``;
* ``MS_res = sum (d_si - dbar_s. - dbar_.i + dbar)^2 / ((n-1)(m-1))``, expected ``s_e^2``.

The variance of the grand mean is ``s_u^2/n + s_t^2/m + s_e^2/(nm) = (MS_seed + MS_task -
MS_res) / (nm)``. Each of ``MS_seed`` and ``MS_task`` is taken no smaller than ``MS_res``
(a variance component is not negative): with three seeds the seed means can agree more closely
than the evaluation noise allows, and then the evaluation noise is what the seed part is
credited with. The interval is ``mean +- t_{0.975, df} se`` with Satterthwaite's ``df``
(about ``n - 1`` when seeds dominate, large when tasks do).

**The verdict** (:func:`shown`, one rule for every page, the README, the lab report and the
notebooks): a change is *shown* when that interval excludes 0. With one seed, training noise is
not measured and nothing is shown. A change that is not shown is printed with the design's
**minimum detectable effect** (:func:`mde_exact`): the true change the same design finds with
80% power at two-sided 5%, from the noncentral t with the same ``se`` and ``df``.

A **claim** (:func:`claim_verdict`) is read against its size from its source: *supported*
(the interval excludes 0 in the claimed direction), *refuted at this scale* (the interval
excludes the claimed size, or half of it: it says which) or *undecided* (it includes both 0
and the claimed size). A **control** (:func:`control_verdict`) has a sign: a positive control
that moves the wrong way, or stays below the smallest detectable effect, *failed*; a negative
control that comes out better than its baseline failed. Every contrast an experiment did not
name as primary before it ran is **exploratory**: its p-values are Holm-corrected over its
page (:func:`holm`).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence

import numpy as np

LEVEL = 0.95
"""Two-sided confidence level of every interval."""
POWER = 0.80
"""Power of the minimum detectable effect."""
ALPHA = 1 - LEVEL
"""Two-sided significance level (the verdict and Holm's correction)."""
N_BOOT = 2000
"""Bootstrap resamples (per-run task intervals and the credit experiment's intervals)."""


# ----------------------------------------------------------------------------- t


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (exact, scipy; a
    Satterthwaite ``df`` need not be whole)."""
    if not df or df <= 0 or df != df:
        raise ValueError(f"a t quantile needs positive degrees of freedom, got df={df}")
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(xs: Sequence[float], level: float = LEVEL) -> tuple[float, list[float] | None]:
    """Mean and t-interval ``mean +- t_{(1+level)/2, n-1} sd / sqrt(n)``; ``None`` for one value
    (one seed says nothing about the spread between seeds). For per-seed readings of one run
    (the periodic evaluations); paired changes use :func:`paired_change`."""
    if not xs:
        raise ValueError("t_interval needs at least one value")
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    h = t_quantile((1 + level) / 2, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, [m - h, m + h]


def power_at(effect: float, se: float, df: float, level: float = LEVEL) -> float:
    """The chance a two-sided t-test at ``1 - level`` with standard error ``se`` and ``df``
    degrees of freedom rejects 0 when the true change is ``effect``: with ``c = t_{(1+level)/2,
    df}`` and noncentrality ``effect / se``, ``P(T' > c) + P(T' < -c)``, ``T'`` noncentral t."""
    from scipy.stats import nct

    c = t_quantile((1 + level) / 2, df)
    nc = abs(effect) / se
    upper, lower = float(nct.sf(c, df, nc)), float(nct.cdf(-c, df, nc))
    # scipy's noncentral t returns NaN far in a tail; the tail's mass there is below 1e-15
    upper = upper if upper == upper else float(nc > c)
    lower = lower if lower == lower else 0.0
    return upper + lower


def mde_exact(se: float, df: float, level: float = LEVEL, power: float = POWER) -> float:
    """Minimum detectable effect: the true change ``delta`` at which :func:`power_at` is
    ``power`` (the exact noncentral t, not the ``(t_a + t_b) se`` approximation, which is a few
    percent low at few degrees of freedom). ``0`` when ``se`` is 0."""
    if se <= 0:
        return 0.0
    from scipy.optimize import brentq

    hi = se * (t_quantile((1 + level) / 2, df) + t_quantile(power, df)) * 2 + se
    while power_at(hi, se, df, level) < power:
        hi *= 2
    return float(brentq(lambda d: power_at(d, se, df, level) - power, 0.0, hi, xtol=se * 1e-9))


def mde(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float | None:
    """Minimum detectable effect of a mean over ``n`` independent values with standard deviation
    ``sd`` (:func:`mde_exact` at ``se = sd / sqrt(n)``, ``n - 1`` degrees of freedom); ``None``
    for one value."""
    if n < 2:
        return None
    return mde_exact(sd / math.sqrt(n), n - 1, level, power)


# ----------------------------------------------------------------------------- crossed


def crossed(deltas: Sequence[Sequence[float]]) -> dict:
    """The crossed seeds-by-tasks analysis of ``deltas[s][i]`` (module docstring): ``mean``,
    ``se`` and ``df`` of the grand mean with seeds and tasks both random, the three mean squares,
    ``sd_seeds`` (the seed means' standard deviation as observed), ``sd_seeds_floor`` (what the
    residual noise alone gives a seed mean, ``sqrt(MS_res / m)``) and ``seed_floor_used`` (the
    observed spread was below it, so the floor stood in). Needs at least two seeds and two
    tasks."""
    d = np.asarray(deltas, dtype=float)  # [n, m]
    n, m = d.shape
    if n < 2 or m < 2:
        raise ValueError(f"the crossed analysis needs at least two seeds and two tasks, got {n} x {m}")
    grand = d.mean()
    seed_means, task_means = d.mean(axis=1), d.mean(axis=0)  # [n], [m]
    ms_seed = m * float(((seed_means - grand) ** 2).sum()) / (n - 1)
    ms_task = n * float(((task_means - grand) ** 2).sum()) / (m - 1)
    resid = d - seed_means[:, None] - task_means[None, :] + grand  # [n, m]
    df_res = (n - 1) * (m - 1)
    ms_res = float((resid ** 2).sum()) / df_res
    seed_floor = ms_seed < ms_res
    total, df = _combined(ms_seed, n - 1, ms_task, m - 1, ms_res, df_res)
    return {"mean": float(grand), "se": math.sqrt(max(total, 0.0) / (n * m)), "df": float(df),
            "ms_seed": ms_seed, "ms_task": ms_task, "ms_res": ms_res,
            "sd_seeds": float(seed_means.std(ddof=1)), "sd_seeds_floor": math.sqrt(ms_res / m),
            "seed_floor_used": bool(seed_floor)}


def _combined(ms_seed: float, df_seed: float, ms_task: float, df_task: float, ms_res: float,
              df_res: float) -> tuple[float, float]:
    """``max(MS_seed, MS_res) + max(MS_task, MS_res) - MS_res`` and its Satterthwaite df
    (``(sum c_k MS_k)^2 / sum (c_k MS_k)^2 / df_k``); a term floored at ``MS_res`` cancels
    against ``-MS_res`` exactly, leaving the other terms and their df."""
    terms = [(x, f) for x, f in ((ms_seed, df_seed), (ms_task, df_task)) if x > ms_res]
    if len(terms) == 2:
        terms.append((-ms_res, df_res))
    elif not terms:
        terms = [(ms_res, df_res)]
    total = sum(x for x, _ in terms)
    denom = sum(x * x / f for x, f in terms)
    return total, (total * total / denom if denom > 0 else float(df_res))


def components(deltas: Sequence[Sequence[float]]) -> dict:
    """The crossed design's variance components from a two-way table (:func:`crossed`):
    ``seed = max(0, (MS_seed - MS_res) / m)``, ``task = max(0, (MS_task - MS_res) / n)``,
    ``residual = MS_res``: what a design with other numbers of seeds and tasks would see."""
    c = crossed(deltas)
    n, m = len(deltas), len(deltas[0])
    return {"seed": max(0.0, (c["ms_seed"] - c["ms_res"]) / m),
            "task": max(0.0, (c["ms_task"] - c["ms_res"]) / n), "residual": c["ms_res"]}


def design_mde(comp: Mapping[str, float], seeds: int, tasks: int, level: float = LEVEL,
               power: float = POWER) -> float:
    """The MDE a design of ``seeds`` x ``tasks`` would have with variance components ``comp``
    (:func:`components`): ``se^2 = s_u^2 / n + s_t^2 / m + s_e^2 / (n m)`` and Satterthwaite's
    df from the expected mean squares (``MS_seed = s_e^2 + m s_u^2`` on ``n - 1`` df,
    ``MS_task = s_e^2 + n s_t^2`` on ``m - 1``, ``MS_res = s_e^2`` on ``(n-1)(m-1)``), a zero
    component dropped as :func:`crossed` drops a floored one. At the measured design it gives
    the recorded MDE."""
    n, m = seeds, tasks
    if n < 2 or m < 2:
        raise ValueError("a design needs at least two seeds and two tasks")
    r = comp["residual"]
    total, df = _combined(r + m * comp["seed"], n - 1, r + n * comp["task"], m - 1, r,
                          (n - 1) * (m - 1))
    return mde_exact(math.sqrt(max(total, 0.0) / (n * m)), df, level, power)


def seeds_needed(comp: Mapping[str, float], tasks: int, target: float, most: int = 64) -> int | None:
    """The fewest training seeds (2 to ``most``) whose design on ``tasks`` tasks detects
    ``target`` (:func:`design_mde` at most ``target``); ``None`` when even ``most`` cannot."""
    for n in range(2, most + 1):
        if design_mde(comp, n, tasks) <= target:
            return n
    return None


def p_value(mean: float, se: float, df: float) -> float:
    """Two-sided p of the t-test of ``mean = 0`` (1 when ``se`` is 0 and ``mean`` is 0)."""
    if se <= 0:
        return 1.0 if mean == 0 else 0.0
    from scipy.stats import t

    return float(2 * t.sf(abs(mean) / se, df))


# ----------------------------------------------------------------------------- changes


def paired_change(per_seed: Mapping[int | str, Sequence[float]],
                  task_ids: Sequence[str] | None = None) -> dict:
    """The results-file record of a paired change from per-seed, per-task changes (every seed
    on the same tasks, in the order of ``task_ids``):

    ``mean``; ``ci95``, ``se``, ``df`` and ``p`` with seeds and tasks both random
    (:func:`crossed`); ``mde`` (:func:`mde_exact` at that ``se`` and ``df``); ``shown``
    (:func:`shown`); ``per_seed`` (each seed's mean), ``per_task`` (the per-seed, per-task
    changes every difference is computed from), ``task_ids``; ``sd_seeds``, ``sd_seeds_floor``
    and ``seed_floor_used``; ``ci95_seeds`` (the t interval over the seed means alone, printed
    for comparison, never the verdict). One seed: ``ci95`` is ``None`` and nothing is shown."""
    if not per_seed:
        raise ValueError("paired_change needs at least one seed")
    lengths = {len(v) for v in per_seed.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every seed needs the same, non-zero number of tasks; got {sorted(lengths)}")
    n_tasks = lengths.pop()
    if task_ids is not None and len(task_ids) != n_tasks:
        raise ValueError(f"{len(task_ids)} task ids for {n_tasks} tasks per seed")
    deltas = [list(map(float, v)) for v in per_seed.values()]
    means = [statistics.fmean(d) for d in deltas]
    rec = {"mean": statistics.fmean(means), "ci95": None, "se": None, "df": None, "p": None,
           "mde": None, "over": "seeds and tasks",
           "per_seed": {str(s): m for s, m in zip(per_seed, means)},
           "per_task": {str(s): d for s, d in zip(per_seed, deltas)},
           "task_ids": list(task_ids) if task_ids is not None else None,
           "seeds": len(deltas), "tasks": n_tasks,
           "sd_seeds": statistics.stdev(means) if len(means) > 1 else None,
           "ci95_seeds": t_interval(means)[1]}
    if len(deltas) > 1 and n_tasks > 1:
        c = crossed_interval(deltas)
        rec.update(ci95=c["ci95"], se=c["se"], df=c["df"], p=p_value(c["mean"], c["se"], c["df"]),
                   mde=mde_exact(c["se"], c["df"]), sd_seeds_floor=c["sd_seeds_floor"],
                   seed_floor_used=c["seed_floor_used"])
    rec["shown"] = shown(rec)
    return rec


def crossed_interval(deltas: Sequence[Sequence[float]], level: float = LEVEL) -> dict:
    """:func:`crossed` with ``ci95``, ``mean +- t_{(1+level)/2, df} se``: the interval the
    verdict reads."""
    c = crossed(deltas)
    h = t_quantile((1 + level) / 2, c["df"]) * c["se"]
    return {**c, "ci95": [c["mean"] - h, c["mean"] + h]}


def _aligned(a: Mapping, b: Mapping, seed: str) -> tuple[list[float], list[float], list[str] | None]:
    """Seed ``seed``'s per-task changes of ``a`` and ``b`` on the tasks both hold, paired by
    task id where both records carry ids (else by position, which needs equal lengths)."""
    xa, xb = a["per_task"][seed], b["per_task"][seed]
    ia, ib = a.get("task_ids"), b.get("task_ids")
    if ia is not None and ib is not None:
        where = {t: j for j, t in enumerate(ib)}
        keep = [(i, where[t]) for i, t in enumerate(ia) if t in where]
        if not keep:
            raise ValueError("the two changes share no task id: they were measured on other lists")
        return [xa[i] for i, _ in keep], [xb[j] for _, j in keep], [ia[i] for i, _ in keep]
    if len(xa) != len(xb):
        raise ValueError(f"{len(xa)} and {len(xb)} tasks and no task ids to pair them by")
    return list(xa), list(xb), ia or ib


def difference(a: Mapping, b: Mapping) -> dict | None:
    """``b - a`` of two :func:`paired_change` records, seed by seed and task by task on the
    seeds and tasks both have (same seed = same start and sampling seed; tasks paired by id):
    a :func:`paired_change` record of the differences, plus ``poi``, the probability of
    improvement of ``b`` over ``a`` (:func:`probability_of_improvement`). ``None`` when they
    share no seed. Records without per-task changes give the seeds' means only."""
    seeds = [s for s in a["per_seed"] if s in b["per_seed"]]
    if not seeds:
        return None
    if "per_task" in a and "per_task" in b:
        per, pairs, ids = {}, {}, None
        for s in seeds:
            xa, xb, ids = _aligned(a, b, s)
            per[s] = [y - x for x, y in zip(xa, xb)]
            pairs[s] = (xa, xb)
        rec = paired_change(per, ids)
        rec["poi"] = probability_of_improvement([pairs[s][0] for s in seeds],
                                                [pairs[s][1] for s in seeds])
        return rec
    return paired_change({s: [b["per_seed"][s] - a["per_seed"][s]] for s in seeds})


def probability_of_improvement(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """``P(X_b > X_a)`` for a random task, ``X_a`` and ``X_b`` the scores of a random run of
    each method on it (ties count one half), averaged over tasks: the Mann-Whitney statistic
    per task over the two methods' runs, as Agarwal et al. 2021 (``rliable``) define it.
    ``a[s][i]``, ``b[s][i]``: seed ``s``'s score on task ``i`` (here each run's paired change,
    so every run is read against its own start)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)  # [n_a, m], [n_b, m]
    if xa.shape[1] != xb.shape[1] or not xa.size or not xb.size:
        raise ValueError("probability_of_improvement needs runs on the same, non-zero number of tasks")
    gt = (xb[:, None, :] > xa[None, :, :]).mean(axis=(0, 1))  # [m]
    eq = (xb[:, None, :] == xa[None, :, :]).mean(axis=(0, 1))  # [m]
    return float((gt + 0.5 * eq).mean())


def shown(change: Mapping) -> bool:
    """The one verdict rule: the 95% interval with seeds and tasks both random excludes 0."""
    ci = change.get("ci95")
    return ci is not None and (ci[0] > 0 or ci[1] < 0)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: with ``p_(1) <= ... <= p_(k)``,
    ``p~_(j) = max_{l <= j} min(1, (k - l + 1) p_(l))``. A contrast is shown at 5% family-wise
    error when its adjusted p is below 0.05."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        out[i] = running
    return out


# ----------------------------------------------------------------------------- reading


def verdict(change: Mapping, unit: str = "") -> str:
    """The verdict in words: ``shown (up)``, ``not shown; this design detects differences of at
    least X``, ``not shown; no variation between seeds and tasks: cannot estimate what this
    design detects`` or ``one seed: training noise not measured, not shown``."""
    if change.get("ci95") is None:
        return "one seed: training noise not measured, not shown"
    if shown(change):
        return f"shown ({'up' if change['mean'] > 0 else 'down'})"
    m = change.get("mde")
    if not m:
        return "not shown; no variation between seeds and tasks: cannot estimate what this design detects"
    return f"not shown; this design detects differences of at least {m:.3f}{unit}"


def claim_verdict(change: Mapping | None, direction: int, size: float | None) -> dict:
    """A claim read against its size (module docstring). ``direction``: +1 (the claimed method
    is better) or -1; ``size``: the claimed effect in the change's units (``None``: only a
    direction is claimed). Returns ``{"verdict", "why"}``: ``supported``, ``refuted at this
    scale`` or ``undecided``."""
    if not change or change.get("ci95") is None:
        return {"verdict": "undecided", "why": "one seed: no interval"}
    lo, hi = (x * direction for x in change["ci95"])
    lo, hi = min(lo, hi), max(lo, hi)  # the interval in the claimed direction
    if size is not None:
        s = abs(size)
        if hi < s / 2:
            more = "; a smaller effect in the claimed direction is shown" if lo > 0 else ""
            return {"verdict": "refuted at this scale",
                    "why": f"the interval excludes half the claimed {_signed(direction * s)}{more}"}
        if lo > 0:
            why = "the interval excludes 0 in the claimed direction"
            if hi < s:
                why += f", and the claimed {_signed(direction * s)} (the effect is smaller)"
            return {"verdict": "supported", "why": why}
        if hi < s:
            return {"verdict": "refuted at this scale",
                    "why": f"the interval excludes the claimed {_signed(direction * s)}"}
        return {"verdict": "undecided",
                "why": f"the interval includes 0 and the claimed {_signed(direction * s)}"}
    if lo > 0:
        return {"verdict": "supported", "why": "the interval excludes 0 in the claimed direction"}
    if hi < 0:
        return {"verdict": "refuted at this scale",
                "why": "the interval lies wholly on the other side of 0 (no size is claimed)"}
    return {"verdict": "undecided", "why": "the interval includes 0 (no size is claimed)"}


def control_verdict(change: Mapping | None, direction: int, mde_of_claim: float | None) -> dict:
    """A control read with its sign. ``direction`` +1: a positive control (a variant known to
    be better); it passes when its interval excludes 0 upward and its mean is at least the
    claim's smallest detectable effect (else the harness could not see an effect the size of
    what it does). ``direction`` 0: a negative control (no signal); it passes unless it comes
    out better than its baseline. Returns ``{"passed", "why"}``; never arithmetic across signs."""
    if not change or change.get("ci95") is None:
        return {"passed": False, "why": "the control failed: one seed, no interval"}
    lo, hi = change["ci95"]
    if direction == 0:
        if lo > 0:
            return {"passed": False, "why": "the control failed: it came out better than its "
                                            "baseline, so something besides the signal moved it"}
        return {"passed": True, "why": "no better than its baseline, as expected"}
    lo, hi = sorted((direction * lo, direction * hi))
    mean = direction * change["mean"]
    if hi < 0:
        return {"passed": False, "why": "the control failed: it moved the wrong way"}
    if lo <= 0:
        return {"passed": False, "why": "the control failed: its interval includes 0"}
    if mde_of_claim is not None and mean < mde_of_claim:
        return {"passed": False, "why": f"the control failed: shown, but {mean:.3f} is below the "
                                        f"smallest effect the claim's design detects ({mde_of_claim:.3f})"}
    return {"passed": True, "why": "shown in the expected direction, at least the smallest "
                                   "detectable effect"}


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def interval_text(lo_hi: Sequence[float] | None, digits: int = 3) -> str:
    """``[+0.031, +0.073]``, or ``n/a``."""
    if lo_hi is None or any(x != x for x in lo_hi):
        return "n/a"
    return f"[{lo_hi[0]:+.{digits}f}, {lo_hi[1]:+.{digits}f}]"


def describe(change: Mapping, digits: int = 3) -> str:
    """``+0.052 [+0.031, +0.073] over 3 seeds and 200 tasks: shown (up)``; a change that is not
    shown carries the design's MDE."""
    m = change["mean"]
    if change.get("ci95") is None:
        return f"{m:+.{digits}f}, {verdict(change)}"
    return (f"{m:+.{digits}f} {interval_text(change['ci95'], digits)} over {change['seeds']} seeds "
            f"and {change['tasks']} tasks: {verdict(change)}")


def summary(xs: Sequence[float]) -> dict:
    """``{"mean", "ci95"}`` of per-seed values (:func:`t_interval`), for the periodic readings."""
    mean, ci = t_interval(list(xs))
    return {"mean": mean, "ci95": ci}


def compact(change: Mapping | None) -> dict | None:
    """A paired-change record without its per-task lists: what a summary keeps."""
    if not change:
        return None
    keep = ("mean", "ci95", "se", "df", "p", "mde", "per_seed", "seeds", "tasks", "sd_seeds",
            "sd_seeds_floor", "seed_floor_used", "ci95_seeds", "shown", "poi")
    return {k: change[k] for k in keep if k in change}


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
