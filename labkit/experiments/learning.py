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

from labkit.credit.reshaping import RECIPES
from labkit.experiments import pages
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


def run(exp: Config) -> Path:
    results = run_methods("learning", {"grpo": RECIPES["raw"]}, exp)
    results["command"] = command("learning", exp)
    if exp.paired_tasks:
        add_paired(results, exp)
    return pages.write_page(results, exp.out, render, pages.curves_figure)


def render(results: dict) -> str:
    """The page of a learning results JSON."""
    c, s = results["config"], results["setting"]
    what = (f"Raw GRPO on `{s['model']}`, `{s['feedback']}` feedback, {s['steps']} steps of "
            f"{s['batch']} at T = {c['temperature']}, lr {s['lr']}, KL 0.01 (k3); trained on the "
            f"`{s['train_split']}` templates, held out: `{s['split']}` (templates neither training "
            "nor the model's SFT data holds); the same training problems and held-out tasks for "
            f"every seed (task seed {s['task_seed']}).")
    lines = pages.header(results, TITLE, what)
    lines += ["## Paired change", ""]
    for key in ("paired", "paired_clean", "paired_trained"):
        lines += pages.paired_lines(results, key)
    lines += pages.periodic_lines(results) + pages.figure_line("learning")
    return "\n".join(lines)
