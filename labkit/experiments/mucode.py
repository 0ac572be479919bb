"""``python -m labkit experiment mucode``: muCODE on the tiny default, over training seeds.

Per training seed ``s`` (``seeds``), on the template testbed:

1. Expert iteration (:func:`labkit.mucode.loop.run_mucode`) from the tiny model on
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

Every interval has training seeds and held-out tasks both random
(:func:`labkit.experiments.stats.paired_change`). Each training seed evaluates with its own
sampling seed (the same for the start and its generators), so the start's sampling noise
differs between seeds. The claims and their controls are named before the run
(:data:`PRIMARY`); every other contrast on the page is exploratory, Holm-corrected. Each seed's result is kept in
``<run_root>/seed<s>/result.json`` and reused when the experiment runs again with the same
settings, so an interrupted experiment redoes only the seeds it had not finished.

Writes ``docs/results/mucode.{md,json,html,png}`` with the paper's Table 1 and Table 2
alongside.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.config import to_record
from labkit.machine import thread_budget
from labkit.env.overlap import ReferencePool
from labkit.sandbox.pool import Sandbox
from labkit.env.tasks import load_tasks, synthetic_problems
from labkit import provenance
from labkit.experiments.claims import Contrast
from labkit.experiments.config import DEFAULT_OUT, command
from labkit.experiments.methods import METHODS, check_methods
from labkit.experiments import claims, pages, stats
from labkit.mucode.episodes import EpisodeConfig, turn_prompt
from labkit.mucode.loop import MucodeConfig, MucodeTasks, evaluate_bon, run_mucode
from labkit.mucode.verifier import VerifierConfig, build_verifier, ranking_metrics, train_verifier
from labkit.policy.loading import PolicyConfig, load_policy, weights_fingerprint
from labkit.policy.sft import SFTConfig
from labkit.seeding import derive_seed

SELECTOR_ORDER = ("random", "public_tests", "verifier", "public_then_verifier", "oracle")
GENERATORS = ("expert_iteration", "ei_filtered", "ei_oracle", "sft_self")
"""Trained generators, muCODE methods of :data:`labkit.experiments.methods.METHODS` (each sets
its relabelling, ``MucodeConfig.relabel``): muCODE's expert iteration, its filtered form, and
two controls: correct experts only (the ceiling of relabelling) and a fine-tune on the start
model's own correct samples (forgetting alone)."""

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
    *(f"multi-turn, BoN, {s}" for s in SELECTOR_ORDER))

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
    "BoN: oracle - random (single-turn)": ("single-turn, BoN, oracle", "single-turn, BoN, random"),
    "BoN: verifier - random (single-turn)": ("single-turn, BoN, verifier", "single-turn, BoN, random"),
    "BoN: oracle - random (multi-turn)": ("multi-turn, BoN, oracle", "multi-turn, BoN, random"),
}

PASS_K = "single-turn, pass@k"
"""The condition of pass@k: ``pass_k`` single-turn candidates at the sampling temperature,
any of which passes the hidden tests (a policy that only sharpens raises pass@1, lowers this)."""

GEN = "expert_iteration"
"""The generator muCODE trains (the claims are read on it)."""

PRIMARY = (
    Contrast("expert iteration - start, multi-turn", "claim",
             f"{GEN}|multi-turn, N=1 (random pick)", None, +1, size=0.028,
             source="muCODE (arXiv 2502.20380) Table 1, Llama-3.2-1B on MBPP: single-turn 35.1, "
                    "muCODE multi-turn 37.9 (+2.8 points)"),
    Contrast("correct experts only - start", "positive",
             "ei_oracle|multi-turn, N=1 (random pick)", None, +1,
             of="expert iteration - start, multi-turn"),
    Contrast("own correct samples - start", "negative",
             "sft_self|multi-turn, N=1 (random pick)", None, +1,
             of="expert iteration - start, multi-turn"),
    Contrast("learned verifier - random pick, multi-turn BoN", "claim",
             f"{GEN}|BoN: verifier - random (multi-turn)", None, +1, size=0.058,
             source="muCODE (arXiv 2502.20380) Table 2, Llama-3.2-1B on MBPP: random pick 37.5, "
                    "learned verifier 43.3 (+5.8 points)"),
    Contrast("oracle - random pick, multi-turn BoN", "positive",
             f"{GEN}|BoN: oracle - random (multi-turn)", None, +1,
             of="learned verifier - random pick, multi-turn BoN"),
)
"""The claims and their signed controls, named before the run: ``generator|condition`` is a
generator's paired change from the start on a condition; ``generator|contrast`` a contrast
within a generator (:data:`CONTRASTS`)."""


SMOKE = {"seeds": (0, 1), "train_problems": 6, "rollouts_per_task": 1, "iterations": 1,
         "eval_tasks": 4, "sft_steps": 2, "turns": 2, "n_candidates": 2, "verifier_epochs": 2,
         "verifier_patience": 1, "pass_k": 2}
"""``--smoke``: every generator, two seeds, the whole pipeline in a few minutes."""


def _change(results, c: Contrast, key: str):
    """:data:`PRIMARY`'s getter (:func:`labkit.experiments.claims.read`): the change the
    contrast names, on every held-out task (``paired``) or the ones no trained-on reference
    solves (``paired_clean``), and the start's level on that condition (for relative sizes)."""
    gen, what = c.variant.split("|", 1)
    if what in CONTRASTS:
        return results.get("contrasts", {}).get(gen, {}).get(what) if key == "paired" else \
            results.get("contrasts_clean", {}).get(gen, {}).get(what), None
    cond = results.get("generators", {}).get(gen, {}).get(what)
    if not cond:
        return None, None
    return cond.get(f"{key}_change"), cond["start"]["mean"]


PRIMARY_KEY = "paired_clean"
"""The claims are read on the held-out tasks no trained-on reference solves."""


@dataclass
class Config:
    """Budget of the muCODE experiment (sized for 2 CPU cores: about 10 minutes a seed)."""

    seeds: tuple[int, ...] = (0, 1, 2)
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
    """Base of the held-out evaluations' seeds (``EpisodeConfig.seed``: candidate sampling and
    the random selector's picks): training seed ``s`` evaluates the start and its generators at
    ``derive_seed(eval_seed, "eval", s)``, so the start's sampling noise differs between seeds
    and the intervals over seeds cover it."""
    pass_k: int = 8
    """pass@k: single-turn candidates per held-out task at ``temperature`` for the start and
    every generator (:data:`PASS_K`; 0 = off)."""
    replicates: int = 1
    """Evaluation runs per generator and seed (independent sampling, the same tasks); a task's
    value is its mean over them. They shrink sampling noise; the intervals keep seeds and tasks
    random."""
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
    every iteration and the BCE one); with ``verifier_patience``, at most this many."""
    verifier_patience: int = 0
    """Train each verifier until its held-in loss stops falling (``VerifierConfig.patience``):
    the loss on the attempts of the training problems held out of verifier training, checked
    after every pass; 0 = always ``verifier_epochs`` passes."""
    verifier_max_len: int = 256
    """Tokens per verifier input (problem statement + candidate), cut from the left so the
    program's end survives; shorter is faster but drops more of the statement."""
    batch_size: int = 128
    """Sequences per decode call."""
    threads: int = 2
    """torch threads (at most ``OMP_NUM_THREADS`` where the environment sets it:
    :func:`labkit.machine.thread_budget`)."""
    policy: str = "tiny"
    """Starting generator (``tiny`` or a local Hugging Face folder), loaded without a KL
    reference; also the backbone of both verifiers."""
    generators: tuple[str, ...] = tuple(GENERATORS)
    """Trained generators (:data:`GENERATORS`): ``expert_iteration`` and its controls."""
    out: str = DEFAULT_OUT
    """Folder of ``mucode.{md,json,html,png}``; publishing is explicit: ``out=docs/results``."""
    allow_code_drift: bool = False
    """Reuse a seed's cached result made by other code (another commit or other uncommitted
    changes); off, such a result is refused with one line naming the difference."""
    smoke: bool = False
    """A smoke run (``experiment mucode --smoke``, the :data:`SMOKE` budget): its page says its
    numbers decide nothing."""
    run_root: str = "runs/experiments/mucode"
    """Parent of the per-seed folders ``<run_root>/seed<s>/``: the expert-iteration run
    (``expert_iteration/``: config, metrics, episodes, per-iteration checkpoints) and the
    seed's ``result.json``."""


# Settings that do not decide a seed's result (a cached result.json is reused across them).
# ``batch_size`` is not among them: the decode chunks decide how the random stream is drawn.
_NOT_IN_RESULT = ("seeds", "out", "threads", "run_root", "allow_code_drift", "smoke")


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
    """One training seed: every generator of ``cfg.generators`` trained by expert iteration
    with its relabelling, the BCE verifier, and every generator (and the start) evaluated
    with the expert-iteration run's Bradley-Terry verifier."""
    folder = Path(cfg.run_root) / f"seed{seed}"
    cache = folder / "result.json"
    want = _fingerprint(cfg, seed, weights)
    now = provenance.code_identity()
    if cache.exists():
        old = json.loads(cache.read_text())
        if old.get("fingerprint") == json.loads(json.dumps(want)):
            why = provenance.drift([old.get("code")], now)
            if why and not cfg.allow_code_drift:
                raise provenance.CodeDriftError(
                    f"{cache}: will not reuse it: {why}; delete it to rerun the seed on this "
                    "code, or pass allow_code_drift=true")
            print(f"seed {seed}: reusing {cache}", flush=True)
            return old
    folder.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    ecfg = EpisodeConfig(turns=cfg.turns, n_candidates=cfg.n_candidates,
                         temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                         batch_size=cfg.batch_size, seed=eval_seed(cfg, seed))
    vcfg = VerifierConfig(backbone=cfg.policy, loss="bt", epochs=cfg.verifier_epochs,
                          patience=cfg.verifier_patience, max_len=cfg.verifier_max_len)
    runs, rows = {}, {}
    for gen in ("expert_iteration", *[g for g in cfg.generators if g != "expert_iteration"]):
        if (folder / gen).exists():  # an unfinished or different earlier run
            shutil.rmtree(folder / gen)
        mcfg = METHODS[gen].configure(MucodeConfig(
            run_dir=str(folder / gen), seed=seed, iterations=cfg.iterations,
            rollouts_per_task=cfg.rollouts_per_task, policy=PolicyConfig(spec=cfg.policy),
            tasks=MucodeTasks(train_problems=cfg.train_problems, eval_tasks=0),
            collect=EpisodeConfig(turns=cfg.turns, n_candidates=1, temperature=cfg.temperature,
                                  max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size),
            verifier=vcfg,
            sft=SFTConfig(lr=cfg.sft_lr, batch_size=cfg.sft_batch_size, max_steps=cfg.sft_steps,
                          warmup_steps=5, log_every=10)))
        t0 = time.time()
        print(f"seed {seed}: {gen} ({mcfg.relabel} relabelling), {len(train)} "
              f"{cfg.train_split} tasks x {cfg.rollouts_per_task} rollouts, {cfg.iterations} "
              "iterations", flush=True)
        runs[gen] = run_mucode(mcfg, policy=load_policy(cfg.policy, reference="none"),
                               train_tasks=train, eval_tasks=[], sandbox=sandbox)
        rows[gen] = runs[gen].rows
        timings[f"{gen}_s"] = round(time.time() - t0, 1)
    ei = runs["expert_iteration"]
    t0 = time.time()
    bcfg = dataclasses.replace(vcfg, loss="bce", seed=derive_seed(seed, "bce_verifier"))
    bce = build_verifier(bcfg)
    binfo = train_verifier(bce, [e for e in ei.data if e.group not in ei.held_out], bcfg,
                           validation=[e for e in ei.data if e.group in ei.held_out])
    timings["bce_verifier_s"] = round(time.time() - t0, 1)
    synthetic, humaneval = {}, {}
    for name, gen in (("start", start), *((g, runs[g].policy) for g in runs)):
        t0 = time.time()
        synthetic[name] = _per_task(gen, syn_eval, ecfg, cfg.replicates, SELECTOR_ORDER,
                                    ei.verifier, bce, sandbox)
        timings[f"eval_synthetic_{name}_s"] = round(time.time() - t0, 1)
        if cfg.pass_k:
            synthetic[name]["conditions"][PASS_K] = _pass_at_k(gen, syn_eval, ecfg, cfg.pass_k, sandbox)
        c = synthetic[name]["conditions"]
        print(f"  {name}: " + ", ".join(f"{s} {statistics.fmean(c[f'multi-turn, BoN, {s}']):.3f}"
                                        for s in SELECTOR_ORDER), flush=True)
        if he_fit:
            t0 = time.time()
            hcfg = dataclasses.replace(ecfg, turns=cfg.humaneval_turns)
            humaneval[name] = _per_task(gen, he_fit, hcfg, 1, tuple(cfg.humaneval_selectors),
                                        ei.verifier, bce, sandbox)
            timings[f"eval_humaneval_{name}_s"] = round(time.time() - t0, 1)
    result = {"fingerprint": want, "code": now, "cpu": provenance.cpu_model(), "seed": seed,
              "runs": rows, "bce_verifier": {k: binfo[k] for k in ("epochs", "best_epoch",
                                                                    "heldin_losses", "final_loss")},
              "verifier_heldout_tasks": len(ei.held_out), "synthetic": synthetic,
              "humaneval": humaneval, "timings_s": timings}
    cache.write_text(json.dumps(result, indent=1, default=float))
    return json.loads(cache.read_text())


def eval_seed(cfg: Config, seed: int) -> int:
    """The held-out evaluations' sampling seed of training seed ``seed``."""
    return derive_seed(cfg.eval_seed, "eval", seed)


def _pass_at_k(policy, tasks, ecfg: EpisodeConfig, k: int, sandbox) -> list[float]:
    """Per task: whether any of ``k`` single-turn candidates at the episodes' temperature
    passes the hidden tests (0 for a task whose prompt does not fit)."""
    one = dataclasses.replace(ecfg, turns=1, n_candidates=k, seed=derive_seed(ecfg.seed, "pass_k"))
    rep = evaluate_bon(policy, tasks, one, ("oracle",), sandbox=sandbox, keep_episodes=True)
    got = {e.task_id: float(e.fits and bool(e.turns) and any(e.turns[0].hidden_ok))
           for e in rep["episodes"]}
    return [got.get(t.task_id, 0.0) for t in tasks]


def _levels(per_seed: list[list[float]]) -> dict:
    """Mean level of a condition with its t interval over seeds."""
    mean, ci = stats.t_interval([statistics.fmean(v) for v in per_seed])
    return {"mean": mean, "ci95": ci, "over": "seeds"}


def summarise(per_seed: dict[int, dict], eval_ids: list[str], leaked: set[str]) -> dict:
    """Per trained generator and condition: both levels and the paired change (generator minus
    start, per task and seed) over seeds, on every held-out task and on the ones no reference
    of the trained problems solves; per generator (start included) the within-generator
    contrasts; the verifiers' ranking over seeds."""
    seeds = list(per_seed)
    clean = [i for i, t in enumerate(eval_ids) if t not in leaked]
    first = per_seed[seeds[0]]["synthetic"]
    have = first["start"]["conditions"]
    conds = [c for c in CONDITION_ORDER if c in have] + [c for c in have if c not in CONDITION_ORDER]
    gens = [g for g in first if g != "start"]
    generators: dict = {}
    for g in gens:
        for c in conds:
            start = {s: per_seed[s]["synthetic"]["start"]["conditions"][c] for s in seeds}
            end = {s: per_seed[s]["synthetic"][g]["conditions"][c] for s in seeds}
            delta = {s: [e - b for b, e in zip(start[s], end[s])] for s in seeds}
            generators.setdefault(g, {})[c] = {
                "start": _levels(list(start.values())), "end": _levels(list(end.values())),
                "paired_change": stats.paired_change(delta, eval_ids),
                "paired_clean_change": stats.paired_change(
                    {s: [d[i] for i in clean] for s, d in delta.items()}, [eval_ids[i] for i in clean])}
    contrasts, contrasts_clean = {}, {}
    for g in ["start", *gens]:
        for name, (a, b) in CONTRASTS.items():
            cs = {s: per_seed[s]["synthetic"][g]["conditions"] for s in seeds}
            if a in cs[seeds[0]] and b in cs[seeds[0]]:
                d = {s: [x - y for x, y in zip(cs[s][a], cs[s][b])] for s in seeds}
                contrasts.setdefault(g, {})[name] = stats.paired_change(d, eval_ids)
                contrasts_clean.setdefault(g, {})[name] = stats.paired_change(
                    {s: [v[i] for i in clean] for s, v in d.items()}, [eval_ids[i] for i in clean])
    ranking = {}
    for g in ["start", *gens]:
        for v in ("bt", "bce"):
            for k in ("verifier/pairwise_acc", "verifier/auc", "verifier/bon_hit",
                      "verifier/bon_random"):
                vals = [per_seed[s]["synthetic"][g]["verifier_ranking"][v][k] for s in seeds]
                vals = [x for x in vals if x == x]
                m, ci = stats.t_interval(vals) if vals else (float("nan"), None)
                ranking.setdefault(g, {}).setdefault(v, {})[k] = {"mean": m, "ci95": ci,
                                                                  "seeds": len(vals)}
    return {"generators": generators, "contrasts": contrasts, "contrasts_clean": contrasts_clean,
            "verifier_ranking": ranking, "clean_tasks": len(clean)}


HEADLINE = "multi-turn, N=1 (random pick)"
"""The condition the relabelling split is read on: one candidate a turn, with feedback turns."""


def analysis(summary: dict, key: str = "paired_clean") -> dict:
    """What the page reads beside its claims (exploratory): ``drop``, expert iteration's change
    from the start split by what it relabels with (:func:`_split_drop`), and ``multi_turn``, the
    start model's gain from feedback turns (can multi-turn repair be tested on it?)."""
    g = summary["generators"]

    def change(name):
        return g.get(name, {}).get(HEADLINE, {}).get(f"{key}_change")

    turns = summary["contrasts"].get("start", {}).get("turns: multi-turn - single-turn (random)")
    return {"drop": _split_drop(change),
            "multi_turn": {"gain": stats.compact(turns),
                           "testable": bool(turns and stats.shown(turns) and turns["mean"] > 0)}}


def restat(results: dict) -> dict:
    """Every change computed again from its per-task data with this code's statistics; the
    claims and the analysis read again (nothing is evaluated)."""
    for table in ("generators", "contrasts", "contrasts_clean"):
        for conds in results.get(table, {}).values():
            for name, rec in conds.items():
                if table == "generators":
                    for k in ("paired_change", "paired_clean_change"):
                        if rec.get(k):
                            rec[k] = stats.paired_change(rec[k]["per_task"], rec[k].get("task_ids"))
                elif rec and "per_task" in rec:
                    conds[name] = stats.paired_change(rec["per_task"], rec.get("task_ids"))
    results.pop("controls", None)
    results["analysis"] = analysis(results)
    results["primary"] = claims.read(results, PRIMARY, PRIMARY_KEY, getter=_change)
    return results


def _split_drop(change) -> dict:
    """Expert iteration's change from the start, split by relabelling (each paired by seed and
    task, :func:`labkit.experiments.stats.difference`): ``fine_tune`` = correct experts only
    minus the start (what fine-tuning on right labels costs or gives), ``wrong_labels`` =
    expert iteration minus correct experts only (the same loop, the verifier's experts instead
    of correct ones), ``filter`` = the filtered form minus expert iteration (what the
    public-test filter wins back)."""
    ei, oracle, filtered = change("expert_iteration"), change("ei_oracle"), change("ei_filtered")
    return {"fine_tune": stats.compact(oracle),
            "wrong_labels": stats.compact(ei and oracle and stats.difference(oracle, ei)),
            "filter": stats.compact(ei and filtered and stats.difference(ei, filtered))}


def run(cfg: Config) -> Path:
    import torch

    if not cfg.seeds:
        raise ValueError("experiment mucode needs at least one seed (--set seeds=[0,1,2])")
    check_methods(cfg.generators, loop="mucode", field_name="generators")
    torch.set_num_threads(thread_budget(cfg.threads))
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
        "experiment": "mucode", "config": to_record(cfg), "command": _command(cfg),
        "setting": {"train_split": cfg.train_split, "split": "test", "model": cfg.policy,
                    "model_sha256": weights, "train_problems": len(train),
                    "rollouts_per_task": cfg.rollouts_per_task, "iterations": cfg.iterations,
                    "sft_steps": cfg.sft_steps, "eval_tasks": len(syn_eval),
                    "n_candidates": cfg.n_candidates, "turns": cfg.turns,
                    "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens,
                    "replicates": cfg.replicates, "task_seed": cfg.task_seed,
                    "eval_seed": cfg.eval_seed, "seeds": list(cfg.seeds)},
        "seeds": list(cfg.seeds),
        "tasks": {"train": len(train), "eval": len(syn_eval), "eval_clean": summary["clean_tasks"],
                  "eval_solved_by_trained_reference": sorted(leaked),
                  "humaneval_total_test_val": he_total, "humaneval_fit": he_n_fit,
                  "humaneval_run": len(he_fit), "humaneval_ids": [t.task_id for t in he_fit]},
        **{k: v for k, v in summary.items() if k != "clean_tasks"},
        "analysis": analysis(summary),
        "training": {str(s): r["runs"] for s, r in per_seed.items()},
        "bce_verifier": {str(s): r.get("bce_verifier") for s, r in per_seed.items()},
        "timings_s": {"per_seed_s": {str(s): round(sum(r["timings_s"].values()), 1)
                                     for s, r in per_seed.items()}},
        "paper": PAPER,
    }
    codes = {provenance.label(r.get("code")) for r in per_seed.values()}
    results["provenance"] = {
        "code": provenance.label(provenance.code_identity()), "runs": sorted(codes),
        "clean_single_commit": len(codes) == 1 and not any(c == "unknown" or "+dirty" in c for c in codes),
        "allow_code_drift": cfg.allow_code_drift}
    results["primary"] = claims.read(results, PRIMARY, PRIMARY_KEY, getter=_change)
    return pages.write_page(results, cfg.out, render, figure)


def _command(cfg: Config) -> str:
    return command("mucode", cfg)


def figure(r: dict, out: Path):
    """Each generator's change from the start on every condition, with its interval over seeds."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for g, conds in r["generators"].items():
        names = list(conds)
        ys = [100 * conds[c]["paired_change"]["mean"] for c in names]
        ci = [conds[c]["paired_change"]["ci95"] for c in names]
        fig.add_trace(go.Bar(x=names, y=ys, name=g, error_y={
            "type": "data", "array": [100 * (x[1] - y / 100) if x else 0 for x, y in zip(ci, ys)],
            "arrayminus": [100 * (y / 100 - x[0]) if x else 0 for x, y in zip(ci, ys)]}))
    fig.update_layout(barmode="group", template="plotly_white", xaxis_title="condition",
                      title=f"muCODE: change from the starting model on {r['setting']['eval_tasks']} "
                            f"held-out tasks ({len(r['seeds'])} seeds, 95% over seeds)",
                      yaxis_title="change in pass rate (points)", xaxis_tickangle=-30)
    return pages.save_figure(fig, out, "mucode", width=1000, height=550)


def _family(r: dict) -> dict[str, dict]:
    """The page's exploratory contrasts as one Holm family: every generator's change on every
    condition and every contrast within a generator, on all held-out tasks."""
    rows = [(f"{g}: {c}", v["paired_change"]) for g, conds in r["generators"].items()
            for c, v in conds.items()]
    rows += [(f"{g}: {n}", ch) for g, cs in r["contrasts"].items() for n, ch in cs.items() if ch]
    return {x["label"]: x for x in claims.exploratory(rows)}


def _holm(row) -> str:
    if not row or row.get("p_holm") is None:
        return "n/a"
    return f"Holm p {row['p_holm']:.3f}" + (", shown" if row["shown"] else "")


def _verdict_points(change) -> str:
    """:func:`labkit.experiments.stats.verdict` with the detectable difference in points."""
    mde = change.get("mde")
    return stats.verdict({**change, "mde": None if mde is None else 100 * mde}, " points")


def _pts(change) -> str:
    """``+4.7 [+4.1, +5.3]`` points, or n/a."""
    if not change:
        return "n/a"
    s = f"{100 * change['mean']:+.1f}"
    return s + (f" [{100 * change['ci95'][0]:+.1f}, {100 * change['ci95'][1]:+.1f}]" if change.get("ci95") else "")


def _ci(m: dict) -> str:
    """``0.74 [0.66, 0.82]`` from a ``{mean, ci95}`` level, or n/a."""
    if not m or m.get("mean") != m.get("mean"):
        return "n/a"
    return f"{m['mean']:.2f}" + (f" [{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]" if m.get("ci95") else "")


def _verifier_lines(r: dict) -> list[str]:
    """The verifiers read on the held-out tasks (AUC with its interval over seeds) and how
    long each trained."""
    rank = r.get("verifier_ranking") or {}
    if not rank:
        return []
    names = {"bt": "Bradley-Terry (the run's last)", "bce": "BCE (same data)"}
    lines = ["", "## The verifiers on held-out tasks", "",
             "Each verifier scores the turn-1 candidates of every held-out `test` task (other "
             "templates than it trained on), labelled by the hidden tests; mean over seeds with "
             "its 95% t interval. AUC 0.5 is chance.", "",
             "| candidates of | verifier | AUC | within-task pairwise accuracy | "
             "top-scored passes | random pick passes |", "|---|---|---|---|---|---|"]
    for g, vs in rank.items():
        for v, m in vs.items():
            lines.append(f"| {g} | {names.get(v, v)} | {_ci(m['verifier/auc'])} | "
                         f"{_ci(m['verifier/pairwise_acc'])} | {_ci(m['verifier/bon_hit'])} | "
                         f"{_ci(m['verifier/bon_random'])} |")
    rows = [(s, runs[GEN][-1]) for s, runs in r.get("training", {}).items()
            if runs.get(GEN)]
    if rows:
        bce = r.get("bce_verifier") or {}
        lines += ["", "How each seed's verifiers trained in the last iteration (examples: "
                  "labelled attempts it trained on; passes run, and the pass kept by the lowest "
                  "held-in loss, on the training problems held out of its data):", "",
                  "| seed | examples (passing share) | Bradley-Terry passes / kept | "
                  "held-in loss | BCE passes / kept |", "|---|---|---|---|---|"]
        for s, row in rows:
            b = bce.get(s) or {}
            lines.append(f"| {s} | {row.get('verifier/data', 0)} "
                         f"({row.get('verifier/data_pos_frac', float('nan')):.2f}) | "
                         f"{row.get('verifier/epochs', 'n/a')} / {row.get('verifier/best_epoch', 'n/a')} | "
                         f"{row.get('verifier/heldin_loss', float('nan')):.3f} | "
                         f"{b.get('epochs', 'n/a')} / {b.get('best_epoch', 'n/a')} |")
        cap, patience = r["config"].get("verifier_epochs"), r["config"].get("verifier_patience")
        if patience:
            ran = [row.get("verifier/epochs") for _, row in rows] + \
                  [(bce.get(s) or {}).get("epochs") for s, _ in rows]
            full = sum(e == cap for e in ran)
            lines += ["", f"Training stopped after {patience} pass(es) without a 1% fall of the "
                      f"held-in loss, or at {cap} passes: {full} of the {len(ran)} verifiers above "
                      f"ran all {cap} (their held-in loss was still falling or had just stopped)."]
    return lines


GENERATOR_TEXT = {
    "expert_iteration": "muCODE: every turn relabelled with the verifier's local expert",
    "ei_filtered": "the expert used only when it passes the public tests",
    "ei_oracle": "control: correct experts only",
    "sft_self": "control: the same fine-tune on the model's own correct samples, no relabelling",
}
"""How the page describes each generator."""


def render(r: dict) -> str:
    """The page of a mucode results JSON."""
    st, t = r["setting"], r["tasks"]
    an = r.get("analysis") or {}
    what = (f"Expert iteration from `{st['model']}` on {st['train_problems']} synthetic problems of "
            f"the `{st['train_split']}` templates x {st['rollouts_per_task']} rollouts x {st['turns']} "
            f"turns, {st['iterations']} iterations of {st['sft_steps']} SFT steps, one run per "
            "generator and seed. Generators: "
            + "; ".join(f"`{g}` ({GENERATOR_TEXT.get(g, METHODS[g].label)})" for g in r["generators"])
            + (f" (not trained here: {', '.join(f'`{g}`' for g in GENERATOR_TEXT if g not in r['generators'])})"
               if set(GENERATOR_TEXT) - set(r["generators"]) else "")
            + f". Evaluation, paired: {st['eval_tasks']} held-out `test` tasks, N = {st['n_candidates']} "
            f"candidates a turn, T = {st['turns']} turns, temperature {st['temperature']}; the "
            "`oracle` selector reads the hidden tests (the ceiling of selection). Changes are in "
            "pass-rate units (0.01 = one point).")
    lines = pages.header(r, "muCODE on the tiny model: expert iteration, a learned verifier, Best-of-N",
                         what) + pages.primary_lines(r)
    drop = an.get("drop") or {}
    if drop.get("wrong_labels"):
        parts = [("fine-tuning on correct experts only (`ei_oracle` - start)", drop.get("fine_tune")),
                 ("wrong labels (`expert_iteration` - `ei_oracle`)", drop["wrong_labels"]),
                 ("the public-test filter (`ei_filtered` - `expert_iteration`)", drop.get("filter"))]
        lines += ["## Expert iteration's change, split by what it relabels with (exploratory)", "",
                  f"On `{HEADLINE}`, the tasks no trained-on reference solves, paired by seed and task:", ""]
        lines += [f"- {what}: {_pts(ch)} points, " + (_verdict_points(ch) if ch else "n/a")
                  for what, ch in parts]
        lines.append("")
    gain = (an.get("multi_turn") or {}).get("gain")
    if gain is not None:
        lines += ["## Multi-turn repair", "",
                  f"Multi-turn minus single-turn for the starting model (random pick): {_pts(gain)} points, "
                  + _verdict_points(gain) + ". "
                  + ("The model uses the feedback turn." if an["multi_turn"]["testable"] else
                     "The starting model does not improve on a second turn with feedback, so "
                     "multi-turn repair cannot be tested on this model."), ""]
    holm = _family(r)
    lines += ["## Held-out pass rate: change from the starting model (exploratory, points)", "",
              "Each cell: the change with its 95% interval, then Holm's adjusted p over the page.", "",
              "| condition | start | " + " | ".join(r["generators"]) + " |",
              "|---|---|" + "---|" * len(r["generators"])]
    first = next(iter(r["generators"].values()))
    for c in first:
        cells = [f"{_pts(r['generators'][g][c]['paired_change'])} ({_holm(holm.get(f'{g}: {c}'))})"
                 for g in r["generators"]]
        lines.append(f"| {c} | {100 * first[c]['start']['mean']:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "## Contrasts within a generator (exploratory, points)", "",
              "| contrast | " + " | ".join(r["contrasts"]) + " |", "|---|" + "---|" * len(r["contrasts"])]
    names = list(next(iter(r["contrasts"].values())))
    for n in names:
        lines.append(f"| {n} | " + " | ".join(
            f"{_pts(r['contrasts'][g].get(n))} ({_holm(holm.get(f'{g}: {n}'))})" for g in r["contrasts"]) + " |")
    lines += _verifier_lines(r)
    lines += ["", "## What expert iteration taught", "",
              "| generator | seed | expert passes the hidden tests (last iteration) | SFT pairs |",
              "|---|---|---|---|"]
    for s, runs in r["training"].items():
        for g, rows in runs.items():
            last = rows[-1] if rows else {}
            lines.append(f"| {g} | {s} | {last.get('expert/pass_frac', float('nan')):.2f} | "
                         f"{last.get('sft/pairs', 0)} |")
    lines += ["", f"Held-out tasks a trained-on reference solves: "
              f"{len(t['eval_solved_by_trained_reference'])} of {t['eval']}.", ""] + pages.figure_line("mucode")
    return "\n".join(lines)
