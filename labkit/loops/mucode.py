"""muCODE: expert iteration with a learned verifier (arXiv 2502.20380), one readable loop.

    for iteration k = 1..K:
        episodes <- multi-turn rollouts of the current generator on the training tasks
                    (labkit.loops.episodes; every attempt labelled by the hidden tests)
        D        <- D + every distinct (task, attempt, label)           (accumulated)
        r_phi    <- a fresh verifier trained on D (BT or BCE)         (labkit.loops.verifier)
        y*_x     <- argmax_{y collected for x so far} r_phi(x, y)      the local expert
        pairs    <- (prompt of every turn of every episode of x, y*_x)  relabelling
        theta    <- supervised fine-tuning on pairs                  (labkit.policy.sft)
        metrics  -> metrics.jsonl, checkpoints/iter_k, events

Relabelling with the expert is what makes single-step rewards enough: every turn, whatever
state it starts in, is taught to jump to the best program known for the task.

:func:`evaluate_bon` runs multi-turn Best-of-N with every selector on held-out tasks,
sharing sampled candidates between selectors wherever their states coincide.
``python -m labkit mucode --config FILE.yaml --set k=v`` runs :func:`run_mucode`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Sequence

from labkit.config import to_dict
from labkit.env.records import RepairTask
from labkit.loops.episodes import (NEEDS_VERIFIER, SELECTORS, Episode, EpisodeConfig, run_episodes,
                                   step_records, summarise)
from labkit.loops.events import EventBus, RunFolder
from labkit.loops.verifier import (Verifier, VerifierConfig, VerifierExample, build_verifier,
                                   evaluate_verifier, examples_from, train_verifier)
from labkit.policy.loading import PolicyConfig, load_policy
from labkit.policy.sft import SFTConfig, train_sft
from labkit.seeding import derive_seed, seed_everything

# ============================================================================= config


@dataclass
class MucodeTasks:
    """Which tasks to train and evaluate on."""

    source: str = "synthetic"
    """``synthetic`` or ``humaneval`` (bugs injected by :mod:`labkit.env.bugs`)."""
    train_problems: int = 64
    """Training tasks: problems generated for ``synthetic`` (one buggy variant each); for other
    sources, the first this many tasks of the train split."""
    eval_split: str = "test"
    """Split of the held-out tasks: ``test`` (templates training never sees), ``val``, or
    ``in_template`` (synthetic only)."""
    eval_tasks: int = 40
    """Held-out tasks for the end-of-iteration evaluation (0 = none)."""
    verifier_holdout: float = 0.2
    """Share of the training tasks whose collected attempts are held out of verifier
    training to measure its ranking (pairwise accuracy, AUC, best-of-N hit rate)."""


@dataclass
class MucodeConfig:
    """A muCODE expert-iteration run (``python -m labkit mucode --config FILE.yaml``)."""

    run_dir: str = "runs/mucode"
    """The run folder: ``config.json``, ``metrics.jsonl`` (a row per iteration),
    ``eval.jsonl``, ``episodes.jsonl`` and ``checkpoints/iter_k/``. Not checked first: the
    ``.jsonl`` files of an earlier run there are appended to."""
    seed: int = 0
    """Seeds everything random: the task lists, the verifier hold-out split and, derived per
    iteration, collection, verifier training, SFT and evaluation."""
    iterations: int = 2
    """K: rounds of collect, train a verifier, relabel, fine-tune; 0 only evaluates the
    starting generator."""
    rollouts_per_task: int = 4
    """Trajectories collected per training task and iteration (the paper: 15)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The generator: ``tiny`` or a local Hugging Face folder, LoRA if asked. Loaded without a
    KL reference (``reference`` is forced to ``none``: SFT needs none)."""
    tasks: MucodeTasks = field(default_factory=MucodeTasks)
    """Training and held-out tasks, and the share of training tasks held out of verifier
    training."""
    collect: EpisodeConfig = field(default_factory=lambda: EpisodeConfig(turns=3, n_candidates=1))
    """Collection rollouts: T turns, one candidate a turn, temperature 0.7 (the paper's)."""
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    """The verifier model and its training. A fresh one is trained every iteration on
    everything collected so far (its ``seed`` is derived per iteration)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(
        lr=3e-4, batch_size=16, max_steps=80, warmup_steps=5, min_lr_ratio=0.1, log_every=10))
    """The generator's fine-tune on the relabelled pairs of each iteration (its ``seed``
    derived per iteration); the optimiser and schedule restart every iteration."""
    evaluate: EpisodeConfig = field(default_factory=lambda: EpisodeConfig(
        turns=3, n_candidates=5, selector="public_then_verifier"))
    """Held-out evaluation after each iteration (and before the first): every selector in
    ``eval_selectors`` with these turns and candidates."""
    eval_selectors: tuple[str, ...] = ("random", "public_tests", "verifier", "public_then_verifier")
    """Selectors run side by side at each evaluation, sharing candidates wherever their states
    coincide; the verifier ones are skipped before the first iteration (no verifier yet)."""
    save_checkpoints: bool = True
    """Write ``checkpoints/iter_k/`` after every iteration: the generator and tokenizer
    (``save_pretrained``), ``verifier/verifier.pt`` and ``experts.json``. Off saves disk and
    time but leaves no model to reload after the run."""

    def validate(self) -> None:
        if self.iterations < 0 or self.rollouts_per_task < 1:
            raise ValueError("iterations >= 0 and rollouts_per_task >= 1 are required")
        unknown = [s for s in self.eval_selectors if s not in SELECTORS]
        if unknown:
            raise ValueError(f"unknown selectors {unknown}; registered: {SELECTORS.names()}")
        self.collect.validate()
        self.evaluate.validate()
        self.verifier.validate()


# ============================================================================= pure steps


def collected_examples(tasks: Sequence[RepairTask],
                       episodes: Sequence[Episode]) -> list[VerifierExample]:
    """Every distinct (task, candidate) of every turn, labelled by its hidden-test verdict."""
    by_id = {t.task_id: t for t in tasks}
    ts, cs, ys = [], [], []
    for ep in episodes:
        for turn in ep.turns:
            for code, ok in zip(turn.candidates, turn.hidden_ok):
                ts.append(by_id[ep.task_id])
                cs.append(code)
                ys.append(float(ok))
    return examples_from(ts, cs, ys)


def choose_experts(codes: dict[str, Sequence[str]],
                   scores: dict[str, Sequence[float]]) -> dict[str, str]:
    """The local expert of each task: ``y*_x = argmax_y r_phi(x, y)`` over its collected
    programs (first of ties); empty programs are never experts."""
    out = {}
    for task_id, cs in codes.items():
        best, best_s = None, None
        for c, s in zip(cs, scores[task_id]):
            if c.strip() and (best_s is None or s > best_s):
                best, best_s = c, s
        if best is not None:
            out[task_id] = best
    return out


def collect_programs(pool: dict[str, dict[str, bool]], episodes: Sequence[Episode]) -> None:
    """Add every distinct candidate program of ``episodes`` to ``pool`` (task id -> program ->
    hidden-test label, in order of first appearance).

    The pool lives for the whole run, as the verifier's data does: the local expert of a task
    is the verifier's best over *everything* collected for it so far, so a program that passed
    in an earlier iteration stays a candidate expert even if this iteration's policy no longer
    writes it (relabelling still uses this iteration's trajectories)."""
    for ep in episodes:
        progs = pool.setdefault(ep.task_id, {})
        for turn in ep.turns:
            for c, ok in zip(turn.candidates, turn.hidden_ok):
                progs.setdefault(c, ok)


def relabel(episodes: Sequence[Episode], experts: dict[str, str]) -> list[tuple[str, str]]:
    """``(prompt_t, y*_x)`` for every turn t of every episode of a task with an expert,
    duplicates dropped: each turn's target becomes the expert program."""
    seen, pairs = set(), []
    for ep in episodes:
        target = experts.get(ep.task_id)
        if target is None:
            continue
        completion = target.rstrip() + "\n"
        for turn in ep.turns:
            if (turn.prompt, completion) not in seen:
                seen.add((turn.prompt, completion))
                pairs.append((turn.prompt, completion))
    return pairs


def split_tasks(tasks: Sequence[RepairTask], holdout: float, seed: int) -> tuple[list, list]:
    """(train, held-out) by a hash of the task id: a stable ``holdout`` share held out."""
    held = [t for t in tasks if derive_seed(seed, "verifier-holdout", t.task_id) % 1000
            < holdout * 1000]
    ids = {t.task_id for t in held}
    return [t for t in tasks if t.task_id not in ids], held


# ============================================================================= evaluation


def evaluate_bon(policy, tasks: Sequence[RepairTask], config: EpisodeConfig,
                 selectors: Sequence[str], *, verifier: Verifier | None = None, sandbox=None,
                 replicates: int = 1, keep_episodes: bool = False) -> dict:
    """Multi-turn Best-of-N with every selector on ``tasks``, ``replicates`` independent
    times, in one batched run (selectors share candidates wherever their states coincide).
    Selectors that need a verifier are skipped when there is none.

    Returns ``{"replicates": [{selector: summary, "candidates": {...}}, ...]}`` where
    ``summary`` is :func:`summarise` plus ``per_task`` and ``candidates`` holds the turn-1
    candidates' mean hidden pass rate (the exact expectation of single-turn repair with
    N = 1) and pass@N (an oracle pick); ``keep_episodes`` adds ``"episodes"`` (all of them).
    """
    sels = [s for s in selectors if verifier is not None or s not in NEEDS_VERIFIER]
    eps = run_episodes(policy, tasks, config, verifier=verifier, sandbox=sandbox,
                       rollouts_per_task=replicates, selectors=sels)
    reps = []
    for r in range(replicates):
        out: dict = {}
        for sel in sels:
            mine = [e for e in eps if e.rollout == r and e.selector == sel]
            out[sel] = {**summarise(mine), "per_task": [
                {"task_id": e.task_id, "turn1": e.turns[0].passed if e.turns else None,
                 "final": e.reward if e.fits else None, "turns": len(e.turns)} for e in mine]}
        first = [e for e in eps if e.rollout == r and e.selector == sels[0] and e.fits and e.turns]
        n = max(1, len(first))
        out["candidates"] = {
            "single_turn_n1": sum(sum(e.turns[0].hidden_ok) / len(e.turns[0].hidden_ok)
                                  for e in first) / n,
            "turn1_pass_at_n": sum(any(e.turns[0].hidden_ok) for e in first) / n,
            "tasks": len(tasks), "fit": len(first)}
        reps.append(out)
    result: dict = {"replicates": reps}
    if keep_episodes:
        result["episodes"] = eps
    return result


# ============================================================================= the loop


@dataclass
class MucodeResult:
    policy: object
    verifier: Verifier | None
    rows: list[dict]
    evals: list[dict]
    data: list[VerifierExample] = field(default_factory=list)
    """Every labelled (task, attempt) collected, accumulated over iterations."""
    held_out: frozenset = frozenset()
    """Task ids whose examples the verifier never trained on."""


def _load_tasks(cfg: MucodeConfig) -> tuple[list[RepairTask], list[RepairTask]]:
    from labkit.env.tasks import load_tasks

    t = cfg.tasks
    train = load_tasks(t.source, "train", n=t.train_problems if t.source == "synthetic" else None,
                       seed=cfg.seed)
    if t.source != "synthetic":
        train = train[: t.train_problems]
    held: list[RepairTask] = []
    if t.eval_tasks:
        held = load_tasks(t.source, t.eval_split,
                          n=t.eval_tasks if t.source == "synthetic" else None,
                          seed=cfg.seed)[: t.eval_tasks]
    return train, held


def run_mucode(cfg: MucodeConfig, *, policy=None, train_tasks: Sequence[RepairTask] | None = None,
               eval_tasks: Sequence[RepairTask] | None = None, sandbox=None,
               events: EventBus | None = None) -> MucodeResult:
    """Expert iteration (module docstring). Writes ``config.json``, ``metrics.jsonl`` (one
    row per iteration), ``eval.jsonl``, ``episodes.jsonl`` (step records) and
    ``checkpoints/iter_k/`` (the generator, its tokenizer and ``verifier/verifier.pt``)."""
    cfg.validate()
    seed_everything(cfg.seed)
    bus = events or EventBus()
    run = RunFolder(cfg.run_dir)
    run.write_json("config.json", to_dict(cfg))
    if train_tasks is None or eval_tasks is None:
        loaded_train, loaded_eval = _load_tasks(cfg)
        train_tasks = loaded_train if train_tasks is None else train_tasks
        eval_tasks = loaded_eval if eval_tasks is None else eval_tasks
    train_tasks, eval_tasks = list(train_tasks), list(eval_tasks)
    if not train_tasks:
        raise ValueError("muCODE has no training tasks: check tasks.source / tasks.train_problems")
    policy = policy or load_policy(dataclasses.replace(cfg.policy, reference="none"))
    own_sandbox = sandbox is None
    if own_sandbox:
        from labkit.env.sandbox import Sandbox

        sandbox = Sandbox()
    fit_tasks, held_tasks = split_tasks(train_tasks, cfg.tasks.verifier_holdout, cfg.seed)
    data: list[VerifierExample] = []
    programs: dict[str, dict[str, bool]] = {}  # every program collected so far (collect_programs)
    rows: list[dict] = []
    evals: list[dict] = []
    verifier: Verifier | None = None
    bus.emit("on_train_start", trainer=None, config=cfg)

    def evaluate(iteration: int) -> None:
        if not eval_tasks:
            return
        t0 = time.time()
        ecfg = dataclasses.replace(cfg.evaluate, seed=derive_seed(cfg.seed, "eval"))
        rep = evaluate_bon(policy, eval_tasks, ecfg, cfg.eval_selectors, verifier=verifier,
                           sandbox=sandbox)["replicates"][0]
        row = {"step": iteration, "time/eval": round(time.time() - t0, 1),
               **{f"eval/{k}": v for k, v in rep["candidates"].items()}}
        for sel, r in rep.items():
            if sel != "candidates":
                row.update({f"eval/{sel}/{k}": v for k, v in r.items() if k != "per_task"})
        run.append("eval.jsonl", row)
        evals.append(row)
        bus.emit("on_eval", trainer=None, step=iteration, metrics=row)

    try:
        evaluate(0)
        for it in range(1, cfg.iterations + 1):
            row: dict = {"step": it}
            # -- collect ---------------------------------------------------------------------
            t0 = time.time()
            ccfg = dataclasses.replace(cfg.collect, seed=derive_seed(cfg.seed, "collect", it))
            episodes = run_episodes(policy, train_tasks, ccfg, sandbox=sandbox,
                                    rollouts_per_task=cfg.rollouts_per_task)
            row["time/collect"] = round(time.time() - t0, 1)
            row.update({f"collect/{k}": v for k, v in summarise(episodes).items()})
            bus.emit("on_rollout", trainer=None, step=it, rollouts=episodes)
            for ep in episodes:
                for rec in step_records(ep, cfg.collect.gamma):
                    run.append("episodes.jsonl", {"step": it, **rec})

            # -- verifier --------------------------------------------------------------------
            t0 = time.time()
            new = collected_examples(train_tasks, episodes)
            seen = {(e.group, e.text) for e in data}
            data += [e for e in new if (e.group, e.text) not in seen]
            held_ids = {t.task_id for t in held_tasks}
            fit_data = [e for e in data if e.group not in held_ids]
            held_data = [e for e in data if e.group in held_ids]
            vcfg = dataclasses.replace(cfg.verifier, seed=derive_seed(cfg.seed, "verifier", it))
            verifier = build_verifier(vcfg)
            vinfo = train_verifier(verifier, fit_data or data, vcfg)
            row.update({"verifier/train_loss": vinfo["final_loss"],
                        "verifier/steps": vinfo["steps"],
                        "verifier/data": len(data), "verifier/data_pos_frac":
                            sum(e.label for e in data) / max(1, len(data))})
            if held_data:
                held_metrics = evaluate_verifier(verifier, held_data)
                row.update({f"heldout/{k}": v for k, v in held_metrics.items()})
            row["time/verifier"] = round(time.time() - t0, 1)

            # -- local experts and relabelling -------------------------------------------------
            by_id = {t.task_id: t for t in train_tasks}
            collect_programs(programs, episodes)
            codes = {tid: list(p) for tid, p in programs.items()}
            labels = {tid: list(p.values()) for tid, p in programs.items()}
            flat = [(tid, c) for tid, cs in codes.items() for c in cs]
            flat_scores = verifier.score([by_id[tid] for tid, _ in flat], [c for _, c in flat])
            scores: dict[str, list[float]] = {}
            for (tid, _), s in zip(flat, flat_scores):
                scores.setdefault(tid, []).append(s)
            experts = choose_experts(codes, scores)
            expert_ok = [labels[tid][codes[tid].index(c)] for tid, c in experts.items()]
            solvable = sum(any(v) for v in labels.values())
            pairs = relabel(episodes, experts)
            row.update({"expert/tasks": len(experts), "expert/programs": len(flat),
                        "expert/pass_frac": sum(expert_ok) / max(1, len(expert_ok)),
                        "expert/solvable_frac": solvable / max(1, len(labels)),
                        "sft/pairs": len(pairs)})

            # -- fine-tune the generator ------------------------------------------------------
            t0 = time.time()
            scfg = dataclasses.replace(cfg.sft, seed=derive_seed(cfg.seed, "sft", it))
            info = train_sft(policy.model, policy.tokenizer, pairs, scfg, progress=False)
            row.update({"sft/steps": info["steps"], "sft/final_loss": info["final_loss"],
                        "sft/dropped_too_long": info["dropped_too_long"],
                        "time/sft": round(time.time() - t0, 1)})
            run.append("metrics.jsonl", row)
            rows.append(row)
            bus.emit("on_step_end", trainer=None, step=it, metrics=row, records=[])
            if cfg.save_checkpoints:
                path = run.path / "checkpoints" / f"iter_{it:03d}"
                policy.model.save_pretrained(str(path))
                policy.tokenizer.save_pretrained(str(path))
                verifier.save(path / "verifier")
                (path / "experts.json").write_text(json.dumps(experts, indent=1))
                bus.emit("on_checkpoint", trainer=None, step=it, path=path)
            evaluate(it)
        bus.emit("on_train_end", trainer=None)
    finally:
        if own_sandbox:
            sandbox.close()
    return MucodeResult(policy, verifier, rows, evals, data,
                        frozenset(t.task_id for t in held_tasks))
