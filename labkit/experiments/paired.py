"""Paired held-out evaluation: the start policy and each run's final checkpoint on the same
tasks with the same sampling seed, so that a change in pass@1 is measured task by task
instead of as the difference of two noisy means.

Protocol (:class:`Protocol`): for training seed ``s`` the evaluation sampling seed is
``e_s = derive_seed(eval_seed, "paired", s)``; the start policy and every run of seed ``s``
are evaluated at ``e_s``: ``k`` samples per task at ``temperature`` (pass@1, their mean pass
rate) and, when ``pass_k > 0``, ``pass_k`` samples per task at the training temperature
(pass@k, and pass@1 at that temperature). A seed's change ``d_{s,i} = end_{s,i} - start_{s,i}``
then holds the start's sampling noise of that seed, so the interval over seeds covers it.

Every evaluation is cached in a JSON file named after what it evaluated (the policy's
weights or checkpoint, the tasks, the protocol and the seed), so a report can be rebuilt
without evaluating again and an interrupted experiment repeats nothing it finished.

``python -m labkit paired RUN_DIR [RUN_DIR ...] --tasks 400 --k 4`` prints, per run, its
paired change with a bootstrap interval over tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.config import from_dict
from labkit.env.balanced import balanced_synthetic
from labkit.env.overlap import ReferencePool
from labkit.sandbox.pool import Sandbox
from labkit.env.tasks import load_tasks, synthetic_problems
from labkit.experiments import stats
from labkit.experiments.config import ExperimentConfig, ReuseError
from labkit.loops.trainer import TrainConfig, latest_checkpoint
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import load_policy, weights_fingerprint
from labkit.seeding import derive_seed


@dataclass(frozen=True)
class Protocol:
    """How the start and the end of every run are evaluated."""

    k: int = 4
    """Samples per task at ``temperature``: pass@1 is their mean pass rate."""
    temperature: float = 0.7
    """Sampling temperature of pass@1."""
    pass_k: int = 8
    """Samples per task at ``train_temperature`` for pass@k (0 = off)."""
    train_temperature: float = 1.6
    """The training sampler's temperature, at which pass@k is read."""
    eval_seed: int = 4321
    """Base of the per-training-seed evaluation seeds."""
    parallel_chunks: int = 2
    """Sampling chunks decoded at once (``EvalConfig.parallel_chunks``; part of the stream)."""
    max_new_tokens: int = 320
    """Longest completion."""

    def seed_for(self, training_seed: int) -> int:
        """``e_s``: the sampling seed of training seed ``s``'s start and end evaluations."""
        return derive_seed(self.eval_seed, "paired", training_seed)

    @classmethod
    def of(cls, exp: ExperimentConfig) -> "Protocol":
        return cls(k=exp.paired_k, temperature=exp.paired_temperature, pass_k=exp.paired_pass_k,
                   train_temperature=exp.temperature, eval_seed=exp.paired_eval_seed,
                   parallel_chunks=exp.parallel_chunks)


def policy_at(run_dir: str | Path, step: int | None = None):
    """The run's policy at its newest complete checkpoint (or ``step``; 0 = the start)."""
    import torch

    run = Path(run_dir)
    cfg = from_dict(TrainConfig, json.loads((run / "config.json").read_text()))
    policy = load_policy(cfg.policy)
    if step == 0:
        return policy
    ckpt = run / "checkpoints" / f"step_{step:06d}" if step else latest_checkpoint(run)
    if ckpt is None or not (ckpt / "COMPLETE").exists():
        raise FileNotFoundError(f"{run}: no complete checkpoint{'' if step is None else f' at step {step}'}")
    params = dict(policy.model.named_parameters())
    with torch.no_grad():
        for name, value in torch.load(ckpt / "trainable.pt", weights_only=True).items():
            params[name].copy_(value)
    return policy


def held_out_tasks(n_tasks: int, split: str = "test", seed: int = 0, n_bugs: int = 1,
                   multi_hunk: bool = False, per_template: int | None = None) -> list:
    """The first ``n_tasks`` synthetic tasks of ``split`` (one buggy variant per problem), the
    same list for every run compared on them. ``per_template``: at most that many tasks of
    any one template, drawing further into the stream to fill the list
    (:func:`labkit.env.balanced.balanced_tasks`)."""
    per = 4 if multi_hunk else 1  # multi-hunk: about 40% of problems give one
    kinds = {"n_bugs": n_bugs, "multi_hunk": multi_hunk}
    if per_template:
        return balanced_synthetic(split, n_tasks, per_template, seed=seed,
                                  problems=2 * n_tasks * per, **kinds)
    return load_tasks("synthetic", split=split, n=n_tasks * per, seed=seed, **kinds)[:n_tasks]


def paired_list(exp: ExperimentConfig) -> list:
    """The ``exp.paired_tasks`` held-out tasks every run is compared on (of ``exp.split``, at
    most ``exp.paired_per_template`` per template). Experiments build it before they train
    anything (the tasks are cached), so a list the split cannot fill fails at once."""
    return held_out_tasks(exp.paired_tasks, exp.split, exp.task_seed, exp.n_bugs, exp.multi_hunk,
                          exp.paired_per_template)


def cache_name(kind: str, task_ids: Sequence[str], **key) -> str:
    """File name of a cached evaluation of ``kind`` on ``task_ids`` under ``key``."""
    text = json.dumps({"tasks": list(task_ids), **key}, sort_keys=True)
    return f"paired-{kind}-" + hashlib.sha256(text.encode()).hexdigest()[:12] + ".json"


def _correct(load, tasks: Sequence, k: int, temperature: float, seed: int, proto: Protocol,
             path: Path, sandbox) -> list[int]:
    """Per task, how many of ``k`` samples at ``temperature`` and ``seed`` pass every hidden
    test; read from ``path`` when it holds this evaluation, else evaluated (``load()`` gives
    the policy) and written there."""
    try:
        return json.loads(path.read_text())["correct"]
    except (OSError, ValueError, KeyError):
        pass
    rep = evaluate(load(), tasks, EvalConfig(k=k, temperature=temperature, greedy=False, seed=seed,
                                             max_new_tokens=proto.max_new_tokens,
                                             parallel_chunks=proto.parallel_chunks), sandbox=sandbox)
    correct = [p["correct"] for p in rep["per_task"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"k": k, "temperature": temperature, "seed": seed,
                                "task_ids": [t.task_id for t in tasks], "correct": correct}))
    return correct


def _readings(load, tasks, proto: Protocol, seed: int, where: Path, ident: str, sandbox) -> dict:
    """pass@1 at the protocol's temperature and, when asked, pass@k and pass@1 at the
    training temperature, per task, for one policy and one sampling seed."""
    ids = [t.task_id for t in tasks]
    c1 = _correct(load, tasks, proto.k, proto.temperature, seed, proto,
                  where / cache_name("p1", ids, who=ident, k=proto.k, t=proto.temperature, seed=seed,
                                     chunks=proto.parallel_chunks), sandbox)
    out = {"pass_at_1": [c / proto.k for c in c1]}
    if proto.pass_k:
        ck = _correct(load, tasks, proto.pass_k, proto.train_temperature, seed, proto,
                      where / cache_name("pk", ids, who=ident, k=proto.pass_k,
                                         t=proto.train_temperature, seed=seed,
                                         chunks=proto.parallel_chunks), sandbox)
        out["pass_at_k"] = [float(c > 0) for c in ck]
        out["pass_at_1_train_t"] = [c / proto.pass_k for c in ck]
    return out


def paired_eval(runs: Sequence[tuple[int, str | Path]], tasks: Sequence, proto: Protocol,
                cache: str | Path | None = None) -> dict:
    """Evaluate the start policy and every run's final checkpoint on ``tasks``.

    ``runs``: ``(training seed, run folder)`` pairs. For each seed the start policy (the first
    run's config) is evaluated once at that seed's sampling seed and cached in ``cache``
    (default: beside the first run, ``<its parent>/../paired-start``); each run's end in its
    own folder. Returns ``{"protocol", "task_ids", "start": {seed: readings}, "runs":
    {run_dir: {"seed", **readings}}}``, readings being per-task lists (:func:`_readings`)."""
    if not runs:
        raise ValueError("paired_eval needs at least one run")
    first = Path(runs[0][1])
    cache = Path(cache) if cache else first.parent.parent / "paired-start"
    start_spec = from_dict(TrainConfig, json.loads((first / "config.json").read_text())).policy
    start_id = "start:" + weights_fingerprint(start_spec.spec)
    out = {"protocol": dataclasses.asdict(proto), "task_ids": [t.task_id for t in tasks],
           "start": {}, "runs": {}}
    with Sandbox() as sandbox:
        for seed in sorted({s for s, _ in runs}):
            e = proto.seed_for(seed)
            out["start"][str(seed)] = _readings(lambda: policy_at(first, 0), tasks, proto, e, cache,
                                                start_id, sandbox)
        for seed, run_dir in runs:
            d = Path(run_dir)
            ckpt = latest_checkpoint(d)
            if ckpt is None:
                raise FileNotFoundError(f"{d}: no complete checkpoint to evaluate")
            ident = f"{d.resolve()}:{ckpt.name}"
            out["runs"][str(run_dir)] = {"seed": seed, **_readings(lambda d=d: policy_at(d), tasks, proto,
                                                                   proto.seed_for(seed), d, ident,
                                                                   sandbox)}
    return out


# ----------------------------------------------------------------------------- experiments


READINGS = {"pass_at_1": "paired", "pass_at_k": "paired_pass_k"}
"""Reading of a paired evaluation -> the key prefix of its changes in a results file."""


def add_paired(results: dict, exp: ExperimentConfig, methods: list[str] | None = None) -> dict:
    """Paired changes of every run of ``results``: each method gets ``paired_change`` (pass@1)
    and ``paired_pass_k_change`` (pass@k at the training temperature), each a
    :func:`labkit.experiments.stats.paired_change` record (interval over seeds). When the runs
    trained on ``val`` templates, also without the held-out tasks a trained-on reference
    solves (``paired_clean``) and on new instances of the trained templates
    (``paired_trained``). Returns the raw paired evaluation of ``split``."""
    recorded = results.get("recorded", {}).get("methods", ())  # their changes came with them
    methods = methods or [m for m in results["methods"] if m not in recorded]
    blocks = results.get("recorded", {}).pop("paired", {})
    if not methods:  # every method came from a record: its evaluations stand, nothing to pair
        results.update(blocks)
        return {}
    tasks = paired_list(exp)
    proto = Protocol.of(exp)
    runs = [(s["seed"], s["run_dir"]) for m in methods for s in results["methods"][m]["seeds"]]
    cache = Path(exp.run_root) / "paired-start"
    pe = paired_eval(runs, tasks, proto, cache)
    _changes(results, methods, pe, "paired")
    if exp.train_split != "train":
        # The leak pool that defines the held-out splits holds training-split references only;
        # a reference of the split trained on here may solve a held-out problem outright.
        leaked = leaked_task_ids(exp, tasks)
        clean = [i for i, t in enumerate(tasks) if t.task_id not in leaked]
        _changes(results, methods, pe, "paired_clean", keep=clean)
        results["paired_clean"]["dropped_solved_by_trained_reference"] = len(tasks) - len(clean)
        if exp.paired_trained:
            trained = trained_template_tasks(exp)
            _changes(results, methods, paired_eval(runs, trained, proto, cache), "paired_trained")
    results["paired"]["protocol"] = pe["protocol"]
    samples = len(tasks) * (proto.k + proto.pass_k) * (len({s for s, _ in runs}) + len(runs))
    results["paired"]["samples"] = samples
    if exp.screen_tasks:
        add_screened(results, exp, methods, runs, cache)
    return pe


def add_screened(results: dict, exp: ExperimentConfig, methods: list[str], runs: list,
                 cache: Path) -> None:
    """The lower-noise evaluation (``paired_screened``): held-out tasks the start policy neither
    always nor never passes, more samples per task, and the screen's reading as a control
    variate.

    1. Screen: ``exp.screen_pool`` held-out tasks of ``exp.split`` (at most
       ``exp.screen_per_template`` per template; without the ones a trained-on reference solves
       when training used other templates), the start policy sampled ``exp.screen_k`` times per
       task at the evaluation temperature with a sampling seed of its own (``screen``); a task
       is kept when its pass rate ``x_i`` lies in ``exp.screen_range``, the first
       ``exp.screen_tasks`` of them.
    2. Evaluate start and ends on the kept tasks as the paired protocol does, with
       ``exp.screen_eval_k`` samples per task (pass@1 only).
    3. Adjust: ``d'_si = d_si - beta (x_i - mean x)``, ``beta`` the slope of the tasks' mean
       change on ``x`` (:func:`control_variate`). ``x`` comes from another sampling seed than
       ``d``, so the adjustment removes task-to-task variation without bias; the analysis is
       the usual one on ``d'``.

    The screened list is another population (tasks whose outcome the start leaves open): its
    change answers "on tasks where there is room", at a cost in samples the page states beside
    the standard evaluation's (``samples``)."""
    pool = held_out_tasks(exp.screen_pool, exp.split, exp.task_seed, exp.n_bugs, exp.multi_hunk,
                          exp.screen_per_template)
    if exp.train_split != "train":
        leaked = leaked_task_ids(exp, pool)
        pool = [t for t in pool if t.task_id not in leaked]
    proto = Protocol.of(exp)
    first = Path(runs[0][1])
    start_id = "start:" + weights_fingerprint(
        from_dict(TrainConfig, json.loads((first / "config.json").read_text())).policy.spec)
    ids = [t.task_id for t in pool]
    seed = derive_seed(exp.paired_eval_seed, "screen")
    with Sandbox() as sandbox:
        correct = _correct(lambda: policy_at(first, 0), pool, exp.screen_k, proto.temperature, seed,
                           proto, cache / cache_name("screen", ids, who=start_id, k=exp.screen_k,
                                                     t=proto.temperature, seed=seed,
                                                     chunks=proto.parallel_chunks), sandbox)
    low, high = exp.screen_range
    rate = {t.task_id: c / exp.screen_k for t, c in zip(pool, correct)}
    kept = [t for t in pool if low <= rate[t.task_id] <= high][:exp.screen_tasks]
    if len(kept) < 2:
        raise ValueError(f"the screen kept {len(kept)} of {len(pool)} held-out tasks; widen "
                         "screen_range or raise screen_pool")
    sproto = dataclasses.replace(proto, k=exp.screen_eval_k, pass_k=0)
    pe = paired_eval(runs, kept, sproto, cache)
    x = [rate[t.task_id] for t in kept]
    _changes(results, methods, pe, "paired_screened", covariate=x)
    n_evals = len({s for s, _ in runs}) + len(runs)
    results["paired_screened"].update(
        protocol=pe["protocol"], pool=len(pool), screen_k=exp.screen_k, range=list(exp.screen_range),
        covariate=x, samples=len(pool) * exp.screen_k + len(kept) * exp.screen_eval_k * n_evals,
        samples_pass_at_1_standard=results["paired"]["tasks"] * proto.k * n_evals)


def control_variate(per_seed: dict, x: Sequence[float]) -> tuple[dict, float]:
    """Per-task changes ``d_si`` adjusted by a per-task covariate measured independently:
    ``d'_si = d_si - beta (x_i - mean(x))``, ``beta = sum_i (x_i - mean x)(dbar_i - mean dbar) /
    sum_i (x_i - mean x)^2`` with ``dbar_i`` the task's mean change over seeds (0 when ``x`` does
    not vary). Returns the adjusted changes and ``beta``."""
    xm = statistics.fmean(x)
    task_means = [statistics.fmean(col) for col in zip(*per_seed.values())]
    dm = statistics.fmean(task_means)
    sxx = sum((xi - xm) ** 2 for xi in x)
    beta = (sum((xi - xm) * (d - dm) for xi, d in zip(x, task_means)) / sxx) if sxx > 0 else 0.0
    return {s: [d - beta * (xi - xm) for d, xi in zip(v, x)] for s, v in per_seed.items()}, beta


def _changes(results: dict, methods: list[str], pe: dict, key: str,
             keep: list[int] | None = None, covariate: Sequence[float] | None = None) -> None:
    """Each method's paired changes under ``key`` (only the task indices ``keep``; adjusted by
    ``covariate``, one value per task, with :func:`control_variate`)."""
    idx = list(range(len(pe["task_ids"]))) if keep is None else keep
    pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
    readings = [r for r in READINGS if r in next(iter(pe["start"].values()))]
    starts = {r: {s: statistics.fmean(pick(v[r])) for s, v in pe["start"].items()} for r in readings}
    for m in methods:
        res = results["methods"][m]
        for reading in readings:
            per_seed, ends = {}, {}
            for s in res["seeds"]:
                run = pe["runs"][str(s["run_dir"])]
                start, end = pick(pe["start"][str(s["seed"])][reading]), pick(run[reading])
                per_seed[s["seed"]] = [b - a for a, b in zip(start, end)]
                ends[str(s["seed"])] = statistics.fmean(end)
            prefix = key if reading == "pass_at_1" else key.replace("paired", READINGS[reading], 1)
            if covariate is not None:
                per_seed, beta = control_variate(per_seed, covariate)
                res[f"{prefix}_beta"] = beta
            res[f"{prefix}_change"] = stats.paired_change(per_seed, [pe["task_ids"][i] for i in idx])
            res[f"{prefix}_end"] = ends
    results[key] = {"tasks": len(idx), "start": {r: starts[r] for r in readings},
                    "start_mean": {r: statistics.fmean(starts[r].values()) for r in readings}}
    theirs = results.get("recorded", {}).get("start", {}).get(key)  # each seed's mean
    if theirs is not None and theirs != results[key]["start"]:
        raise ReuseError(f"{key}: the start policy reads {results[key]['start']} here and "
                         f"{theirs} in {results['recorded']['from']}: the recorded methods' changes "
                         "would not pair with the new ones (another machine or code samples "
                         "differently); rerun every method, without reuse_recorded")


def leaked_task_ids(exp: ExperimentConfig, tasks: list) -> set[str]:
    """Ids of ``tasks`` (synthetic, of ``exp.split``) whose every hidden test some reference
    of the problems trained on (``exp.train_problems`` of ``exp.train_split``) passes."""
    pool = ReferencePool(synthetic_problems(exp.train_split, exp.train_problems,
                                            seed=exp.task_seed))
    return {t.task_id for t in tasks if pool.solves_task(t)}


def trained_template_tasks(exp: ExperimentConfig) -> list:
    """``exp.paired_tasks`` new instances of the templates trained on (``exp.train_split``):
    problems of another stream of the generator whose ids no training problem has (of the
    experiment's ``templates`` only, when it trains on some)."""
    kinds = {"n_bugs": exp.n_bugs, "multi_hunk": exp.multi_hunk}
    templates = set(getattr(exp, "templates", ()) or ())
    trained = {t.problem_id for t in load_tasks("synthetic", split=exp.train_split,
                                                n=exp.train_problems, seed=exp.task_seed, **kinds)}
    want = exp.paired_tasks * (4 if exp.multi_hunk else 1) + len(trained) // 4
    for _ in range(6):  # widen the stream while short
        fresh = load_tasks("synthetic", split=exp.train_split, n=want,
                           seed=exp.task_seed + 1000, bugs_per_problem=1, **kinds)
        if templates:
            fresh = [t for t in fresh if t.meta.get("template") in templates]
        out = [t for t in fresh if t.problem_id not in trained][: exp.paired_tasks]
        if len(out) >= exp.paired_tasks:
            break
        want *= 2
    if len(out) < exp.paired_tasks:
        raise ValueError(f"only {len(out)} new instances of the {exp.train_split!r} templates; "
                         f"lower paired_tasks or train_problems")
    return out


def task_interval(start: Sequence[float], end: Sequence[float], n_boot: int = stats.N_BOOT) -> dict:
    """One run's mean per-task change ``mean_i (end_i - start_i)`` with its bootstrap interval
    over tasks (:func:`labkit.experiments.stats.bootstrap`)."""
    if len(start) != len(end) or not start:
        raise ValueError("start and end need the same, non-zero number of tasks")
    d = [e - s for s, e in zip(start, end)]
    return {"mean": statistics.fmean(d), "ci95": stats.bootstrap(
                lambda rng: statistics.fmean(stats.resample(d, rng))),
            "tasks": len(d), "improved": sum(x > 0 for x in d), "worsened": sum(x < 0 for x in d)}


def build_parser():
    """The ``paired`` command's argument parser (the reference lists its flags)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m labkit paired", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (each with config.json and checkpoints)")
    p.add_argument("--tasks", type=int, default=400, help="held-out tasks of the synthetic test split")
    p.add_argument("--k", type=int, default=4, help="samples per task for pass@1")
    p.add_argument("--pass-k", type=int, default=0, help="pass@k at the runs' training temperature")
    p.add_argument("--out", default=None, help="JSON file for the per-task readings")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfgs = [from_dict(TrainConfig, json.loads((Path(d) / "config.json").read_text())) for d in a.runs]
    proto = Protocol(k=a.k, pass_k=a.pass_k, train_temperature=cfgs[0].sampling.temperature)
    res = paired_eval([(c.seed, d) for c, d in zip(cfgs, a.runs)], held_out_tasks(a.tasks), proto)
    for d, r in res["runs"].items():
        start = res["start"][str(r["seed"])]["pass_at_1"]
        t = task_interval(start, r["pass_at_1"])
        print(f"{d}: {statistics.fmean(start):.4f} -> {statistics.fmean(r['pass_at_1']):.4f}, paired "
              f"change {t['mean']:+.4f} {stats.interval_text(t['ci95'], 4)} over {t['tasks']} tasks "
              f"({t['improved']} up, {t['worsened']} down)", flush=True)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({d: {"change": statistics.fmean(r["pass_at_1"]) - statistics.fmean(
        res["start"][str(r["seed"])]["pass_at_1"])} for d, r in res["runs"].items()}))
    return 0
