"""Experiments that compare training methods over several seeds and write
``docs/results/<name>.{md,json,html,png}``.

Each experiment is a module of this package with a config dataclass ``Config`` and a
function ``run(config) -> Path`` (the markdown report); ``python -m labkit experiment NAME
--set key=value`` finds it through :data:`EXPERIMENTS`. This module holds what they share:
the multi-seed runner, the 95% interval, the report and its figure.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.config import from_dict, to_dict, to_record
from labkit.env.overlap import ReferencePool
from labkit.env.tasks import load_tasks, synthetic_problems
from labkit.experiments import stats
from labkit.experiments.paired import held_out_tasks, paired_difference, paired_eval
from labkit.experiments.stats import describe
from labkit.loops.events import RunFolder
from labkit.loops.trainer import WATCH_FIELDS, TrainConfig, Trainer, latest_checkpoint
from labkit.policy.loading import weights_fingerprint

EXPERIMENTS = ("learning", "reshaping", "didpo", "credit", "mucode")
"""Experiment modules under ``labkit.experiments`` (each defines ``Config`` and ``run``)."""

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

# Student t quantiles (two-sided 95%) for small samples; df -> t
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_ci95(xs: list[float]) -> tuple[float, float | None]:
    """Mean and half-width of the 95% t-interval; the half-width is ``None`` for a single
    value (one seed says nothing about seed-to-seed spread)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    t = _T95.get(len(xs) - 1, 1.96)
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def format_interval(mean: float, half: float | None, digits: int = 3, scale: float = 1.0,
                    signed: bool = False) -> str:
    """``"+0.012 ± 0.020"``; ``"+0.012 ± n/a"`` when there is no interval (one seed)."""
    if mean != mean:
        return "n/a"
    body = f"{mean * scale:+.{digits}f}" if signed else f"{mean * scale:.{digits}f}"
    return f"{body} ± {'n/a' if half is None else f'{half * scale:.{digits}f}'}"


@dataclass
class ExperimentConfig:
    """Shared budget of an experiment (every method gets the same)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    """Training seeds; every method trains once per seed (``TrainConfig.seed``: sampling,
    task order). The tasks themselves come from ``task_seed``, the same for every run, so runs
    are compared paired; the 95% interval over seeds covers training noise. A single seed
    gives no interval."""
    task_seed: int = 0
    """Seed of the training and held-out task lists (``tasks.seed``), fixed across seeds and
    methods: every run trains on the same problems and is evaluated on the same tasks."""
    train_split: str = "train"
    """Split trained on (``tasks.train_split``): ``train``, the shipped model's SFT templates
    (where it is strong and sure: few groups with signal), or ``val``, templates neither its
    SFT data nor ``test`` holds (room to learn). With ``val`` the paired evaluation also
    measures new instances of the trained templates (``paired_trained``)."""
    split: str = "test"
    """Held-out split evaluated on: ``test`` (templates training never saw), ``val``, or
    ``in_template`` (new instances of training templates)."""
    feedback: str = "dense"
    """Feedback regime of training (``feedback.mode``): dense, binary, public, noisy, coarse."""
    n_bugs: int = 1
    """Bugs per task (train and held-out); with 2-3, ``multi_hunk`` picks separable ones."""
    multi_hunk: bool = False
    """Only tasks whose bugs are separate, separately tested hunks (``tasks.multi_hunk``)."""
    paired_tasks: int = 200
    """After training: the start policy and every run's final checkpoint on these many
    held-out tasks of ``split``, one sampling seed (``labkit.experiments.paired``); the
    per-task changes give each seed's paired change. 0 = off."""
    paired_per_template: int | None = 12
    """At most this many of the ``paired_tasks`` from any one template, the list filled from
    further down the stream (:func:`labkit.env.balanced.balanced_tasks`; 12 since
    2026-12-03). ``0`` or ``None``: the split's first tasks as drawn, where one ``test``
    template is 28% of 200 (every result recorded before that date)."""
    paired_k: int = 4
    """Samples per task for each run's checkpoint in the paired evaluation (T = 0.7)."""
    paired_start_k: int = 16
    """Samples per task for the start policy, which every run is compared with (its noise
    would otherwise enter every seed's change alike)."""
    steps: int = 40
    """Policy updates per run (``TrainConfig.steps``); a checkpoint every
    ``max(1, steps // 3)``. The learning rate is constant without warm-up, which lets an
    aliased method read a shorter budget off another experiment's longer finished run
    (:func:`finished_run`, ``prefix``)."""
    tasks_per_step: int = 16
    """16 tasks x 8 samples per update: smaller batches did not generalise to held-out
    tasks on the tiny model (docs/results/probes)."""
    group_size: int = 8
    """G: completions sampled per task and update (``sampling.group_size``, the GRPO group;
    at most 320 new tokens). A larger group leaves fewer all-equal groups (zero
    advantage, no signal) at G times the sampling and sandbox cost per task."""
    temperature: float = 1.6
    """The training sampler's temperature (``sampling.temperature``; 1.6 since 2026-12-03,
    every result recorded before it ran at 1.0). A hotter sampler leaves fewer all-equal
    groups on a sure model: the shipped one on the balanced held-out list at T = 1.6 has
    11.5% all-equal groups, entropy 0.245, pass@1 0.244 / pass@8 0.515, where at T = 1.0
    (uncapped list) 55% and 0.048 (docs/tiny_model.md); GRPO gained as much held-out at 1.6
    as at 1.0 (docs/results/probes/tiny_h_t16_balanced). Evaluation always samples at 0.7."""
    sampler: str = "race"
    """How the training sampler draws a token (``sampling.sampler``): ``race`` (every recorded
    result) or ``inverse_cdf``, the same distribution at a fraction of the CPU time and
    another random stream (docs/benchmarks.md)."""
    parallel_chunks: int = 2
    """Sampling chunks (64 rows) decoded at once, one per core, each from its own random stream
    (``sampling.parallel_chunks``, also the runs' held-out evaluations): 2 since 2026-12-04,
    sampling in 0.80-0.85x the time idle and 0.29x with one core busy; every result recorded
    before it sampled with 1 (one stream, one chunk after another), which reproduces them."""
    lr: float = 5e-5
    """Peak AdamW learning rate (``optim.lr``), constant, no warm-up. 5e-5 moves the
    2M-parameter tiny model within tens of steps; a larger model wants far less."""
    eval_every: int = 20
    """Held-out pass@1 every N steps, plus step 0 and the last step
    (``TrainConfig.eval_every``): the points of the report's curves, and a budget read at step s
    needs one at s. 0 turns evaluation off and leaves the report nothing to read."""
    eval_tasks: int = 200
    """Held-out tasks of the synthetic ``test`` split (templates training never sees) at each
    evaluation (``tasks.eval_tasks``); an evaluation costs ``eval_tasks x eval_k`` samples."""
    eval_k: int = 4
    """Samples per held-out task at each evaluation, at T = 0.7 (``TrainConfig.eval_k``); pass@1
    is their mean pass rate. More samples narrow each reading's sampling noise at k times the
    evaluation cost."""
    train_problems: int = 2000
    """Synthetic training problems generated per run (``tasks.train_problems``, one buggy
    variant each); each step samples ``tasks_per_step`` of them."""
    out: str = str(RESULTS)
    """Folder the reports are written to: ``<name>.md``, ``.json``, ``.html`` and ``.png``
    (default: the repository's ``docs/results``)."""
    run_root: str = "runs/experiments"
    """Root of the run folders: method ``m`` of experiment ``e`` trains into
    ``<run_root>/<e>/<m>/seed<seed>``, where finished runs are found again (``reuse_finished``)
    and aliased methods look for the other experiment's runs. Relative to the working directory."""
    policy: str = "tiny"
    """The starting policy (``policy.spec``): ``tiny`` or a local Hugging Face causal-LM folder.
    Every run keeps a KL reference (``reference: auto``, ``kl_coef`` 0.01)."""
    reuse_finished: bool = True
    """Keep a run whose folder already holds a finished run of the same config: finished
    runs are not trained again, and an interrupted one resumes from its last checkpoint
    (:func:`prepare_run_dir`)."""
    report_to: str = "none"
    """Experiment trackers every run reports to (``TrainConfig.report_to``), comma-separated:
    tensorboard, wandb, mlflow, trackio, or none. Where a run is watched is not part of what
    it trains: runs reported elsewhere are reused and resumed alike."""


SYNTHETIC_TEST_TIMEOUT_S = 0.25
"""The experiments' per-test wall limit (``sandbox.test_timeout_s``; the sandbox's default
is 1 s). Synthetic references run in microseconds (all 1,463 of the val, test and two-bug
val sets pass at it); at 1 s the one looping candidate most steps hold made the sandbox phase
0.9 s of a 3.2 s step, at 0.25 s 0.42 s (docs/benchmarks.md)."""


def base_train_config(exp: ExperimentConfig, seed: int, run_dir: str) -> TrainConfig:
    return from_dict(TrainConfig, {
        "run_dir": run_dir, "seed": seed, "steps": exp.steps, "tasks_per_step": exp.tasks_per_step,
        "policy": {"spec": exp.policy, "reference": "auto"},
        "sampling": {"group_size": exp.group_size, "temperature": exp.temperature, "max_new_tokens": 320,
                     "sampler": exp.sampler, "parallel_chunks": exp.parallel_chunks},
        "tasks": {"source": "synthetic", "train_problems": exp.train_problems,
                  "train_split": exp.train_split, "eval_split": exp.split,
                  "eval_tasks": exp.eval_tasks, "seed": exp.task_seed, "n_bugs": exp.n_bugs,
                  "multi_hunk": exp.multi_hunk},
        "feedback": {"mode": exp.feedback},
        "sandbox": {"test_timeout_s": SYNTHETIC_TEST_TIMEOUT_S},
        "loss": {"kl_coef": 0.01, "micro_batch_size": 32},
        "optim": {"lr": exp.lr},
        "eval_every": exp.eval_every, "eval_k": exp.eval_k, "eval_temperature": 0.7,
        "checkpoint_every": max(1, exp.steps // 3), "log_rollouts": 16,
        "report_to": exp.report_to,
    })


def run_methods(name: str, methods: dict, exp: ExperimentConfig, configure=None,
                aliases: dict[str, str] | None = None) -> dict:
    """Train every method with every seed; collect eval curves and timings.

    ``aliases`` maps a method to another experiment's method (``"reshaping/raw_grpo"``) that
    trains the identical configuration: a finished run of it is reused instead of trained
    again (the config, run folder aside, must match exactly)."""
    results: dict = {"experiment": name, "config": to_record(exp), "methods": {}}
    if exp.paired_tasks:
        paired_list(exp)  # a list that cannot be filled fails now, not after the training
    weights = weights_fingerprint(exp.policy)  # a run is reused only on the same weights
    for method, make in methods.items():
        per_seed = []
        for seed in exp.seeds:
            run_dir = f"{exp.run_root}/{name}/{method}/seed{seed}"
            cfg = base_train_config(exp, seed, run_dir)
            cfg.reshape = make()
            if configure:
                configure(method, cfg)
            alias = f"{exp.run_root}/{aliases[method]}/seed{seed}" if aliases and method in aliases else None
            done = None
            if exp.reuse_finished:
                if finished_run(run_dir, cfg, weights=weights):
                    done = run_dir
                elif alias and finished_run(alias, cfg, prefix=True, weights=weights):
                    done = alias
            if done:
                per_seed.append(summarise_run(done, seed, upto=cfg.steps))
                print(f"{method} seed {seed}: reusing the finished run in {done} (its first "
                      f"{cfg.steps} steps)", flush=True)
                continue
            t0 = time.time()
            resume = prepare_run_dir(run_dir, cfg, weights=weights)
            tr = Trainer(cfg)
            record_weights(run_dir, weights)
            if resume:
                print(f"{method} seed {seed}: resuming {run_dir} from step {tr.resume()}", flush=True)
            tr.train(progress=True)
            tr.close()
            per_seed.append(summarise_run(run_dir, seed, wall_s=time.time() - t0))
            print(f"{method} seed {seed}: held-out pass@1 {per_seed[-1]['pass_at_1_start']:.3f} -> "
                  f"{per_seed[-1]['pass_at_1_end']:.3f} ({per_seed[-1]['wall_s']:.0f} s)", flush=True)
        results["methods"][method] = summarise_method(per_seed)
    results["setting"] = setting(exp, weights)
    results["seeds"] = list(exp.seeds)
    return results


def setting(exp: ExperimentConfig, weights: str | None = None) -> dict:
    """What every results file says first: split, feedback regime, model, budget, seeds.
    ``weights``: the policy's fingerprint when the caller has it (else it is computed)."""
    return {"train_split": exp.train_split, "split": exp.split, "feedback": exp.feedback,
            "model": exp.policy, "model_sha256": weights or weights_fingerprint(exp.policy),
            "steps": exp.steps, "batch": f"{exp.tasks_per_step} tasks x {exp.group_size} samples",
            "lr": exp.lr, "n_bugs": exp.n_bugs, "multi_hunk": exp.multi_hunk,
            "task_seed": exp.task_seed, "seeds": list(exp.seeds),
            "paired": {"tasks": exp.paired_tasks, "k": exp.paired_k, "start_k": exp.paired_start_k,
                       "temperature": 0.7, "per_template": exp.paired_per_template}}


def paired_list(exp: ExperimentConfig) -> list:
    """The ``exp.paired_tasks`` held-out tasks every run is compared on (of ``exp.split``, at
    most ``exp.paired_per_template`` per template). :func:`run_methods` builds it before it
    trains anything (the tasks are cached), so that a list the split cannot fill raises its
    ``ValueError`` at once instead of after hours of training."""
    return held_out_tasks(exp.paired_tasks, exp.split, exp.task_seed, exp.n_bugs, exp.multi_hunk,
                          exp.paired_per_template)


def add_paired(results: dict, exp: ExperimentConfig, methods: list[str] | None = None) -> dict:
    """Paired evaluation of every run of ``results`` (start vs final checkpoint, the same
    ``exp.paired_tasks`` held-out tasks and sampling seed); each method gets its
    ``paired_change`` (:func:`labkit.experiments.stats.paired_change`: the interval is over
    seeds). When the runs trained on ``val`` templates, the same is measured on new instances
    of those templates (``paired_trained_change``: what RL learnt where it trained, next to
    what carried over to ``split``). Returns the raw paired evaluation of ``split`` (also
    stored under ``results["paired"]``)."""
    methods = methods or list(results["methods"])
    tasks = paired_list(exp)
    pe = _add_paired_on(results, exp, methods, tasks, "paired")
    if exp.train_split != "train":
        # The leak pool that defines the held-out splits holds training-split references only;
        # a reference of the split trained on here may solve a held-out problem outright.
        leaked = leaked_task_ids(exp, tasks)
        clean = [i for i, t in enumerate(tasks) if t.task_id not in leaked]
        _add_paired_on(results, exp, methods, tasks, "paired_clean", keep=clean, evaluated=pe)
        results["paired_clean"]["dropped_solved_by_trained_reference"] = len(tasks) - len(clean)
        _add_paired_on(results, exp, methods, trained_template_tasks(exp), "paired_trained")
    return pe


def leaked_task_ids(exp: ExperimentConfig, tasks: list) -> set[str]:
    """Ids of ``tasks`` (synthetic, of ``exp.split``) whose every hidden test some reference
    of the problems trained on (``exp.train_problems`` of ``exp.train_split``) passes."""
    pool = ReferencePool(synthetic_problems(exp.train_split, exp.train_problems,
                                            seed=exp.task_seed))
    return {t.task_id for t in tasks if pool.solves_task(t)}


def trained_template_tasks(exp: ExperimentConfig) -> list:
    """``exp.paired_tasks`` new instances of the templates trained on (``exp.train_split``):
    problems of another stream of the generator whose ids no training problem has."""
    kinds = {"n_bugs": exp.n_bugs, "multi_hunk": exp.multi_hunk}
    trained = {t.problem_id for t in load_tasks("synthetic", split=exp.train_split,
                                                n=exp.train_problems, seed=exp.task_seed, **kinds)}
    want = exp.paired_tasks * (4 if exp.multi_hunk else 1) + len(trained) // 4
    for _ in range(3):  # multi-hunk instances skip many problems: widen the stream if short
        fresh = load_tasks("synthetic", split=exp.train_split, n=want,
                           seed=exp.task_seed + 1000, bugs_per_problem=1, **kinds)
        out = [t for t in fresh if t.problem_id not in trained][: exp.paired_tasks]
        if len(out) >= exp.paired_tasks:
            break
        want = want * 13 // 10
    if len(out) < exp.paired_tasks:
        raise ValueError(f"only {len(out)} new instances of the {exp.train_split!r} templates; "
                         f"lower paired_tasks or train_problems")
    return out


def _add_paired_on(results: dict, exp: ExperimentConfig, methods: list[str], tasks: list,
                   key: str, keep: list[int] | None = None, evaluated: dict | None = None) -> dict:
    """Paired changes of every run on ``tasks`` (only the task indices ``keep``, when given),
    under ``key``; ``evaluated``: the :func:`paired_eval` of these tasks, when already made."""
    dirs = [s["run_dir"] for m in methods for s in results["methods"][m]["seeds"]]
    pe = evaluated or paired_eval(dirs, tasks, exp.paired_k, start_k=exp.paired_start_k)
    idx = list(range(len(tasks))) if keep is None else keep
    start = [pe["start_per_task"][i] for i in idx]
    for m in methods:
        r = results["methods"][m]
        per_seed = {}
        for s in r["seeds"]:
            end = [pe["runs"][str(s["run_dir"])]["end_per_task"][i] for i in idx]
            per_seed[s["seed"]] = [e - b for b, e in zip(start, end)]
            diff = paired_difference(start, end)
            s[key] = {"end_pass_at_1": statistics.fmean(end), "change": diff["mean"],
                      "task_ci95": diff["ci95"]}
        r[f"{key}_change"] = stats.paired_change(per_seed)
        r[f"{key}_start_pass_at_1"] = statistics.fmean(start)
    results[key] = {"tasks": len(idx), "k": pe["k"], "start_k": pe["start_k"],
                    "start_pass_at_1": statistics.fmean(start)}
    return pe


def paired_lines(results: dict) -> list[str]:
    """The report's headline tables: each method's paired change with its interval over seeds
    (and, labelled, the hierarchical and task-only bootstraps), on the held-out split and, when
    measured, on new instances of the templates trained on."""
    setting = results.get("setting", {})
    cap = setting.get("paired", {}).get("per_template")
    split = f"`{setting.get('split')}`" + (f", at most {cap} per template" if cap else "")
    titles = {"paired": f"Paired held-out change ({{tasks}} tasks of {split}",
              "paired_clean": f"Paired held-out change without the tasks a reference trained on "
                              f"solves ({{tasks}} tasks of {split}",
              "paired_trained": "Paired change on the templates trained on ({tasks} new instances "
                                f"of `{setting.get('train_split')}`"}
    lines: list[str] = []
    for key, title in titles.items():
        p = results.get(key)
        if not p:
            continue
        lines += ["", "## " + title.format(tasks=p["tasks"]) + f", start {p['start_pass_at_1']:.3f} with "
                  f"{p['start_k']} samples per task, each run's final checkpoint with {p['k']}, "
                  "T = 0.7, one sampling seed)", "",
                  "| method | paired change, 95% CI over seeds | per seed | hierarchical bootstrap | "
                  "task-only bootstrap |", "|---|---|---|---|---|"]
        for m, r in results["methods"].items():
            c = r.get(f"{key}_change")
            if not c:
                continue
            h, t = c["hierarchical_ci95"], c["task_bootstrap_ci95"]
            lines.append(f"| {m} | {describe(c)} | {', '.join(f'{v:+.3f}' for v in c['per_seed'].values())} | "
                         + (f"[{h[0]:+.3f}, {h[1]:+.3f}]" if h else "n/a") + f" | [{t[0]:+.3f}, {t[1]:+.3f}] |")
    return lines + [""] if lines else []


WEIGHTS_FILE = "weights.json"
"""Beside a run's ``config.json``: the fingerprint of the starting policy's weights
(:func:`labkit.policy.loading.weights_fingerprint`). The config names the policy (``tiny``),
not its weights; when the shipped model is rebuilt, a run of the old one must not be reused."""


def record_weights(run_dir: str | Path, weights: str) -> None:
    """Write :data:`WEIGHTS_FILE` into ``run_dir``."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    Path(run_dir, WEIGHTS_FILE).write_text(json.dumps({"weights_sha256": weights}) + "\n")


def _same_weights(run_dir: Path, weights: str | None) -> bool:
    """``weights`` is None (not checked), or the run recorded the same fingerprint (a run
    without a record, from before runs recorded it, counts as another model)."""
    if weights is None:
        return True
    try:
        return json.loads((run_dir / WEIGHTS_FILE).read_text()).get("weights_sha256") == weights
    except (OSError, ValueError, AttributeError):
        return False


def prepare_run_dir(run_dir: str | Path, cfg: TrainConfig, weights: str | None = None) -> bool:
    """Before training ``cfg`` in ``run_dir``: True if the folder holds an unfinished run of
    the same config (and, when ``weights`` is given, the same starting weights) with a
    complete checkpoint (resume it). A folder holding anything else (another config or
    model, or no checkpoint to resume from) is moved aside to ``<run_dir>.replaced-<n>``,
    never overwritten or appended to; returns False."""
    d = Path(run_dir)
    if not d.exists() or not any(d.iterdir()):
        return False
    if (_saved_config(d) == _as_json(cfg) and _same_weights(d, weights)
            and latest_checkpoint(d) is not None):
        return True
    n = 1
    while d.with_name(f"{d.name}.replaced-{n}").exists():
        n += 1
    d.rename(d.with_name(f"{d.name}.replaced-{n}"))
    print(f"{d}: held another or unresumable run; moved to {d.name}.replaced-{n}", flush=True)
    return False


def finished_run(run_dir: str | Path, cfg: TrainConfig, prefix: bool = False,
                 weights: str | None = None) -> bool:
    """True when ``run_dir`` holds a run of exactly ``cfg`` (wherever its folder was) that
    reached ``cfg.steps`` and logged its final evaluation; with ``weights``, also one that
    started from the weights of that fingerprint (:data:`WEIGHTS_FILE`).

    ``prefix``: also accept a longer finished run of the same config that evaluated at step
    ``cfg.steps``, when the learning rate is constant without warm-up: its first
    ``cfg.steps`` steps are then exactly a ``cfg.steps``-step run (everything random derives
    from ``(seed, step)``), read with ``summarise_run(..., upto=cfg.steps)``."""
    theirs = _saved_config(Path(run_dir))
    if theirs is None or not _same_weights(Path(run_dir), weights):
        return False
    run = RunFolder(run_dir)
    steps, evals, ours = run.read("metrics.jsonl"), run.read("eval.jsonl"), _as_json(cfg)
    if not steps or not evals or steps[-1]["step"] != theirs.get("steps") or evals[-1]["step"] != theirs.get("steps"):
        return False
    ignore = {"run_dir": None}
    if prefix and cfg.optim.schedule == "constant" and not cfg.optim.warmup_steps:
        ignore |= {"steps": None, "checkpoint_every": None}
        if theirs["steps"] < cfg.steps or not any(e["step"] == cfg.steps for e in evals):
            return False
    return {**theirs, **ignore} == {**ours, **ignore}


def _as_json(cfg: TrainConfig) -> dict:
    """``cfg`` as it reads back from a run's ``config.json`` (tuples become lists), without
    the fields that say where it is watched (:data:`WATCH_FIELDS`)."""
    return {k: v for k, v in json.loads(json.dumps(to_dict(cfg))).items() if k not in WATCH_FIELDS}


def _saved_config(run_dir: Path) -> dict | None:
    try:
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return {k: v for k, v in saved.items() if k not in WATCH_FIELDS}


def summarise_run(run_dir: str | Path, seed: int, wall_s: float | None = None,
                  upto: int | None = None) -> dict:
    """One finished run folder -> the per-seed record of a report. Without ``wall_s`` the
    wall time is the sum of the logged step and evaluation times. ``upto``: read only the
    first ``upto`` steps (see :func:`finished_run`'s ``prefix``)."""
    run = RunFolder(run_dir)
    evals, steps = run.read("eval.jsonl"), run.read("metrics.jsonl")
    if upto is not None:
        evals = [e for e in evals if e["step"] <= upto]
        steps = [r for r in steps if r["step"] <= upto]
    if not evals or not steps:
        raise ValueError(f"{run_dir}: no eval.jsonl / metrics.jsonl rows; is the run finished?")
    if wall_s is None:
        wall_s = sum(r["time/step"] for r in steps) + sum(e.get("time/eval", 0.0) for e in evals)
    return {
        "seed": seed, "run_dir": str(run_dir), "wall_s": round(wall_s, 1),
        "s_per_step": round(statistics.fmean(r["time/step"] for r in steps), 3),
        "pass_at_1_start": evals[0]["eval/pass_at_1"], "pass_at_1_end": evals[-1]["eval/pass_at_1"],
        "curve": [[e["step"], e["eval/pass_at_1"]] for e in evals],
        "train_reward_first": steps[0]["reward/mean"], "train_reward_last": steps[-1]["reward/mean"],
    }


def summarise_method(per_seed: list[dict]) -> dict:
    """Per-seed records -> mean and 95% interval of start, end and end - start."""
    starts = [s["pass_at_1_start"] for s in per_seed]
    ends = [s["pass_at_1_end"] for s in per_seed]
    return {
        "seeds": per_seed,
        "start": mean_ci95(starts), "end": mean_ci95(ends),
        "delta": mean_ci95([e - s for s, e in zip(starts, ends)]),
        "wall_s": statistics.fmean(s["wall_s"] for s in per_seed),
        "s_per_step": statistics.fmean(s["s_per_step"] for s in per_seed),
    }


def write_report(results: dict, out_dir: str | Path, title: str, notes: str = "",
                 extra: list[str] | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = results["experiment"]
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    lines = [f"# {title}", "", notes, "", "## Periodic held-out evaluation during training", "",
             f"Each run's own readings ({results['config'].get('eval_tasks')} tasks x "
             f"{results['config'].get('eval_k')} samples at every evaluation); the interval is a "
             "t-interval over seeds of end - start.", "",
             "| method | held-out pass@1 start | end | end - start (95% CI) | s/step | wall per run (s) |",
             "|---|---|---|---|---|---|"]
    for m, r in results["methods"].items():
        (s, _), (e, _), (d, dh) = r["start"], r["end"], r["delta"]
        lines.append(f"| {m} | {s:.3f} | {e:.3f} | {format_interval(d, dh, signed=True)} | "
                     f"{r['s_per_step']:.2f} | {r['wall_s']:.0f} |")
    lines += ["", "Per seed:", "", "| method | seed | start | end | train reward first -> last |", "|---|---|---|---|---|"]
    for m, r in results["methods"].items():
        for sd in r["seeds"]:
            lines.append(f"| {m} | {sd['seed']} | {sd['pass_at_1_start']:.3f} | {sd['pass_at_1_end']:.3f} | "
                         f"{sd['train_reward_first']:.3f} -> {sd['train_reward_last']:.3f} |")
    lines = lines[:4] + paired_lines(results) + lines[4:]  # the paired change leads
    lines += extra or []
    fig_html, fig_png = _figure(results, out, name)
    lines += ["", f"Figure: [{fig_html.name}]({fig_html.name})" + (f", ![pass@1 vs step]({fig_png.name})" if fig_png else ""), ""]
    md = out / f"{name}.md"
    write_markdown(md, "\n".join(lines))
    return md


COMMENTARY = "<!-- commentary: kept when the report is written again -->"


def write_markdown(path: Path, generated: str) -> None:
    """Write a report's generated part; a hand-written reading of the numbers below the
    :data:`COMMENTARY` marker in the existing file is kept (moved under the new numbers)."""
    kept = ""
    if path.exists():
        old = path.read_text()
        if COMMENTARY in old:
            kept = old[old.index(COMMENTARY):]
    path.write_text(generated.rstrip("\n") + "\n" + ("\n" + kept if kept else ""))


def _figure(results: dict, out: Path, name: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for m, r in results["methods"].items():
        for sd in r["seeds"]:
            xs, ys = zip(*sd["curve"])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{m} seed {sd['seed']}",
                                     legendgroup=m, opacity=0.8))
    fig.update_layout(title=f"{name}: held-out pass@1 vs step", xaxis_title="step",
                      yaxis_title="held-out pass@1", template="plotly_white")
    return save_figure(fig, out, name)


def save_figure(fig, out: Path, name: str, width: int = 900, height: int = 500):
    """``<out>/<name>.html`` (loading plotly.js as :func:`write_figure_html` says) and, when
    kaleido can render it, ``<name>.png``; returns both paths (``None`` for a skipped PNG)."""
    out.mkdir(parents=True, exist_ok=True)
    html = write_figure_html(fig, out / f"{name}.html")
    png = out / f"{name}.png"
    try:
        fig.write_image(str(png), width=width, height=height)
    except Exception as e:  # noqa: BLE001 - kaleido needs a Chrome; report and keep the HTML
        print(f"PNG export skipped: {type(e).__name__}: {e}")
        png.unlink(missing_ok=True)  # never leave an earlier run's picture beside this page
        png = None
    return html, png


PLOTLY_JS = "plotly.min.js"


def shared_plotly_js(folder: Path) -> str | None:
    """The path, relative to ``folder``, of the nearest ``plotly.min.js`` of the installed
    plotly's version in ``folder`` or a folder above it inside the same project (the walk
    stops at the first folder holding ``.git`` or ``pyproject.toml``; outside a project only
    ``folder`` itself is looked at); ``None`` when there is none.

    This is what lets the figures of ``docs/results/probes/<name>/`` load the one committed
    ``docs/results/plotly.min.js`` instead of each folder carrying its own 4.6 MB copy."""
    import os

    from plotly.offline import get_plotlyjs_version

    folder = folder.resolve()
    chain = [folder, *folder.parents]
    top = next((i for i, d in enumerate(chain)
                if (d / ".git").exists() or (d / "pyproject.toml").is_file()), 0)
    wanted = f"plotly.js v{get_plotlyjs_version()}"
    for d in chain[:top + 1]:
        js = d / PLOTLY_JS
        if js.is_file():
            with js.open(errors="replace") as f:
                head = f.read(200)
            if wanted in head:
                return Path(os.path.relpath(js, folder)).as_posix()
    return None


def write_figure_html(fig, html: Path) -> Path:
    """Write ``fig`` as a full HTML page at ``html``. The page loads plotly.js from the nearest
    copy of the installed version found by :func:`shared_plotly_js` (``plotly.min.js``
    beside the page, or e.g. ``../../plotly.min.js``); when there is none, plotly's
    ``include_plotlyjs="directory"`` writes one beside the page, which every later figure of
    that folder shares. That mode keeps a ``plotly.min.js`` already beside the page whatever
    its version, so a stale copy there must be deleted by hand."""
    shared = shared_plotly_js(html.parent)
    fig.write_html(str(html), include_plotlyjs=shared or "directory", full_html=True)
    return html


def load(name: str):
    """The experiment module called ``name`` (``Config`` and ``run``), with a clear error."""
    import importlib

    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    try:
        return importlib.import_module(f"labkit.experiments.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"labkit.experiments.{name}":
            raise ValueError(f"experiment {name!r} is not built yet") from None
        raise
