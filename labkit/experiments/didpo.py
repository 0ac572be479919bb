"""``python -m labkit experiment didpo``: GRPO vs DiDPO (diff anchors) vs DiDPO-fork
(counterfactual forks) on the tiny default, the same step budget and seeds, plus the
paper's ablations on ``ablation_seeds``, each compared paired by seed with GRPO and DiDPO.

The fork variant spends more compute per step (it generates and executes forks), so it is
also reported at equal wall clock: with a constant learning rate a run truncated at step
``s`` is the same as a run of ``s`` steps, so its held-out pass@1 at the last evaluation
within GRPO's wall time is read off the same curve (``didpo_fork@wall``). Held-out pass@1
vs step, mean and 95% interval over seeds, seconds per step.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from labkit.credit.reshaping import ReshapeConfig
from labkit.experiments import stats
from labkit.experiments.config import RESULTS, ExperimentConfig, base_train_config
from labkit.experiments.paired import add_paired
from labkit.experiments.runs import run_methods
from labkit.loops.trainer import Trainer


@dataclass
class Config(ExperimentConfig):
    """The shared budget, plus which methods run on every seed and which on one."""

    methods: tuple[str, ...] = ("grpo", "didpo", "didpo_fork")
    """Advantage estimators (``TrainConfig.estimator``) trained on every seed on the raw reward,
    and timed side by side for the cost table; ``grpo`` and ``didpo_fork`` together give the
    ``didpo_fork@wall`` row."""
    ablations: tuple[str, ...] = ("didpo_no_ae", "didpo_no_ad", "didpo_whole_diff",
                                  "didpo_additive_gs", "didpo_group_mean")
    """Estimators trained on ``ablation_seeds`` only: DiDPO without ``A_E``, without ``A_D``
    (GRPO), with the whole diff as the one unit of credit, with additive groupability, and the
    labelled non-paper ``A_D`` = group mean minus task mean (:mod:`labkit.credit.anchors`);
    empty = none. They are not in the cost table."""
    ablation_seeds: tuple[int, ...] = (0, 1, 2)
    """The seeds the ablations train on (a subset of ``seeds``: each ablation is compared,
    paired by seed, with GRPO and DiDPO on these seeds; one seed gives no interval)."""
    n_bugs: int = 2
    """Two bugs per task, in separate hunks: DiDPO's premise is multi-region edits."""
    multi_hunk: bool = True
    """Only tasks whose bugs are separately tested hunks (a partial repair earns partial
    reward)."""
    paired_per_template: int | None = 16
    """At most 16 held-out tasks of any one template (the single-bug experiments: 12).
    Two-bug multi-hunk tasks come from the 22 ``test`` templates at very different rates
    (task seed 0, 3,200 problems: 1,033 tasks, 595 of one template, 10 templates with 1-10):
    a cap of 12 fills only 179 of the 200 tasks, 16 fills 204."""
    steps: int = 20
    """Policy updates per run."""
    fork_steps: int = 0
    """Steps for ``didpo_fork`` (0 = ``steps``): with the small fork budget below it runs
    GRPO's step count; a larger budget would need fewer steps to fit GRPO's wall clock."""
    fork_fraction: float = 0.05
    """Forks per completion token for ``didpo_fork`` (``fork.fraction``)."""
    fork_budget: int = 2
    """At most this many forks per completion (``fork.budget``): 1-2 at the highest-entropy
    positions keep ``didpo_fork`` within about 1.5x GRPO's wall time per step."""
    fork_strategy: str = "entropy"
    """Where to fork (``fork.strategy``): the policy's least sure tokens."""
    cost_rounds: int = 2
    """Rounds of the side-by-side cost measurement (one step of every method per round)."""
    ablation_steps: int = 0
    """Steps for the ablations (0 = ``steps``); compare them with the main methods'
    evaluation at that step (``eval_every`` should divide it)."""
    out: str = str(RESULTS)
    """Folder of the ``didpo`` report files (default: the repository's ``docs/results``)."""


def _method(estimator: str):
    """Every method trains on the raw reward; ``_configure`` sets the estimator by name."""
    return ReshapeConfig.raw


def _configure(exp: Config):
    def configure(method: str, cfg) -> None:
        cfg.estimator = method
        cfg.fork.fraction, cfg.fork.budget = exp.fork_fraction, exp.fork_budget
        cfg.fork.strategy = exp.fork_strategy
        if method.startswith("didpo_fork") and exp.fork_steps:
            cfg.steps = exp.fork_steps
            cfg.eval_every = min(cfg.eval_every, exp.fork_steps) if cfg.eval_every else 0
            cfg.checkpoint_every = max(1, exp.fork_steps // 3)
        elif method in exp.ablations and exp.ablation_steps:
            cfg.steps = exp.ablation_steps
            cfg.checkpoint_every = max(1, exp.ablation_steps // 3)
    return configure


def equal_wall(grpo: dict, fork: dict, costs: dict[str, float]) -> dict:
    """``fork``'s per-seed results truncated to GRPO's wall time.

    ``costs`` are seconds per step of each method measured side by side in this experiment
    (:func:`measure_step_costs`), never the runs' own timings, which come from other times and
    loads. ``steps_at_wall = floor(steps_grpo * cost_grpo / cost_fork)``; the pass@1 reported
    is the last evaluation at or before that step. A seed whose last such evaluation is step
    0 has not trained within the budget: it is listed in ``not_reached``, never averaged in
    as a trained result (step 0 is the start policy).
    """
    by_seed = {s["seed"]: s for s in grpo["seeds"]}
    ratio = costs["grpo"] / max(costs["didpo_fork"], 1e-9)
    seeds, not_reached = [], []
    for f in fork["seeds"]:
        g = by_seed.get(f["seed"])
        if g is None:
            continue
        budget = int(g["curve"][-1][0] * ratio)  # fork steps that fit in GRPO's wall time
        point = max((p for p in f["curve"] if p[0] <= budget), key=lambda p: p[0])
        if point[0] == 0:
            not_reached.append({"seed": f["seed"], "steps_at_wall": budget,
                                "first_evaluation": min(p[0] for p in f["curve"] if p[0] > 0)})
            continue
        seeds.append({**f, "pass_at_1_end": point[1], "curve": [p for p in f["curve"] if p[0] <= budget],
                      "steps_at_wall": budget, "step_evaluated": point[0]})
    out = {"seeds": seeds, "not_reached": not_reached, "cost_ratio": ratio,
           "s_per_step": costs["didpo_fork"]}
    if seeds:
        starts = [s["pass_at_1_start"] for s in seeds]
        ends = [s["pass_at_1_end"] for s in seeds]
        out |= {"start": mean_ci95(starts), "end": mean_ci95(ends),
                "delta": mean_ci95([e - s for s, e in zip(starts, ends)]),
                "wall_s": statistics.fmean(s["step_evaluated"] * costs["didpo_fork"] for s in seeds)}
    return out


def measure_step_costs(exp: Config, methods: tuple[str, ...], rounds: int = 2) -> dict[str, float]:
    """Seconds per training step of each method, measured side by side now: ``rounds``
    rounds, each training one step of every method in turn (same seed, tasks and start
    policy, fresh run folders, no evaluation), so all share the machine's load. The median
    over rounds; the first round of each method also pays its one-off set-up (buggy-code
    baselines), the reason for more than one round."""
    import shutil
    import tempfile

    times: dict[str, list[float]] = {m: [] for m in methods}
    root = Path(tempfile.mkdtemp(prefix="didpo-costs-"))
    configure = _configure(exp)
    try:
        trainers = {}
        for m in methods:
            cfg = base_train_config(exp, exp.seeds[0], str(root / m))
            cfg.reshape = _method(m)()
            configure(m, cfg)
            cfg.steps, cfg.eval_every, cfg.checkpoint_every = rounds, 0, rounds + 1
            trainers[m] = Trainer(cfg)
        for _ in range(rounds):
            for m in methods:
                times[m].append(trainers[m].train_step()["time/step"])
        for tr in trainers.values():
            tr.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {m: statistics.median(v) for m, v in times.items()}


def run(exp: Config) -> Path:
    missing = sorted(set(exp.ablation_seeds) - set(exp.seeds)) if exp.ablations else []
    if missing:
        raise ValueError(f"ablation_seeds {missing} are not in seeds {list(exp.seeds)}: the "
                         "ablations are compared with the main methods on the same seeds; add "
                         "them to seeds or drop them from ablation_seeds")
    main = run_methods("didpo", {m: _method(m) for m in exp.methods}, exp, configure=_configure(exp))
    # Learning curves may come from runs made at other times; costs are measured here, now,
    # side by side, for every compared method (the equal-wall budget depends on them).
    main["step_costs_s"] = measure_step_costs(exp, tuple(exp.methods), exp.cost_rounds)
    abl = None
    if exp.ablations:
        some = dataclasses.replace(exp, seeds=tuple(exp.ablation_seeds))
        abl = run_methods("didpo", {m: _method(m) for m in exp.ablations}, some, configure=_configure(exp))
        if exp.paired_tasks:
            add_paired(abl, some)
        for m, r in abl["methods"].items():
            main["methods"][ablation_name(m, exp.ablation_seeds)] = r
    if exp.paired_tasks:
        add_paired(main, exp, methods=list(exp.methods))
        if abl is not None:
            main["ablation_differences"] = ablation_differences(
                main, {m: ablation_name(m, exp.ablation_seeds) for m in exp.ablations})
    if "grpo" in main["methods"] and "didpo_fork" in main["methods"]:
        wall = equal_wall(main["methods"]["grpo"], main["methods"]["didpo_fork"], main["step_costs_s"])
        if wall["seeds"]:
            main["methods"]["didpo_fork@wall"] = wall
        main["didpo_fork@wall"] = wall
    notes = (
        f"Tasks: {exp.n_bugs} bugs per function in separate, separately tested hunks (multi-hunk), "
        f"held-out split `{exp.split}`. All methods: the tiny default, raw reward (fraction of "
        "hidden tests passed, so a partial repair earns partial reward), PPO-clip with "
        f"KL 0.01 (k3), lr {exp.lr}, {exp.steps} steps of {exp.tasks_per_step} tasks x {exp.group_size} "
        f"samples, seeds {list(exp.seeds)}; held-out pass@1 on {exp.eval_tasks} synthetic test tasks x "
        f"{exp.eval_k} samples at T = 0.7. Only the advantage estimator differs: `grpo` (sequence "
        "advantage broadcast to tokens), `didpo` (A_E + lambda A_D over diff anchors, lambda 1), "
        f"`didpo_fork` (A_E + counterfactual-fork credit from an EMA baseline, at most "
        f"{exp.fork_budget} forks per completion at `{exp.fork_strategy}` positions)."
        + (f" Ablations ({', '.join(exp.ablations)}) on seeds {list(exp.ablation_seeds)}."
           if exp.ablations else " No ablations.")
        + " `didpo_fork@wall`: the fork runs read at GRPO's wall time."
        + (f" `didpo_fork` runs {exp.fork_steps} steps (its cost per step is several of GRPO's)."
           if exp.fork_steps else "")
        + (f" The ablations run {exp.ablation_steps} steps: compare them with the main methods' "
           f"evaluation at step {exp.ablation_steps} (in the per-seed curves)." if exp.ablation_steps else ""))
    return write_report(main, exp.out, "GRPO vs DiDPO vs DiDPO-fork on the tiny model", notes,
                        cost_lines(main) + ablation_lines(main))


def ablation_name(method: str, seeds) -> str:
    """``didpo_no_ae (seed 0)`` / ``didpo_no_ae (seeds 0,1,2)``: the report's row name."""
    seeds = list(seeds)
    return f"{method} (seed {seeds[0]})" if len(seeds) == 1 else \
        f"{method} (seeds {','.join(map(str, seeds))})"


REFERENCES = ("grpo", "didpo")
PAIRED_KEYS = ("paired", "paired_clean", "paired_trained")


def ablation_differences(results: dict, names: dict[str, str]) -> dict:
    """Each ablation minus GRPO and minus DiDPO, paired by seed: per shared seed the
    difference of the two runs' paired changes (same tasks, same start, same sampling seed),
    then the mean and t-interval over those seeds (:func:`labkit.experiments.stats.seed_difference`),
    for every paired evaluation made (held-out, its clean subset, the trained templates)."""
    out: dict = {}
    for abl, row in names.items():
        for ref in REFERENCES:
            if ref not in results["methods"]:
                continue
            for key in PAIRED_KEYS:
                a = results["methods"][row].get(f"{key}_change")
                b = results["methods"][ref].get(f"{key}_change")
                if not a or not b:
                    continue
                d = stats.seed_difference(b, a)  # the ablation minus the reference
                if d is not None:
                    out.setdefault(abl, {}).setdefault(ref, {})[key] = d
    return out


def ablation_lines(results: dict) -> list[str]:
    """The report's table of each ablation minus GRPO and minus DiDPO, paired by seed."""
    diffs = results.get("ablation_differences")
    if not diffs:
        return []
    titles = {"paired": "held-out", "paired_clean": "held-out, clean", "paired_trained": "trained templates"}
    keys = [k for k in PAIRED_KEYS if any(k in by.get(ref, {}) for by in diffs.values() for ref in by)]
    lines = ["", "Ablations minus the main methods, paired by seed (difference of the paired "
             "changes on each shared seed; 95% t-interval over those seeds):", "",
             "| ablation | minus | " + " | ".join(titles[k] for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for abl, by in diffs.items():
        for ref, per in by.items():
            cells = []
            for k in keys:
                d = per.get(k)
                if d is None:
                    cells.append("n/a")
                    continue
                c = f"{d['mean']:+.4f}"
                if d["ci95"]:
                    c += f" [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]" + ("" if d["shown"] else " (not shown)")
                else:
                    c += ", one seed"
                cells.append(c)
            lines.append(f"| {abl} | {ref} | " + " | ".join(cells) + " |")
    return lines


def cost_lines(results: dict) -> list[str]:
    """The report's side-by-side cost table and what the equal-wall reading could not reach."""
    costs = results["step_costs_s"]
    base = costs.get("grpo")
    lines = ["", "Cost per step, every method measured side by side in this run of the experiment:",
             "", "| method | s/step | x GRPO |", "|---|---|---|"]
    for m, c in costs.items():
        lines.append(f"| {m} | {c:.2f} | {c / base:.2f} |" if base else f"| {m} | {c:.2f} | n/a |")
    wall = results.get("didpo_fork@wall")
    if wall and wall["not_reached"]:
        seeds = ", ".join(f"seed {x['seed']} ({x['steps_at_wall']} steps in GRPO's wall time, first "
                          f"evaluation at step {x['first_evaluation']})" for x in wall["not_reached"])
        lines += ["", f"`didpo_fork@wall` has no trained reading for {seeds}: those seeds are left "
                      "out (step 0 is the start policy, not a trained result)."
                      + ("" if wall["seeds"] else " No seed reached one; the row is omitted.")]
    return lines
