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

**The weak regimes.** ``feedback`` picks what the claim's two methods are told: ``binary``
(the default, page ``reshaping``), ``public`` (the fraction of the visible examples passed,
page ``reshaping-public``) or ``noisy`` (the fraction of hidden tests after flipping each
outcome with probability 0.1, page ``reshaping-noisy``). Under a regime other than binary the
page also trains ``raw_grpo_binary`` (raw GRPO told the hidden tests' pass/fail) and
``raw_grpo_flip30``, which are the binary page's ``raw_grpo`` and ``raw_grpo_flip30`` runs
(reused where they were trained at the same commit), so each page carries the positive control
in its own harness and says what the weak regime costs against pass/fail of the hidden tests.

**Positive control**: ``raw_grpo`` against ``raw_grpo_flip30``, raw GRPO told the same
pass/fail label but wrong 30% of the time (``flipped`` feedback): the clean label is a
known-better variant of the very same reward, so the harness must see it beat the flipped one
by at least the claim's smallest detectable effect. (``raw_grpo_dense``, told the fraction of
hidden tests, is no such control: binary is the evaluation metric and the fraction pays for
copying the buggy code; it stays as an exploratory row.)
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from labkit.env.feedback import FeedbackConfig
from labkit.env.tasks import load_tasks
from labkit.experiments import claims, pages
from labkit.experiments.claims import Contrast
from labkit.experiments.config import ExperimentConfig, code_commit, command
from labkit.experiments.methods import FLIP_P, check_methods, variants_of
from labkit.experiments.paired import add_paired
from labkit.experiments.runs import run_methods, training_record
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import load_policy, weights_fingerprint

TITLE = "Reward reshaping for GRPO under sparse feedback"


@dataclass
class Config(ExperimentConfig):
    """The shared budget on the sparse mix, and which methods run."""

    feedback: str = "binary"
    """The weak regime the claim's methods train under: ``binary``, ``public`` or ``noisy``
    (:data:`REGIMES`); each writes its own page (:func:`page_of`)."""
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
    methods: tuple[str, ...] | None = None
    """Methods (:data:`labkit.experiments.methods.METHODS`), every one on every seed; ``None``:
    the regime's default (:data:`DEFAULT_METHODS`): under ``binary`` the claim's two, the
    positive control's flipped labels and the dense signal (exploratory); under another regime
    the claim's two and the positive control's pair, ``raw_grpo_binary`` and
    ``raw_grpo_flip30``. The leave-one-out rows ``full-<component>`` and the composite alone
    (``reshaped_grpo``) are there to add."""
    steps: int = 40
    """Policy updates per run."""
    eval_tasks: int = 64
    """Tasks of each periodic evaluation (the paired evaluation uses ``paired_tasks``)."""
    paired_per_template: int | None = 16
    """At most 16 held-out two-bug tasks of any one template."""

    def validate(self) -> None:
        super().validate()
        if self.feedback not in REGIMES:
            raise ValueError(f"feedback: the reshaping claim is read under {', '.join(REGIMES)}, "
                             f"not {self.feedback!r}; pick one of them")
        check_methods(methods_of(self))


REGIMES = {
    "binary": "pass/fail of the hidden tests",
    "public": "the fraction of the visible examples passed, an incomplete set of tests",
    "noisy": "the fraction of hidden tests passed, each outcome flipped with probability "
             f"{FeedbackConfig().noise_p}",
}
"""The weak feedback regimes the claim is read under, and what each tells the learner."""

DEFAULT_METHODS = {
    "binary": ("raw_grpo", "reshaped_full", "raw_grpo_flip30", "raw_grpo_dense"),
    "other": ("raw_grpo", "reshaped_full", "raw_grpo_binary", "raw_grpo_flip30"),
}
"""The methods a page trains when ``methods`` is not given, by regime (``other``: not binary)."""


def page_of(exp: Config) -> str:
    """The page (and run folder) of a regime: ``reshaping`` under ``binary``, else
    ``reshaping-<regime>``."""
    return "reshaping" if exp.feedback == "binary" else f"reshaping-{exp.feedback}"


def methods_of(exp: Config) -> tuple[str, ...]:
    """The methods ``exp`` trains: its ``methods``, or its regime's default."""
    if exp.methods is not None:
        return tuple(exp.methods)
    return DEFAULT_METHODS["binary" if exp.feedback == "binary" else "other"]


def aliases_of(exp: Config) -> dict[str, tuple[str, ...]]:
    """Where a regime page's control runs may already be: ``raw_grpo_binary`` is the binary
    page's ``raw_grpo``, and both control methods are the same runs on every other regime's
    page (identical configs, so a run found there at this commit is reused)."""
    if exp.feedback == "binary":
        return {}
    others = [f"reshaping-{r}" for r in REGIMES if r not in ("binary", exp.feedback)]
    return {"raw_grpo_binary": ("reshaping/raw_grpo", *(f"{o}/raw_grpo_binary" for o in others)),
            "raw_grpo_flip30": ("reshaping/raw_grpo_flip30", *(f"{o}/raw_grpo_flip30" for o in others))}


BLOG_RELATIVE_GAIN = 0.35
"""The seed blog's claim: reshaped GRPO +35% relative over raw-reward GRPO."""

def primary(feedback: str = "binary") -> tuple[Contrast, ...]:
    """The claim and its signed positive control under a regime, named before the run. The
    control is the same under every regime: raw GRPO told clean pass/fail labels of the hidden
    tests against the same labels 30% flipped (``raw_grpo`` itself under ``binary``,
    ``raw_grpo_binary`` under another regime)."""
    regime = "" if feedback == "binary" else f", {feedback} feedback"
    return (
        Contrast(f"full recipe - raw GRPO{regime}", "claim", "reshaped_full", "raw_grpo", +1,
                 relative=BLOG_RELATIVE_GAIN,
                 source="the seed blog on signal reshaping for GRPO under weak feedback: +35% over "
                        "raw-reward GRPO (relative; here on raw GRPO's end pass@1)"),
        Contrast("clean - 30%-flipped pass/fail labels, raw GRPO", "positive",
                 "raw_grpo" if feedback == "binary" else "raw_grpo_binary", "raw_grpo_flip30", +1),
    )


PRIMARY = primary()
"""The binary page's claim and control."""

SMOKE = {"seeds": (0, 1), "steps": 1, "tasks_per_step": 1, "group_size": 2, "eval_every": 1,
         "eval_tasks": 2, "eval_k": 1, "train_problems": 60, "paired_tasks": 4, "paired_k": 1,
         "paired_pass_k": 2, "paired_per_template": 0, "paired_trained": False}
"""``--smoke``: every default method, two seeds, one step each."""


def restat(results: dict) -> dict:
    """:func:`labkit.experiments.claims.restat_methods` with this experiment's claim."""
    c = results["config"]
    return claims.restat_methods(results, primary(c.get("feedback", "binary")),
                                 claims.primary_key(c))


def run(exp: Config) -> Path:
    exp.validate()  # unknown methods and regimes fail before training
    page = page_of(exp)
    results = run_methods(page, methods_of(exp), exp, shared={"tasks.templates": tuple(exp.templates)},
                          aliases=aliases_of(exp))
    results["experiment"] = "reshaping"
    results.setdefault("page", page)
    results["command"] = command("reshaping", exp)
    training_record(results)
    if exp.paired_tasks:
        add_paired(results, exp)
        results["primary"] = claims.read(results, primary(exp.feedback), claims.primary_key(exp))
    return pages.write_page(results, exp.out, render, pages.curves_figure)


def _pairs(results: dict) -> list[tuple[str, str]]:
    """The method-against-method rows (the primary ones among them are read above)."""
    names = list(results["methods"])
    out = [("raw_grpo", m) for m in names if m not in ("raw_grpo", "raw_grpo_flip30", "raw_grpo_binary")]
    out += [("raw_grpo_flip30", "raw_grpo")] if "raw_grpo_flip30" in names else []
    out += [("raw_grpo_binary", "raw_grpo")] if "raw_grpo_binary" in names else []
    out += [("reshaped_full", m) for m in variants_of("reshaped_full", names)]
    return out


def render(results: dict) -> str:
    """The page of a reshaping results JSON."""
    c, s = results["config"], results["setting"]
    regime = c.get("feedback", "binary")
    told = {"raw_grpo_binary": "pass/fail of the hidden tests",
            "raw_grpo_flip30": f"that label, wrong with probability {FLIP_P}",
            "raw_grpo_dense": "the fraction of hidden tests"}
    others = [f"`{m}` ({t})" for m, t in told.items() if m in results["methods"]]
    what = (f"Every method: `{s['model']}`, {s['steps']} steps of {s['batch']} at T = "
            f"{c['temperature']}, {pages.optim_text(results, 'raw_grpo')}; `{regime}` feedback "
            f"({REGIMES.get(regime, regime)})"
            + (f" except {', '.join(others[:-1])}{' and ' if len(others) > 1 else ''}{others[-1]}"
               if others else "") + "; trained on "
            f"{c['n_bugs']}-bug tasks of the `{s['train_split']}` templates "
            f"{', '.join(f'`{t}`' for t in c['templates'])} (the sparse mix), held out: "
            f"`{s['split']}`, always graded on the hidden tests. `reshaped_full`: the composite "
            "reward, piecewise amplification, a focus threshold and the curriculum; `full-<x>`: "
            "without x.")
    title = TITLE if regime == "binary" else f"{TITLE}: the `{regime}` regime"
    lines = pages.header(results, title, what) + pages.primary_lines(results)
    pairs = _pairs(results)
    holm = pages.family(results, pairs)
    lines += ["## Paired change (exploratory)", ""]
    for key in pages.PAIRED_KEYS:
        lines += pages.paired_lines(results, key, holm=holm)
    for key in pages.PAIRED_KEYS:
        lines += pages.difference_lines(results, pairs, key, holm=holm)
    lines += ["## How sparse the signal was", "",
              "Per method, over its runs' steps: the share of groups whose rewards were all equal "
              "(no advantage at all), the mean abs(A) per token and the gradient norm.", "",
              "| method | all-equal groups | mean abs(A) per token | grad norm |", "|---|---|---|---|"]
    for m, r in results["methods"].items():
        lines.append(f"| {m} | {_num(r.get('zero_std_frac'))} | {_num(r.get('abs_adv_per_token'))} | "
                     f"{_num(r.get('grad_norm'))} |")
    lines += [""] + pages.periodic_lines(results) + pages.figure_line(pages.page_name(results))
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
    args = {"split": split, "n": n, "task_seed": task_seed, "k": k, "temperature": temperature,
            "sample_seed": sample_seed, "policy": policy}
    rec = {"what": "start pass@1 of two-bug tasks per template (the sparse mix's choice)",
           "command": ("python -c \"from labkit.experiments.reshaping import template_pass_rates as t; "
                       f"t('docs/results', **{args!r})\""),
           "code_commit": code_commit(),
           "model_sha256": weights_fingerprint(policy), "split": split, "n": n, "task_seed": task_seed,
           "k": k, "temperature": temperature, "sample_seed": sample_seed, "overall": rep["pass_at_1"],
           "templates": rates}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "sparse_mix.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec

