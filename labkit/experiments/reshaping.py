"""``python -m labkit experiment reshaping``: raw vs reshaped GRPO under weak feedback.

The seed blog claims its reshaping recipe makes GRPO better under *weak* feedback (sparse,
noisy, incomplete tests): +35% over raw-reward GRPO. Here both methods train on the same
tasks with the same seeds under each feedback regime (``dense``: the fraction of hidden tests,
the strong baseline; ``binary``: pass/fail only; ``public``: the visible examples only;
``noisy``: flipped test outcomes), and are evaluated paired on held-out templates against
the hidden tests. The reshaped recipe is ``reshaped_grpo``: the blog's components that can
act under GRPO's per-group standardisation (the composite reward with the precision gate;
batch normalisation, the EMA baseline and a clip at 5 cannot, docs/training.md).

Per regime: each method's paired change with a 95% interval over seeds, and the difference
reshaped - raw, paired by seed (same seed = same tasks, same first samples), with its
interval over seeds; the blog's claim holds only where that interval is above 0 *and* the
relative gain reaches the claimed size (:func:`claim_verdict`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from labkit.credit.reshaping import RECIPES
from labkit.experiments.config import ExperimentConfig
from labkit.experiments.paired import add_paired
from labkit.experiments.runs import run_methods, setting


@dataclass
class Config(ExperimentConfig):
    """The shared budget, plus which regimes and methods run."""

    regimes: tuple[str, ...] = ("dense", "binary", "public")
    """Feedback regimes, each a full comparison (``feedback.mode``)."""
    methods: tuple[str, ...] = ("raw_grpo", "reshaped_grpo")
    """Which of :data:`RESHAPING_METHODS` to run."""


RESHAPING_METHODS = {"raw_grpo": RECIPES["raw"], "reshaped_grpo": RECIPES["reshaped_grpo"]}
"""Method -> its reshaping recipe (both with the ``grpo`` estimator)."""


def method_difference(results: dict, a: str, b: str) -> dict | None:
    """``b - a`` of the paired changes, seed by seed (same seed, same tasks and first
    samples), with a t-interval over seeds; ``None`` when a seed is missing."""
    pa, pb = results["methods"][a]["paired_change"], results["methods"][b]["paired_change"]
    diff = seed_difference(pa, pb)
    if diff is None:
        return None
    start = results["paired"]["start_pass_at_1"]
    end_a, end_b = start + pa["mean"], start + pb["mean"]
    return {**diff, "relative_end": end_b / end_a - 1 if end_a > 0 else None}


def run(exp: Config) -> Path:
    unknown = set(exp.methods) - set(RESHAPING_METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; available: {', '.join(RESHAPING_METHODS)}")
    out: dict = {"experiment": "reshaping", "setting": {**setting(exp), "feedback": list(exp.regimes)},
                 "seeds": list(exp.seeds), "regimes": {}}
    lines = ["# Raw vs reshaped GRPO under weak feedback", "",
             f"Tiny model, {exp.steps} steps of {exp.tasks_per_step} tasks x {exp.group_size} samples "
             f"(T = {exp.temperature}), lr {exp.lr}, KL 0.01; seeds {list(exp.seeds)}; training problems and held-out "
             f"tasks from task seed {exp.task_seed}; held-out split `{exp.split}` (templates training "
             "never saw), always graded on the hidden tests. `raw_grpo`: reward = what the regime "
             "tells; `reshaped_grpo`: the blog's composite reward (gated precision 0.2, style 0.1, "
             "progress 0.05, hack penalty 1.0) on top of it, the components that can act under GRPO.",
             ""]
    for regime in exp.regimes:
        rexp = dataclasses.replace(exp, feedback=regime)
        # raw GRPO under dense feedback is the learning experiment's run when the budgets match
        results = run_methods(f"reshaping/{regime}", {m: RESHAPING_METHODS[m] for m in exp.methods},
                              rexp, aliases={"raw_grpo": "learning/grpo"})
        if exp.paired_tasks:
            add_paired(results, rexp)
        diff = (method_difference(results, "raw_grpo", "reshaped_grpo")
                if exp.paired_tasks and {"raw_grpo", "reshaped_grpo"} <= set(exp.methods) else None)
        results["reshaped_minus_raw"] = diff
        out["regimes"][regime] = results
        lines += [f"## Feedback `{regime}`"] + paired_lines(results)
        if diff is not None:
            verdict = claim_verdict(diff)
            rel = "" if diff["relative_end"] is None else f"; end pass@1 relative {diff['relative_end']:+.1%}"
            lines += [f"reshaped - raw, paired by seed: {describe(diff)}{rel}: **{verdict}** "
                      "(the blog claims +35% relative).", ""]
        _figure(results, Path(exp.out), f"reshaping_{regime}")
        lines += [f"Figure: [reshaping_{regime}.html](reshaping_{regime}.html)", ""]
    out["config"] = results["config"]
    md = Path(exp.out) / "reshaping.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    (md.with_suffix(".json")).write_text(json.dumps(out, indent=2))
    write_markdown(md, "\n".join(lines))
    return md


BLOG_RELATIVE_GAIN = 0.35
"""The seed blog's claim: reshaped GRPO +35% relative over raw-reward GRPO under weak feedback."""


def claim_verdict(diff: dict) -> str:
    """The report's reading of reshaped - raw (paired by seed): the claim holds only when the
    gain is shown (interval over seeds above 0) and its relative size, end pass@1 reshaped
    over raw, reaches :data:`BLOG_RELATIVE_GAIN`; a shown but smaller gain reproduces the
    direction only."""
    if not diff["shown"]:
        return "no difference shown (the interval includes 0)"
    if diff["mean"] < 0:
        return "reshaping is worse here"
    rel = diff.get("relative_end")
    if rel is not None and rel >= BLOG_RELATIVE_GAIN:
        return "the blog's claim holds here"
    size = "" if rel is None else f" ({rel:+.1%} relative)"
    return f"a gain is shown, but far smaller than the claim{size}"

