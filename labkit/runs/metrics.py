"""Training metrics: pure functions returning flat, namespaced dicts (``reward/mean``,
``len/mean``, ``hack/sys_exit``...). The trainer merges them into one row per step of
``metrics.jsonl``, which widgets, notebooks and CI all read."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Mapping, Sequence


def _stats(prefix: str, xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {f"{prefix}/mean": statistics.fmean(xs),
            f"{prefix}/std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
            f"{prefix}/max": max(xs), f"{prefix}/min": min(xs)}


def reward_metrics(rewards: Sequence[float], components: Sequence[Mapping[str, float]]) -> dict:
    """``reward/*`` for the reshaped reward and ``reward/<component>`` means."""
    out = _stats("reward", list(rewards))
    for key in sorted({k for c in components for k in c}):
        out[f"reward/{key}"] = statistics.fmean(c.get(key, 0.0) for c in components)
    return out


def length_metrics(n_tokens: Sequence[int], finished: Sequence[bool]) -> dict:
    return {**_stats("len", [float(n) for n in n_tokens]),
            "len/truncated_frac": 1 - statistics.fmean(float(f) for f in finished) if finished else 0.0}


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct-n (Li et al. 2016): unique n-grams / all n-grams over whitespace tokens."""
    grams = [tuple(t.split()[i:i + n]) for t in texts for i in range(max(0, len(t.split()) - n + 1))]
    return len(set(grams)) / len(grams) if grams else 0.0


def diversity_metrics(codes_by_group: Mapping[str, Sequence[str]]) -> dict:
    """``div/distinct2`` over all completions, ``div/unique_frac`` = distinct programs per group."""
    all_codes = [c for cs in codes_by_group.values() for c in cs]
    uniq = [len(set(cs)) / len(cs) for cs in codes_by_group.values() if cs]
    return {"div/distinct2": distinct_n(all_codes, 2),
            "div/unique_frac": statistics.fmean(uniq) if uniq else 0.0}


def hack_metrics(flags: Sequence[Sequence[str]], names: Sequence[str] = ()) -> dict:
    """Reward-hacking monitor: ``hack/any`` and ``hack/<flag>``, the share of samples flagged."""
    n = max(1, len(flags))
    counts = Counter(f for fs in flags for f in set(fs))
    out = {"hack/any": sum(bool(fs) for fs in flags) / n}
    for name in sorted(set(names) | set(counts)):
        out[f"hack/{name}"] = counts.get(name, 0) / n
    return out


def compile_metrics(syntax_errors: Sequence[bool], r_compile: Sequence[float]) -> dict:
    """``compile/syntax_error``: share of candidates that do not parse; ``compile/fail``: share
    with ``r_compile = 0`` (unparsable, or the module fails to load). Kept apart from the hack
    monitor: a syntax error is a failed attempt, not a reward hack."""
    n = max(1, len(r_compile))
    return {"compile/syntax_error": sum(map(bool, syntax_errors)) / n,
            "compile/fail": sum(r < 1.0 for r in r_compile) / n}


def status_metrics(statuses: Sequence[str]) -> dict:
    """``exec/<status>``: share of each sandbox status in the batch."""
    n = max(1, len(statuses))
    return {f"exec/{s}": c / n for s, c in sorted(Counter(statuses).items())}


def average_ranks(xs) -> list[float]:
    """Ranks 1..n, ties sharing the mean of their positions."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
