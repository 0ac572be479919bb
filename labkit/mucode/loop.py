"""muCODE: expert iteration with a learned verifier (arXiv 2502.20380), one readable loop.

    for iteration k = 1..K:
        episodes <- multi-turn rollouts of the current generator on the training tasks
                    (labkit.mucode.episodes; every attempt labelled by the hidden tests)
        D        <- D + every distinct (task, attempt, label)           (accumulated)
        r_phi    <- a fresh verifier trained on D (BT or BCE)         (labkit.mucode.verifier)
        y*_x     <- argmax_{y collected for x so far} r_phi(x, y)      the local expert
        pairs    <- (prompt of every turn of every episode of x, y*_x)  relabelling
        theta    <- supervised fine-tuning on pairs                  (labkit.policy.sft)
        metrics  -> metrics.jsonl, checkpoints/iter_k, events

Relabelling with the expert is what makes single-step rewards enough: every turn, whatever
state it starts in, is taught to jump to the best program known for the task.

:func:`evaluate_bon` runs multi-turn Best-of-N with every selector on held-out tasks,
sharing sampled candidates between selectors wherever their states coincide.
``python -m labkit mucode --config FILE.yaml --set k=v`` runs :func:`run_mucode`
(:class:`ExpertIteration`, whose iterations are the stage functions :func:`collect`,
:func:`fit_verifier`, :func:`pick_experts` + :func:`relabel` and :func:`finetune`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Literal, Sequence

from labkit.config import to_dict
from labkit.env.records import RepairTask
from labkit.sandbox.pool import Sandbox
from labkit.env.tasks import load_tasks
from labkit.mucode.episodes import (NEEDS_VERIFIER, SELECTORS, Episode, EpisodeConfig,
                                    run_episodes, step_records, summarise)
from labkit.runs.events import EventBus, RunFolder
from labkit.mucode.verifier import (Verifier, VerifierConfig, VerifierExample, build_verifier,
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
    relabel: Literal["verifier", "verifier_public", "oracle", "self"] = "verifier"
    """What each turn is taught. ``verifier``: muCODE's local expert, the verifier's favourite
    program of the task; ``verifier_public``: the same, used only when it passes the task's
    public tests (filtered relabelling); ``oracle``: the verifier's favourite among programs
    that pass the hidden tests (a control: relabelling with correct experts only);
    ``self``: no relabelling, each turn's own candidates that pass the hidden tests (a
    control: the same fine-tune on the policy's own correct samples, which separates
    forgetting from wrong labels)."""
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


def collect_programs(pool: dict[str, dict[str, bool]], episodes: Sequence[Episode],
                     public: dict[str, dict[str, bool]] | None = None) -> None:
    """Add every distinct candidate program of ``episodes`` to ``pool`` (task id -> program ->
    hidden-test label, in order of first appearance).

    The pool lives for the whole run, as the verifier's data does: the local expert of a task
    is the verifier's best over *everything* collected for it so far, so a program that passed
    in an earlier iteration stays a candidate expert even if this iteration's policy no longer
    writes it (relabelling still uses this iteration's trajectories)."""
    for ep in episodes:
        progs = pool.setdefault(ep.task_id, {})
        pubs = public.setdefault(ep.task_id, {}) if public is not None else {}
        for turn in ep.turns:
            for c, ok, (p, t) in zip(turn.candidates, turn.hidden_ok, turn.public):
                progs.setdefault(c, ok)
                pubs.setdefault(c, t > 0 and p == t)


def own_passing_pairs(episodes: Sequence[Episode]) -> list[tuple[str, str]]:
    """``(prompt_t, y)`` for every candidate ``y`` of every turn that passes the hidden tests,
    duplicates dropped: the ``self`` control's fine-tuning data (no relabelling)."""
    seen, pairs = set(), []
    for ep in episodes:
        for turn in ep.turns:
            for c, ok in zip(turn.candidates, turn.hidden_ok):
                pair = (turn.prompt, c.rstrip() + "\n")
                if ok and c.strip() and pair not in seen:
                    seen.add(pair)
                    pairs.append(pair)
    return pairs


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


def collect(policy, tasks: Sequence[RepairTask], cfg: MucodeConfig, iteration: int,
            sandbox) -> tuple[list[Episode], dict]:
    """Stage 1: multi-turn episodes of the current generator on ``tasks`` (every attempt
    labelled by the hidden tests), with ``collect/*`` metrics."""
    t0 = time.time()
    ccfg = dataclasses.replace(cfg.collect, seed=derive_seed(cfg.seed, "collect", iteration))
    episodes = run_episodes(policy, tasks, ccfg, sandbox=sandbox,
                            rollouts_per_task=cfg.rollouts_per_task)
    return episodes, {"time/collect": round(time.time() - t0, 1),
                      **{f"collect/{k}": v for k, v in summarise(episodes).items()}}


def fit_verifier(data: Sequence[VerifierExample], held_ids: set[str], cfg: MucodeConfig,
                 iteration: int) -> tuple[Verifier, dict]:
    """Stage 2: a fresh verifier trained on the accumulated ``data`` minus the examples of
    the held-out task ids (on which it is then measured: ``heldout/*``). With
    ``VerifierConfig.patience`` those examples are also its held-in loss, which picks how long
    it trains (so ``heldout/*`` is then slightly optimistic; an experiment reads its verifier
    on tasks of other templates)."""
    t0 = time.time()
    fit_data = [e for e in data if e.group not in held_ids]
    held_data = [e for e in data if e.group in held_ids]
    vcfg = dataclasses.replace(cfg.verifier, seed=derive_seed(cfg.seed, "verifier", iteration))
    verifier = build_verifier(vcfg)
    vinfo = train_verifier(verifier, fit_data or list(data), vcfg,
                           validation=held_data if fit_data else ())
    row = {"verifier/train_loss": vinfo["final_loss"], "verifier/steps": vinfo["steps"],
           "verifier/epochs": vinfo["epochs"], "verifier/best_epoch": vinfo["best_epoch"],
           "verifier/heldin_loss": min(vinfo["heldin_losses"], default=math.nan),
           "verifier/data": len(data),
           "verifier/data_pos_frac": sum(e.label for e in data) / max(1, len(data))}
    if held_data:
        row.update({f"heldout/{k}": v for k, v in evaluate_verifier(verifier, held_data).items()})
    row["time/verifier"] = round(time.time() - t0, 1)
    return verifier, row


def pick_experts(verifier: Verifier, programs: dict[str, dict[str, bool]],
                 tasks: Sequence[RepairTask],
                 allowed: dict[str, dict[str, bool]] | None = None) -> tuple[dict[str, str], dict]:
    """Stage 3a: each task's local expert, the verifier's favourite among every program
    collected for it so far (``programs``: :func:`collect_programs`; with ``allowed``, only
    among the programs it marks True), with ``expert/*`` metrics (how often the expert truly
    passes, and how many tasks have a passing program)."""
    by_id = {t.task_id: t for t in tasks}
    labels_all = programs
    if allowed is not None:
        programs = {tid: {c: ok for c, ok in p.items() if allowed.get(tid, {}).get(c)}
                    for tid, p in programs.items()}
        programs = {tid: p for tid, p in programs.items() if p}
    codes = {tid: list(p) for tid, p in programs.items()}
    labels = {tid: list(p.values()) for tid, p in programs.items()}
    flat = [(tid, c) for tid, cs in codes.items() for c in cs]
    flat_scores = verifier.score([by_id[tid] for tid, _ in flat], [c for _, c in flat])
    scores: dict[str, list[float]] = {}
    for (tid, _), sc in zip(flat, flat_scores):
        scores.setdefault(tid, []).append(sc)
    experts = choose_experts(codes, scores)
    expert_ok = [labels[tid][codes[tid].index(c)] for tid, c in experts.items()]
    solvable = sum(any(v.values()) for v in labels_all.values())
    return experts, {"expert/tasks": len(experts), "expert/programs": len(flat),
                     "expert/pass_frac": sum(expert_ok) / max(1, len(expert_ok)),
                     "expert/solvable_frac": solvable / max(1, len(labels_all))}


def finetune(policy, pairs: Sequence[tuple[str, str]], cfg: MucodeConfig, iteration: int) -> dict:
    """Stage 4: supervised fine-tuning of the generator on the relabelled pairs."""
    t0 = time.time()
    scfg = dataclasses.replace(cfg.sft, seed=derive_seed(cfg.seed, "sft", iteration))
    info = train_sft(policy.model, policy.tokenizer, list(pairs), scfg, progress=False)
    return {"sft/steps": info["steps"], "sft/final_loss": info["final_loss"],
            "sft/dropped_too_long": info["dropped_too_long"], "time/sft": round(time.time() - t0, 1)}


class ExpertIteration:
    """The muCODE loop (module docstring) as the RL trainer is one: it holds the run's state,
    writes the run folder and emits the same events with itself as ``trainer``
    (``on_train_start``, ``on_rollout`` with the episodes, ``on_step_end`` per iteration,
    ``on_checkpoint``, ``on_eval``, ``on_train_end``). Each iteration is the four stage
    functions :func:`collect`, :func:`fit_verifier`, :func:`pick_experts` + :func:`relabel`
    and :func:`finetune`. Writes ``config.json``, ``metrics.jsonl`` (one row per
    iteration), ``eval.jsonl``, ``episodes.jsonl`` (step records) and ``checkpoints/iter_k/``
    (the generator, its tokenizer, ``verifier/verifier.pt`` and ``experts.json``)."""

    def __init__(self, cfg: MucodeConfig, *, policy=None,
                 train_tasks: Sequence[RepairTask] | None = None,
                 eval_tasks: Sequence[RepairTask] | None = None, sandbox=None,
                 events: EventBus | None = None):
        cfg.validate()
        seed_everything(cfg.seed)
        self.cfg = cfg
        self.events = events or EventBus()
        self.run = RunFolder(cfg.run_dir)
        if train_tasks is None or eval_tasks is None:
            loaded_train, loaded_eval = _load_tasks(cfg)
            train_tasks = loaded_train if train_tasks is None else train_tasks
            eval_tasks = loaded_eval if eval_tasks is None else eval_tasks
        self.train_tasks, self.eval_tasks = list(train_tasks), list(eval_tasks)
        if not self.train_tasks:
            raise ValueError("muCODE has no training tasks: check tasks.source / tasks.train_problems")
        self.policy = policy or load_policy(dataclasses.replace(cfg.policy, reference="none"))
        self._own_sandbox = sandbox is None
        if sandbox is None:
            sandbox = Sandbox()
        self.sandbox = sandbox
        fit, held = split_tasks(self.train_tasks, cfg.tasks.verifier_holdout, cfg.seed)
        self.held_ids = {t.task_id for t in held}
        self.data: list[VerifierExample] = []
        self.programs: dict[str, dict[str, bool]] = {}  # every program so far (collect_programs)
        self.public: dict[str, dict[str, bool]] = {}  # ... and whether it passes the public tests
        self.rows: list[dict] = []
        self.evals: list[dict] = []
        self.verifier: Verifier | None = None
        self.iteration = 0

    def evaluate(self) -> dict | None:
        """Multi-turn Best-of-N of every ``eval_selectors`` on the held-out tasks (``eval/*``)."""
        if not self.eval_tasks:
            return None
        cfg = self.cfg
        t0 = time.time()
        ecfg = dataclasses.replace(cfg.evaluate, seed=derive_seed(cfg.seed, "eval"))
        rep = evaluate_bon(self.policy, self.eval_tasks, ecfg, cfg.eval_selectors,
                           verifier=self.verifier, sandbox=self.sandbox)["replicates"][0]
        row = {"step": self.iteration, "time/eval": round(time.time() - t0, 1),
               **{f"eval/{k}": v for k, v in rep["candidates"].items()}}
        for sel, r in rep.items():
            if sel != "candidates":
                row.update({f"eval/{sel}/{k}": v for k, v in r.items() if k != "per_task"})
        self.run.append("eval.jsonl", row)
        self.evals.append(row)
        self.events.emit("on_eval", trainer=self, step=self.iteration, metrics=row)
        return row

    def iterate(self) -> dict:
        """One iteration: collect, fit the verifier, pick experts and relabel, fine-tune."""
        cfg = self.cfg
        self.iteration += 1
        it = self.iteration
        episodes, row = collect(self.policy, self.train_tasks, cfg, it, self.sandbox)
        row = {"step": it, **row}
        self.events.emit("on_rollout", trainer=self, step=it, rollouts=episodes)
        for ep in episodes:
            for rec in step_records(ep, cfg.collect.gamma):
                self.run.append("episodes.jsonl", {"step": it, **rec})
        seen = {(e.group, e.text) for e in self.data}
        self.data += [e for e in collected_examples(self.train_tasks, episodes)
                      if (e.group, e.text) not in seen]
        self.verifier, vrow = fit_verifier(self.data, self.held_ids, cfg, it)
        collect_programs(self.programs, episodes, self.public)
        mode = cfg.relabel
        allowed = {"verifier": None, "verifier_public": self.public, "self": None,
                   "oracle": self.programs}[mode]
        experts, erow = pick_experts(self.verifier, self.programs, self.train_tasks, allowed)
        pairs = own_passing_pairs(episodes) if mode == "self" else relabel(episodes, experts)
        row.update({**vrow, **erow, "sft/pairs": len(pairs)})
        row.update(finetune(self.policy, pairs, cfg, it))
        self.run.append("metrics.jsonl", row)
        self.rows.append(row)
        self.events.emit("on_step_end", trainer=self, step=it, metrics=row, records=[])
        if cfg.save_checkpoints:
            path = self.run.path / "checkpoints" / f"iter_{it:03d}"
            self.policy.model.save_pretrained(str(path))
            self.policy.tokenizer.save_pretrained(str(path))
            self.verifier.save(path / "verifier")
            (path / "experts.json").write_text(json.dumps(experts, indent=1))
            self.events.emit("on_checkpoint", trainer=self, step=it, path=path)
        return row

    def train(self) -> MucodeResult:
        """Evaluate, then ``iterations`` times iterate and evaluate."""
        self.run.write_json("config.json", to_dict(self.cfg))
        self.events.emit("on_train_start", trainer=self, config=self.cfg)
        try:
            self.evaluate()
            while self.iteration < self.cfg.iterations:
                self.iterate()
                self.evaluate()
            self.events.emit("on_train_end", trainer=self)
        finally:
            self.close()
        return MucodeResult(self.policy, self.verifier, self.rows, self.evals, self.data,
                            frozenset(self.held_ids))

    def close(self) -> None:
        if self._own_sandbox:
            self.sandbox.close()
            self._own_sandbox = False


def run_mucode(cfg: MucodeConfig, *, policy=None, train_tasks: Sequence[RepairTask] | None = None,
               eval_tasks: Sequence[RepairTask] | None = None, sandbox=None,
               events: EventBus | None = None) -> MucodeResult:
    """Expert iteration (module docstring): ``ExpertIteration(...).train()``."""
    return ExpertIteration(cfg, policy=policy, train_tasks=train_tasks, eval_tasks=eval_tasks,
                           sandbox=sandbox, events=events).train()
