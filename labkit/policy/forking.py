"""Counterfactual forking: what if the policy had written another token at step t?

The "counterfactual forking" reading of DiDPO (``docs/didpo.md`` and
``docs/forking.md``; it is *not* in the paper's released code): at a chosen step ``t`` of a factual completion
``y`` of prompt ``x``, a baseline policy ``b`` (the EMA copy) proposes an alternative token
``a != y_t``, the current policy ``pi`` continues from there, and the step's credit is

    dR_t = R(x, y) - R(x, y_<t a y'),    y' ~ pi(. | x, y_<t, a).

This module makes such forks cheaply, keeps their lineage, and builds the *edit-level*
counterfactuals (revert one hunk of a candidate's diff, re-run the tests) that serve as
the ground truth credit estimators are compared against. Estimators themselves live in
:mod:`labkit.credit`.

Cost. A fork shares ``x y_<t`` with its parent, whose keys and values already exist: from
sampling (:func:`labkit.policy.rollout.sample_with_cache`) or from one batched forward over
the factual sequences (:func:`factual_cache`). So a fork's prefill is one position (``y_{t-1}``
again, for ``pi``'s logits at ``t``) instead of ``|x| + t``, and all forks of a batch decode
together, from a cache cut out of the parents' rows: with the lean engine (the default) each
distinct prompt's keys and values once, read in place by all its forks, plus each fork's own
completion columns; with ``engine="generate"`` one ``generate`` call on the prefixes
left-padded to a common width (:func:`gather_prefix`) in a static cache (allocated once per
batch, so a decode step writes one column instead of concatenating the cache anew).
:func:`continue_forks` with ``kv=None`` re-encodes every prefix instead: the naive reference
that tests and ``labkit.bench.fork`` compare against. ``docs/forking.md`` has the numbers.

Pieces, top to bottom: where to fork (a registry of position strategies), what to put
there (:func:`propose_alternatives`), the batched continuation (:func:`continue_forks`),
all three at once (:func:`fork`), then diff hunks and :func:`hunk_effects`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from labkit.env.edits import (Hunk, hunk_char_span, revert_hunks, rollout_hunks,  # noqa: F401
                               split_hunks)
from labkit.registry import Registry
from labkit.policy import lean
from labkit.policy.rollout import (KVRow, Rollout, SamplingConfig, check_sampler, collate, draw, make_rollout, nucleus,
                                   sequence_logprobs, stop_token_ids, strip_completion)
from labkit.seeding import derive_seed


@dataclass
class ForkConfig:
    """How forks are proposed and continued."""

    temperature: float = 0.7
    """T of both the baseline's proposal ``softmax(z_b / T)`` and the continuation. Must be
    the parents' sampling temperature: a fork's log-probs on the shared prefix are the
    parent's, and all of a rollout's log-probs refer to one ``log softmax(z / T)``."""
    top_p: float = 1.0
    """Nucleus of the proposal and of the continuation."""
    greedy: bool = False
    """Argmax instead of sampling, for the alternative (``argmax_{a != y_t} z_b``) and the
    continuation: reproducible forks for tests and benchmarks."""
    max_new_tokens: int = 256
    """Completion budget shared with the parent: ``t + 1 + len(continuation) <= this``, so a
    fork is never longer than its parent could have been."""
    stop_strings: tuple[str, ...] = ("\n###",)
    """Stop strings besides EOS, as in :class:`~labkit.policy.rollout.SamplingConfig`."""
    batch_size: int = 64
    """Forks per ``generate`` call, and parents per baseline or cache-building forward."""
    seed: int = 0
    """Seeds the baseline's choice of alternatives and the continuations' sampling.
    :meth:`from_sampling` copies the parents' seed unless overridden."""
    engine: Literal["lean", "generate"] = "lean"
    """How the continuations decode: ``lean``, labkit's loop over
    :class:`~labkit.policy.lean.LeanStep` (one token per row per step from the model's own
    modules; Llama-family models, others fall back to ``generate``); ``generate``,
    transformers' ``model.generate`` on a static cache. The same distribution, the same
    tokens under ``greedy`` (tested); ``lean`` skips generate's per-token processors,
    stopping criteria and cache bookkeeping, and with a kept cache stores each prompt once
    for all the forks of it (:func:`continue_forks`)."""

    sampler: Literal["race", "inverse_cdf"] = "race"
    """How the lean continuation draws a token (:attr:`SamplingConfig.sampler`)."""

    @classmethod
    def from_sampling(cls, sampling: SamplingConfig, **overrides) -> ForkConfig:
        """The fork settings matching how the parents were sampled (``engine``: the
        parents' ``generate`` stays ``generate``, ``lean`` and ``loop`` decode ``lean``)."""
        shared = ("temperature", "top_p", "max_new_tokens", "stop_strings", "batch_size", "seed",
                  "sampler")
        engine = "generate" if sampling.engine == "generate" else "lean"
        return cls(**{name: getattr(sampling, name) for name in shared} | {"engine": engine}
                   | overrides)

    def validate(self) -> None:
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be > 0 and top_p in (0, 1] (greedy=True for argmax)")
        if self.engine not in ("lean", "generate"):
            raise ValueError(f"engine must be 'lean' or 'generate', got {self.engine!r}")
        check_sampler(self.sampler, self.engine)
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")


# ============================================================================= positions


class PositionStrategy(str, enum.Enum):
    UNIFORM = "uniform"
    DIFF = "diff"
    ENTROPY = "entropy"


@dataclass(frozen=True)
class PositionInputs:
    """What a position strategy may look at besides the rollout itself."""

    buggy_code: str | None = None
    """The program the completion repairs (``diff``)."""
    entropy: Sequence[float] | None = None
    """The current policy's entropy at each completion token (``entropy``)."""


PositionFn = Callable[[Rollout, int, random.Random, PositionInputs], list[int]]
POSITION_STRATEGIES: Registry[PositionFn] = Registry("position strategy")


def register_positions(name: str | PositionStrategy) -> Callable[[PositionFn], PositionFn]:
    """Register ``fn(rollout, k, rng, inputs) -> sorted distinct positions (at most k)``."""
    return POSITION_STRATEGIES.register(name.value if isinstance(name, PositionStrategy) else name)


@register_positions(PositionStrategy.UNIFORM)
def uniform_positions(rollout: Rollout, k: int, rng: random.Random,
                      inputs: PositionInputs) -> list[int]:
    """``k`` of the ``n`` completion steps, uniformly without replacement (the default: an
    unbiased sub-sample of the steps, so ``E[sum_sampled dR_t] = (k / n) sum_t dR_t``)."""
    return sorted(rng.sample(range(rollout.n_tokens), min(k, rollout.n_tokens)))


@register_positions(PositionStrategy.DIFF)
def diff_positions(rollout: Rollout, k: int, rng: random.Random,
                   inputs: PositionInputs) -> list[int]:
    """``k`` steps drawn uniformly from the tokens inside the completion's edit, i.e. the
    lines of its code that differ from the buggy code (:func:`changed_tokens`); none for a
    completion that copies the buggy code."""
    if inputs.buggy_code is None:
        raise ValueError("the 'diff' position strategy needs the buggy code of each task")
    candidates = changed_tokens(rollout, inputs.buggy_code)
    return sorted(rng.sample(candidates, min(k, len(candidates))))


@register_positions(PositionStrategy.ENTROPY)
def entropy_positions(rollout: Rollout, k: int, rng: random.Random,
                      inputs: PositionInputs) -> list[int]:
    """The ``k`` steps where the current policy was least sure, ``H_t = -sum_v p_t(v) log
    p_t(v)`` largest (ties: the earlier step). Deterministic; ``rng`` is unused."""
    if inputs.entropy is None or len(inputs.entropy) < rollout.n_tokens:
        raise ValueError("the 'entropy' position strategy needs one entropy per completion "
                         "token (token_entropy)")
    order = sorted(range(rollout.n_tokens), key=lambda i: (-inputs.entropy[i], i))
    return sorted(order[:k])


@dataclass
class PositionConfig:
    """Which steps of each rollout to fork."""

    strategy: str = PositionStrategy.UNIFORM.value
    """A key of :data:`POSITION_STRATEGIES`."""
    fraction: float = 0.2
    """Forks per completion step: ``k = ceil(fraction * n)`` (the reading's ~20% sub-sampling)."""
    budget: int = 32
    """At most this many forks per rollout (``k = min(k, budget)``): bounds the cost of long
    completions, at the price of sampling them more sparsely."""
    seed: int = 0
    """Seeds the position draws: each rollout ``(task_id, sample)`` draws from its own stream
    of it, so positions do not depend on batch order (``entropy`` ignores it)."""


def fork_count(n_tokens: int, fraction: float, budget: int) -> int:
    """``k = min(budget, ceil(fraction * n))``, 0 for an empty completion."""
    return min(budget, math.ceil(fraction * n_tokens)) if n_tokens else 0


def choose_positions(rollouts: Sequence[Rollout], config: PositionConfig | None = None, *,
                     buggy_code: Mapping[str, str] | None = None,
                     entropy: Sequence[Sequence[float]] | None = None) -> list[list[int]]:
    """Fork positions for each rollout (sorted, distinct, in ``[0, n_tokens)``).

    ``buggy_code`` maps task ids to the buggy program (strategy ``diff``); ``entropy[i]`` is
    rollout ``i``'s per-token entropy (strategy ``entropy``, see :func:`token_entropy`).
    Deterministic: rollout ``(task_id, sample)`` draws from its own stream of ``config.seed``.
    """
    cfg = config or PositionConfig()
    if cfg.strategy not in POSITION_STRATEGIES:
        raise ValueError(f"unknown position strategy {cfg.strategy!r}; "
                         f"registered: {sorted(POSITION_STRATEGIES)}")
    fn = POSITION_STRATEGIES[cfg.strategy]
    out = []
    for i, r in enumerate(rollouts):
        rng = random.Random(derive_seed(cfg.seed, "fork-positions", r.task_id, r.sample))
        inputs = PositionInputs(buggy_code=buggy_code.get(r.task_id) if buggy_code else None,
                                entropy=entropy[i] if entropy is not None else None)
        out.append(fn(r, fork_count(r.n_tokens, cfg.fraction, cfg.budget), rng, inputs))
    return out


@torch.no_grad()
def token_entropy(model, rollouts: Sequence[Rollout], pad_id: int, temperature: float = 1.0,
                  batch_size: int = 64) -> list[list[float]]:
    """``H_t = -sum_v p(v) log p(v)``, ``p = softmax(z_t / T)``, at every completion token of
    every rollout: teacher-forced forwards of ``batch_size`` rollouts (``[b, T, V]`` logits)."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for c0 in range(0, len(rollouts), batch_size):
        chunk = rollouts[c0:c0 + batch_size]
        _, ent = sequence_logprobs(model, collate(chunk, pad_id, device), temperature,
                                   with_entropy=True)  # [b, T]
        out += [ent[b, :r.n_tokens].tolist() for b, r in enumerate(chunk)]
    return out


# ============================================================================= alternatives


@dataclass(frozen=True)
class Proposal:
    """The baseline's alternative token for step ``t`` of ``rollouts[parent]``."""

    parent: int
    t: int
    factual: int
    alt: int
    """Differs from ``factual`` unless the baseline gives every other token probability 0."""
    logp_alt: float
    """``log b(alt | x, y_<t)`` at the proposal temperature (before top-p and exclusion)."""
    logp_factual: float
    """``log b(y_t | x, y_<t)``, same distribution."""


top_p_mask = nucleus  # the same nucleus rule as sampling (labkit.policy.rollout)


def alternative_probs(logits: torch.Tensor, factual: torch.Tensor, temperature: float,
                      top_p: float = 1.0, banned: Sequence[int] = ()) -> torch.Tensor:
    """The proposal ``q(a) = p(a) [a != y, a not banned] / Z`` over the nucleus of
    ``p = softmax(z / T)``, i.e. the baseline's distribution conditioned on differing from
    the factual token ``y``.

    Rows whose nucleus holds nothing but ``y`` (and banned tokens) fall back to all of ``p``;
    rows where even that has no mass keep ``q = onehot(y)``. ``logits [N, V]``,
    ``factual [N]`` -> ``[N, V]`` rows summing to 1.
    """
    p = torch.softmax(logits.float() / temperature, dim=-1)  # [N, V]
    allowed = torch.ones_like(p, dtype=torch.bool)
    allowed[:, list(banned)] = False
    allowed.scatter_(-1, factual[:, None], False)
    q = p * (allowed & top_p_mask(p, top_p))  # [N, V]
    empty = q.sum(-1) <= 0  # [N]
    q[empty] = p[empty] * allowed[empty]
    stuck = q.sum(-1) <= 0  # [N]
    q[stuck] = F.one_hot(factual[stuck], p.shape[-1]).to(q.dtype)
    return q / q.sum(-1, keepdim=True)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int,
             device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-aligned sequences: ``ids``, ``attention_mask`` and ``position_ids``
    (``cumsum(mask) - 1``, as ``generate`` computes them), each ``[B, max_len]``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        if s:
            ids[b, width - len(s):] = torch.tensor(list(s))
            mask[b, width - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, W]
    return ids.to(device), mask.to(device), pos.to(device)


def _sites(positions: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(parent, t) pairs, parent-major, t ascending."""
    return [(i, t) for i, ts in enumerate(positions) for t in sorted(set(ts))]


def _prefix_needs(rollouts: Sequence[Rollout], sites: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Per parent, ``|x| + max t``: the longest prefix ``x y_<t`` any of its forks shares."""
    need: dict[int, int] = {}
    for i, t in sites:
        need[i] = max(need.get(i, 0), len(rollouts[i].prompt_ids) + t)
    return need


def cache_lengths(rollouts: Sequence[Rollout], proposals: Sequence[Proposal]) -> dict[int, int]:
    """Per parent, how many of its tokens the forks' caches need: ``|x| + max t - 1`` (its
    longest forked prefix ``x y_<t`` but the last token, which each fork feeds again)."""
    need = _prefix_needs(rollouts, [(p.parent, p.t) for p in proposals])
    return {i: n - 1 for i, n in need.items()}


@torch.no_grad()
def propose_alternatives(baseline, rollouts: Sequence[Rollout],
                         positions: Sequence[Sequence[int]], config: ForkConfig,
                         pad_id: int) -> list[Proposal]:
    """``a ~ q`` of :func:`alternative_probs` with ``z = z_b(. | x, y_<t)`` at every site
    (``argmax q`` when ``config.greedy``); ``pad_id`` is never proposed.

    The baseline encodes each parent once, up to its last fork (``x y_<max t``), in batches
    of ``config.batch_size`` parents; only the rows at fork sites reach the LM head.
    """
    sites = _sites(positions)
    if not sites:
        return []
    for i, t in sites:
        if not 0 <= t < rollouts[i].n_tokens:
            raise ValueError(f"fork position {t} is outside rollout {i}'s "
                             f"{rollouts[i].n_tokens} completion tokens")
    device = next(baseline.parameters()).device
    need = _prefix_needs(rollouts, sites)
    parents = sorted(need)
    gen = torch.Generator(device=device).manual_seed(derive_seed(config.seed, "fork-alternatives"))
    was_training = baseline.training
    baseline.eval()
    out: list[Proposal] = []
    for c0 in range(0, len(parents), config.batch_size):
        chunk = parents[c0:c0 + config.batch_size]
        row_of = {p: b for b, p in enumerate(chunk)}
        seqs = [(rollouts[p].prompt_ids + rollouts[p].completion_ids)[:need[p]] for p in chunk]
        ids, mask, pos = left_pad(seqs, pad_id, device)  # [b, S]
        width = ids.shape[1]
        chunk_sites = [(i, t) for i, t in sites if i in row_of]
        # the logits predicting y_t sit at the column of x y_<t's last token
        keep = torch.zeros((len(chunk), width), dtype=torch.bool)  # [b, S]
        keep[[row_of[i] for i, _ in chunk_sites],
             [width - need[i] + len(rollouts[i].prompt_ids) + t - 1 for i, t in chunk_sites]] = True
        logits = baseline(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                          logits_to_keep=keep.to(device)).logits.float()  # [n, V], row-major
        factual = torch.tensor([rollouts[i].completion_ids[t] for i, t in chunk_sites],
                               device=device)  # [n]
        q = alternative_probs(logits, factual, config.temperature, config.top_p,
                              banned=[pad_id])  # [n, V]
        alt = q.argmax(-1) if config.greedy else torch.multinomial(q, 1, generator=gen)[:, 0]
        logp = torch.log_softmax(logits / config.temperature, dim=-1)  # [n, V]
        lp_alt = logp.gather(-1, alt[:, None])[:, 0].tolist()
        lp_fac = logp.gather(-1, factual[:, None])[:, 0].tolist()
        out += [Proposal(parent=i, t=t, factual=int(y), alt=int(a), logp_alt=la, logp_factual=lf)
                for (i, t), y, a, la, lf in zip(chunk_sites, factual.tolist(), alt.tolist(),
                                                lp_alt, lp_fac)]
    baseline.train(was_training)
    return out


# ============================================================================= prefix caches


def _full_attention_layers(cache) -> list:
    from transformers.cache_utils import DynamicLayer

    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise ValueError(f"prefix reuse needs full-attention DynamicLayer caches, got {kinds}: "
                         "a sliding-window or recurrent layer cannot be cut at any prefix")
    return cache.layers


def gather_prefix(rows: Sequence[KVRow], lengths: Sequence[int], starts: Sequence[int] | None = None
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the keys and values of ``lengths[j]`` tokens of ``rows[j]`` from its token
    ``starts[j]`` (default 0: the first ones), right-aligned in one batch
    (``[F, H_kv, W, D]``, ``W = max L``):

        out[j, :, W - L_j + c] = src_j[row_j, :, offset_j + start_j + c],   0 <= c < L_j,

    zeros left of ``W - L_j`` (padding, hidden by the attention mask). A copy: the parents'
    caches are left as they are. One slice copy per fork and layer (faster on CPU than one
    advanced-indexing gather, which materialises an index per element).
    """
    width = max(lengths)
    starts = [0] * len(rows) if starts is None else starts
    sources = [_full_attention_layers(r.cache) for r in rows]
    for r, n, a, layers in zip(rows, lengths, starts, sources):
        if r.offset < 0 or a < 0 or r.offset + a + n > layers[0].keys.shape[2]:
            raise ValueError(f"row {r.row} of a {layers[0].keys.shape[2]}-column cache holds no "
                             f"{n} tokens from column {r.offset + a}")
    out = []
    for i, layer in enumerate(sources[0]):
        k_out = layer.keys.new_zeros((len(rows), layer.keys.shape[1], width, layer.keys.shape[-1]))
        v_out = layer.values.new_zeros((len(rows), layer.values.shape[1], width,
                                        layer.values.shape[-1]))  # [F, H_kv, W, D]
        for j, (r, n, a) in enumerate(zip(rows, lengths, starts)):
            if n:
                c = r.offset + a
                k_out[j, :, width - n:] = sources[j][i].keys[r.row, :, c:c + n]
                v_out[j, :, width - n:] = sources[j][i].values[r.row, :, c:c + n]
        out.append((k_out, v_out))
    return out


@torch.no_grad()
def factual_cache(model, rollouts: Sequence[Rollout], lengths: Mapping[int, int], pad_id: int,
                  batch_size: int = 64) -> tuple[dict[int, KVRow], int]:
    """Keys and values of ``(prompt_ids + completion_ids)[:lengths[i]]`` for each rollout
    ``i`` in ``lengths``, by one batched forward per ``batch_size`` rollouts (the path for
    rollouts sampled without :func:`~labkit.policy.rollout.sample_with_cache`).

    Returns ``{i: KVRow}`` and the number of positions encoded, ``sum_i lengths[i]``.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    parents = sorted(i for i, n in lengths.items() if n > 0)
    out: dict[int, KVRow] = {}
    for c0 in range(0, len(parents), batch_size):
        chunk = parents[c0:c0 + batch_size]
        seqs = [(rollouts[i].prompt_ids + rollouts[i].completion_ids)[:lengths[i]] for i in chunk]
        ids, mask, pos = left_pad(seqs, pad_id, device)  # [b, S]
        cache = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                      logits_to_keep=1).cache
        out |= {i: KVRow(cache=cache, row=b, offset=ids.shape[1] - len(s))
                for b, (i, s) in enumerate(zip(chunk, seqs))}
    model.train(was_training)
    return out, sum(lengths[i] for i in parents)


# ============================================================================= continuation


@dataclass
class Fork:
    """One counterfactual completion and its lineage."""

    task_id: str
    parent_sample: int
    """The parent is the rollout ``(task_id, parent_sample)``."""
    t: int
    """The forked step: ``rollout.completion_ids[:t]`` is the parent's."""
    factual_token: int
    alt_token: int
    logp_alt_baseline: float
    """``log b(alt | x, y_<t)`` (see :class:`Proposal`)."""
    logp_factual_baseline: float
    rollout: Rollout
    """``y_<t a y'``, a full record (ids, log-probs under ``pi``, text, code, offsets) ready
    for the sandbox; its ``logprobs[t]`` is ``log pi(a | x, y_<t)``."""

    @property
    def differs(self) -> bool:
        return self.alt_token != self.factual_token

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rollout"}
        return d | {"rollout": self.rollout.to_dict()}


@dataclass
class ForkStats:
    """What a batch of forks cost. Positions are real tokens (padding not counted)."""

    forks: int = 0
    prefix_positions: int = 0
    """``sum_j |x_j| + t_j``: the shared prefixes, what naive regeneration re-encodes."""
    recomputed_positions: int = 0
    """Prefix positions the current policy encoded again: with reuse, one per fork (``y_{t-1}``,
    for ``pi``'s logits at ``t``) plus a :func:`factual_cache` forward if one was needed;
    naive: all of ``prefix_positions``."""
    baseline_positions: int = 0
    """Positions the baseline encoded to propose the alternatives (the same either way)."""
    generated_tokens: int = 0
    """Continuation tokens kept (after the alternative)."""
    proposal_s: float = 0.0
    cache_s: float = 0.0
    """The :func:`factual_cache` forward (0 when the cache came from sampling)."""
    prefill_s: float = 0.0
    """Cache assembly and the one-position forward, or the naive re-encoding."""
    decode_s: float = 0.0
    """``generate`` and the records."""

    @property
    def recomputed_fraction(self) -> float:
        return self.recomputed_positions / max(self.prefix_positions, 1)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"recomputed_fraction": self.recomputed_fraction}


@dataclass
class ForkBatch:
    """The forks of one call and what they cost."""

    forks: list[Fork] = field(default_factory=list)
    """In proposal order: parent by parent, ``t`` ascending."""
    stats: ForkStats = field(default_factory=ForkStats)


class _RowBudget:
    """Stopping criterion: row ``j`` is done after ``budget[j]`` tokens beyond ``start``."""

    def __init__(self, start: int, budget: torch.Tensor):
        self.start, self.budget = start, budget  # budget: [F]

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return (input_ids.shape[1] - self.start) >= self.budget  # [F]


def _shared_prompt_step(model, parents: Sequence[Rollout], props: Sequence[Proposal],
                        rows: Sequence[KVRow], capacity: int) -> lean.LeanStep:
    """A :class:`~labkit.policy.lean.LeanStep` over the forks' kept caches: the shared part
    is each distinct prompt but its last token (``|x| - 1`` columns, once per prompt, from
    one of its parents), a fork's own part its ``t`` tokens ``x_{-1} y_<t-1`` (so that
    feeding ``y_{t-1}`` next gives ``pi``'s logits at ``t``); both right-aligned."""
    first: dict[tuple, int] = {}
    shared_rows, shared_len, which = [], [], []
    for row, parent in zip(rows, parents):
        key = tuple(parent.prompt_ids)
        if key not in first:
            first[key] = len(shared_rows)
            shared_rows.append(row)
            shared_len.append(len(parent.prompt_ids) - 1)
        which.append(first[key])
    dev = rows[0].cache.layers[0].keys.device
    shared = gather_prefix(shared_rows, shared_len)
    own_len = [p.t for p in props]
    own = gather_prefix(rows, own_len, starts=[len(r.prompt_ids) - 1 for r in parents])
    from transformers import DynamicCache

    cache = DynamicCache(config=lean.causal_lm(model).config)
    for i, (k, v) in enumerate(shared):
        cache.update(k, v, i)
    return lean.LeanStep(model, cache, _right_aligned(shared_len, dev), capacity,
                         rows=torch.tensor(which, device=dev), suffix=own,
                         suffix_mask=_right_aligned(own_len, dev))


def _right_aligned(lengths: Sequence[int], device) -> torch.Tensor:
    """``[n, max L]`` mask of right-aligned rows of ``lengths`` (1 = a token, 0 = padding)."""
    width = max(lengths)
    cols = torch.arange(width, device=device)[None]
    return (cols >= width - torch.tensor(lengths, device=device)[:, None]).long()


def _lean_continue(step: lean.LeanStep, pos: torch.Tensor, alt: torch.Tensor,
                   budget: Sequence[int], config: ForkConfig, eos_ids: set[int], pad_id: int,
                   tok, pieces: dict[int, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``continue_forks``' decode on a :class:`~labkit.policy.lean.LeanStep`: feed ``a`` at
    ``pos`` ``[F, 1]``, then draw ``y'_s ~ pi(. | x, y_<t, a, y'_<s)`` (argmax under
    ``config.greedy``) until row ``j`` has ``budget[j]`` tokens, an EOS or a stop string;
    finished rows receive ``pad_id`` (as ``generate`` pads them). Returns ``(tokens [F, T'],
    log softmax(z / T) of each [F, T'])``."""
    n = max(budget)
    eos = torch.tensor(sorted(eos_ids), device=alt.device)
    left = torch.tensor(budget, device=alt.device)  # [F] tokens each row may still write
    alive = (left > 0) & ~torch.isin(alt, eos)
    stops = tuple(config.stop_strings)

    def piece(y: int) -> str:
        if y not in pieces:
            pieces[y] = tok.decode([y], skip_special_tokens=False)
        return pieces[y]

    texts = [piece(int(a)) for a in alt.tolist()] if stops else []
    logits = step(alt, pos)
    toks, lps = [], []
    for s in range(n):
        y, logp = draw(logits, config.temperature, config.top_p, greedy=config.greedy,
                       sampler=config.sampler)
        y = torch.where(alive, y, torch.full_like(y, pad_id))
        toks.append(y)
        lps.append(logp.gather(-1, y[:, None])[:, 0])
        alive = alive & ~torch.isin(y, eos) & (left > s + 1)
        if stops:
            for i in alive.nonzero().flatten().tolist():
                text = piece(int(y[i]))
                texts[i] += text
                if any(st in texts[i][-(len(st) + len(text)):] for st in stops):
                    alive[i] = False
        if not alive.any():
            break
        pos = pos + 1
        logits = step(y, pos)
    return torch.stack(toks, 1).cpu(), torch.stack(lps, 1).cpu()


@torch.no_grad()
def continue_forks(policy, rollouts: Sequence[Rollout], proposals: Sequence[Proposal],
                   config: ForkConfig, *, kv: Mapping[int, KVRow] | Sequence[KVRow] | None
                   ) -> ForkBatch:
    """The current policy's continuations ``y' ~ pi(. | x, y_<t, a)`` of every proposal.

    Forks are sorted by ``t`` (then by prefix length ``L = |x| + t``), so that the rows of a
    batch have similar budgets and few decode steps are spent on finished rows, and decoded
    ``config.batch_size`` at a time in one ``generate`` call each, from a cache holding
    ``x y_<t`` right-aligned:

    * ``kv`` given (``kv[parent]`` locates the parent's keys and values): the cache is cut out
      of the parents' rows (:func:`gather_prefix`, ``L - 1`` columns) and one forward
      of the ``[F, 1]`` tokens ``y_{t-1}`` completes it and yields ``pi``'s logits at ``t``;
    * ``kv=None``: every prefix is re-encoded by one ``[F, W]`` forward (the naive reference).

    With ``config.engine == "lean"`` and ``kv`` given, the prompt part of the cache is not
    copied to every fork: each distinct prompt's keys and values are kept once and read once
    per decode step for all its forks (:class:`~labkit.policy.lean.LeanStep` ``rows``), a fork's
    own columns are only its ``t`` completion tokens, and ``y_{t-1}`` goes through the lean
    step too. Forks of a batch share few prompts (8 tasks x 2 parents in the bench), so the
    per-step memory traffic of attention drops by about that factor.

    ``generate`` then feeds only ``a``. Each fork may write ``config.max_new_tokens - t - 1``
    tokens; under ``config.greedy`` both ways give the same tokens.
    """
    from transformers import DynamicCache, StaticCache, StoppingCriteriaList

    config.validate()
    if any(abs(rollouts[p.parent].temperature - config.temperature) > 1e-9 for p in proposals):
        raise ValueError("forks continue at the temperature their parents were sampled at "
                         "(ForkConfig.from_sampling); the shared prefix keeps the parent's log-probs")
    model, tok = policy.model, policy.tokenizer
    pad_id = tok.pad_token_id
    eos_ids = stop_token_ids(model, tok)
    was_training = model.training
    model.eval()
    torch.manual_seed(config.seed)
    stats = ForkStats(forks=len(proposals))
    prefix_len = [len(rollouts[p.parent].prompt_ids) + p.t for p in proposals]
    order = sorted(range(len(proposals)), key=lambda j: (proposals[j].t, prefix_len[j], j))
    forks: list[Fork | None] = [None] * len(proposals)
    pieces: dict[int, str] = {}  # token id -> its text, for the lean loop's stop strings
    for c0 in range(0, len(order), config.batch_size):
        chunk = order[c0:c0 + config.batch_size]
        props = [proposals[j] for j in chunk]
        parents = [rollouts[p.parent] for p in props]
        lengths = [prefix_len[j] for j in chunk]
        prefixes = [(r.prompt_ids + r.completion_ids)[:n] for r, n in zip(parents, lengths)]
        ids, mask, pos = left_pad(prefixes, pad_id, policy.device)  # [F, W]
        width = ids.shape[1]
        budget = [max(config.max_new_tokens - p.t - 1, 0) for p in props]
        stats.prefix_positions += sum(lengths)

        # ---- prefill: a cache of x y_<t and pi's logits at t. For ``generate`` the cache is
        # static (its columns allocated for the whole decode), so decoding writes one column a
        # step instead of concatenating the whole cache anew; the lean step copies a dynamic
        # one into its own buffer of the same kind.
        t0 = time.perf_counter()
        use_lean = (config.engine == "lean"
                    and lean.supports(model, width + max(budget) + 1) is None)
        step = None
        if use_lean and kv is not None:
            # the forks of one prompt share its keys and values (read once per decode step);
            # each fork's own columns are its tokens between the prompt and y_{t-1}
            step = _shared_prompt_step(model, parents, props, [kv[p.parent] for p in props],
                                       capacity=max(budget) + 1)
            z_logits = step(ids[:, -1], pos[:, -1:])  # y_{t-1} -> pi's logits at t
            stats.recomputed_positions += len(chunk)
        else:
            cache = (DynamicCache(config=model.config) if use_lean else
                     StaticCache(config=model.config, max_cache_len=width + max(budget) + 1))
            if kv is not None:
                prefix = gather_prefix([kv[p.parent] for p in props], [n - 1 for n in lengths])
                for layer, (k, v) in zip(cache.layers, prefix):
                    layer.update(k, v)
                out = model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=pos[:, -1:],
                            cache=cache, use_cache=True, logits_to_keep=1)
                stats.recomputed_positions += len(chunk)
            else:
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                            use_cache=True, logits_to_keep=1)
                stats.recomputed_positions += sum(lengths)
            z_logits = out.logits[:, -1]
            if use_lean:
                step = lean.LeanStep(model, cache, mask, capacity=max(budget) + 1)
        logp_t = torch.log_softmax(z_logits.float() / config.temperature, dim=-1)  # [F, V]
        stats.prefill_s += time.perf_counter() - t0

        # ---- decode: a, then the continuation
        t0 = time.perf_counter()
        alt = torch.tensor([p.alt for p in props], device=policy.device)  # [F]
        new = torch.empty((len(chunk), 0), dtype=torch.long)  # [F, T']
        new_logp = torch.empty((len(chunk), 0))  # [F, T']
        if max(budget) > 0 and step is not None:
            new, new_logp = _lean_continue(step, pos[:, -1:] + 1, alt, budget, config, eos_ids,
                                           pad_id, tok, pieces)
        elif max(budget) > 0:
            sampling = ({"do_sample": False} if config.greedy else
                        {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p})
            gen = model.generate(
                input_ids=torch.cat([ids, alt[:, None]], dim=1),  # [F, W + 1]
                attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1),
                cache=cache, max_new_tokens=max(budget), pad_token_id=pad_id,
                stopping_criteria=StoppingCriteriaList(
                    [_RowBudget(width + 1, torch.tensor(budget, device=policy.device))]),
                stop_strings=list(config.stop_strings) or None, tokenizer=tok,
                output_logits=True, return_dict_in_generate=True, disable_compile=True,
                **sampling)
            new = gen.sequences[:, width + 1:]  # [F, T']
            scores = torch.stack(gen.logits, dim=1).float() / config.temperature  # [F, T', V]
            new_logp = torch.log_softmax(scores, -1).gather(-1, new[..., None])[..., 0]  # [F, T']
            new, new_logp = new.cpu(), new_logp.cpu()
        lp_alt = logp_t.gather(-1, alt[:, None])[:, 0].tolist()
        for row, (j, p, parent) in enumerate(zip(chunk, props, parents)):
            kept = new[row, :budget[row]].tolist()
            ids_new, eos_seen = strip_completion([p.alt] + kept, pad_id, eos_ids)
            lps = [lp_alt[row]] + new_logp[row, :len(ids_new) - 1].tolist()
            stats.generated_tokens += len(ids_new) - 1
            forks[j] = Fork(
                task_id=parent.task_id, parent_sample=parent.sample, t=p.t,
                factual_token=p.factual, alt_token=p.alt, logp_alt_baseline=p.logp_alt,
                logp_factual_baseline=p.logp_factual,
                rollout=make_rollout(
                    tok, task_id=parent.task_id, sample=parent.sample, prompt=parent.prompt,
                    prompt_ids=parent.prompt_ids,
                    completion_ids=parent.completion_ids[:p.t] + ids_new,
                    logprobs=parent.logprobs[:p.t] + lps, eos_seen=eos_seen,
                    stop_strings=config.stop_strings, temperature=config.temperature,
                    meta={"fork_of": [parent.task_id, parent.sample], "fork_t": p.t}))
        stats.decode_s += time.perf_counter() - t0
    model.train(was_training)
    return ForkBatch(forks=forks, stats=stats)  # type: ignore[arg-type]


@torch.no_grad()
def fork(policy, rollouts: Sequence[Rollout], positions: Sequence[Sequence[int]],
         config: ForkConfig | None = None, *, kv: Sequence[KVRow] | None = None,
         baseline=None) -> ForkBatch:
    """Fork ``rollouts[i]`` at every ``t`` in ``positions[i]``.

    ``baseline`` proposes the alternatives (default ``policy.baseline()``, the EMA copy; any
    causal LM sharing the tokenizer works). ``kv`` are the rows of
    :func:`~labkit.policy.rollout.sample_with_cache`, aligned with ``rollouts``; without them
    one batched :func:`factual_cache` forward per ``config.batch_size`` parents encodes each
    parent up to its last fork (counted in ``stats.recomputed_positions``).
    """
    cfg = config or ForkConfig()
    cfg.validate()
    pad_id = policy.tokenizer.pad_token_id
    baseline = policy.baseline() if baseline is None else baseline
    t0 = time.perf_counter()
    proposals = propose_alternatives(baseline, rollouts, positions, cfg, pad_id)
    proposal_s = time.perf_counter() - t0
    lengths = cache_lengths(rollouts, proposals)
    cache_positions, cache_s = 0, 0.0
    if kv is None:
        t0 = time.perf_counter()
        kv, cache_positions = factual_cache(policy.model, rollouts, lengths, pad_id, cfg.batch_size)
        cache_s = time.perf_counter() - t0
    batch = continue_forks(policy, rollouts, proposals, cfg, kv=kv)
    batch.stats = dataclasses.replace(
        batch.stats, proposal_s=proposal_s, cache_s=cache_s,
        baseline_positions=sum(n + 1 for n in lengths.values()),
        recomputed_positions=batch.stats.recomputed_positions + cache_positions)
    return batch


# ============================================================================= a trainer's forks


@dataclass
class ForkCreditConfig:
    """How a trainer makes the forks of ``didpo_fork`` (``TrainConfig.fork``; TRL's
    ``ForkCreditTrainer``).

    Cost per step: ``sum_i min(budget, ceil(fraction * n_i))`` forks, each one baseline
    forward row, one re-encoded position and up to ``max_new_tokens - t - 1`` generated
    tokens, then one sandbox run; the trainer logs it as ``fork/*`` and ``time/fork``.
    """

    strategy: str = "uniform"
    """Where to fork: ``uniform``, ``diff`` (tokens inside the edit) or ``entropy`` (the
    policy's least sure steps), :data:`POSITION_STRATEGIES`."""
    fraction: float = 0.2
    """Forks per completion token (the reading's ~20% step sub-sampling)."""
    budget: int = 8
    """At most this many forks per rollout: bounds the cost of long completions."""
    baseline: Literal["ema", "frozen"] = "ema"
    """Who proposes the alternative token: ``ema``, ``theta_b <- beta theta_b + (1 - beta)
    theta`` after every step, or ``frozen``, the starting policy. Both are saved in the
    checkpoint (``baseline.pt``)."""
    beta: float = 0.99
    """EMA decay of the ``ema`` baseline (closer to 1: slower to follow the policy)."""
    kl_to_baseline: bool = False
    """Point the KL term (``loss.kl_coef``, ``loss.kl_estimator``) at the baseline instead of
    the reference policy: ``beta_KL * KL(pi || pi_b)``, as in the reading."""
    batch_size: int = 64
    """Forks per ``generate`` call."""

    def validate(self) -> None:
        if self.strategy not in POSITION_STRATEGIES:
            raise ValueError(f"fork.strategy {self.strategy!r} is not a position strategy; "
                             f"registered: {sorted(POSITION_STRATEGIES)}")
        if not 0 < self.fraction <= 1 or self.budget < 1 or self.batch_size < 1:
            raise ValueError("fork.fraction must be in (0, 1], fork.budget and "
                             "fork.batch_size >= 1")
        if not 0 <= self.beta < 1:
            raise ValueError("fork.beta must be in [0, 1)")
        if self.baseline not in ("ema", "frozen"):
            raise ValueError(f"fork.baseline must be 'ema' or 'frozen', not {self.baseline!r}")


@dataclass
class ScoredForks:
    """Forks of one batch, made and scored (:func:`fork_and_score`)."""

    batch: ForkBatch
    """The forks themselves (tokens, lineage, cost statistics)."""
    rows: list[int]
    """The parent row of every fork."""
    counterfactual: list[float]
    """``R(fork)`` of every fork, as the caller's ``score`` rewards it."""
    positions: list[list[int]]
    """The positions chosen in each rollout."""
    gen_s: float
    exec_s: float


def fork_and_score(policy, rollouts: Sequence[Rollout], tasks: Sequence, score,
                   positions: PositionConfig, config: ForkConfig, *, kv=None, baseline=None,
                   entropy: Sequence[Sequence[float]] | None = None) -> ScoredForks:
    """Fork ``rollouts`` (row ``b`` for task ``tasks[b]``) at positions chosen by ``positions``
    (:func:`choose_positions`; ``entropy`` computed with :func:`token_entropy` when the
    strategy needs it and none is given), continue each fork with the current policy
    (:func:`fork`) and score every fork's program with ``score(tasks, codes) -> rewards``."""
    t0 = time.time()
    if positions.strategy == "entropy" and entropy is None:
        entropy = token_entropy(policy.model, rollouts, policy.tokenizer.pad_token_id,
                                config.temperature)
    where = choose_positions(rollouts, positions,
                             buggy_code={t.task_id: t.buggy_code for t in tasks}, entropy=entropy)
    batch = fork(policy, rollouts, where, config, kv=kv,
                 baseline=policy.baseline() if baseline is None else baseline)
    gen_s = time.time() - t0
    t0 = time.time()
    parent = {(r.task_id, r.sample): b for b, r in enumerate(rollouts)}
    rows = [parent[(f.task_id, f.parent_sample)] for f in batch.forks]
    counter = [float(x) for x in score([tasks[b] for b in rows], [f.rollout.code for f in batch.forks])]
    return ScoredForks(batch, rows, counter, [list(p) for p in where], gen_s, time.time() - t0)


# ============================================================================= edits


def changed_tokens(rollout: Rollout, buggy_code: str) -> list[int]:
    """Completion tokens inside the edit: those overlapping a hunk of ``rollout.code``
    against ``buggy_code`` (a deleted run marks the token where it was)."""
    return sorted({t for h in rollout_hunks(rollout, buggy_code) for t in h.tokens})
