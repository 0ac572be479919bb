"""``python -m labkit experiment reshaping``: raw-reward GRPO (reward = fraction of tests
passed) vs reshaped GRPO (the blog's recipe with the precision gate), same model, tasks,
step budget and seeds; held-out pass@1 at the start, every ``eval_every`` steps, and at
the end. Reports per seed, mean and a 95% t-interval over seeds, and wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labkit.credit.reshaping import RECIPES
from labkit.experiments import ExperimentConfig, run_methods, write_report


@dataclass
class Config(ExperimentConfig):
    methods: tuple[str, ...] = ("raw_grpo", "reshaped_grpo")
    """Which of :data:`RESHAPING_METHODS` to run (e.g. one, for a learning-rate probe)."""
    paired_tasks: int = 400
    """After training: the start policy and every run's final checkpoint on these many
    common held-out tasks, one sampling seed (:mod:`labkit.experiments.paired`); 0 = off."""
    paired_k: int = 4
    """Samples per task for each run's final checkpoint in the paired evaluation, at T = 0.7;
    more shrink each run's per-task noise at proportional cost."""
    paired_start_k: int = 24
    """Samples per task for the start policy, which every run is compared with: pooled over
    runs its noise would dominate at ``paired_k``."""


RESHAPING_METHODS = {"raw_grpo": RECIPES["raw"], "reshaped_grpo": RECIPES["reshaped"]}


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
    extra = (paired_section(results, exp.paired_tasks, exp.paired_k, exp.paired_start_k)
             if exp.paired_tasks else [])
    return write_report(results, exp.out, "Raw vs reshaped GRPO on the tiny model", notes, extra)


def paired_section(results: dict, n_tasks: int, k: int, start_k: int | None = None) -> list[str]:
    """Run the paired evaluation over every run of ``results``, store it there (per method:
    per seed, and pooled as the per-task mean over seeds minus the start) and return the
    report's lines."""
    import statistics

    from labkit.experiments.paired import paired_eval

    dirs = [s["run_dir"] for r in results["methods"].values() for s in r["seeds"]]
    pe = paired_eval(dirs, n_tasks, k, start_k=start_k)
    start = pe["start_per_task"]
    lines = ["", f"## Paired held-out evaluation ({pe['tasks']} common test tasks x {k} samples, one sampling seed)",
             "", "The start policy and each run's final checkpoint on the same tasks with the same "
             "sampling seed: the change is measured task by task (95% bootstrap interval over tasks). "
             f"Start pass@1 {pe['start_pass_at_1']:.4f} ({pe['start_k']} samples per task).", "",
             "| method | seed | end pass@1 | paired change (95% CI) | tasks up / down |", "|---|---|---|---|---|"]
    paired: dict = {"tasks": pe["tasks"], "k": k, "start_k": pe["start_k"],
                    "start_pass_at_1": pe["start_pass_at_1"], "methods": {}}
    for m, r in results["methods"].items():
        rows = [(s["seed"], pe["runs"][str(s["run_dir"])]) for s in r["seeds"]]
        for seed, x in rows:
            lines.append(f"| {m} | {seed} | {x['end_pass_at_1']:.4f} | {x['mean']:+.4f} "
                         f"[{x['ci95'][0]:+.4f}, {x['ci95'][1]:+.4f}] | {x['improved']} / {x['worsened']} |")
        mean_end, pooled = _pooled(start, [x["end_per_task"] for _, x in rows])
        lines.append(f"| **{m}** | mean of seeds | {statistics.fmean(mean_end):.4f} | **{pooled['mean']:+.4f}** "
                     f"[{pooled['ci95'][0]:+.4f}, {pooled['ci95'][1]:+.4f}] | {pooled['improved']} / "
                     f"{pooled['worsened']} |")
        paired["methods"][m] = {"pooled": pooled, "seeds": {str(seed): {k2: v for k2, v in x.items()
                                                                          if not k2.endswith("per_task")}
                                                             for seed, x in rows}}
    if len(results["methods"]) > 1:  # every run trains GRPO; does RL move held-out pass@1 at all?
        mean_end, pooled = _pooled(start, [x["end_per_task"] for x in pe["runs"].values()])
        lines.append(f"| **all runs** | {len(pe['runs'])} runs | {statistics.fmean(mean_end):.4f} | "
                     f"**{pooled['mean']:+.4f}** [{pooled['ci95'][0]:+.4f}, {pooled['ci95'][1]:+.4f}] | "
                     f"{pooled['improved']} / {pooled['worsened']} |")
        paired["all_runs"] = pooled
    results["paired"] = paired
    return lines + [""]


def _pooled(start: list[float], ends: list[list[float]]) -> tuple[list[float], dict]:
    """Per task, the mean over runs of the end minus the start (tasks are the sampling
    unit, so runs sharing them are averaged before the bootstrap)."""
    import statistics

    from labkit.experiments.paired import paired_difference

    mean_end = [statistics.fmean(e[i] for e in ends) for i in range(len(start))]
    return mean_end, paired_difference(start, mean_end)
