"""``python -m labkit experiment mucode``: muCODE on the tiny default.

1. Expert iteration (:func:`labkit.loops.mucode.run_mucode`) from the tiny model on synthetic
   training tasks: collect multi-turn rollouts, train a Bradley-Terry verifier, relabel with
   the local experts, fine-tune; ``iterations`` times.
2. A BCE verifier trained on exactly the same collected data, for the BT-vs-BCE comparison.
3. For the starting model and the expert-iteration model, on held-out synthetic tasks and
   every seed: multi-turn Best-of-N (N candidates a turn, T turns) with the four selectors,
   candidates shared between selectors where their states coincide. From the same runs:
   single-turn (turn 1) and multi-turn (final) pass rates, N = 1 (the random selector, or the
   exact mean over turn-1 candidates) and N = 5.
4. Bug-injected HumanEval (test + val splits, never used to train the tiny model): the same
   on the tasks whose turn-1 prompt plus ``max_new_tokens`` fits the 768 positions.

Writes ``docs/results/mucode.{md,json}`` with the paper's Table 1 and Table 2 alongside.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.config import to_record
from labkit.env.sandbox import Sandbox
from labkit.env.tasks import load_tasks
from labkit.experiments import RESULTS, format_interval, mean_ci95, write_markdown
from labkit.loops.episodes import EpisodeConfig, turn_prompt
from labkit.loops.mucode import MucodeConfig, MucodeTasks, evaluate_bon, run_mucode
from labkit.loops.verifier import (VerifierConfig, best_of_n_hit_rate, build_verifier,
                                   ranking_metrics, train_verifier)
from labkit.policy.loading import PolicyConfig, load_policy
from labkit.policy.sft import SFTConfig

SELECTOR_ORDER = ("random", "public_tests", "verifier", "public_then_verifier")

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


@dataclass
class Config:
    """Budget of the muCODE experiment (sized for 2 shared CPU cores, ~25 minutes)."""

    replicates: int = 3
    """Independent evaluation runs (sampling and random picks differ; same tasks): the
    'seeds' of the report."""
    eval_seed: int = 0
    """Seed of the held-out evaluations (``EpisodeConfig.seed``: candidate sampling and the
    random selector's picks); the starting and the expert-iteration model are evaluated under
    the same seed."""
    ei_seed: int = 0
    """Seed of the one expert-iteration run (its cost rules out one per seed here)."""
    train_problems: int = 32
    """Synthetic train-split problems (one buggy variant each, drawn with ``ei_seed``) that
    expert iteration collects on; a fifth of them (``MucodeTasks.verifier_holdout``) is held out
    of verifier training."""
    rollouts_per_task: int = 3
    """Episodes collected per training task and iteration (``MucodeConfig.rollouts_per_task``;
    the paper: 15): more give the verifier more labelled attempts and the local expert more
    programs to choose from, at proportional collection cost."""
    iterations: int = 2
    """Rounds of collect, train the verifier, relabel, fine-tune (``MucodeConfig.iterations``)."""
    eval_tasks: int = 40
    """Held-out synthetic ``test``-split tasks (seed 0) both generators are evaluated on."""
    humaneval_tasks: int = 12
    """Bug-injected HumanEval tasks from the test and val splits (0 = skip)."""
    humaneval_turns: int = 2
    """T for the HumanEval evaluation (``turns`` is the synthetic one). HumanEval prompts are
    long: a later turn whose prompt does not fit with ``max_new_tokens`` ends the episode."""
    humaneval_replicates: int = 1
    """Independent evaluation replicates on HumanEval, as ``replicates`` (1 = no interval)."""
    humaneval_selectors: tuple[str, ...] = ("random", "public_then_verifier")
    """Selectors evaluated on HumanEval, a subset to save time: ``random`` (distributed as N =
    1) and the paper's best, ``public_then_verifier``."""
    n_candidates: int = 5
    """N: candidates sampled per turn in the evaluations (Best-of-N; collection always samples
    one). The report labels its rows BoN-5."""
    turns: int = 3
    """T: the most attempts per episode, in collection and in the synthetic evaluation (1 =
    single-turn repair)."""
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
    """Sequences per ``generate`` call."""
    threads: int = 1
    """torch threads (1 is fastest for the 2M model on shared cores)."""
    policy: str = "tiny"
    """Starting generator (``tiny`` or a local Hugging Face folder), loaded without a KL
    reference; also the backbone of both verifiers."""
    out: str = str(RESULTS)
    """Folder of ``mucode.md`` and ``mucode.json`` (default: the repository's ``docs/results``)."""
    run_root: str = "runs/experiments/mucode"
    """Parent of the expert-iteration run folder ``<run_root>/expert_iteration`` (config,
    metrics, episodes, per-iteration checkpoints)."""


def _fits(policy, task, max_new_tokens: int) -> bool:
    limit = getattr(policy.model.config, "max_position_embeddings", None)
    n = len(policy.tokenizer(turn_prompt(task, None, None, policy.tokenizer),
                             add_special_tokens=False).input_ids)
    return not limit or n + max_new_tokens <= limit


def _eval_generator(policy, tasks, ecfg: EpisodeConfig, replicates: int, selectors, bt, bce,
                    sandbox) -> dict:
    """Per replicate: every selector's turn-1 and final pass rate, and both verifiers' ranking
    of the turn-1 candidates (held-out tasks, hidden-test labels)."""
    t0 = time.time()
    rep = evaluate_bon(policy, tasks, ecfg, selectors, verifier=bt, sandbox=sandbox,
                       replicates=replicates, keep_episodes=True)
    by_id = {t.task_id: t for t in tasks}
    out = {}
    for r, summary in enumerate(rep["replicates"]):
        eps = [e for e in rep["episodes"]
               if e.rollout == r and e.selector == selectors[0] and e.fits and e.turns]
        codes = [(e.task_id, c, ok) for e in eps
                 for c, ok in zip(e.turns[0].candidates, e.turns[0].hidden_ok)]
        labels = [float(ok) for _, _, ok in codes]
        groups = [tid for tid, _, _ in codes]
        rank = {}
        for name, v in (("bt", bt), ("bce", bce)):
            scores = v.score([by_id[t] for t, _, _ in codes], [c for _, c, _ in codes])
            rank[name] = ranking_metrics(scores, labels, groups)
            # single-turn BoN with this verifier over all tasks (unsolvable ones count 0)
            hit, _, n_solv = best_of_n_hit_rate(scores, labels, groups)
            rank[name]["single_turn_bon"] = hit * n_solv / max(1, len(eps)) if n_solv else 0.0
        res = {sel: {k: summary[sel][k] for k in ("pass/turn1", "pass/final", "turns/mean",
                                                  "stop/public_pass", "episodes")}
               for sel in selectors if sel in summary}
        res["candidates"] = summary["candidates"]
        res["verifier_ranking"] = rank
        out[r] = res
        print(f"  replicate {r}: " + ", ".join(
            f"{s} {res[s]['pass/turn1']:.3f}->{res[s]['pass/final']:.3f}"
            for s in selectors if s in res), flush=True)
    print(f"  ({time.time() - t0:.0f} s)", flush=True)
    return out


def _conditions(per_seed: dict) -> dict[str, list[float]]:
    """Named conditions -> one value per seed."""
    seeds = list(per_seed.values())
    cond = {"single-turn, N=1": [s["candidates"]["single_turn_n1"] for s in seeds],
            "multi-turn, N=1 (random pick)": [s["random"]["pass/final"] for s in seeds]}
    for sel in SELECTOR_ORDER:
        cond[f"single-turn, BoN-5, {sel}"] = [s[sel]["pass/turn1"] for s in seeds]
    for sel in SELECTOR_ORDER:
        cond[f"multi-turn, BoN-5, {sel}"] = [s[sel]["pass/final"] for s in seeds]
    cond["single-turn, BoN-5, verifier (BCE)"] = [s["verifier_ranking"]["bce"]["single_turn_bon"]
                                                  for s in seeds]
    cond["single-turn, pass@5 (oracle pick)"] = [s["candidates"]["turn1_pass_at_n"] for s in seeds]
    return cond


def run(cfg: Config) -> Path:
    import torch

    torch.set_num_threads(cfg.threads)
    t_all = time.time()
    timings: dict[str, float] = {}
    train = load_tasks("synthetic", "train", n=cfg.train_problems, seed=cfg.ei_seed)
    syn_eval = load_tasks("synthetic", "test", n=cfg.eval_tasks, seed=0)[: cfg.eval_tasks]
    start = load_policy(cfg.policy, reference="none")
    he_fit, he_total, he_n_fit = [], 0, 0
    if cfg.humaneval_tasks:
        he = load_tasks("humaneval", "test", seed=0) + load_tasks("humaneval", "val", seed=0)
        he_total = len(he)
        he_fit = [t for t in he if _fits(start, t, cfg.max_new_tokens)]
        he_n_fit = len(he_fit)
        he_fit = he_fit[: cfg.humaneval_tasks]
    timings["load_s"] = round(time.time() - t_all, 1)

    ecfg = EpisodeConfig(turns=cfg.turns, n_candidates=cfg.n_candidates,
                         temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                         batch_size=cfg.batch_size, seed=cfg.eval_seed)
    vcfg = VerifierConfig(backbone=cfg.policy, loss="bt", epochs=cfg.verifier_epochs,
                          max_len=cfg.verifier_max_len)
    mcfg = MucodeConfig(
        run_dir=f"{cfg.run_root}/expert_iteration", seed=cfg.ei_seed, iterations=cfg.iterations,
        rollouts_per_task=cfg.rollouts_per_task, policy=PolicyConfig(spec=cfg.policy),
        tasks=MucodeTasks(train_problems=cfg.train_problems, eval_tasks=0),
        collect=EpisodeConfig(turns=cfg.turns, n_candidates=1, temperature=cfg.temperature,
                              max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size),
        verifier=vcfg,
        sft=SFTConfig(lr=cfg.sft_lr, batch_size=cfg.sft_batch_size, max_steps=cfg.sft_steps,
                      warmup_steps=5, log_every=10))
    with Sandbox() as sandbox:
        # -- 1. expert iteration ---------------------------------------------------------------
        t0 = time.time()
        print(f"expert iteration: {len(train)} training tasks x {cfg.rollouts_per_task} rollouts, "
              f"{cfg.iterations} iterations", flush=True)
        ei = run_mucode(mcfg, policy=load_policy(cfg.policy, reference="none"), train_tasks=train,
                        eval_tasks=[], sandbox=sandbox)
        timings["expert_iteration_s"] = round(time.time() - t0, 1)
        for row in ei.rows:
            print("  " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in row.items()), flush=True)

        # -- 2. a BCE verifier on the same data ------------------------------------------------
        t0 = time.time()
        fit_data = [e for e in ei.data if e.group not in ei.held_out]
        bce = build_verifier(dataclasses.replace(vcfg, loss="bce"))
        train_verifier(bce, fit_data, dataclasses.replace(vcfg, loss="bce"))
        timings["bce_verifier_s"] = round(time.time() - t0, 1)

        # -- 3. synthetic held-out evaluation -------------------------------------------------
        synthetic = {}
        for name, gen in (("start", start), ("expert_iteration", ei.policy)):
            t0 = time.time()
            print(f"synthetic eval, {name}: {len(syn_eval)} tasks", flush=True)
            synthetic[name] = _eval_generator(gen, syn_eval, ecfg, cfg.replicates,
                                              SELECTOR_ORDER, ei.verifier, bce, sandbox)
            timings[f"eval_synthetic_{name}_s"] = round(time.time() - t0, 1)

        # -- 4. HumanEval (the tasks that fit) ------------------------------------------------
        humaneval = {}
        if he_fit:
            hcfg = dataclasses.replace(ecfg, turns=cfg.humaneval_turns)
            for name, gen in (("start", start), ("expert_iteration", ei.policy)):
                t0 = time.time()
                print(f"humaneval eval, {name}: {len(he_fit)} tasks", flush=True)
                humaneval[name] = _eval_generator(gen, he_fit, hcfg, cfg.humaneval_replicates,
                                                  tuple(cfg.humaneval_selectors), ei.verifier,
                                                  bce, sandbox)
                timings[f"eval_humaneval_{name}_s"] = round(time.time() - t0, 1)
    timings["total_s"] = round(time.time() - t_all, 1)

    summary, methods = {}, {}
    for name, per_seed in synthetic.items():
        summary[name] = {c: mean_ci95(v) for c, v in _conditions(per_seed).items()}
    start_c, end_c = _conditions(synthetic["start"]), _conditions(synthetic["expert_iteration"])
    for c in start_c:
        methods[c] = {"start": mean_ci95(start_c[c]), "end": mean_ci95(end_c[c]),
                      "delta": mean_ci95([e - s for s, e in zip(start_c[c], end_c[c])])}
    ranking = {}
    for name, per_seed in synthetic.items():
        for v in ("bt", "bce"):
            for k in ("verifier/pairwise_acc", "verifier/auc", "verifier/bon_hit",
                      "verifier/bon_random"):
                vals = [s["verifier_ranking"][v][k] for s in per_seed.values()]
                vals = [x for x in vals if x == x]  # drop nan
                ranking.setdefault(name, {}).setdefault(v, {})[k] = (
                    mean_ci95(vals) if vals else (float("nan"), None))
    results = {
        "experiment": "mucode", "config": to_record(cfg), "timings_s": timings,
        "tasks": {"synthetic_train": len(train), "synthetic_eval": len(syn_eval),
                  "humaneval_total_test_val": he_total, "humaneval_fit": he_n_fit,
                  "humaneval_run": len(he_fit),
                  "humaneval_ids": [t.task_id for t in he_fit]},
        "expert_iteration": ei.rows, "verifier_heldout_tasks": len(ei.held_out),
        "synthetic": {g: {str(s): r for s, r in v.items()} for g, v in synthetic.items()},
        "humaneval": {g: {str(s): r for s, r in v.items()} for g, v in humaneval.items()},
        "summary": summary, "methods": methods, "verifier_ranking": ranking, "paper": PAPER,
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mucode.json").write_text(json.dumps(results, indent=2, default=float))
    md = out / "mucode.md"
    write_markdown(md, _markdown(results, cfg))
    return md


def _pct(mh) -> str:
    return format_interval(*mh, digits=1, scale=100)


def _markdown(r: dict, cfg: Config) -> str:
    t, tm = r["tasks"], r["timings_s"]
    L = ["# muCODE on the tiny model: multi-turn repair, a learned verifier, expert iteration, BoN",
         "",
         f"Generated by `python -m labkit experiment mucode` in {tm['total_s'] / 60:.1f} "
         "minutes of "
         f"wall time on 2 shared CPU cores. Budget: expert iteration on {t['synthetic_train']} "
         f"synthetic training tasks x {cfg.rollouts_per_task} rollouts x {cfg.turns} turns, "
         f"{cfg.iterations} iterations, {cfg.sft_steps} SFT steps each, one run (seed "
         f"{cfg.ei_seed}); evaluation on {t['synthetic_eval']} held-out synthetic tasks (test "
         f"split) with N = {cfg.n_candidates} candidates a turn, T = {cfg.turns} turns, "
         f"temperature {cfg.temperature}, {cfg.max_new_tokens} new tokens, {cfg.replicates} "
         "independent evaluation replicates (sampling and random picks). ± is the 95% "
         "t-interval over replicates; it covers sampling noise only, not the task sample or "
         "the training run (one expert-iteration run).",
         "",
         "## Held-out synthetic tasks: pass rate (%) on the hidden tests",
         "",
         "| condition | starting model | after expert iteration | difference |",
         "|---|---|---|---|"]
    for c, m in r["methods"].items():
        L.append(f"| {c} | {_pct(m['start'])} | {_pct(m['end'])} | {_pct(m['delta'])} |")
    L += ["",
          "Single-turn = the first turn's chosen attempt; multi-turn = the final attempt of the "
          "episode (it stops once the public tests pass). `single-turn, N=1` is the exact mean "
          "over the turn-1 candidates; the `random` selector picks one of the N uniformly, so "
          "it is distributed as N = 1. The verifier selectors use the Bradley-Terry verifier of "
          "the last expert-iteration round; `(BCE)` is the BCE verifier trained on the same data.",
          "",
          "## The paper (1B model, pass@1 %, MBPP / HumanEval)",
          "",
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
    L += ["", "BoN hit rate: over tasks with at least one passing candidate, how often the "
          "top-scored one passes; the random-pick rate is the same for a uniform pick.", "",
          "## Expert iteration", "",
          "| iteration | collected final pass | turn-1 pass | verifier held-out AUC "
          "| expert passes | SFT pairs | SFT loss | s |",
          "|---|---|---|---|---|---|---|---|"]
    for row in r["expert_iteration"]:
        secs = sum(v for k, v in row.items() if k.startswith("time/"))
        L.append(f"| {row['step']} | {row['collect/pass/final']:.3f} | "
                 f"{row['collect/pass/turn1']:.3f} | "
                 f"{row.get('heldout/verifier/auc', float('nan')):.3f} | "
                 f"{row['expert/pass_frac']:.3f} | "
                 f"{row['sft/pairs']} | {row['sft/final_loss']:.3f} | {secs:.0f} |")
    L += ["", "## Bug-injected HumanEval", ""]
    if r["humaneval"]:
        L += [f"{t['humaneval_fit']} of the {t['humaneval_total_test_val']} test + val tasks "
              "have a "
              f"turn-1 prompt that fits 768 positions with {cfg.max_new_tokens} new tokens; the "
              f"first {t['humaneval_run']} of those were run, T = {cfg.humaneval_turns}, "
              f"{cfg.humaneval_replicates} replicate(s). Later turns that would not fit end the "
              "episode.", "",
              "| generator | selector | single-turn | multi-turn |", "|---|---|---|---|"]
        for g, per_seed in r["humaneval"].items():
            seeds = list(per_seed.values())
            for sel in cfg.humaneval_selectors:
                a = mean_ci95([s[sel]["pass/turn1"] for s in seeds])
                b = mean_ci95([s[sel]["pass/final"] for s in seeds])
                L.append(f"| {g} | {sel} | {_pct(a)} | {_pct(b)} |")
    else:
        L.append("Not run (humaneval_tasks = 0).")
    L += ["", "## Wall time", "", "| phase | seconds |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in tm.items()]
    L += ["", "Numbers: [mucode.json](mucode.json). Per-replicate results are there too.", ""]
    return "\n".join(L)


__all__ = ["Config", "run", "PAPER"]
