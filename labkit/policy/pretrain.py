"""``python -m labkit pretrain-tiny``: build the embedded default model from scratch, offline.

1. Data: bug-injected synthetic tasks from the train split (problems never in val/test),
   plus HumanEval train problems with injected bugs; each task gives a (buggy -> fixed)
   pair in the plain prompt format.
2. A byte-level BPE tokenizer trained on those texts.
3. A small Llama-style causal LM initialised from a config, then SFT on the pairs
   (loss on the completion only) for a wall-clock budget.
4. Save as a Hugging Face folder; evaluate at the RL sampling temperature on the held-out
   synthetic test split (templates SFT never saw), the in-template split, two-bug multi-hunk
   test tasks and bug-injected HumanEval test problems; write ``manifest.json`` with the
   command, seed, data sizes, the SFT data's templates, timings and measured quality.
"""

from __future__ import annotations

import json
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.config import to_record
from labkit.policy.pretrain_data.augment import RENAME_STYLES, flip_comparisons, name_words, relabel_strings, rename_identifiers
from labkit.env.balanced import balanced_synthetic
from labkit.policy.pretrain_data.generated import generated_tasks, held_out_shapes, shape_key
from labkit.sandbox.pool import Sandbox
from labkit.env.tasks import load_tasks
from labkit.policy import tiny
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import TINY_DIR, load_policy
from labkit.policy.prompts import training_text
from labkit.policy.sft import SFTConfig, train_sft
from labkit.policy.tiny import TinyModelConfig
from labkit.seeding import derive_seed, seed_everything


@dataclass
class PretrainConfig:
    """Everything that decides the shipped tiny model."""

    out: str = str(TINY_DIR)
    """The model folder written (a Hugging Face folder plus ``manifest.json``)."""
    seed: int = 0
    """Seeds the data streams, the tokenizer's data order, the initialisation and SFT."""
    synthetic_problems: int = 3000
    """Synthetic train problems; each gives ``bugs_per_problem`` validated buggy variants."""
    template_share: float = 1.0
    """Share of the training templates the SFT data may use (by a hash of the template id;
    1 = all). Below 1, RL on the train split meets templates SFT never showed."""
    multi_hunk_problems: int = 1000
    """Synthetic train problems offered as two-bug multi-hunk tasks (about 40% give one)."""
    renamed_copies: int = 3
    """Per synthetic task, this many extra SFT pairs with the function, parameters and
    locals renamed to random names (``labkit.policy.pretrain_data.augment.rename_identifiers``): the names
    can then only be copied from the buggy code, which teaches copying instead of writing the
    function from its description (three copies copy better than one: the journal's
    docs/journal/tiny_model.md)."""
    rename_style: str = "compound"
    """How renamed copies name things (``labkit.policy.pretrain_data.augment.RENAME_STYLES``): ``compound``
    (the shipped model's: the function two to four snake-case parts, half of them real words
    of the SFT data) or ``short`` (one pseudo-word per name). Compound names teach the model
    to copy held-out names of several words, which short ones leave it garbling
    (docs/journal/tiny_model.md)."""
    relabel_strings: bool = False
    """Renamed copies also replace the string labels the function returns (``"same"``,
    ``"near"``) with fresh words, in the prompt, the code and the tests
    (``labkit.policy.pretrain_data.augment.relabel_strings``): a template's labels can then only be copied
    from the description, never recalled from another template. Off in the shipped model: a
    model built with it still never solved the held-out ``side_of`` template it was meant for
    and was weaker held-out (docs/journal/tiny_model.md)."""
    flip_comparisons: float = 0.0
    """Renamed copies also mirror each comparison with this probability (``k > 14`` ->
    ``14 < k``, the same ones in the buggy code and the fix;
    ``labkit.policy.pretrain_data.augment.flip_comparisons``): which way a comparison faces can then only be
    copied from the code shown, a lesson in copying the code's shape, not only its names.
    0 = off (the shipped model). A model built with 0.5 copied the comparison but still never
    solved ``side_of`` and was weaker held-out (docs/journal/tiny_model.md)."""
    generated_problems: int = 0
    """Generated programs (:mod:`labkit.policy.pretrain_data.generated`: random if-chains, loops and arithmetic
    under fresh names, never a held-out template's shape) added to the SFT data, each with
    ``generated_bugs`` validated bugs: shapes no template has, so the code shown is the only
    place a fix can come from. 0 = none (the shipped model). A model continued with
    them (``init_from``) copied a held-out if-chain's shape but not its string labels
    (docs/journal/tiny_model.md)."""
    generated_bugs: int = 3
    """Validated bugs per generated problem (each one SFT pair)."""
    init_from: str = ""
    """A model folder to continue from (its tokenizer and weights) instead of a new tokenizer
    and a randomly initialised model: continued SFT, e.g. the shipped model on new data for a
    few hundred steps; ``vocab_size`` and ``model`` are then the folder's, not this config's.
    Empty = build from scratch."""
    bugs_per_problem: int = 3
    """Validated buggy variants per synthetic training problem (each one SFT pair)."""
    humaneval_bugs_per_problem: int = 1
    """Bug-injected variants per HumanEval train problem (a little out-of-family data)."""
    data_procs: int = 2
    """Processes building the synthetic training tasks (each with its own sandbox)."""
    vocab_size: int = 1024
    """Byte-level BPE vocabulary trained on the SFT texts."""
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    """The Llama-style architecture (about 2M parameters by default)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(max_steps=2500, time_budget_s=0,
                                                             batch_size=32, lr=3e-3, max_len=512))
    """Supervised fine-tuning: a step budget (not wall time, so a loaded machine trains the
    same model), cosine decay over it."""
    eval_synthetic_tasks: int = 200
    """Held-out synthetic tasks of the quality evaluation (test split; half as many for the
    in-template and multi-hunk rows)."""
    eval_humaneval_tasks: int = 0
    """0 = every bug-injected HumanEval test-split task."""
    eval_k: int = 8
    """Samples per task of the quality evaluation (pass@1 and pass@8)."""
    snapshot_every: int = 0
    """Also save the model every N SFT steps under ``out/snapshots/step_N`` (0 = never): one
    run then shows how held-out quality moves with training length (mid-schedule snapshots:
    their learning rate had not decayed yet)."""
    eval_temperature: float = 1.6
    """The RL sampling temperature (the experiments', ``ExperimentConfig.temperature``): the
    starting policy is measured where RL will sample it."""
    eval_per_template: int = 12
    """Also measure ``eval_synthetic_tasks`` held-out ``test`` tasks with at most this many of
    any one template (row ``synthetic_test_balanced``, :mod:`labkit.env.balanced`); one
    template is 28% of the first 200 as drawn. 0 = no such row."""


def _pairs(tasks) -> list[tuple[str, str]]:
    return [training_text(t, t.reference_code) for t in tasks]


def _synthetic_chunk(args: tuple[int, int, int, int]) -> list:
    n, seed, bugs, n_bugs = args
    return load_tasks("synthetic", split="train", n=n, seed=seed, bugs_per_problem=bugs,
                      n_bugs=n_bugs, multi_hunk=n_bugs > 1)


def in_template_share(template: str, share: float) -> bool:
    """Whether ``template`` is among the ``share`` of training templates SFT may use."""
    if share >= 1.0:
        return True
    import hashlib

    u = int.from_bytes(hashlib.sha256(f"labkit-sft-template:{template}".encode()).digest()[:8], "big")
    return u / 2**64 < share


def synthetic_train_tasks(n: int, seed: int, bugs_per_problem: int, procs: int = 2,
                          n_bugs: int = 1) -> list:
    """``n`` synthetic train problems' validated bug variants, built by ``procs`` processes
    (each its own generator stream and sandbox pool); duplicates across streams dropped.
    Problems of every stream are split by problem id, so nothing leaks into val/test."""
    from concurrent.futures import ProcessPoolExecutor

    sizes = [n // procs + (i < n % procs) for i in range(procs)]
    jobs = [(k, derive_seed(seed, "pretrain-stream", i, *(("bugs", n_bugs) if n_bugs > 1 else ())),
             bugs_per_problem, n_bugs) for i, k in enumerate(sizes)]
    if procs == 1:
        chunks = [_synthetic_chunk(jobs[0])]
    else:
        with ProcessPoolExecutor(procs) as pool:
            chunks = list(pool.map(_synthetic_chunk, jobs))
    seen, out = set(), []
    for t in (t for c in chunks for t in c):
        key = (t.buggy_code, t.reference_code)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def measure_quality(folder: str | Path, cfg: PretrainConfig) -> dict[str, dict]:
    """The manifest's quality rows of the model in ``folder``: pass@1 / pass@k, greedy, token
    entropy, all-equal groups and names kept on the held-out ``test`` templates (as drawn,
    and balanced: at most ``cfg.eval_per_template`` per template), new instances
    of training templates (``in_template``), two-bug ``test`` tasks and bug-injected HumanEval,
    sampled at ``cfg.eval_temperature`` (the trainer's), ``cfg.eval_k`` samples a task. A set
    with no task at this size (two-bug tasks often fail validation on tiny budgets) is left
    out."""
    policy = load_policy(str(folder), reference="none")
    ecfg = EvalConfig(k=cfg.eval_k, temperature=cfg.eval_temperature)
    n = cfg.eval_synthetic_tasks
    sets = {
        "synthetic_test": load_tasks("synthetic", split="test", n=n, seed=0),
        "synthetic_test_balanced": balanced_synthetic("test", n, cfg.eval_per_template, seed=0)
        if cfg.eval_per_template else [],
        "synthetic_in_template": load_tasks("synthetic", split="in_template", n=n // 2, seed=0),
        "synthetic_multi_hunk_test": load_tasks("synthetic", split="test", n=n, seed=0, n_bugs=2,
                                                multi_hunk=True)[: n // 2],
        "humaneval_test": load_tasks("humaneval", split="test", seed=0),
    }
    if cfg.eval_humaneval_tasks:
        sets["humaneval_test"] = sets["humaneval_test"][: cfg.eval_humaneval_tasks]
    for name in (k for k, tasks in sets.items() if not tasks):
        print(f"eval: {name} skipped (no tasks at this size)", flush=True)
    with Sandbox() as sb:
        quality = {name: evaluate(policy, tasks, ecfg, sandbox=sb, progress=True)
                   for name, tasks in sets.items() if tasks}
    return {name: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in q.items() if k != "per_task"}
            for name, q in quality.items()}


def remeasure_quality(cfg: PretrainConfig, argv: list[str] | None = None) -> dict:
    """Measure the model already built in ``cfg.out`` again (:func:`measure_quality`, e.g. at
    another ``eval_temperature``) and rewrite its manifest's quality, keeping everything that
    says how it was made; the command and the evaluation settings used are recorded under
    ``quality_measured``. The weights are not touched."""
    path = Path(cfg.out, "manifest.json")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest here; build the model first "
                                "(python -m labkit pretrain-tiny --set out=...)")
    manifest = json.loads(path.read_text())
    t0 = time.time()
    manifest["quality"] = measure_quality(cfg.out, cfg)
    manifest["quality_measured"] = {
        "command": "python -m labkit pretrain-tiny --evaluate-only "
                   + " ".join(shlex.quote(a) for a in (argv or [])),
        "eval_temperature": cfg.eval_temperature, "eval_k": cfg.eval_k,
        "eval_synthetic_tasks": cfg.eval_synthetic_tasks,
        "eval_per_template": cfg.eval_per_template, "seconds": round(time.time() - t0, 1)}
    path.write_text(json.dumps(manifest, indent=2))
    return manifest


def pretrain_tiny(cfg: PretrainConfig, argv: list[str] | None = None) -> dict:
    import torch

    if cfg.rename_style not in RENAME_STYLES:
        raise ValueError(f"rename_style {cfg.rename_style!r}: expected one of {', '.join(RENAME_STYLES)}")
    seed_everything(cfg.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t_start = time.time()
    timings = {}

    # -- data ---------------------------------------------------------------------------
    t0 = time.time()
    syn = synthetic_train_tasks(cfg.synthetic_problems, cfg.seed, cfg.bugs_per_problem,
                                procs=cfg.data_procs)
    multi = synthetic_train_tasks(cfg.multi_hunk_problems, cfg.seed, 1, procs=cfg.data_procs,
                                  n_bugs=2) if cfg.multi_hunk_problems else []
    syn = [t for t in syn + multi if in_template_share(t.meta["template"], cfg.template_share)]
    he = load_tasks("humaneval", split="train", seed=cfg.seed,
                    bugs_per_problem=cfg.humaneval_bugs_per_problem)
    rng = random.Random(f"labkit-pretrain-rename:{cfg.seed}")
    words = name_words(t.prompt for t in syn) if cfg.rename_style == "compound" else ()
    renamed = [rename_identifiers(t, rng, style=cfg.rename_style, words=words)
               for t in syn for _ in range(cfg.renamed_copies)]
    if cfg.relabel_strings:
        renamed = [relabel_strings(t, rng, words=words) for t in renamed]
    if cfg.flip_comparisons:
        flip_rng = random.Random(f"labkit-pretrain-flip:{cfg.seed}")
        renamed = [flip_comparisons(t, flip_rng, p=cfg.flip_comparisons) for t in renamed]
    gen = []
    if cfg.generated_problems:
        gen = generated_tasks(cfg.generated_problems, cfg.seed, cfg.generated_bugs,
                              words=words or name_words(t.prompt for t in syn))
    pairs = _pairs(syn) + _pairs(renamed) + _pairs(he) + _pairs(gen)
    sft_templates = sorted({t.meta["template"] for t in syn + gen})
    if gen:  # measured, not assumed: no SFT program has a held-out template's shape
        banned = held_out_shapes()
        held_out_shapes_in_sft = sum(shape_key(t.reference_code) in banned for t in syn + gen)
    timings["data_s"] = round(time.time() - t0, 1)
    print(f"data: {len(syn)} synthetic ({sum(t.difficulty > 1 for t in syn)} multi-hunk, "
          f"{len({t.meta['template'] for t in syn})} templates), {len(renamed)} renamed copies, {len(gen)} generated "
          f"({len({t.meta['template'] for t in gen})} shapes), {len(he)} HumanEval train pairs "
          f"({timings['data_s']} s)", flush=True)

    # -- tokenizer and model ------------------------------------------------------------
    t0 = time.time()
    if cfg.init_from:  # the lab's loader: its folder checks and errors, float32 on the CPU
        start = load_policy(cfg.init_from, reference="none", device="cpu", dtype="float32")
        tok, model = start.tokenizer, start.model
    else:
        tok = tiny.train_tokenizer((p + c for p, c in pairs), vocab_size=cfg.vocab_size)
        model = tiny.init_model(tok, cfg.model, seed=cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    timings["tokenizer_s"] = round(time.time() - t0, 1)
    print(f"tokenizer: {len(tok)} tokens; model: {n_params:,} parameters", flush=True)

    # -- SFT ----------------------------------------------------------------------------
    def snapshot(rec: dict) -> None:
        if cfg.snapshot_every and rec["step"] % cfg.snapshot_every == 0 and rec["step"] < cfg.sft.max_steps:
            tiny.save(model, tok, Path(cfg.out) / "snapshots" / f"step_{rec['step']:06d}")

    sft = train_sft(model, tok, pairs, cfg.sft, on_log=snapshot)
    timings["sft_s"] = sft["seconds"]
    out = tiny.save(model, tok, cfg.out)

    # -- evaluation ---------------------------------------------------------------------
    t0 = time.time()
    quality = measure_quality(out, cfg)
    timings["eval_s"] = round(time.time() - t0, 1)

    manifest = {
        "command": "python -m labkit pretrain-tiny " + " ".join(shlex.quote(a) for a in (argv or [])),
        "seed": cfg.seed,
        "config": to_record(cfg),
        "sft_templates": sft_templates,
        "data": {"synthetic_train_pairs": len(syn), "humaneval_train_pairs": len(he),
                 "renamed_pairs": len(renamed), "generated_pairs": len(gen),
                 **({"held_out_shapes_in_sft": held_out_shapes_in_sft} if gen else {}),
                 "relabelled_pairs": sum(t.task_id.endswith("~relabelled") for t in renamed),
                 "flipped_pairs": sum(t.task_id.endswith("~flipped") for t in renamed),
                 "multi_hunk_pairs": sum(t.difficulty > 1 for t in syn),
                 "sft_examples": sft["examples"], "dropped_too_long": sft["dropped_too_long"]},
        "model": {"parameters": n_params, "vocab": len(tok), "architecture": "LlamaForCausalLM"},
        "training": {k: v for k, v in sft.items() if k != "history"},
        "loss_curve": sft["history"],
        "timings_s": timings,
        "total_s": round(time.time() - t_start, 1),
        "quality": quality,
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "platform": platform.platform()},
    }
    Path(out, "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
