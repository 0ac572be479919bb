"""``python -m labkit experiment learning``: does RL move the tiny model at all?

Plain GRPO (raw dense reward, the fraction of hidden tests passed) on the template split:
every seed trains on the same training problems, and the start policy and each run's final
checkpoint are evaluated on the same held-out tasks of templates training never saw
(:mod:`labkit.experiments.paired`). The headline is the paired change with its 95% t-interval
over training seeds and the one verdict rule (:mod:`labkit.experiments.stats`). Every other
experiment builds on this one: a method can only beat GRPO where GRPO moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labkit.experiments import claims, pages
from labkit.experiments.claims import Contrast
from labkit.experiments.config import ExperimentConfig, command
from labkit.experiments.paired import add_paired
from labkit.experiments.runs import run_methods

TITLE = "Does GRPO move the tiny model? (template-held-out)"


@dataclass
class Config(ExperimentConfig):
    """The budget of the learning check (one method: raw GRPO)."""

    train_split: str = "val"
    """Trained on the ``val`` templates, which the shipped model's SFT data never held."""
    steps: int = 150
    """Policy updates per run (about 20 minutes a run on 2 cores)."""
    eval_every: int = 50
    """Periodic held-out evaluations during the run (the paired evaluation comes after)."""
    eval_tasks: int = 100
    """Tasks of each periodic evaluation (the paired one uses ``paired_tasks``)."""
    train_problems: int = 1000
    """Synthetic training problems of ``train_split``."""
    screen_tasks: int = 80
    """The lower-noise evaluation beside the standard one (:class:`ExperimentConfig`): 80
    screened tasks x 6 samples cost about what 200 x 4 do, the screen included."""


PRIMARY = (Contrast("GRPO - start", "claim", "grpo", None, +1, size=0.05,
                    source="the lab's design target for its testbed: RL moves the shipped model by "
                           "at least 5 points of held-out pass@1, or no method comparison can be read "
                           "on it"),)
"""The claim, named before the run (no control: a shown claim is its own evidence that the
testbed moves)."""

SMOKE = {"seeds": (0, 1), "steps": 2, "tasks_per_step": 2, "group_size": 2, "eval_every": 2,
         "eval_tasks": 4, "eval_k": 1, "train_problems": 24, "paired_tasks": 6, "paired_k": 2,
         "paired_pass_k": 2, "paired_per_template": 0, "paired_trained": False,
         "screen_tasks": 4, "screen_pool": 12, "screen_k": 2, "screen_range": (0.0, 1.0),
         "screen_eval_k": 2, "screen_per_template": 0}
"""``--smoke``: the whole pipeline, two seeds, in about two minutes on two cores."""


def restat(results: dict) -> dict:
    """:func:`labkit.experiments.claims.restat_methods` with this experiment's claim."""
    return claims.restat_methods(results, PRIMARY, claims.primary_key(results["config"]))


def run(exp: Config) -> Path:
    results = run_methods("learning", ("grpo",), exp)
    results["command"] = command("learning", exp)
    if exp.paired_tasks:
        add_paired(results, exp)
        results["primary"] = claims.read(results, PRIMARY, claims.primary_key(exp))
    return pages.write_page(results, exp.out, render, pages.curves_figure)


def render(results: dict) -> str:
    """The page of a learning results JSON."""
    c, s = results["config"], results["setting"]
    what = (f"Raw GRPO on `{s['model']}`, `{s['feedback']}` feedback, {s['steps']} steps of "
            f"{s['batch']} at T = {c['temperature']}, {pages.optim_text(results, 'grpo')}; trained on the "
            f"`{s['train_split']}` templates, held out: `{s['split']}` (templates neither training "
            "nor the model's SFT data holds); the same training problems and held-out tasks for "
            f"every seed (task seed {s['task_seed']}).")
    lines = pages.header(results, TITLE, what) + pages.primary_lines(results)
    lines += pages.screened_lines(results, "grpo")
    holm = pages.family(results, [])
    lines += ["## Paired change (exploratory)", ""]
    for key in pages.PAIRED_KEYS:
        lines += pages.paired_lines(results, key, holm=holm)
    lines += pages.periodic_lines(results) + pages.figure_line(pages.page_name(results))
    return "\n".join(lines)
