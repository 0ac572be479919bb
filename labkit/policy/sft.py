"""Supervised fine-tuning on (prompt, completion) pairs: the loss is on completion tokens only.

Used to train the embedded tiny model (buggy -> fixed pairs) and, by muCODE's expert
iteration, to fine-tune a generator on relabelled trajectories. Length-bucketed batches,
AdamW, linear warm-up then cosine decay, a wall-clock budget as well as a step budget.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass
class SFTConfig:
    """Supervised fine-tuning settings."""

    lr: float = 2e-3
    """Peak AdamW learning rate (betas 0.9, 0.95), reached after ``warmup_steps`` and decayed
    by cosine to ``min_lr_ratio * lr``. 2e-3 suits training the tiny model from scratch;
    fine-tuning a trained model wants less (muCODE uses 3e-4)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay on matrices only (embeddings, projections); biases and
    norms get none."""
    batch_size: int = 32
    """(prompt, completion) pairs per step. Batches are length-bucketed (similar lengths
    together) to save padding."""
    max_steps: int = 100_000
    """Steps to train (unless :func:`train_sft` gets ``total_steps``) and, without a time
    budget, the horizon of the cosine decay."""
    time_budget_s: float = 0.0
    """Stop after this many seconds (0 = no limit). With a budget (and no explicit
    ``total_steps``) the cosine decay runs over wall-clock time instead of steps, so the
    whole budget is used whatever the machine's speed."""
    warmup_steps: int = 50
    """Steps of linear warm-up from ``lr / warmup_steps`` to ``lr`` (0 = none)."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine decay, as a share of ``lr``."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this before each optimiser step."""
    max_len: int = 640
    """Pairs longer than this many tokens are dropped (and counted)."""
    log_every: int = 50
    """Every N steps, log the mean loss of the last N steps, the learning rate and the elapsed
    seconds (``history`` and ``on_log``)."""
    seed: int = 0
    """Seeds the batch order and torch."""


def tokenize_pairs(tokenizer, pairs: Sequence[tuple[str, str]], max_len: int) -> tuple[list, int]:
    """Token ids and the number of prompt tokens per pair; EOS appended to each completion."""
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False).input_ids
    comps = tokenizer([c for _, c in pairs], add_special_tokens=False).input_ids
    eos = tokenizer.eos_token_id
    out, dropped = [], 0
    for p, c in zip(prompts, comps):
        ids = p + c + [eos]
        if len(ids) > max_len:
            dropped += 1
            continue
        out.append((ids, len(p)))
    return out, dropped


def _batches(examples: list, batch_size: int, rng: random.Random):
    """Endless length-bucketed batches: sort a shuffled pool by length, cut, shuffle the cuts."""
    while True:
        idx = list(range(len(examples)))
        rng.shuffle(idx)
        pool = 50 * batch_size
        for p0 in range(0, len(idx), pool):
            chunk = sorted(idx[p0:p0 + pool], key=lambda i: len(examples[i][0]))
            cuts = [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
            rng.shuffle(cuts)
            yield from cuts


def _collate(examples: list, ids_idx: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    L = max(len(examples[i][0]) for i in ids_idx)
    ids = torch.full((len(ids_idx), L), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for b, i in enumerate(ids_idx):
        seq, p = examples[i]
        ids[b, :len(seq)] = torch.tensor(seq)
        attn[b, :len(seq)] = 1
        labels[b, p:len(seq)] = torch.tensor(seq[p:])
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def lr_at(step: int, cfg: SFTConfig, total: int, frac: float | None = None) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to
    ``min_lr_ratio * lr``: ``lr_t = lr (m + (1 - m) (1 + cos(pi f)) / 2)`` with ``f`` the
    fraction of the decay done (steps out of ``total``, or ``frac`` when given)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if frac is None:
        frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    frac = min(1.0, max(0.0, frac))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def train_sft(model, tokenizer, pairs: Sequence[tuple[str, str]], cfg: SFTConfig,
              *, total_steps: int | None = None, on_log: Callable[[dict], None] | None = None,
              progress: bool = True) -> dict:
    """Train ``model`` in place; returns a summary (steps, tokens, losses, seconds)."""
    examples, dropped = tokenize_pairs(tokenizer, pairs, cfg.max_len)
    if not examples:
        raise ValueError("train_sft: no training pair fits max_len; raise max_len or shorten data")
    total = total_steps or cfg.max_steps
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    model.train()
    by_time = bool(cfg.time_budget_s) and total_steps is None
    t_decay = None  # when the warm-up ended (the time-based decay starts there)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=None if by_time else total, desc="sft", unit="step")
    t0 = time.time()
    losses, tokens, step = [], 0, 0
    history = []
    for idx in _batches(examples, cfg.batch_size, rng):
        elapsed = time.time() - t0
        if step >= total or (cfg.time_budget_s and elapsed > cfg.time_budget_s):
            break
        frac = None
        if by_time and step >= cfg.warmup_steps:
            t_decay = elapsed if t_decay is None else t_decay
            frac = (elapsed - t_decay) / max(1e-9, cfg.time_budget_s - t_decay)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg, total, frac)
        batch = {k: v.to(device) for k, v in _collate(examples, idx, tokenizer.pad_token_id).items()}
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        tokens += int((batch["labels"] != -100).sum())
        step += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % cfg.log_every == 0:
            rec = {"step": step, "loss": sum(losses[-cfg.log_every:]) / cfg.log_every,
                   "lr": opt.param_groups[0]["lr"], "seconds": round(time.time() - t0, 1)}
            history.append(rec)
            if on_log:
                on_log(rec)
    if bar is not None:
        bar.close()
    model.eval()
    return {"steps": step, "examples": len(examples), "dropped_too_long": dropped,
            "completion_tokens": tokens, "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
            "seconds": round(time.time() - t0, 1), "history": history}
