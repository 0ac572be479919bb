"""A learned verifier: a scalar score ``r_phi(x, y)`` for a task ``x`` and a program ``y``.

muCODE (arXiv 2502.20380) trains it on the generator's own rollouts, labelled by the
hidden tests (the oracle), and uses it twice: to pick each task's *local expert* (the best
collected program) for relabelling, and to rank candidates in multi-turn Best-of-N.

Models (:func:`build_verifier`):

* ``value_head`` (default): the causal LM's backbone (``AutoModel`` on the same folder,
  the LM head dropped) and a linear head on the last token's hidden state,
  ``r = w^T h_last + b``. For ``"tiny"`` this is the embedded tiny model's backbone.
* ``seqcls``: ``AutoModelForSequenceClassification`` with ``num_labels = 1`` from a local
  folder (transformers pools the last non-padding token).

Either may train LoRA adapters (peft) instead of all backbone weights; the head always trains.

Losses (:data:`VERIFIER_LOSSES`, pure functions of scores ``r`` ``[B]``, labels ``y`` in
{0, 1} ``[B]`` and task ids ``g`` ``[B]``):

* ``bce``: ``mean_i -[y_i log sigma(r_i) + (1 - y_i) log(1 - sigma(r_i))]``;
* ``bt`` (Bradley-Terry): over the pairs ``P = {(i, j): g_i = g_j, y_i = 1, y_j = 0}``,
  ``mean_{(i,j) in P} [-log sigma(r_i - r_j) + c (r_i^2 + r_j^2)]``, ``c = 1e-3`` keeping the
  scale-free pairwise loss centred near 0; a batch with no pair costs ``c mean_i r_i^2``.

Held-out ranking metrics (:func:`ranking_metrics`): within-task pairwise accuracy, AUC, and
the best-of-N hit rate (the top-scored candidate of a task passes, over tasks with at least
one passing candidate).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

import torch
import torch.nn.functional as F

from labkit.registry import Registry
from labkit.env.records import RepairTask
from labkit.runs.metrics import average_ranks
from labkit.policy.loading import (PolicyLoadError, load_tokenizer, lora_targets_for,
                                   resolve_device_dtype, resolve_spec)

# ============================================================================= losses

VerifierLoss = Callable[..., torch.Tensor]
VERIFIER_LOSSES: Registry[VerifierLoss] = Registry("verifier loss")


@VERIFIER_LOSSES.register("bce")
def bce_loss(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor,
             reg: float = 1e-3) -> torch.Tensor:
    """``L = mean_i -[y_i log sigma(r_i) + (1 - y_i) log(1 - sigma(r_i))]`` (``reg`` unused:
    the logistic loss fixes the scale itself)."""
    return F.binary_cross_entropy_with_logits(scores.float(), labels.float())  # []


def bt_pairs(labels: Sequence[float], groups: Sequence) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` in one task with ``y_i > y_j`` (the preferred one first)."""
    return [(i, j) for i in range(len(labels)) for j in range(len(labels))
            if groups[i] == groups[j] and labels[i] > labels[j]]


@VERIFIER_LOSSES.register("bt")
def bt_loss(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor,
            reg: float = 1e-3) -> torch.Tensor:
    """``L = mean_{(i,j): g_i = g_j, y_i > y_j} [-log sigma(r_i - r_j) + reg (r_i^2 + r_j^2)]``;
    with no such pair, ``reg * mean_i r_i^2``."""
    r = scores.float()  # [B]
    same = groups.unsqueeze(0) == groups.unsqueeze(1)  # [B, B]
    better = labels.unsqueeze(1) > labels.unsqueeze(0)  # [B, B]: y_i > y_j
    pair = same & better  # [B, B]
    if not bool(pair.any()):
        return reg * (r ** 2).mean()
    diff = r.unsqueeze(1) - r.unsqueeze(0)  # [B, B]: r_i - r_j
    sq = r.unsqueeze(1) ** 2 + r.unsqueeze(0) ** 2  # [B, B]
    per_pair = -F.logsigmoid(diff) + reg * sq  # [B, B]
    return per_pair[pair].mean()


# ============================================================================= metrics


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """``P(r_pos > r_neg) + 0.5 P(r_pos = r_neg)`` over all positive/negative pairs
    (Mann-Whitney); ``nan`` without both classes."""
    pos = [s for s, y in zip(scores, labels) if y > 0.5]
    neg = [s for s, y in zip(scores, labels) if y <= 0.5]
    if not pos or not neg:
        return float("nan")
    # rank-based: sum of positive ranks (average ranks for ties)
    ranks = average_ranks(scores)
    r_pos = sum(r for r, y in zip(ranks, labels) if y > 0.5)
    n_pos, n_neg = len(pos), len(neg)
    return (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def pairwise_accuracy(scores: Sequence[float], labels: Sequence[float],
                      groups: Sequence) -> float:
    """Over within-task pairs with ``y_i > y_j``: the fraction with ``r_i > r_j`` (ties 0.5);
    ``nan`` when there is no such pair."""
    pairs = bt_pairs(labels, groups)
    if not pairs:
        return float("nan")
    return sum(1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
               for i, j in pairs) / len(pairs)


def best_of_n_hit_rate(scores: Sequence[float], labels: Sequence[float],
                       groups: Sequence) -> tuple[float, float, int]:
    """Over tasks with at least one passing candidate: the fraction whose top-scored
    candidate passes (first of ties), the same for a random pick (the mean pass rate,
    the baseline), and the number of such tasks."""
    by: dict = {}
    for i, g in enumerate(groups):
        by.setdefault(g, []).append(i)
    hits, base, n = 0.0, 0.0, 0
    for idx in by.values():
        if not any(labels[i] > 0.5 for i in idx):
            continue
        top = max(idx, key=lambda i: (scores[i], -i))
        hits += labels[top] > 0.5
        base += sum(labels[i] > 0.5 for i in idx) / len(idx)
        n += 1
    if not n:
        return float("nan"), float("nan"), 0
    return hits / n, base / n, n


def ranking_metrics(scores: Sequence[float], labels: Sequence[float], groups: Sequence) -> dict:
    """``verifier/pairwise_acc``, ``verifier/auc``, ``verifier/bon_hit``,
    ``verifier/bon_random`` (the random-pick baseline), ``verifier/bon_tasks``."""
    hit, base, n = best_of_n_hit_rate(scores, labels, groups)
    return {"verifier/pairwise_acc": pairwise_accuracy(scores, labels, groups),
            "verifier/auc": auc(scores, labels), "verifier/bon_hit": hit,
            "verifier/bon_random": base, "verifier/bon_tasks": n,
            "verifier/examples": len(scores), "verifier/pos_frac":
                sum(y > 0.5 for y in labels) / max(1, len(labels))}


# ============================================================================= the model


@dataclass
class VerifierConfig:
    """The verifier model and its training."""

    backbone: str = "tiny"
    """``"tiny"`` or a local Hugging Face folder (a causal LM, or a sequence classifier)."""
    kind: Literal["value_head", "seqcls"] = "value_head"
    """``value_head``: the LM's backbone plus a zero-initialised linear head on the last
    token's hidden state (any causal-LM folder, ``tiny`` included); ``seqcls``:
    ``AutoModelForSequenceClassification`` with one label, for a folder holding a sequence
    classifier (from a causal LM its ``score`` layer starts random)."""
    loss: str = "bt"
    """``bt`` (Bradley-Terry within tasks, the paper's better ranker) or ``bce``."""
    reg: float = 1e-3
    """``c`` in the Bradley-Terry term ``c (r_i^2 + r_j^2)``."""
    lora: bool = False
    """Train LoRA adapters (peft) on the architecture's default targets (the attention
    projections) instead of every backbone weight; the head always trains fully. Less memory on
    a large backbone, less capacity."""
    lora_r: int = 8
    """Rank of each LoRA adapter (``lora``)."""
    lora_alpha: int = 16
    """LoRA scale: an adapter's update is multiplied by ``lora_alpha / lora_r``."""
    lr: float = 3e-4
    """AdamW learning rate, constant for the whole training (no warm-up, no decay)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay, on every trainable parameter (the head included)."""
    epochs: int = 3
    """Passes over the examples, batches reshuffled each pass (with ``patience``: at most this
    many). 0 trains nothing: a ``value_head`` verifier then scores every candidate 0, so its
    selectors pick the first."""
    patience: int = 0
    """Train until the held-in loss stops falling: after each pass, the loss on the
    ``validation`` examples given to :func:`train_verifier` (held-in tasks: the training
    distribution, not trained on), or without them the pass's mean training loss; stop after
    ``patience`` passes without a fall of at least ``min_delta`` and keep the best pass's
    weights. 0: always ``epochs`` passes."""
    min_delta: float = 0.01
    """The smallest fall of the held-in loss (relative: a share of the best so far) that
    counts as falling (``patience``)."""
    tasks_per_batch: int = 8
    """Tasks per batch; all of a task's candidates (up to ``max_per_task``) go together,
    so Bradley-Terry pairs exist in every batch."""
    max_per_task: int = 16
    """At most this many of a task's candidates per batch (a random subset, redrawn each epoch;
    the rest sit that pass out): bounds the batch size and the number of Bradley-Terry pairs,
    which grows with its square."""
    max_len: int = 384
    """Tokens per (task, code) text, cut from the left so the program's end survives."""
    grad_clip: float = 1.0
    """Clip the global gradient norm of the trainable parameters to this before each step."""
    seed: int = 0
    """Seeds the batch order, the candidate subsets and torch (the ``value_head`` head starts
    at zero regardless); muCODE derives one per iteration."""
    device: str = "auto"
    """``auto``: ``cuda`` when available, else ``cpu``; or a torch device string. The verifier
    always runs in float32."""

    def validate(self) -> None:
        if self.loss not in VERIFIER_LOSSES:
            raise ValueError(f"unknown verifier loss {self.loss!r}; registered: "
                             f"{VERIFIER_LOSSES.names()}")
        if self.kind not in ("value_head", "seqcls"):
            raise ValueError(f"unknown verifier kind {self.kind!r}; choose value_head or seqcls")
        if self.epochs < 0 or self.tasks_per_batch < 1 or self.max_len < 16:
            raise ValueError("epochs >= 0, tasks_per_batch >= 1 and max_len >= 16 are required")
        if self.patience < 0 or not 0 <= self.min_delta < 1:
            raise ValueError("patience >= 0 and 0 <= min_delta < 1 are required")


def verifier_text(task: RepairTask, code: str) -> str:
    """What the verifier reads: the problem statement and the candidate program."""
    return f"### Problem\n{task.prompt.strip()}\n### Candidate\n{code.rstrip()}\n### Verdict\n"


class Verifier(torch.nn.Module):
    """Scores texts; ``score(tasks, codes)`` is the no-grad, batched entry point."""

    def __init__(self, model, tokenizer, kind: str, head: torch.nn.Module | None, device,
                 max_len: int):
        super().__init__()
        self.model = model
        self.head = head
        self.tokenizer = tokenizer
        self.kind = kind
        self.device = device
        self.max_len = max_len

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        tok = self.tokenizer
        side = tok.truncation_side
        tok.truncation_side = "left"
        enc = tok(list(texts), return_tensors="pt", padding=True, truncation=True,
                  max_length=self.max_len, add_special_tokens=False)
        tok.truncation_side = side
        return {k: v.to(self.device) for k, v in enc.items()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B]`` (left padding: the last column is every row's last token)."""
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        if self.kind == "seqcls":
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
            return out.logits.squeeze(-1).float()  # [B]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                         use_cache=False)
        h = out.last_hidden_state[:, -1, :]  # [B, H]
        return self.head(h.float()).squeeze(-1)  # [B]

    @torch.no_grad()
    def score_texts(self, texts: Sequence[str], batch_size: int = 32) -> list[float]:
        was = self.training
        self.eval()
        out: list[float] = []
        for b in range(0, len(texts), batch_size):
            enc = self.encode(texts[b:b + batch_size])
            out += self(enc["input_ids"], enc["attention_mask"]).tolist()
        self.train(was)
        return out

    def score(self, tasks: Sequence[RepairTask], codes: Sequence[str],
              batch_size: int = 32) -> list[float]:
        return self.score_texts([verifier_text(t, c) for t, c in zip(tasks, codes)], batch_size)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"kind": self.kind, "state": self.state_dict()}, path / "verifier.pt")
        return path


def build_verifier(config: VerifierConfig | None = None) -> Verifier:
    """A fresh verifier on ``config.backbone`` (head initialised to zero: every score starts
    at 0, so the first Bradley-Terry loss is ``log 2``)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    cfg = config or VerifierConfig()
    cfg.validate()
    path = resolve_spec(cfg.backbone)
    device, _ = resolve_device_dtype(cfg.device, "float32")
    tok = load_tokenizer(path)
    try:
        if cfg.kind == "seqcls":
            model = AutoModelForSequenceClassification.from_pretrained(
                str(path), local_files_only=True, num_labels=1, dtype=torch.float32)
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tok.pad_token_id
            head = None
        else:
            model = AutoModel.from_pretrained(str(path), local_files_only=True,
                                              dtype=torch.float32)
            head = torch.nn.Linear(model.config.hidden_size, 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
    except (OSError, ValueError) as e:
        raise PolicyLoadError(f"cannot build a {cfg.kind} verifier from {str(path)!r}: "
                              f"{e}") from None
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        targets = lora_targets_for(model, ())
        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets,
            task_type="SEQ_CLS" if cfg.kind == "seqcls" else "FEATURE_EXTRACTION",
            modules_to_save=["score"] if cfg.kind == "seqcls" else None))
    return Verifier(model, tok, cfg.kind, head, device, cfg.max_len).to(device)


# ============================================================================= training


@dataclass(frozen=True)
class VerifierExample:
    """One labelled (task, code) pair; ``group`` is the task id (Bradley-Terry pairs
    never cross tasks)."""

    group: str
    text: str
    label: float


def examples_from(tasks: Sequence[RepairTask], codes: Sequence[str],
                  labels: Sequence[float]) -> list[VerifierExample]:
    """Labelled examples, one per distinct (task, code) (duplicates would weigh twice)."""
    seen, out = set(), []
    for t, c, y in zip(tasks, codes, labels):
        if (t.task_id, c) in seen:
            continue
        seen.add((t.task_id, c))
        out.append(VerifierExample(t.task_id, verifier_text(t, c), float(y)))
    return out


def _batches(examples: Sequence[VerifierExample], cfg: VerifierConfig,
             rng: random.Random) -> list[list[int]]:
    by: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        by.setdefault(ex.group, []).append(i)
    groups = list(by)
    rng.shuffle(groups)
    out = []
    for b in range(0, len(groups), cfg.tasks_per_batch):
        idx: list[int] = []
        for g in groups[b:b + cfg.tasks_per_batch]:
            members = list(by[g])
            rng.shuffle(members)
            idx += members[: cfg.max_per_task]
        out.append(idx)
    return out


def train_verifier(verifier: Verifier, examples: Sequence[VerifierExample],
                   config: VerifierConfig | None = None, *,
                   validation: Sequence[VerifierExample] = (),
                   on_log: Callable[[dict], None] | None = None) -> dict:
    """Train in place with the configured loss; returns ``{steps, losses, final_loss,
    pairs_per_batch, epochs, best_epoch, heldin_losses}``. Batches hold whole tasks (see
    :class:`VerifierConfig`). With ``config.patience``, passes stop once the held-in loss
    (:func:`heldin_loss` on ``validation``, or the pass's mean training loss without it)
    stops falling, and the weights of the pass where it was lowest are kept."""
    cfg = config or VerifierConfig()
    cfg.validate()
    if not examples:
        raise ValueError("train_verifier: no examples; collect rollouts first")
    loss_fn = VERIFIER_LOSSES.get(cfg.loss)
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    params = [p for p in verifier.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gid = {g: i for i, g in enumerate(sorted({e.group for e in examples}))}
    verifier.train()
    losses, pairs, step = [], [], 0
    heldin: list[float] = []
    best, best_epoch, best_state = math.inf, 0, None  # the lowest held-in loss
    ref, since = math.inf, 0  # the last fall of at least min_delta, and its pass
    for epoch in range(1, cfg.epochs + 1):
        first = len(losses)
        for idx in _batches(examples, cfg, rng):
            batch = [examples[i] for i in idx]
            enc = verifier.encode([e.text for e in batch])
            labels = torch.tensor([e.label for e in batch], device=verifier.device)  # [B]
            groups = torch.tensor([gid[e.group] for e in batch], device=verifier.device)  # [B]
            scores = verifier(enc["input_ids"], enc["attention_mask"])  # [B]
            loss = loss_fn(scores, labels, groups, reg=cfg.reg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            losses.append(loss.item())
            pairs.append(len(bt_pairs([e.label for e in batch], [e.group for e in batch])))
            step += 1
            if on_log:
                on_log({"verifier/step": step, "verifier/loss": losses[-1]})
        if not cfg.patience:
            continue
        heldin.append(heldin_loss(verifier, validation, cfg) if validation else
                      sum(losses[first:]) / max(1, len(losses) - first))
        if on_log:
            on_log({"verifier/epoch": epoch, "verifier/heldin_loss": heldin[-1]})
        if heldin[-1] < best:  # the lowest so far: keep its weights
            best, best_epoch = heldin[-1], epoch
            best_state = {k: v.detach().clone() for k, v in verifier.state_dict().items()}
        if heldin[-1] < ref * (1 - cfg.min_delta):  # a fall that counts
            ref, since = heldin[-1], epoch
        if epoch - since >= cfg.patience:
            break
    if best_state is not None:
        verifier.load_state_dict(best_state)
    verifier.eval()
    tail = losses[-10:] or [math.nan]
    return {"steps": step, "losses": losses, "final_loss": sum(tail) / len(tail),
            "pairs_per_batch": sum(pairs) / max(1, len(pairs)),
            "epochs": len(heldin) if cfg.patience else cfg.epochs,
            "best_epoch": best_epoch if cfg.patience else cfg.epochs, "heldin_losses": heldin}


@torch.no_grad()
def heldin_loss(verifier: Verifier, examples: Sequence[VerifierExample],
                config: VerifierConfig) -> float:
    """The configured loss on ``examples``, every task whole in one batch of its own, averaged
    over tasks (deterministic: no subsets, no shuffling; eval mode)."""
    loss_fn = VERIFIER_LOSSES.get(config.loss)
    scores = verifier.score_texts([e.text for e in examples])  # one batched pass, eval mode
    by: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        by.setdefault(e.group, []).append(i)
    out = [loss_fn(torch.tensor([scores[i] for i in idx]),
                   torch.tensor([examples[i].label for i in idx]),
                   torch.zeros(len(idx)), reg=config.reg).item() for _, idx in sorted(by.items())]
    return sum(out) / max(1, len(out))


def evaluate_verifier(verifier: Verifier, examples: Sequence[VerifierExample]) -> dict:
    """:func:`ranking_metrics` of the verifier's scores on held-out examples."""
    scores = verifier.score_texts([e.text for e in examples])
    return ranking_metrics(scores, [e.label for e in examples], [e.group for e in examples])
