"""``python -m labkit experiment mucode``: muCODE on the tiny default, over training seeds.

Per training seed ``s`` (``seeds``), on the template testbed:

1. Expert iteration (:func:`labkit.loops.mucode.run_mucode`) from the tiny model on
   ``train_problems`` synthetic problems of ``train_split`` (default ``val``: templates
   neither the model's SFT data nor the held-out split holds; the same problems for every
   seed): collect multi-turn rollouts, train a Bradley-Terry verifier, relabel with the local
   experts, fine-tune; ``iterations`` times. The seed drives collection, the verifier's
   hold-out split and training, and the fine-tunes.
2. A BCE verifier trained on exactly the same collected data, for the BT-vs-BCE comparison.
3. The starting model and the seed's expert-iteration model, on the same ``eval_tasks``
   held-out ``test``-split tasks with the same sampling seed (paired): multi-turn Best-of-N
   (N candidates a turn, T turns) with the four selectors, the verifier selectors using the
   seed's last Bradley-Terry verifier, candidates shared between selectors where their
   states coincide. From the same episodes, per task: single-turn (turn 1) and multi-turn
   (final) pass, N = 1 (the exact mean over turn-1 candidates, or the random selector) and
   BoN-N, the BCE verifier's single-turn pick and pass@N.

Every interval is over training seeds (:func:`labkit.experiments.stats.paired_change`: a t
interval of the per-seed mean changes, with the hierarchical seeds-then-tasks bootstrap
and a task-only bootstrap beside it). Each seed's result is kept in
``<run_root>/seed<s>/result.json`` and reused when the experiment runs again with the same
settings, so an interrupted experiment redoes only the seeds it had not finished.

Writes ``docs/results/mucode.{md,json,html,png}`` with the paper's Table 1 and Table 2
alongside.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.config import to_record
from labkit.env.overlap import ReferencePool
from labkit.env.sandbox import Sandbox
from labkit.env.tasks import load_tasks, synthetic_problems
from labkit.experiments.config import RESULTS
from labkit.experiments.pages import save_figure
from labkit.experiments import stats
from labkit.loops.episodes import EpisodeConfig, turn_prompt
from labkit.loops.mucode import MucodeConfig, MucodeTasks, evaluate_bon, run_mucode
from labkit.loops.verifier import VerifierConfig, build_verifier, ranking_metrics, train_verifier
from labkit.policy.loading import PolicyConfig, load_policy, weights_fingerprint
from labkit.policy.sft import SFTConfig
from labkit.seeding import derive_seed

SELECTOR_ORDER = ("random", "public_tests", "verifier", "public_then_verifier")
GENERATORS = ("start", "expert_iteration")

PAPER = {
    "source": "muCODE, arXiv 2502.20380, Llama-3.2-1B-Instruct (1B) rows of Table 1 and Table 2",
    "table1": {"single_turn": {"mbpp": 35.1, "humaneval": 25.6},
               "mucode_multi_turn": {"mbpp": 37.9, "humaneval": 35.4},
               "mucode_multi_turn_bon5": {"mbpp": 51.1, "humaneval": 41.5}},
    "table2": {"random": {"mbpp": 37.5, "humaneval": 31.5},
               "verifier": {"mbpp": 43.3, "humaneval": 36.5},
               "public_tests": {"mbpp": 49.4, "humaneval": 39.7},
               "public_then_verifier": {"mbpp": 51.1, "humaneval": 41.5}},
}

CONDITION_ORDER = (
    "single-turn, N=1", "multi-turn, N=1 (random pick)",
    *(f"single-turn, BoN, {s}" for s in SELECTOR_ORDER), "single-turn, BoN, verifier (BCE)",
    *(f"multi-turn, BoN, {s}" for s in SELECTOR_ORDER), "single-turn, pass@N (oracle pick)")

# Within-generator contrasts the paper's tables read (a minus b, paired per task and seed).
CONTRASTS = {
    "BoN: public_tests - random (multi-turn)": ("multi-turn, BoN, public_tests",
                                                "multi-turn, BoN, random"),
    "BoN: verifier - random (multi-turn)": ("multi-turn, BoN, verifier", "multi-turn, BoN, random"),
    "BoN: public_then_verifier - public_tests (multi-turn)": (
        "multi-turn, BoN, public_then_verifier", "multi-turn, BoN, public_tests"),
    "turns: multi-turn - single-turn (public_then_verifier)": (
        "multi-turn, BoN, public_then_verifier", "single-turn, BoN, public_then_verifier"),
    "turns: multi-turn - single-turn (random)": ("multi-turn, BoN, random",
                                                 "single-turn, BoN, random"),
    "verifier: BT - BCE pick (single-turn)": ("single-turn, BoN, verifier",
                                              "single-turn, BoN, verifier (BCE)"),
}


@dataclass
class Config:
    """Budget of the muCODE experiment (sized for 2 CPU cores: about 10 minutes a seed)."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Training seeds: one expert-iteration run each; every interval is over them."""
    train_split: str = "val"
    """Templates expert iteration trains on (``val``: neither the tiny model's SFT data nor the
    held-out ``test`` split holds them; ``train``: the SFT templates)."""
    train_problems: int = 48
    """Synthetic problems of ``train_split`` (one buggy variant each, drawn with
    ``task_seed``, the same for every seed) that expert iteration collects on; a fifth of them
    (``MucodeTasks.verifier_holdout``) is held out of verifier training."""
    task_seed: int = 0
    """Seed of the training problems and of the held-out tasks."""
    rollouts_per_task: int = 4
    """Episodes collected per training task and iteration (``MucodeConfig.rollouts_per_task``;
    the paper: 15): more give the verifier more labelled attempts and the local expert more
    programs to choose from, at proportional collection cost."""
    iterations: int = 2
    """Rounds of collect, train the verifier, relabel, fine-tune (``MucodeConfig.iterations``)."""
    eval_tasks: int = 200
    """Held-out synthetic ``test``-split tasks both generators are evaluated on, paired."""
    eval_seed: int = 0
    """Seed of the held-out evaluations (``EpisodeConfig.seed``: candidate sampling and the
    random selector's picks): the same for both generators and every training seed."""
    replicates: int = 1
    """Evaluation runs per generator and seed (independent sampling, the same tasks); a task's
    value is its mean over them. They shrink sampling noise; the intervals stay over seeds."""
    humaneval_tasks: int = 0
    """Bug-injected HumanEval tasks from the test and val splits whose turn-1 prompt fits the
    model's positions (0 = skip). The tiny model's 768 positions leave few that fit."""
    humaneval_turns: int = 2
    """T for the HumanEval evaluation (``turns`` is the synthetic one). HumanEval prompts are
    long: a later turn whose prompt does not fit with ``max_new_tokens`` ends the episode."""
    humaneval_selectors: tuple[str, ...] = ("random", "public_then_verifier")
    """Selectors evaluated on HumanEval, a subset to save time: ``random`` (distributed as N =
    1) and the paper's best, ``public_then_verifier``."""
    n_candidates: int = 5
    """N: candidates sampled per turn in the evaluations (Best-of-N; collection always samples
    one)."""
    turns: int = 3
    """T: the most attempts per episode, in collection and in the synthetic evaluation (1 =
    single-turn repair; the paper evaluates T = 3)."""
    max_new_tokens: int = 128
    """Completion budget per attempt in collection and evaluation; also decides which HumanEval
    tasks are run (their turn-1 prompt plus this must fit the model's positions)."""
    temperature: float = 0.7
    """Sampling temperature of collection and evaluation (the paper's 0.7)."""
    sft_steps: int = 60
    """SFT steps per iteration (``SFTConfig.max_steps``, also the cosine decay's horizon; 5
    warm-up steps)."""
    sft_lr: float = 3e-4
    """Peak learning rate of each iteration's fine-tune (cosine decay to 0.1 of it)."""
    sft_batch_size: int = 8
    """Relabelled (prompt, expert program) pairs per SFT step."""
    verifier_epochs: int = 3
    """Passes over the collected data when training each verifier (the Bradley-Terry one of
    every iteration and the BCE one)."""
    verifier_max_len: int = 256
    """Tokens per verifier input (problem statement + candidate), cut from the left so the
    program's end survives; shorter is faster but drops more of the statement."""
    batch_size: int = 128
    """Sequences per decode call."""
    threads: int = 2
    """torch threads."""
    policy: str = "tiny"
    """Starting generator (``tiny`` or a local Hugging Face folder), loaded without a KL
    reference; also the backbone of both verifiers."""
    out: str = str(RESULTS)
    """Folder of ``mucode.{md,json,html,png}`` (default: the repository's ``docs/results``)."""
    run_root: str = "runs/experiments/mucode"
    """Parent of the per-seed folders ``<run_root>/seed<s>/``: the expert-iteration run
    (``expert_iteration/``: config, metrics, episodes, per-iteration checkpoints) and the
    seed's ``result.json``."""


# Settings that do not decide a seed's result (a cached result.json is reused across them).
# ``batch_size`` is not among them: the decode chunks decide how the random stream is drawn.
_NOT_IN_RESULT = ("seeds", "out", "threads", "run_root")


def _fingerprint(cfg: Config, seed: int, weights: str | None = None) -> dict:
    """What decides a seed's result: the settings, the seed and the starting policy's weights
    (``policy`` names a folder, ``tiny`` whichever model is shipped; ``weights``: their
    fingerprint when the caller has it, else it is computed)."""
    rec = to_record(cfg)
    return {**{k: v for k, v in rec.items() if k not in _NOT_IN_RESULT}, "seed": seed,
            "weights_sha256": weights or weights_fingerprint(cfg.policy)}


def _fits(policy, task, max_new_tokens: int) -> bool:
    limit = getattr(policy.model.config, "max_position_embeddings", None)
    n = len(policy.tokenizer(turn_prompt(task, None, None, policy.tokenizer),
                             add_special_tokens=False).input_ids)
    return not limit or n + max_new_tokens <= limit


def _per_task(policy, tasks, ecfg: EpisodeConfig, replicates: int, selectors, bt, bce,
              sandbox) -> dict:
    """Every condition's per-task value (mean over replicates, in ``tasks`` order), each
    selector's mean number of turns, and both verifiers' ranking of the turn-1 candidates
    (hidden-test labels; mean over replicates)."""
    rep = evaluate_bon(policy, tasks, ecfg, selectors, verifier=bt, sandbox=sandbox,
                       replicates=replicates, keep_episodes=True)
    index = {t.task_id: i for i, t in enumerate(tasks)}
    by_id = {t.task_id: t for t in tasks}
    n, R = len(tasks), replicates
    cond: dict[str, list[float]] = {}

    def add(name: str, i: int, v: float) -> None:
        cond.setdefault(name, [0.0] * n)[i] += v / R

    turns: dict[str, list[float]] = {}
    ranks: dict[str, list[dict]] = {"bt": [], "bce": []}
    for r in range(R):
        for e in rep["episodes"]:
            if e.rollout != r:
                continue
            i = index[e.task_id]
            first = e.turns[0] if e.turns and e.fits else None
            add(f"single-turn, BoN, {e.selector}", i, float(first.passed) if first else 0.0)
            add(f"multi-turn, BoN, {e.selector}", i, e.reward if e.fits else 0.0)
            turns.setdefault(e.selector, []).append(len(e.turns))
            if e.selector == selectors[0] and first:
                ok = first.hidden_ok
                add("single-turn, N=1", i, sum(ok) / len(ok))
                add("single-turn, pass@N (oracle pick)", i, float(any(ok)))
        first_eps = [e for e in rep["episodes"]
                     if e.rollout == r and e.selector == selectors[0] and e.fits and e.turns]
        codes = [(e.task_id, c, ok) for e in first_eps
                 for c, ok in zip(e.turns[0].candidates, e.turns[0].hidden_ok)]
        labels = [float(ok) for _, _, ok in codes]
        groups = [tid for tid, _, _ in codes]
        for name, v in (("bt", bt), ("bce", bce)):
            scores = v.score([by_id[t] for t, _, _ in codes], [c for _, c, _ in codes])
            ranks[name].append(ranking_metrics(scores, labels, groups))
            if name == "bce":  # the BCE verifier's single-turn pick (first of ties)
                best: dict[str, int] = {}
                for j, tid in enumerate(groups):
                    if tid not in best or scores[j] > scores[best[tid]]:
                        best[tid] = j
                for tid, j in best.items():
                    add("single-turn, BoN, verifier (BCE)", index[tid], labels[j])
    cond.setdefault("single-turn, BoN, verifier (BCE)", [0.0] * n)
    cond["multi-turn, N=1 (random pick)"] = list(cond["multi-turn, BoN, random"])
    ranking = {name: {k: _nanmean([m[k] for m in ms]) for k in ms[0]}
               for name, ms in ranks.items() if ms}
    return {"conditions": cond, "turns": {s: statistics.fmean(v) for s, v in turns.items()},
            "verifier_ranking": ranking}


def _nanmean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.fmean(xs) if xs else float("nan")


def _run_seed(cfg: Config, seed: int, train, syn_eval, he_fit, start, sandbox,
              weights: str | None = None) -> dict:
    """One training seed: expert iteration, the BCE verifier, both generators evaluated."""
    folder = Path(cfg.run_root) / f"seed{seed}"
    cache = folder / "result.json"
    want = _fingerprint(cfg, seed, weights)
    if cache.exists():
        old = json.loads(cache.read_text())
        if old.get("fingerprint") == json.loads(json.dumps(want)):
            print(f"seed {seed}: reusing {cache}", flush=True)
            return old
    if (folder / "expert_iteration").exists():  # an unfinished or different earlier run
        shutil.rmtree(folder / "expert_iteration")
    folder.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    ecfg = EpisodeConfig(turns=cfg.turns, n_candidates=cfg.n_candidates,
                         temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                         batch_size=cfg.batch_size, seed=cfg.eval_seed)
    vcfg = VerifierConfig(backbone=cfg.policy, loss="bt", epochs=cfg.verifier_epochs,
                          max_len=cfg.verifier_max_len)
    mcfg = MucodeConfig(
        run_dir=str(folder / "expert_iteration"), seed=seed, iterations=cfg.iterations,
        rollouts_per_task=cfg.rollouts_per_task, policy=PolicyConfig(spec=cfg.policy),
        tasks=MucodeTasks(train_problems=cfg.train_problems, eval_tasks=0),
        collect=EpisodeConfig(turns=cfg.turns, n_candidates=1, temperature=cfg.temperature,
                              max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size),
        verifier=vcfg,
        sft=SFTConfig(lr=cfg.sft_lr, batch_size=cfg.sft_batch_size, max_steps=cfg.sft_steps,
                      warmup_steps=5, log_every=10))
    t0 = time.time()
    print(f"seed {seed}: expert iteration, {len(train)} {cfg.train_split} tasks x "
          f"{cfg.rollouts_per_task} rollouts, {cfg.iterations} iterations", flush=True)
    ei = run_mucode(mcfg, policy=load_policy(cfg.policy, reference="none"), train_tasks=train,
                    eval_tasks=[], sandbox=sandbox)
    timings["expert_iteration_s"] = round(time.time() - t0, 1)
    for row in ei.rows:
        print("  " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in row.items()), flush=True)
    t0 = time.time()
    bcfg = dataclasses.replace(vcfg, loss="bce", seed=derive_seed(seed, "bce_verifier"))
    bce = build_verifier(bcfg)
    train_verifier(bce, [e for e in ei.data if e.group not in ei.held_out], bcfg)
    timings["bce_verifier_s"] = round(time.time() - t0, 1)
    synthetic, humaneval = {}, {}
    for name, gen in (("start", start), ("expert_iteration", ei.policy)):
        t0 = time.time()
        synthetic[name] = _per_task(gen, syn_eval, ecfg, cfg.replicates, SELECTOR_ORDER,
                                    ei.verifier, bce, sandbox)
        timings[f"eval_synthetic_{name}_s"] = round(time.time() - t0, 1)
        c = synthetic[name]["conditions"]
        print(f"  {name}: " + ", ".join(f"{s} {statistics.fmean(c[f'multi-turn, BoN, {s}']):.3f}"
                                        for s in SELECTOR_ORDER)
              + f" ({timings[f'eval_synthetic_{name}_s']:.0f} s)", flush=True)
        if he_fit:
            t0 = time.time()
            hcfg = dataclasses.replace(ecfg, turns=cfg.humaneval_turns)
            humaneval[name] = _per_task(gen, he_fit, hcfg, 1, tuple(cfg.humaneval_selectors),
                                        ei.verifier, bce, sandbox)
            timings[f"eval_humaneval_{name}_s"] = round(time.time() - t0, 1)
    result = {"fingerprint": want, "seed": seed, "expert_iteration": ei.rows,
              "verifier_heldout_tasks": len(ei.held_out), "synthetic": synthetic,
              "humaneval": humaneval, "timings_s": timings}
    cache.write_text(json.dumps(result, indent=1, default=float))
    return json.loads(cache.read_text())


def _levels(per_seed: list[list[float]]) -> dict:
    """Mean level of a condition with its t interval over seeds."""
    mean, ci = stats.t_interval([statistics.fmean(v) for v in per_seed])
    return {"mean": mean, "ci95": ci, "over": "seeds"}


def summarise(per_seed: dict[int, dict], eval_ids: list[str], leaked: set[str]) -> dict:
    """Per condition: each generator's level and the paired change (expert iteration minus
    start, per task and seed) over seeds, on every held-out task and on the ones no reference
    of the trained problems solves; per generator, the within-generator contrasts; the
    verifiers' ranking over seeds."""
    seeds = list(per_seed)
    clean = [i for i, t in enumerate(eval_ids) if t not in leaked]
    have = per_seed[seeds[0]]["synthetic"]["start"]["conditions"]
    conds = [c for c in CONDITION_ORDER if c in have] + [c for c in have if c not in CONDITION_ORDER]
    methods = {}
    for c in conds:
        start = {s: per_seed[s]["synthetic"]["start"]["conditions"][c] for s in seeds}
        end = {s: per_seed[s]["synthetic"]["expert_iteration"]["conditions"][c] for s in seeds}
        delta = {s: [e - b for b, e in zip(start[s], end[s])] for s in seeds}
        methods[c] = {"start": _levels(list(start.values())), "end": _levels(list(end.values())),
                      "paired_change": stats.paired_change(delta),
                      "paired_clean_change": stats.paired_change(
                          {s: [d[i] for i in clean] for s, d in delta.items()})}
    contrasts = {}
    for g in GENERATORS:
        for name, (a, b) in CONTRASTS.items():
            cs = {s: per_seed[s]["synthetic"][g]["conditions"] for s in seeds}
            contrasts.setdefault(g, {})[name] = stats.paired_change(
                {s: [x - y for x, y in zip(cs[s][a], cs[s][b])] for s in seeds})
    ranking = {}
    for g in GENERATORS:
        for v in ("bt", "bce"):
            for k in ("verifier/pairwise_acc", "verifier/auc", "verifier/bon_hit",
                      "verifier/bon_random"):
                vals = [per_seed[s]["synthetic"][g]["verifier_ranking"][v][k] for s in seeds]
                vals = [x for x in vals if x == x]
                m, ci = stats.t_interval(vals) if vals else (float("nan"), None)
                ranking.setdefault(g, {}).setdefault(v, {})[k] = {"mean": m, "ci95": ci,
                                                                  "seeds": len(vals)}
    return {"methods": methods, "contrasts": contrasts, "verifier_ranking": ranking,
            "clean_tasks": len(clean)}


def run(cfg: Config) -> Path:
    import torch

    if not cfg.seeds:
        raise ValueError("experiment mucode needs at least one seed (--set seeds=[0,1,2])")
    torch.set_num_threads(cfg.threads)
    t_all = time.time()
    train = load_tasks("synthetic", cfg.train_split, n=cfg.train_problems, seed=cfg.task_seed)
    syn_eval = load_tasks("synthetic", "test", n=cfg.eval_tasks, seed=cfg.task_seed)[: cfg.eval_tasks]
    pool = ReferencePool(synthetic_problems(cfg.train_split, cfg.train_problems,
                                            seed=cfg.task_seed))
    leaked = {t.task_id for t in syn_eval if pool.solves_task(t)} if cfg.train_split != "train" else set()
    start = load_policy(cfg.policy, reference="none")
    he_fit, he_total, he_n_fit = [], 0, 0
    if cfg.humaneval_tasks:
        he = load_tasks("humaneval", "test", seed=0) + load_tasks("humaneval", "val", seed=0)
        he_total = len(he)
        he_fit = [t for t in he if _fits(start, t, cfg.max_new_tokens)]
        he_n_fit = len(he_fit)
        he_fit = he_fit[: cfg.humaneval_tasks]
    per_seed = {}
    weights = weights_fingerprint(cfg.policy)  # once: it reads every weight file
    with Sandbox() as sandbox:
        for seed in cfg.seeds:
            per_seed[seed] = _run_seed(cfg, seed, train, syn_eval, he_fit, start, sandbox, weights)
    summary = summarise(per_seed, [t.task_id for t in syn_eval], leaked)
    results = {
        "experiment": "mucode", "config": to_record(cfg),
        "setting": {"train_split": cfg.train_split, "split": "test", "model": cfg.policy,
                    "train_problems": len(train), "rollouts_per_task": cfg.rollouts_per_task,
                    "iterations": cfg.iterations, "sft_steps": cfg.sft_steps,
                    "eval_tasks": len(syn_eval), "n_candidates": cfg.n_candidates,
                    "turns": cfg.turns, "temperature": cfg.temperature,
                    "max_new_tokens": cfg.max_new_tokens, "replicates": cfg.replicates,
                    "task_seed": cfg.task_seed, "eval_seed": cfg.eval_seed,
                    "seeds": list(cfg.seeds)},
        "seeds": list(cfg.seeds),
        "tasks": {"train": len(train), "eval": len(syn_eval), "eval_clean": summary["clean_tasks"],
                  "eval_solved_by_trained_reference": sorted(leaked),
                  "humaneval_total_test_val": he_total, "humaneval_fit": he_n_fit,
                  "humaneval_run": len(he_fit), "humaneval_ids": [t.task_id for t in he_fit]},
        **{k: v for k, v in summary.items() if k != "clean_tasks"},
        "per_seed": {str(s): {k: v for k, v in r.items() if k != "fingerprint"}
                     for s, r in per_seed.items()},
        "timings_s": {"this_invocation_s": round(time.time() - t_all, 1),  # reused seeds cost ~0
                      "per_seed_s": {str(s): round(sum(r["timings_s"].values()), 1)
                                     for s, r in per_seed.items()}},
        "paper": PAPER,
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mucode.json").write_text(dumps(results))
    html, png = _figure(results, out)
    md = out / "mucode.md"
    md.write_text(_markdown(results, cfg, html, png).rstrip("\n") + "\n")
    return md


_NUMBERS = re.compile(r"\[\s*(-?[0-9][-0-9.eE+]*(?:,\s*-?[0-9][-0-9.eE+]*)*)\s*\]")


def dumps(results: dict) -> str:
    """Indented JSON with every list of numbers on one line (the per-task values of every
    seed would otherwise take one line each)."""
    text = json.dumps(results, indent=2, default=float)
    return _NUMBERS.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                        text)


def _figure(r: dict, out: Path):
    """Each condition's pass rate for both generators, with the interval over seeds."""
    import plotly.graph_objects as go

    fig = go.Figure()
    conds = list(r["methods"])
    for g, label in (("start", "starting model"), ("end", "after expert iteration")):
        ys = [100 * r["methods"][c][g]["mean"] for c in conds]
        err = [100 * (r["methods"][c][g]["ci95"][1] - r["methods"][c][g]["mean"])
               if r["methods"][c][g]["ci95"] else 0.0 for c in conds]
        fig.add_trace(go.Bar(x=conds, y=ys, name=label,
                             error_y={"type": "data", "array": err, "visible": True}))
    fig.update_layout(barmode="group", template="plotly_white",
                      title=f"muCODE on {r['setting']['eval_tasks']} held-out tasks, "
                            f"{len(r['seeds'])} training seeds (95% t-interval over seeds)",
                      yaxis_title="pass rate on the hidden tests (%)", xaxis_tickangle=-30)
    return save_figure(fig, out, "mucode", width=1000, height=550)


def _pct(m: dict) -> str:
    """``52.9 [49.1, 56.7]`` from a ``{"mean", "ci95"}`` record, in percent."""
    s = f"{100 * m['mean']:.1f}"
    if m.get("ci95"):
        s += f" [{100 * m['ci95'][0]:.1f}, {100 * m['ci95'][1]:.1f}]"
    return s


def _change(m: dict) -> str:
    s = f"{100 * m['mean']:+.1f}"
    if m["ci95"]:
        s += f" [{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}]"
        s += "" if m["shown"] else " (not shown)"
    return s


def _per_seed(m: dict) -> str:
    return ", ".join(f"{100 * v:+.1f}" for v in m["per_seed"].values())


def _boot(ci) -> str:
    return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "n/a"


def _markdown(r: dict, cfg: Config, html: Path, png: Path | None) -> str:
    st, t = r["setting"], r["tasks"]
    n_seeds = len(r["seeds"])
    minutes = sum(r["timings_s"]["per_seed_s"].values()) / 60
    L = ["# muCODE on the tiny model: multi-turn repair, a learned verifier, expert iteration, BoN",
         "",
         f"Generated by `python -m labkit experiment mucode`: {n_seeds} training seeds "
         f"({', '.join(map(str, r['seeds']))}), {minutes:.0f} minutes of compute on 2 CPU cores "
         "in all. "
         f"Expert iteration from `{st['model']}` on {st['train_problems']} synthetic problems "
         f"of the `{st['train_split']}` templates x {st['rollouts_per_task']} rollouts x "
         f"{st['turns']} turns, {st['iterations']} iterations of {st['sft_steps']} SFT steps. "
         f"Evaluation, paired (the same tasks and sampling seed for both generators and every "
         f"training seed): {st['eval_tasks']} held-out `test`-split tasks (templates neither "
         f"training nor the model's SFT data holds), N = {st['n_candidates']} candidates a "
         f"turn, T = {st['turns']} turns, temperature {st['temperature']}, "
         f"{st['max_new_tokens']} new tokens, {st['replicates']} evaluation replicate(s) per "
         "seed. Intervals are 95% t-intervals over training seeds; the hierarchical bootstrap "
         "resamples seeds, then tasks; '(not shown)' marks a change whose interval over seeds "
         "includes 0.",
         "",
         "## Held-out tasks: pass rate (%) on the hidden tests",
         "",
         "| condition | starting model | after expert iteration | paired change, CI over seeds "
         "| per seed | hierarchical bootstrap | without tasks a trained reference solves |",
         "|---|---|---|---|---|---|---|"]
    for c, m in r["methods"].items():
        L.append(f"| {c} | {_pct(m['start'])} | {_pct(m['end'])} | {_change(m['paired_change'])} "
                 f"| {_per_seed(m['paired_change'])} | "
                 f"{_boot(m['paired_change']['hierarchical_ci95'])} | "
                 f"{_change(m['paired_clean_change'])} |")
    L += ["",
          f"The last column drops the {len(t['eval_solved_by_trained_reference'])} held-out tasks "
          f"whose hidden tests a reference program of the {st['train_problems']} trained "
          f"problems passes ({t['eval_clean']} tasks left). Single-turn = the first turn's "
          "chosen attempt; multi-turn = the final attempt of the episode (it stops once the "
          "public tests pass). `single-turn, N=1` is the exact mean over the turn-1 candidates; "
          "the `random` selector picks one of the N uniformly, so it is distributed as N = 1. "
          "The verifier selectors use each seed's Bradley-Terry verifier of its last "
          "expert-iteration round, for the starting model too; `(BCE)` is a BCE verifier "
          "trained on the same data.",
          "",
          "## What the paper's tables read: contrasts within a generator (points, paired)",
          "",
          "| contrast | starting model | after expert iteration |", "|---|---|---|"]
    for name in CONTRASTS:
        L.append(f"| {name} | {_change(r['contrasts']['start'][name])} | "
                 f"{_change(r['contrasts']['expert_iteration'][name])} |")
    L += ["", "## The paper (1B model, pass@1 %, MBPP / HumanEval)", "",
          "| Table 1 | MBPP | HumanEval |", "|---|---|---|"]
    for k, v in r["paper"]["table1"].items():
        L.append(f"| {k} | {v['mbpp']} | {v['humaneval']} |")
    L += ["", "| Table 2: BoN selector (N = 5, muCODE generator) | MBPP | HumanEval |",
          "|---|---|---|"]
    for k, v in r["paper"]["table2"].items():
        L.append(f"| {k} | {v['mbpp']} | {v['humaneval']} |")
    L += ["", "## Verifiers: Bradley-Terry vs BCE, ranking the turn-1 candidates of held-out tasks",
          "", "| generator | loss | pairwise acc | AUC | BoN hit rate | random-pick rate |",
          "|---|---|---|---|---|---|"]
    for g, by in r["verifier_ranking"].items():
        for v, m in by.items():
            L.append(f"| {g} | {v} | {_pct(m['verifier/pairwise_acc'])} | "
                     f"{_pct(m['verifier/auc'])} | {_pct(m['verifier/bon_hit'])} | "
                     f"{_pct(m['verifier/bon_random'])} |")
    L += ["", "Mean over seeds with the t-interval. BoN hit rate: over tasks with at least one "
          "passing candidate, how often the top-scored one passes; the random-pick rate is the "
          "same for a uniform pick.", "",
          "## Expert iteration, per seed", "",
          "| seed | iteration | collected final pass | turn-1 pass | verifier held-out AUC "
          "| expert passes | SFT pairs | SFT loss | s |",
          "|---|---|---|---|---|---|---|---|---|"]
    for s, ps in r["per_seed"].items():
        for row in ps["expert_iteration"]:
            secs = sum(v for k, v in row.items() if k.startswith("time/"))
            L.append(f"| {s} | {row['step']} | {row['collect/pass/final']:.3f} | "
                     f"{row['collect/pass/turn1']:.3f} | "
                     f"{row.get('heldout/verifier/auc', float('nan')):.3f} | "
                     f"{row['expert/pass_frac']:.3f} | "
                     f"{row['sft/pairs']} | {row['sft/final_loss']:.3f} | {secs:.0f} |")
    L += ["", "## Bug-injected HumanEval", ""]
    if t["humaneval_run"]:
        L += [f"{t['humaneval_fit']} of the {t['humaneval_total_test_val']} test + val tasks have "
              f"a turn-1 prompt that fits with {st['max_new_tokens']} new tokens; the first "
              f"{t['humaneval_run']} were run, T = {cfg.humaneval_turns}, one replicate.", "",
              "| generator | selector | single-turn | multi-turn |", "|---|---|---|---|"]
        for g in GENERATORS:
            for sel in cfg.humaneval_selectors:
                vals = {k: [statistics.fmean(ps["humaneval"][g]["conditions"][f"{k}, BoN, {sel}"])
                            for ps in r["per_seed"].values()] for k in ("single-turn", "multi-turn")}
                L.append(f"| {g} | {sel} | " + " | ".join(
                    _pct(_levels([[x] for x in v])) for v in vals.values()) + " |")
    else:
        L.append("Not run (`humaneval_tasks = 0`): few bug-injected HumanEval prompts fit the "
                 "tiny model's 768 positions with room for a repair.")
    L += ["", "## Wall time per seed (seconds)", "",
          "| seed | " + " | ".join(next(iter(r["per_seed"].values()))["timings_s"]) + " |",
          "|---|" + "---|" * len(next(iter(r["per_seed"].values()))["timings_s"])]
    for s, ps in r["per_seed"].items():
        L.append(f"| {s} | " + " | ".join(str(v) for v in ps["timings_s"].values()) + " |")
    L += ["", f"Figure: [{html.name}]({html.name})"
          + (f", ![pass rates]({png.name})" if png else ""),
          "", "Numbers: [mucode.json](mucode.json), with every seed's per-task values.", ""]
    return "\n".join(L)


__all__ = ["Config", "run", "summarise", "PAPER", "CONTRASTS"]
