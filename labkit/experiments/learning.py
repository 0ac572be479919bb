"""``python -m labkit experiment learning``: does RL move the tiny model at all?

Plain GRPO (raw dense reward, the fraction of hidden tests passed) on the template split:
every seed trains on the same training problems, and the start policy and each run's final
checkpoint are evaluated on the same held-out tasks of templates training never saw, with the
same sampling seed. The headline is the paired change with a 95% t-interval over training
seeds (``labkit.experiments.stats``); an interval that includes 0 is reported as not shown.
Every other experiment builds on this one: a method can only beat GRPO where GRPO moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labkit.credit.reshaping import RECIPES
from labkit.experiments import ExperimentConfig, add_paired, run_methods, write_report


@dataclass
class Config(ExperimentConfig):
    """The budget of the learning check (one method: raw GRPO)."""

    steps: int = 60
    """Policy updates per run; at the default batch a run takes about half an hour on 2 cores."""
    eval_every: int = 20
    """Periodic held-out evaluations during the run (the paired evaluation comes after)."""
    eval_tasks: int = 100
    """Tasks of each periodic evaluation (the paired one uses ``paired_tasks``)."""


def run(exp: Config) -> Path:
    results = run_methods("learning", {"grpo": RECIPES["raw"]}, exp)
    if exp.paired_tasks:
        add_paired(results, exp)
    notes = (f"Raw GRPO on `{exp.policy}` (weights sha256 {results['setting']['model_sha256']}...), "
             f"`{exp.feedback}` feedback, {exp.steps} steps of "
             f"{exp.tasks_per_step} tasks x {exp.group_size} samples (T = {exp.temperature}"
             f"{'' if exp.sampler == 'race' else ', sampler ' + exp.sampler}), lr {exp.lr}, KL 0.01 "
             f"(k3), seeds {list(exp.seeds)}; training problems and held-out tasks from task seed "
             f"{exp.task_seed} (the same for every seed); trained on split `{exp.train_split}`, "
             f"held-out split `{exp.split}`.")
    return write_report(results, exp.out, "Does GRPO move the tiny model? (template-held-out)", notes)
