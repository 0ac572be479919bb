"""``python -m labkit experiment reshaping``: raw-reward GRPO (reward = fraction of tests
passed) vs reshaped GRPO (the blog's recipe with the precision gate), same model, tasks,
step budget and seeds; held-out pass@1 at the start, every ``eval_every`` steps, and at
the end. Reports per seed, mean and a 95% t-interval over seeds, and wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labkit.credit.reshaping import ReshapeConfig
from labkit.experiments import ExperimentConfig, run_methods, write_report


@dataclass
class Config(ExperimentConfig):
    methods: tuple[str, ...] = ("raw_grpo", "reshaped_grpo")
    """Which of :data:`RESHAPING_METHODS` to run (e.g. one, for a learning-rate probe)."""


RESHAPING_METHODS = {
    "raw_grpo": lambda: ReshapeConfig.raw(),
    "reshaped_grpo": lambda: ReshapeConfig(w_test=1.0, w_precision=0.2, w_style=0.1, w_progress=0.05,
                                           w_hack=1.0, gate_precision="improved", normalise="batch",
                                           warmup_steps=5, adv_clip=5.0, amplify="none",
                                           focus_threshold=0.0),
}


def run(exp: Config) -> Path:
    unknown = set(exp.methods) - set(RESHAPING_METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; available: {', '.join(RESHAPING_METHODS)}")
    results = run_methods("reshaping", {m: RESHAPING_METHODS[m] for m in exp.methods}, exp)
    notes = ("Raw GRPO: reward = fraction of hidden tests passed. Reshaped GRPO: the blog's recipe "
             "(w_test 1.0, w_precision 0.2 gated on improving the tests, w_style 0.1, w_progress 0.05, "
             "hack penalty 1.0, batch normalisation with a 5-step warm-up on running statistics, "
             "advantages clipped to [-5, 5]). Same tiny model, tasks, seeds and step budget. "
             f"Seeds {list(exp.seeds)}, {exp.steps} steps of {exp.tasks_per_step} tasks x "
             f"{exp.group_size} samples; held-out pass@1 on {exp.eval_tasks} synthetic test tasks "
             f"x {exp.eval_k} samples at T = 0.7.")
    return write_report(results, exp.out, "Raw vs reshaped GRPO on the tiny model", notes)
