"""``python -m labkit experiment reshaping``: does the blog's reward reshaping help GRPO under
sparse feedback, and could this testbed see it if it did?

The seed blog claims its recipe makes GRPO better under *weak* feedback: +35% over raw-reward
GRPO. Reshaping should matter most where rewards are sparse, so every method trains under
``binary`` feedback (pass/fail only) on a **sparse mix**: two-bug tasks of the training
templates the starting policy rarely repairs (``templates``; most groups start all-equal).

* ``raw_grpo``: the reward is what the regime tells;
* ``reshaped_grpo``: the composite reward (gated precision, style, progress, hack penalty);
* ``reshaped_full``: every component of the blog that can act under GRPO's per-group
  standardisation (docs/training.md, "Which components can act"): the composite, piecewise
  amplification of large advantages, a focus threshold that damps small ones, and the
  learnability curriculum; batch normalisation, the EMA baseline and a clip at 5 are affine or
  never bind under GRPO and are left out;
* ``full-<component>``: ``reshaped_full`` with one component switched off (leave one out).

**Positive control**: ``raw_grpo_dense``, raw GRPO told the fraction of hidden tests on the
same mix, against ``raw_grpo`` under ``binary``: a denser signal should learn faster. If even
that is not shown, the harness cannot see reward-shaping effects of this size.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from labkit.credit.reshaping import COMPONENT_OFF, RECIPES, ReshapeConfig
from labkit.env.tasks import load_tasks
from labkit.experiments import pages, stats
from labkit.experiments.config import ExperimentConfig, command
from labkit.experiments.paired import add_paired
from labkit.experiments.runs import run_methods, training_record
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import load_policy, weights_fingerprint

TITLE = "Reward reshaping for GRPO under sparse feedback"


def full_recipe() -> ReshapeConfig:
    """The blog's recipe with every component that acts under GRPO: the composite reward
    (``reshaped_grpo``), piecewise amplification (``|A| > 1`` doubled: the blog's "分段放大"),
    and a focus threshold (``|A| < 0.5`` damped to a tenth: the blog's suppressed low-advantage
    samples). The curriculum is the trainer's (``TrainConfig.curriculum``)."""
    return dataclasses.replace(RECIPES["reshaped_grpo"](), amplify="piecewise", amplify_scale=2.0,
                               focus_threshold=0.5, focus_damping=0.1)


LEAVE_ONE_OUT = ("composite", "amplify", "focus", "curriculum")
"""The components of :func:`full_recipe` that act under GRPO, each switched off in turn."""


def method_config(method: str) -> tuple[ReshapeConfig, bool, str | None]:
    """``(recipe, curriculum, feedback override)`` of a method name."""
    if method == "raw_grpo":
        return RECIPES["raw"](), False, None
    if method == "raw_grpo_dense":
        return RECIPES["raw"](), False, "dense"
    if method == "reshaped_grpo":
        return RECIPES["reshaped_grpo"](), False, None
    if method == "reshaped_full":
        return full_recipe(), True, None
    if method.startswith("full-") and method[5:] in LEAVE_ONE_OUT:
        off = method[5:]
        if off == "curriculum":
            return full_recipe(), False, None
        return dataclasses.replace(full_recipe(), **COMPONENT_OFF[off]), True, None
    raise ValueError(f"unknown reshaping method {method!r}; choose raw_grpo, raw_grpo_dense, "
                     f"reshaped_grpo, reshaped_full or full-<{'|'.join(LEAVE_ONE_OUT)}>")


@dataclass
class Config(ExperimentConfig):
    """The shared budget on the sparse mix, and which methods run."""

    feedback: str = "binary"
    """The weak regime every method but the positive control trains under."""
    train_split: str = "val"
    """Trained on the ``val`` templates (never in the shipped model's SFT data)."""
    n_bugs: int = 2
    """Two bugs per task: a repair passes only when both are fixed (sparser than one)."""
    templates: tuple[str, ...] = ("lists/f449aa3dcb", "nested/991fd651d7", "counting/b65edf7bc6",
                                  "strings/6f87f82216")
    """The sparse mix: the four ``val`` templates whose two-bug tasks the shipped model passes
    least at T = 1.6, pass@1 0.07 over them (:func:`template_pass_rates`, another task seed
    than training's; ``docs/results/sparse_mix.json``)."""
    train_problems: int = 3000
    """Problems generated of ``train_split`` before keeping ``templates``."""
    methods: tuple[str, ...] = ("raw_grpo", "raw_grpo_dense", "reshaped_grpo", "reshaped_full",
                                "full-composite", "full-amplify", "full-focus", "full-curriculum")
    """Methods (:func:`method_config`), every one on every seed."""
    steps: int = 40
    """Policy updates per run."""
    eval_tasks: int = 64
    """Tasks of each periodic evaluation (the paired evaluation uses ``paired_tasks``)."""
    paired_per_template: int | None = 16
    """At most 16 held-out two-bug tasks of any one template."""


def _configure(method: str, cfg) -> None:
    recipe, curriculum, feedback = method_config(method)
    cfg.reshape, cfg.curriculum = recipe, curriculum
    if feedback:
        cfg.feedback.mode = feedback


def _make(method: str):
    return lambda: method_config(method)[0]


def run(exp: Config) -> Path:
    for m in exp.methods:
        method_config(m)  # unknown names fail before training
    results = run_methods("reshaping", {m: _make(m) for m in exp.methods}, exp,
                          configure=_with_templates(exp))
    results["command"] = command("reshaping", exp)
    training_record(results)
    if exp.paired_tasks:
        add_paired(results, exp)
        results["controls"] = controls(results)
    return pages.write_page(results, exp.out, render, pages.curves_figure)


def _with_templates(exp: Config):
    def configure(method: str, cfg) -> None:
        cfg.tasks.templates = tuple(exp.templates)
        _configure(method, cfg)
    return configure


def controls(results: dict, key: str = "paired") -> dict | None:
    """Positive control: ``raw_grpo_dense - raw_grpo``; the claim: ``reshaped_full -
    raw_grpo`` (:func:`labkit.experiments.stats.controls`)."""
    m = results["methods"]
    base = m.get("raw_grpo", {}).get(f"{key}_change")
    if not base:
        return None

    def diff(name):
        c = m.get(name, {}).get(f"{key}_change")
        return stats.difference(base, c) if c else None

    return stats.controls(diff("raw_grpo_dense"), None, diff("reshaped_full"))


def _pairs(results: dict) -> list[tuple[str, str]]:
    names = list(results["methods"])
    out = [("raw_grpo", m) for m in names if m != "raw_grpo"]
    out += [("reshaped_full", m) for m in names if m.startswith("full-")]
    return out


BLOG_RELATIVE_GAIN = 0.35
"""The seed blog's claim: reshaped GRPO +35% relative over raw-reward GRPO."""


def render(results: dict) -> str:
    """The page of a reshaping results JSON."""
    c, s = results["config"], results["setting"]
    what = (f"Every method: `{s['model']}`, {s['steps']} steps of {s['batch']} at T = "
            f"{c['temperature']}, lr {s['lr']}, KL 0.01 (k3); `{c['feedback']}` feedback (pass/fail "
            f"only) except the positive control (`dense`); trained on {c['n_bugs']}-bug tasks of the "
            f"`{s['train_split']}` templates {', '.join(f'`{t}`' for t in c['templates'])} (the sparse "
            f"mix), held out: `{s['split']}`, always graded on the hidden tests. `reshaped_full`: the "
            "composite reward, piecewise amplification, a focus threshold and the curriculum; "
            "`full-<x>`: without x.")
    lines = pages.header(results, TITLE, what)
    ctl = results.get("controls")
    if ctl:
        lines += ["## Could this testbed see the effect?", "", *pages.controls_lines(
            ctl, positive="dense - binary feedback, raw GRPO", negative=None,
            claim="the full recipe - raw GRPO (binary)",
            unable="this harness cannot see reward-shaping effects of this size"), ""]
        claim = ctl.get("claim")
        start = results.get("paired", {}).get("start_mean", {}).get("pass_at_1")
        if claim and start is not None and "raw_grpo" in results["methods"]:
            raw_end = start + results["methods"]["raw_grpo"]["paired_change"]["mean"]
            rel = (raw_end + claim["mean"]) / raw_end - 1 if raw_end > 0 else None
            if rel is not None:
                lines += [f"End pass@1 of the full recipe relative to raw GRPO: {rel:+.1%} "
                          f"(the blog claims {BLOG_RELATIVE_GAIN:+.0%}).", ""]
    lines += ["## Paired change", ""]
    for key in ("paired", "paired_clean", "paired_trained"):
        lines += pages.paired_lines(results, key)
    lines += pages.difference_lines(results, _pairs(results), "paired")
    lines += pages.difference_lines(results, _pairs(results), "paired_trained")
    lines += ["## How sparse the signal was", "",
              "Per method, over its runs' steps: the share of groups whose rewards were all equal "
              "(no advantage at all), the mean abs(A) per token and the gradient norm.", "",
              "| method | all-equal groups | mean abs(A) per token | grad norm |", "|---|---|---|---|"]
    for m, r in results["methods"].items():
        lines.append(f"| {m} | {_num(r.get('zero_std_frac'))} | {_num(r.get('abs_adv_per_token'))} | "
                     f"{_num(r.get('grad_norm'))} |")
    lines += [""] + pages.periodic_lines(results) + pages.figure_line("reshaping")
    return "\n".join(lines)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def template_pass_rates(out: str | Path | None = None, split: str = "val", n: int = 480,
                        task_seed: int = 7, k: int = 8, temperature: float = 1.6,
                        sample_seed: int = 11, policy: str = "tiny") -> dict:
    """The starting policy's pass@1 on two-bug tasks of each template of ``split`` (``n``
    problems of task seed ``task_seed``, ``k`` samples at ``temperature``): how the sparse mix
    (:attr:`Config.templates`) is chosen. Writes ``<out>/sparse_mix.json`` when ``out`` is given
    (``python -c "from labkit.experiments.reshaping import template_pass_rates as t;
    t('docs/results')"``)."""
    tasks = load_tasks("synthetic", split=split, n=n, seed=task_seed, n_bugs=2)
    rep = evaluate(load_policy(policy), tasks, EvalConfig(k=k, temperature=temperature, greedy=False,
                                                          seed=sample_seed, parallel_chunks=2))
    by = defaultdict(list)
    for t, p in zip(tasks, rep["per_task"]):
        by[t.meta["template"]].append(p["pass_at_1"])
    rates = {t: {"tasks": len(v), "pass_at_1": sum(v) / len(v)}
             for t, v in sorted(by.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))}
    rec = {"what": "start pass@1 of two-bug tasks per template (the sparse mix's choice)",
           "model_sha256": weights_fingerprint(policy), "split": split, "n": n, "task_seed": task_seed,
           "k": k, "temperature": temperature, "sample_seed": sample_seed, "overall": rep["pass_at_1"],
           "templates": rates}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "sparse_mix.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec

