"""Training every method of an experiment on every seed, reusing what is already done.

:func:`run_methods` trains method x seed runs into ``<run_root>/<experiment>/<method>/seed<s>``.
A finished run of the same config, starting weights and code is reused, an interrupted one
resumes from its last checkpoint (a run killed at any point continues exactly,
``Trainer.resume``), and a folder holding another config or model is moved aside, never
overwritten. A run of other code (:mod:`labkit.provenance`: another commit, other uncommitted
changes) is refused with one line naming the difference, unless ``allow_code_drift``.
:func:`summarise_run` reads a run folder into the per-seed record a results file keeps (with
the code it was trained by).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit import provenance
from labkit.config import apply_values, to_dict, to_record
from labkit.experiments import stats, trl_engine
from labkit.experiments.config import ExperimentConfig, ReuseError, base_train_config
from labkit.experiments.methods import METHODS, check_methods
from labkit.experiments.paired import paired_list
from labkit.runs.events import RunFolder
from labkit.runs.trackers import WATCH_FIELDS
from labkit.loops.checkpoints import refuse_busy
from labkit.loops.trainer import TrainConfig, Trainer, latest_checkpoint
from labkit.policy.loading import weights_fingerprint
from labkit.provenance import CodeDriftError, record_weights  # noqa: F401 (re-exported)


def run_methods(name: str, methods: Sequence[str], exp: ExperimentConfig,
                shared: Mapping[str, Any] | None = None, wall_steps: int | None = None,
                aliases: Mapping[str, str | Sequence[str]] | None = None) -> dict:
    """Train every method (names of :data:`labkit.experiments.methods.METHODS`) with every
    seed; collect eval curves and timings. Each run's config is the experiment's base config
    (:func:`base_train_config`), then ``shared`` (what the experiment sets for every method, by
    dotted path), then the method's own overrides (:meth:`Method.configure`; ``wall_steps``
    for a method at another's wall time).

    ``aliases`` maps a method to another experiment's method (``"reshaping/raw_grpo"``), or
    several in order, that trains the identical configuration: a finished run of the first
    found is reused instead of trained again (the config, run folder aside, must match
    exactly)."""
    check_methods(methods)
    check_engine(exp, methods, shared, wall_steps)
    results: dict = {"experiment": name, "config": to_record(exp), "methods": {}}
    if exp.engine != "labkit" or exp.page:  # its own page, never over another's
        results["page"] = engine_folder(name, exp)
    if exp.paired_tasks:
        paired_list(exp)  # a list that cannot be filled fails now, not after the training
    weights = weights_fingerprint(exp.policy)  # a run is reused only on the same weights
    now = provenance.code_identity()
    recorded, source = recorded_methods(exp, name, weights, now)
    built: dict[str, dict] = {}  # method -> the training config this code gives it
    for method in methods:
        per_seed = []
        for seed in exp.seeds:
            run_dir = f"{exp.run_root}/{engine_folder(name, exp)}/{method}/seed{seed}"
            cfg = method_config(exp, method, seed, run_dir, shared, wall_steps)
            built.setdefault(method, train_config_record(cfg))
            others = (aliases or {}).get(method, ())
            others = (others,) if isinstance(others, str) else others
            done = None
            if exp.reuse_finished:
                candidates = [(run_dir, False)] + [(f"{exp.run_root}/{a}/seed{seed}", True) for a in others]
                done = next((d for d, prefix in candidates
                             if finished_run(d, cfg, prefix=prefix, weights=weights)), None)
            if done:
                provenance.refuse_drift(done, "reuse", exp.allow_code_drift, now)
            if not done and method in recorded:
                break  # taken from the record unless every seed's run is here
            if done:
                per_seed.append(summarise_run(done, seed, upto=cfg.steps, now=now))
                print(f"{method} seed {seed}: reusing the finished run in {done} (its first "
                      f"{cfg.steps} steps)", flush=True)
                continue
            refuse_busy(RunFolder(run_dir))  # before the folder is moved aside or resumed
            t0 = time.time()
            if exp.engine == "trl":  # another config's folder is moved aside; an unfinished run restarts
                prepare_run_dir(run_dir, cfg, weights=weights)
                trl_engine.train(cfg, exp.processes)
                record_weights(run_dir, weights)
                per_seed.append(summarise_run(run_dir, seed, wall_s=time.time() - t0, now=now))
                continue
            resume = prepare_run_dir(run_dir, cfg, weights=weights)
            tr = Trainer(cfg)
            record_weights(run_dir, weights)
            if resume:
                print(f"{method} seed {seed}: resuming {run_dir} from step "
                      f"{tr.resume(allow_code_drift=exp.allow_code_drift)}", flush=True)
            tr.train(progress=True)
            tr.close()
            per_seed.append(summarise_run(run_dir, seed, wall_s=time.time() - t0, now=now))
            print(f"{method} seed {seed}: held-out pass@1 {per_seed[-1]['pass_at_1_start']:.3f} -> "
                  f"{per_seed[-1]['pass_at_1_end']:.3f} ({per_seed[-1]['wall_s']:.0f} s)", flush=True)
        else:  # every seed found or trained
            results["methods"][method] = {**summarise_method(per_seed), "train_config": built[method]}
            continue
        results["methods"][method] = recorded[method]
        results.setdefault("recorded", {**source, "methods": []})["methods"].append(method)
        print(f"{method}: taken from {exp.reuse_recorded} (its runs are not in {exp.run_root})",
              flush=True)
    check_recorded_configs(results, built)
    results["setting"] = setting(exp, weights)
    results["seeds"] = list(exp.seeds)
    results["provenance"] = provenance_record(results, now, exp.allow_code_drift)
    return results


def engine_folder(name: str, exp: ExperimentConfig) -> str:
    """The folder of an experiment's runs under ``run_root``, and the name of its page: its
    ``page`` if it sets one, else its name; ``-trl`` added for the TRL engine (a run of one
    engine is never found again as the other's, and its page never replaces the other's)."""
    base = exp.page or name
    return base if exp.engine == "labkit" else f"{base}-{exp.engine}"


def check_engine(exp: ExperimentConfig, methods: Sequence[str],
                 shared: Mapping[str, Any] | None = None, wall_steps: int | None = None) -> None:
    """Raise :class:`~labkit.experiments.trl_engine.EngineError` (one line) for an engine that
    does not exist, or a method the TRL
    engine cannot train as asked (:func:`labkit.experiments.trl_engine.refusal`): before
    anything trains."""
    if exp.engine not in trl_engine.ENGINES:
        raise trl_engine.EngineError(f"engine {exp.engine!r} is not one of {', '.join(trl_engine.ENGINES)}")
    if exp.processes < 1 or (exp.processes > 1 and exp.engine != "trl"):
        raise trl_engine.EngineError(f"processes={exp.processes}: the labkit engine trains in one process; "
                         "more need engine=trl")
    if exp.engine != "trl":
        return
    for method in methods:
        why = trl_engine.refusal(method_config(exp, method, exp.seeds[0], "-", shared, wall_steps or 1),
                                 exp.processes)
        if why:
            raise trl_engine.EngineError(f"engine=trl cannot train method {method!r}: {why}; drop it from "
                             "methods or use engine=labkit")


def method_config(exp: ExperimentConfig, method: str, seed: int, run_dir: str,
                  shared: Mapping[str, Any] | None = None,
                  wall_steps: int | None = None) -> TrainConfig:
    """The training config of one run of ``method``: the experiment's base config, the
    experiment's ``shared`` settings, then the method's overrides."""
    cfg = apply_values(base_train_config(exp, seed, run_dir), shared or {})
    return METHODS[method].configure(cfg, wall_steps)


def train_config_record(cfg: TrainConfig) -> dict:
    """Every field of a method's training config (KL, clipping, optimiser, sampling,
    reshaping...) as a results file keeps it: what its seeds share, so without the run folder,
    the seed and where it is watched."""
    rec = to_record(cfg)
    for k in ("run_dir", "seed", *WATCH_FIELDS):
        rec.pop(k, None)
    return rec


def provenance_record(results: dict, now: dict, allow_code_drift: bool) -> dict:
    """The results file's account of the code behind its rows: the code that wrote it, every
    code its runs (and recorded methods) were trained by, whether all of it was one clean
    commit, and whether ``allow_code_drift`` let other code in (the page's header says so)."""
    codes = {provenance.label(s.get("code")) for r in results["methods"].values()
             for s in r.get("seeds", [])}
    clean = len(codes) == 1 and not any(c == "unknown" or "+dirty" in c for c in codes)
    return {"code": provenance.label(now), "runs": sorted(codes), "clean_single_commit": clean,
            "allow_code_drift": bool(allow_code_drift)}


NOT_TRAINING = frozenset({"seeds", "out", "run_root", "report_to", "reuse_finished", "reuse_recorded",
                          "allow_code_drift", "smoke"})
"""Experiment fields that do not change what a method's runs train or how they are read
(seeds: a record stands for a method only when it holds every seed asked for), beside the
config's ``METHOD_FIELDS``, which pick the methods."""


PAIRED_KEYS = ("paired", "paired_clean", "paired_trained", "paired_screened")
"""The paired evaluations a results file may hold (:mod:`labkit.experiments.paired`)."""


def recorded_methods(exp: ExperimentConfig, name: str, weights: str,
                     now: dict | None = None) -> tuple[dict[str, dict], dict]:
    """The methods of ``exp.reuse_recorded`` (a results JSON) that can stand for runs of
    ``exp``: same experiment, same config apart from :data:`NOT_TRAINING` and the fields that
    pick the methods (``METHOD_FIELDS``; a field the record lacks counts as its default), same
    starting weights, every seed of ``exp.seeds`` with its per-task paired changes, the
    training config this code builds for the method, and runs of this very code (``now``: a
    record of another commit, of uncommitted changes or of runs that recorded no code is
    refused unless ``allow_code_drift``). A record that is not of this setting is an error, not
    skipped.

    Returns those methods' records and where they come from: ``{"from", "command",
    "code_commit", "start", "paired"}``, ``start`` being the record's start readings per paired
    evaluation, which the new start evaluations must equal for the changes to pair
    (:func:`labkit.experiments.paired.add_paired` checks), ``paired`` its paired evaluations
    (what a results file holds when every method comes from the record)."""
    if not exp.reuse_recorded:
        return {}, {}
    path = Path(exp.reuse_recorded)
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ReuseError(f"reuse_recorded: cannot read {path} ({e}); give a results JSON") from None
    ours, default = to_record(exp), to_record(type(exp)())
    theirs = {**default, **rec.get("config", {})}
    skip = NOT_TRAINING | set(exp.METHOD_FIELDS)
    differ = sorted(k for k in ours if k not in skip
                    and json.dumps(ours[k]) != json.dumps(theirs.get(k)))
    if rec.get("page", rec.get("experiment")) != engine_folder(name, exp) or differ:
        raise ReuseError(f"reuse_recorded: {path} is not a {name!r} run of this config "
                         f"(differs in {', '.join(differ) or 'experiment'}); drop the option or "
                         "set the fields as recorded")
    if rec.get("setting", {}).get("model_sha256") != weights:
        raise ReuseError(f"reuse_recorded: {path} started from other weights than {exp.policy!r}")
    want = {str(s) for s in exp.seeds}
    methods = {m: r for m, r in rec["methods"].items()
               if want <= set(r.get("paired_change", {}).get("per_task", {}))}
    now = now if now is not None else provenance.code_identity()
    for m, r in methods.items():
        why = provenance.drift([s.get("code") for s in r.get("seeds", [])] or [None], now)
        if why and not exp.allow_code_drift:
            raise CodeDriftError(f"reuse_recorded: {path}, method {m}: {why}; rerun it on this code, "
                                 "or pass allow_code_drift=true to mix code versions (the page then "
                                 "says so)")
    source = {"from": exp.reuse_recorded, "command": rec.get("command"),
              "code_commit": rec.get("code_commit"),
              "start": {k: rec[k]["start"] for k in PAIRED_KEYS if k in rec},
              "paired": {k: rec[k] for k in PAIRED_KEYS if k in rec}}
    return methods, source


def check_recorded_configs(results: dict, built: dict[str, dict]) -> None:
    """Each method taken from a record (``results["recorded"]``) must record the training
    config this code builds for it (``built``: method -> :func:`train_config_record`)."""
    for m in results.get("recorded", {}).get("methods", ()):
        theirs = results["methods"][m].get("train_config")
        if theirs is None:
            raise ReuseError(f"reuse_recorded: method {m} records no training config (made before "
                             "records carried it); rerun it")
        differ = sorted(k for k in set(theirs) | set(built[m])
                        if json.dumps(theirs.get(k)) != json.dumps(built[m].get(k)))
        if differ:
            raise ReuseError(f"reuse_recorded: method {m} was trained with another config "
                             f"(differs in {', '.join(differ)}); rerun it")


def setting(exp: ExperimentConfig, weights: str | None = None) -> dict:
    """What every results file says first: split, feedback regime, model, budget, seeds.
    ``weights``: the policy's fingerprint when the caller has it (else it is computed)."""
    return {"train_split": exp.train_split, "split": exp.split, "feedback": exp.feedback,
            "model": exp.policy, "model_sha256": weights or weights_fingerprint(exp.policy),
            "steps": exp.steps, "batch": f"{exp.tasks_per_step} tasks x {exp.group_size} samples",
            "lr": exp.lr, "n_bugs": exp.n_bugs, "multi_hunk": exp.multi_hunk,
            "task_seed": exp.task_seed, "seeds": list(exp.seeds),
            "temperature": exp.temperature, "parallel_chunks": exp.parallel_chunks,
            "paired": {"tasks": exp.paired_tasks, "k": exp.paired_k,
                       "temperature": exp.paired_temperature, "pass_k": exp.paired_pass_k,
                       "per_template": exp.paired_per_template, "eval_seed": exp.paired_eval_seed}}


def _same_weights(run_dir: Path, weights: str | None) -> bool:
    """``weights`` is None (not checked), or the run recorded the same fingerprint in its
    ``provenance.json`` (a run without one counts as another model)."""
    if weights is None:
        return True
    return (provenance.read(run_dir) or {}).get("weights_sha256") == weights


def prepare_run_dir(run_dir: str | Path, cfg: TrainConfig, weights: str | None = None) -> bool:
    """Before training ``cfg`` in ``run_dir``: True if the folder holds an unfinished run of
    the same config (and, when ``weights`` is given, the same starting weights) with a
    complete checkpoint (resume it). A folder holding anything else (another config or
    model, or no checkpoint to resume from) is moved aside to ``<run_dir>.replaced-<n>``,
    never overwritten or appended to; returns False."""
    d = Path(run_dir)
    if not d.exists() or not any(d.iterdir()):
        return False
    if (_same_config(_saved_config(d), cfg) and _same_weights(d, weights)
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
    steps, evals = run.read("metrics.jsonl"), run.read("eval.jsonl")
    if not steps or not evals or steps[-1]["step"] != theirs.get("steps") or evals[-1]["step"] != theirs.get("steps"):
        return False
    ignore = {"run_dir"}
    if prefix and cfg.optim.schedule == "constant" and not cfg.optim.warmup_steps:
        ignore |= {"steps", "checkpoint_every"}
        if theirs["steps"] < cfg.steps or not any(e["step"] == cfg.steps for e in evals):
            return False
    return _same_config(theirs, cfg, ignore)


def _as_json(cfg) -> dict:
    """``cfg`` as it reads back from a run's ``config.json`` (tuples become lists)."""
    return json.loads(json.dumps(to_dict(cfg)))


def _same_config(saved: dict | None, cfg: TrainConfig, ignore: set[str] = frozenset()) -> bool:
    """``saved`` (a run's ``config.json``) is ``cfg``, the keys ``ignore`` aside. A field the
    saved config lacks (one added to the code after the run) counts as equal when ``cfg``
    holds that field's default: a run made before a new option existed ran as its default. The
    fields that say where a run is watched (:data:`WATCH_FIELDS`) are not compared."""
    if saved is None:
        return False
    ignore = set(ignore) | set(WATCH_FIELDS)
    ours, default = _as_json(cfg), _as_json(TrainConfig())

    def fill(theirs: dict, ours: dict, default: dict) -> dict:
        out = dict(theirs)
        for k, v in ours.items():
            if k not in out:
                out[k] = default.get(k, object())
            elif isinstance(v, dict) and isinstance(out[k], dict):
                out[k] = fill(out[k], v, default.get(k, {}) if isinstance(default.get(k), dict) else {})
        return out

    theirs = fill(saved, ours, default)
    return ({k: v for k, v in theirs.items() if k not in ignore}
            == {k: v for k, v in ours.items() if k not in ignore})


def _saved_config(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None


def summarise_run(run_dir: str | Path, seed: int, wall_s: float | None = None,
                  upto: int | None = None, now: dict | None = None) -> dict:
    """One finished run folder -> the per-seed record of a report: the readings, and the code
    and CPU it was trained by (``code``; ``code_drift``: what separates it from ``now``, the
    code writing the report, when they differ). Without ``wall_s`` the wall time is the sum of
    the logged step and evaluation times. ``upto``: read only the first ``upto`` steps (see
    :func:`finished_run`'s ``prefix``)."""
    run = RunFolder(run_dir)
    prov = provenance.read(run_dir) or {}
    started = prov.get("started") or {}
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
        "code": started.get("code"), "cpu": started.get("cpu"),
        "code_drift": provenance.drift(provenance.identities(prov or None), now) if now else None,
    }


def summarise_method(per_seed: list[dict]) -> dict:
    """Per-seed records -> mean and 95% t-interval over seeds of the periodic held-out readings
    at the start, the end and end - start (:func:`labkit.experiments.stats.summary`)."""
    starts = [s["pass_at_1_start"] for s in per_seed]
    ends = [s["pass_at_1_end"] for s in per_seed]
    return {
        "seeds": per_seed,
        "start": stats.summary(starts), "end": stats.summary(ends),
        "delta": stats.summary([e - s for s, e in zip(starts, ends)]),
        "wall_s": statistics.fmean(s["wall_s"] for s in per_seed),
        "s_per_step": statistics.fmean(s["s_per_step"] for s in per_seed),
    }


def training_record(results: dict) -> None:
    """Per method, means over its runs' logged steps: ``abs_adv_per_token`` (mean ``|A|`` per
    token, ``adv/abs_token_mean``), ``grad_norm`` (before clipping) and ``zero_std_frac`` (the
    share of groups whose rewards were all equal: no advantage at all). Methods taken from
    a record (``results["recorded"]``) keep the figures it holds."""
    for m, r in results["methods"].items():
        if m in results.get("recorded", {}).get("methods", ()):
            continue
        rows = [row for s in r["seeds"] for row in RunFolder(s["run_dir"]).read("metrics.jsonl")]
        for key, name in (("adv/abs_token_mean", "abs_adv_per_token"), ("grad/norm", "grad_norm"),
                          ("adv/zero_std_frac", "zero_std_frac")):
            vals = [row[key] for row in rows if key in row]
            r[name] = statistics.fmean(vals) if vals else None

