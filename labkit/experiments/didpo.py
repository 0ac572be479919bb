"""``python -m labkit experiment didpo``: does diff-level credit beat GRPO on multi-hunk
repairs, and could this testbed see it if it did?

Every method trains on the same two-bug, multi-hunk tasks with the same seeds and raw reward;
only the advantage estimator differs: ``grpo`` (one advantage per completion), ``didpo``
(DiDPO's ``A_E + lambda A_D`` over diff anchors), ``didpo_fork`` (credit from counterfactual
forks). Two controls run in the same harness:

* **positive**: ``oracle_hunk``, GRPO plus each hunk's exact Shapley value, measured by
  running every subset of the rollout's hunks (:mod:`labkit.credit.oracle`): the best
  diff-level credit there is. If it does not beat GRPO by more than the design's minimum
  detectable effect, this testbed cannot test DiDPO's claim at this scale;
* **negative**: ``oracle_hunk_shuffled``, the same values permuted among each group's hunks.

At equal cost and step size: ``didpo_fork@wall`` trains the fork estimator for the steps that
fit in GRPO's wall time (step costs measured side by side before training), and every credit
estimator also trains rescaled to GRPO's per-group RMS (its ``scale="rms"`` variant,
``didpo@rms``: ``TrainConfig.match_scale``; :mod:`labkit.experiments.methods`), so a
difference is not a step-size difference. Each row records
the mean ``|A|`` per token and the update's gradient norm.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from labkit import provenance
from labkit.experiments import claims, pages
from labkit.experiments.claims import Contrast
from labkit.experiments.config import ExperimentConfig, command
from labkit.experiments.methods import METHODS, check_methods, variant
from labkit.experiments.paired import add_paired
from labkit.experiments.runs import (check_engine, engine_folder, method_config, run_methods,
                                     train_config_record, training_record)
from labkit.loops.trainer import Trainer

TITLE = "Diff-level credit on multi-hunk repairs: GRPO, DiDPO, DiDPO-fork and an oracle"


@dataclass
class Config(ExperimentConfig):
    """The shared budget, the methods, and the controls."""

    METHOD_FIELDS = ("methods", "scale_matched", "equal_wall", "cost_rounds")

    train_split: str = "val"
    """Trained on the ``val`` templates (never in the shipped model's SFT data)."""
    train_problems: int = 1000
    """Synthetic two-bug training problems of ``train_split``."""
    methods: tuple[str, ...] = ("grpo", "didpo", "didpo_fork", "oracle_hunk", "oracle_hunk_shuffled")
    """Methods (:data:`labkit.experiments.methods.METHODS`: an advantage estimator on the raw
    reward each) trained on every seed."""
    scale_matched: tuple[str, ...] = ("didpo", "didpo_fork", "oracle_hunk")
    """Methods also trained with their advantages rescaled to GRPO's per-group RMS (each one's
    ``scale="rms"`` variant, e.g. ``didpo@rms``)."""
    equal_wall: bool = True
    """Also train ``didpo_fork@wall``, DiDPO-fork's variant at GRPO's wall time: the steps that
    fit in it (``steps * cost_grpo / cost_fork``, the costs measured side by side first)."""
    n_bugs: int = 2
    """Two bugs per task, in separate hunks: DiDPO's premise is multi-region edits."""
    multi_hunk: bool = True
    """Only tasks whose bugs are separately tested hunks (a partial repair earns partial
    reward)."""
    paired_per_template: int | None = 16
    """At most 16 held-out tasks of any one template: two-bug multi-hunk tasks come from the
    ``test`` templates at very different rates, and 12 cannot fill 200 tasks."""
    steps: int = 40
    """Policy updates per run."""
    eval_tasks: int = 64
    """Tasks of each periodic evaluation (the paired evaluation uses ``paired_tasks``)."""
    fork_fraction: float = 0.05
    """Forks per completion token (``fork.fraction``)."""
    fork_budget: int = 2
    """At most this many forks per completion (``fork.budget``)."""
    fork_strategy: str = "entropy"
    """Where to fork (``fork.strategy``): the policy's least sure tokens."""
    cost_rounds: int = 2
    """Rounds of the side-by-side cost measurement (one step of every method per round)."""

    def validate(self) -> None:
        super().validate()
        check_methods(self.methods)
        check_methods(self.scale_matched, field_name="scale_matched")
        trained(self)  # every scale-matched method has its variant
        if self.equal_wall and "grpo" not in self.methods:
            raise ValueError("equal_wall compares with GRPO's wall time: add grpo to methods")


PRIMARY = (
    Contrast("DiDPO - GRPO", "claim", "didpo", "grpo", +1, size=0.056,
             source="DiDPO (arXiv 2608.07147): 48.4 against GRPO's 42.8 average pass@1 over 8 "
                    "benchmarks, Qwen2.5-Coder-7B (+5.6 points)"),
    Contrast("oracle hunk credit - GRPO", "positive", "oracle_hunk", "grpo", +1),
    Contrast("shuffled oracle credit - GRPO", "negative", "oracle_hunk_shuffled", "grpo", +1),
)
"""The claim and its signed controls, named before the run."""

SMOKE = {"seeds": (0, 1), "steps": 2, "tasks_per_step": 1, "group_size": 2, "eval_every": 2,
         "eval_tasks": 2, "eval_k": 1, "train_problems": 40, "paired_tasks": 3, "paired_k": 1,
         "paired_pass_k": 2, "paired_per_template": 0, "cost_rounds": 1, "paired_trained": False}
"""``--smoke``: every method and row, two seeds, two steps each."""


HEADROOM = 0.05
"""The oracle's gain over GRPO (held-out pass@1) a testbed must show before DiDPO's claim is
tried on it: with less, even the best diff-level credit could not reach half the claimed
+0.056, so no number of seeds would decide the claim there."""


def pilot_lines(results: dict) -> list[str]:
    """A pilot's reading (a page that trained the oracle and GRPO but not DiDPO): the oracle's
    gain over GRPO on every evaluation, against :data:`HEADROOM`, and the seeds a full run on
    the same tasks needs to detect half that gain, from the pilot's own variance components
    (:func:`labkit.experiments.claims.plan`)."""
    if "didpo" in results["methods"] or not {"grpo", "oracle_hunk"} <= set(results["methods"]):
        return []
    oracle = next(c for c in PRIMARY if c.role == "positive")
    rows = []
    for key in pages.PAIRED_KEYS:
        change, _ = claims.method_change(results, oracle, key)
        if not change:
            continue
        p = claims.plan(change, change["mean"]) if change["mean"] > 0 else None
        seeds = "n/a (no gain)" if p is None else (str(p["seeds"]) if p["seeds"] else "more than 64")
        if not change.get("ci95"):  # one seed: no interval to read
            verdict = "not decided (one seed)"
        else:
            verdict = "yes" if change["ci95"][0] > 0 and change["mean"] >= HEADROOM else "no"
        rows.append(f"| {key.replace('_', ' ')} | {results[key]['tasks']} | {pages.cell(change)} | "
                    f"{verdict} | {seeds} |")
    return ["## Pilot: is there headroom for diff-level credit?", "",
            f"DiDPO was not trained: this page asks whether the oracle's exact hunk credit beats "
            f"GRPO by at least {HEADROOM:.2f} held-out pass@1 (interval above 0), the room DiDPO's "
            "claim needs. Seeds: how many a full run on the same tasks needs to detect half the "
            "oracle's gain, from this pilot's variance components.", "",
            "| evaluation | tasks | oracle - GRPO [95%] | headroom | seeds for half the gain |",
            "|---|---|---|---|---|", *rows, ""]


def restat(results: dict) -> dict:
    """:func:`labkit.experiments.claims.restat_methods` with this experiment's claim."""
    return claims.restat_methods(results, PRIMARY, claims.primary_key(results["config"]))


def trained(exp: Config) -> list[str]:
    """Every method the experiment trains, in order: ``methods``, the scale-matched variants
    of ``scale_matched``, and DiDPO-fork at GRPO's wall time (``equal_wall``)."""
    return [*exp.methods, *(variant(m, scale="rms") for m in exp.scale_matched),
            *([variant("didpo_fork", wall="grpo")] if exp.equal_wall else [])]


def shared(exp: Config) -> dict:
    """What every method's runs share beyond the base config: how the forks are made."""
    return {"fork.fraction": exp.fork_fraction, "fork.budget": exp.fork_budget,
            "fork.strategy": exp.fork_strategy}


def measure_step_costs(exp: Config, methods: tuple[str, ...], rounds: int = 2) -> dict[str, float]:
    """Seconds per training step of each method, measured side by side now: ``rounds`` rounds,
    each training one step of every method in turn (same seed, tasks and start policy, fresh
    run folders, no evaluation), so all share the machine's load; the median over rounds (the
    first round also pays one-off set-up, the reason for more than one)."""
    import shutil
    import tempfile

    times: dict[str, list[float]] = {m: [] for m in methods}
    root = Path(tempfile.mkdtemp(prefix="didpo-costs-"))
    try:
        trainers = {}
        for m in methods:
            cfg = method_config(exp, m, exp.seeds[0], str(root / m), shared(exp))
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


COSTS_FILE = "step_costs.json"
"""Where an experiment keeps its side-by-side step costs, in its engine's folder of the run root."""


def step_costs(exp: Config, methods: tuple[str, ...]) -> tuple[dict[str, float], str]:
    """The side-by-side step costs of ``methods`` (:func:`measure_step_costs`) and where they
    came from: ``"measured"`` now, or the path of :data:`COSTS_FILE` they were read from.

    They are measured once per run root and kept with the code and every timed method's
    training config: a later start of the same experiment at the same code and configs (a
    resume after an interruption, or a process that trains other seeds of it) reads them back,
    so ``didpo_fork@wall`` keeps the number of steps it started with; so does a start that times
    a subset of the kept methods. A cost measured again would differ by its noise, change those steps
    and so the runs' configs, and restart them from nothing. Other code or configs measure
    anew (and replace the file)."""
    path = Path(exp.run_root) / engine_folder("didpo", exp) / COSTS_FILE
    key = json.loads(json.dumps({
        "methods": list(methods), "rounds": exp.cost_rounds,
        "configs": {m: train_config_record(method_config(exp, m, exp.seeds[0], "-", shared(exp)))
                    for m in methods}}))
    now = provenance.code_identity()
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = None
    if (isinstance(kept, dict) and kept.get("rounds") == key["rounds"]
            and all(kept.get("configs", {}).get(m) == c for m, c in key["configs"].items())
            and provenance.drift([kept.get("code")], now) is None):
        return {m: float(kept["costs"][m]) for m in methods}, str(path)
    costs = measure_step_costs(exp, methods, exp.cost_rounds)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**key, "code": now, "costs": costs}, indent=1))
    return costs, "measured"


def run(exp: Config) -> Path:
    exp.validate()  # unknown methods fail before training
    methods = trained(exp)
    check_engine(exp, methods, shared(exp))  # before the step costs are measured
    walls = [METHODS[m] for m in methods if METHODS[m].wall]  # timed against their own method
    timed = tuple(dict.fromkeys([*(x for w in walls for x in (w.wall, w.variant_of)), *exp.methods]))
    costs, costs_from = step_costs(exp, timed) if walls else ({}, None)
    wall_steps = max(1, int(exp.steps * costs[walls[0].wall] / costs[walls[0].variant_of])) \
        if walls else None
    results = run_methods("didpo", methods, exp, shared=shared(exp), wall_steps=wall_steps)
    results["command"] = command("didpo", exp)
    results["step_costs_s"] = costs
    results["step_costs_from"] = costs_from
    results["wall_steps"] = wall_steps
    training_record(results)
    if exp.paired_tasks:
        add_paired(results, exp)
        results["primary"] = claims.read(results, PRIMARY, claims.primary_key(exp))
    return pages.write_page(results, exp.out, render, pages.curves_figure)


def _pairs(results: dict) -> list[tuple[str, str]]:
    """The method-against-method rows (the primary ones among them are read above)."""
    names = list(results["methods"])
    out = [("grpo", m) for m in names if m != "grpo"]
    out += [("didpo", "didpo_fork")] if {"didpo", "didpo_fork"} <= set(names) else []
    out += [(METHODS[m].variant_of, m) for m in names if m in METHODS and METHODS[m].scale == "rms"
            and METHODS[m].variant_of in names]
    return out


def render(results: dict) -> str:
    """The page of a didpo results JSON."""
    c, s = results["config"], results["setting"]
    what = (f"Every method: `{s['model']}`, raw reward (the fraction of hidden tests passed, so a "
            f"partial repair earns partial reward), {s['steps']} steps of {s['batch']} at "
            f"T = {c['temperature']}, {pages.optim_text(results, 'grpo')}; {c['n_bugs']} bugs per task "
            f"in separate, separately tested hunks; trained on the `{s['train_split']}` templates, "
            f"held out: `{s['split']}`. Only the advantage estimator differs. Forks: at most "
            f"{c['fork_budget']} per completion at `{c['fork_strategy']}` positions.")
    lines = pages.header(results, TITLE, what) + pilot_lines(results) + pages.primary_lines(results)
    pairs = _pairs(results)
    holm = pages.family(results, pairs)
    lines += ["## Paired change (exploratory)", ""]
    for key in pages.PAIRED_KEYS:
        lines += pages.paired_lines(results, key, holm=holm)
    for key in pages.PAIRED_KEYS:
        lines += pages.difference_lines(results, pairs, key, holm=holm)
    lines += ["## Cost and step size", "", cost_text(results), "",
              "| method | s/step (side by side) | x GRPO | mean abs(A) per token | grad norm | all-equal groups |",
              "|---|---|---|---|---|---|"]
    costs = results.get("step_costs_s") or {}
    for m, r in results["methods"].items():
        cost = costs.get(m)
        ratio = f"{cost / costs['grpo']:.2f}" if cost and costs.get("grpo") else "n/a"
        lines.append(f"| {m} | {f'{cost:.2f}' if cost else 'n/a'} | {ratio} | "
                     f"{_num(r.get('abs_adv_per_token'))} | {_num(r.get('grad_norm'))} | "
                     f"{_num(r.get('zero_std_frac'))} |")
    lines += [""] + pages.periodic_lines(results) + pages.figure_line(pages.page_name(results))
    return "\n".join(lines)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def cost_text(results: dict) -> str:
    costs, wall = results.get("step_costs_s") or {}, results.get("wall_steps")
    if not costs or wall is None:
        return "No side-by-side cost measurement in this run."
    when = ("before training" if results.get("step_costs_from") in (None, "measured") else
            "when this experiment's runs first started (kept in their folder's "
            f"`{COSTS_FILE}`, so a resumed experiment trains the same steps)")
    return (f"Step costs measured side by side {when}; `didpo_fork@wall` trains "
            f"{wall} steps, what fits in the wall time of GRPO's {results['setting']['steps']} "
            f"(a fork step costs {costs['didpo_fork'] / costs['grpo']:.2f}x GRPO's).")
