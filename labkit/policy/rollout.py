"""Batched sampling of repair attempts, and the training-forward log-prob path.

:func:`sample` draws G completions for each task in batched decoding (KV cache on;
labkit's :func:`decode` loop by default, ``model.generate`` with ``engine="generate"``) and
returns :class:`Rollout` records with everything later floors need: token ids, the sampling
log-probs ``log softmax(z / T)`` of the chosen tokens, the completion mask, the text, the
extracted program, and each token's character span in the completion so that code spans
(diff hunks, anchors) map onto tokens exactly.

:func:`sequence_logprobs` recomputes the same log-probs with one teacher-forced forward
pass (what the policy-gradient update differentiates); a test checks the two agree.

:func:`sample_with_cache` also hands back the key/value cache the decoding built, one
:class:`KVRow` per rollout, so that counterfactual forks (:mod:`labkit.policy.forking`)
continue from a factual prefix without encoding it again.
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F

from labkit.env.records import RepairTask, Rollout  # noqa: F401 (Rollout re-exported)
from labkit.policy import lean, tail
from labkit.policy.prompts import build_prompt, extract_code
from labkit.seeding import derive_seed


ENGINES = ("lean", "loop", "generate")
SAMPLERS = ("race", "inverse_cdf")
DROP_ENDED = 0.75
"""The lean decode drops the rows that have ended once at most this share of the rows it
still computes is alive (only when no cache is kept: :func:`sample`, not
:func:`sample_with_cache`)."""


@dataclass
class SamplingConfig:
    """How completions are sampled."""

    group_size: int = 8
    """G: completions per task (the GRPO group)."""
    temperature: float = 1.0
    """Sampling temperature: 1 samples the policy itself (what the importance ratio and the
    KL assume). Held-out evaluation samples at its own, lower temperature
    (``EvalConfig.temperature``, ``TrainConfig.eval_temperature``)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability."""
    max_new_tokens: int = 256
    """Longest completion; also Dr. GRPO's constant normaliser unless ``loss.horizon``."""
    batch_size: int = 64
    """Sequences decoded together (tasks x G are chunked to fit)."""
    stop_strings: tuple[str, ...] = ()
    """Extra stop strings besides EOS, e.g. ("\\n###",). Off by default: checking them in
    ``generate`` halves the sampling speed of a small model, and :func:`extract_code` cuts
    a completion at a new ``###`` section anyway."""
    seed: int = 0
    """``torch.manual_seed`` before sampling: the same seed, model and tasks give the same
    completions. The trainer replaces it every step with one derived from
    ``(TrainConfig.seed, step)``."""
    engine: Literal["lean", "loop", "generate"] = "lean"
    """``lean``: labkit's decode loop (:func:`decode`) with :class:`~labkit.policy.lean.LeanStep`
    computing each new token from the model's modules (Llama-family models; others fall
    back to ``loop``); ``loop``: the same loop calling ``model(...)`` per token;
    ``generate``: transformers' ``model.generate``. All three sample the same distribution."""
    sampler: Literal["race", "inverse_cdf"] = "race"
    """How labkit's decode draws a token from ``softmax(z / T)`` (:func:`draw`). ``race``: the
    exponential race, ``torch.multinomial``'s one-sample draw from the same random stream;
    it draws ``V`` exponentials per row and token: the whole draw took about 1.6 ms per token
    for 64 rows x 1,024 tokens on 2 CPU cores, a tenth of the tiny model's decode there.
    ``inverse_cdf``: one uniform per row against the cumulative probabilities, the same
    distribution (about 0.6 ms per token there), from another random stream, so a run's
    completions differ from a ``race`` run's of the same seed. ``race`` is the default:
    every recorded result was sampled with it."""
    parallel_chunks: int = 1
    """How many chunks of ``batch_size`` rows decode at once, each on its own thread with an
    equal share of torch's intra-op threads, never more threads than ``torch.get_num_threads()``
    (a CPU policy, engine ``lean`` or ``loop``, a model whose forward leaves its modules alone,
    see :func:`rewrites_itself`, no CPU autocast; otherwise the chunks run one after another
    from the same streams). A decode step of a few dozen rows is too small for two cores to
    share well: the experiments' two 64-row chunks, one per core, took a median 0.80-0.85x the
    time of decoding them one after the other on both, and 0.29x with one core busy elsewhere
    (docs/journal/benchmarks.md). ``1``: the chunks draw one after another from torch's global
    generator seeded with ``seed`` (the journal's earlier records). ``> 1``: chunk
    ``k`` draws from its own generator, seeded with :func:`chunk_seed`, so the completions do
    not depend on the number of threads or their timing (the same tokens serially or in
    parallel, at the same intra-op thread count); past the first chunk they differ from a
    ``1`` run's. The trainer's held-out evaluation decodes the same way."""

    def validate(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        check_sampler(self.sampler, self.engine)
        if (self.group_size < 1 or self.max_new_tokens < 1 or self.batch_size < 1
                or self.parallel_chunks < 1):
            raise ValueError("group_size, max_new_tokens, batch_size and parallel_chunks must be "
                             f">= 1, got {self.group_size}, {self.max_new_tokens}, "
                             f"{self.batch_size} and {self.parallel_chunks}")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (use a tiny value for near-greedy)")


def check_sampler(sampler: str, engine: str) -> None:
    """A clear error for a sampler labkit does not know, or one ``engine`` cannot use
    (:attr:`SamplingConfig.sampler`; forks check theirs the same way)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if sampler != "race" and engine == "generate":
        raise ValueError(f"sampler {sampler!r} needs labkit's own decode; engine 'generate' draws "
                         "with torch.multinomial: use sampler 'race' with it")


@dataclass(frozen=True)
class KVRow:
    """Where one sequence's keys and values live in a batch cache.

    Token ``j`` of ``prompt_ids + completion_ids`` (``j = 0`` is the first prompt token) sits
    at column ``offset + j`` of row ``row`` in every layer of ``cache`` (a transformers
    ``Cache`` whose layers hold ``keys``/``values`` of shape ``[B, H_kv, S, D]``); columns
    before ``offset`` are left padding. A cache from ``generate`` holds every token but the
    last sampled one.
    """

    cache: Any
    row: int
    offset: int


# ----------------------------------------------------------------------------- offsets


def token_offsets(tokenizer, ids: Sequence[int], text: str | None = None) -> list[tuple[int, int]]:
    """Character span of each token of ``ids`` in ``decode(ids)``.

    Uses the fast tokenizer's offset mapping when re-encoding the text gives back exactly
    ``ids`` (the usual case); otherwise falls back to decoding every prefix (exact by
    construction, one batched Rust call).
    """
    ids = list(ids)
    if text is None:
        text = tokenizer.decode(ids, skip_special_tokens=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] == ids:
        return [tuple(o) for o in enc["offset_mapping"]]
    prefixes = tokenizer.batch_decode([ids[: i + 1] for i in range(len(ids))],
                                      skip_special_tokens=False)
    ends = [len(p) for p in prefixes]
    starts = [0] + ends[:-1]
    return [(s, max(s, e)) for s, e in zip(starts, ends)]


# ----------------------------------------------------------------------------- sampling


def stop_token_ids(model, tokenizer) -> set[int]:
    """The ids that end a completion: the generation config's EOS id(s) and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}


def strip_completion(row: Sequence[int] | torch.Tensor, pad_id: int,
                     eos_ids: set[int]) -> tuple[list[int], bool]:
    """Completion ids up to and including the first EOS (pads dropped); True if EOS came."""
    out, finished = [], False
    for t in (row.tolist() if isinstance(row, torch.Tensor) else row):
        if t in eos_ids:
            out.append(t)
            finished = True
            break
        if t == pad_id and pad_id not in eos_ids:
            break
        out.append(t)
    return out, finished


def make_rollout(tokenizer, *, task_id: str, sample: int, prompt: str, prompt_ids: list[int],
                 completion_ids: list[int], logprobs: list[float], eos_seen: bool,
                 stop_strings: Sequence[str], temperature: float, meta: dict | None = None) -> Rollout:
    """A :class:`Rollout` from a completion's ids: text, extracted code, character offsets.

    ``finished`` is ``eos_seen`` or a stop string in the text (not cut by the token budget).
    """
    text = tokenizer.decode(completion_ids, skip_special_tokens=True)
    code = extract_code(text)
    return Rollout(
        task_id=task_id, sample=sample, prompt=prompt, prompt_ids=prompt_ids,
        completion_ids=completion_ids, logprobs=logprobs, completion=text, code=code,
        code_start=text.find(code.rstrip("\n")) if code else -1,
        offsets=token_offsets(tokenizer, completion_ids) if completion_ids else [],
        finished=eos_seen or any(s in text for s in stop_strings), temperature=temperature,
        meta=meta or {})


@torch.no_grad()
def sample(policy, tasks: Sequence[RepairTask], config: SamplingConfig | None = None, *,
           feedback: Sequence[str | None] | None = None, progress: bool = False) -> list[Rollout]:
    """G completions per task; results grouped task by task (``tasks[i]``'s samples are
    ``out[i*G:(i+1)*G]``). Deterministic under ``config.seed``."""
    return _sample(policy, tasks, config, feedback, progress, keep_cache=False)[0]


@torch.no_grad()
def sample_with_cache(policy, tasks: Sequence[RepairTask], config: SamplingConfig | None = None, *,
                      feedback: Sequence[str | None] | None = None,
                      progress: bool = False) -> tuple[list[Rollout], list[KVRow]]:
    """:func:`sample`, plus the cache ``generate`` filled: ``kv[i]`` locates ``out[i]``.

    The same tokens as :func:`sample` under the same seed; the caches of all chunks stay in
    memory until the rows are dropped (``layers x 2 x B x H_kv x (P + T) x D`` values each).
    """
    return _sample(policy, tasks, config, feedback, progress, keep_cache=True)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p nucleus: per row, the smallest set of most likely tokens whose mass reaches
    ``top_p`` (a token is kept when the mass strictly before it is ``< top_p``).
    ``[N, V]`` probabilities -> ``[N, V]`` bool."""
    sorted_p, order = probs.sort(dim=-1, descending=True)  # [N, V]
    before = sorted_p.cumsum(-1) - sorted_p  # [N, V] mass strictly before each token
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cfg: SamplingConfig,
           eos_ids: set[int], pad_id: int, tokenizer=None, want_cache: bool = True,
           generator: torch.Generator | None = None):
    """Ancestral sampling with a KV cache: ``y_t ~ softmax(z_t / T)`` restricted to the top-p
    nucleus and renormalised; records ``log softmax(z_t / T)[y_t]`` (unrestricted, the
    behaviour log-prob the update's importance ratio uses).

    One prefill forward over the distinct left-padded prompts (positions = cumulative mask
    - 1; the G copies of a prompt share it), then one step per token for the whole batch
    (``engine="lean"``: :class:`~labkit.policy.lean.LeanStep`, else ``model(...)``); finished rows keep receiving ``pad_id``
    (masked in) until every row has ended or ``max_new_tokens`` is reached, as ``generate``
    does. The sampling distribution is ``generate``'s (temperature, then top-p, no top-k);
    most completions come out token-identical to it under the same seed, but not all, so
    ``engine`` is part of a run's config. Per token it skips ``generate``'s logits-processor,
    stopping-criteria and cache-bookkeeping layers.

    Returns ``(new [b, T], logp [b, T], cache)``; the cache holds every token but the last
    sampled one (the :class:`KVRow` contract); ``want_cache=False``: the lean engine does not
    build it (``None``; its prompts' keys are shared by their rows, and a per-row cache is a
    copy), and stops computing rows that have ended once few enough are alive
    (:data:`DROP_ENDED`). Tokens are drawn from ``generator`` (``None``: torch's global one).
    """
    from transformers import DynamicCache

    b = input_ids.shape[0]
    stops = tuple(cfg.stop_strings)
    eos = torch.tensor(sorted(eos_ids), device=input_ids.device)
    cache = DynamicCache(config=model.config)
    attn = attention_mask
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    # Prefill each distinct prompt once (a GRPO chunk holds G copies of each), then give
    # every row its prompt's cache and next-token logits.
    first, inv = _distinct_rows(input_ids, attn)
    logits = model(input_ids=input_ids[first], attention_mask=attn[first], position_ids=pos[first],
                   cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # [u, V]
    step = None
    if cfg.engine == "lean" and lean.supports(model, input_ids.shape[1] + cfg.max_new_tokens) is None:
        # the rows share their prompt's keys and values in place (read once per prompt)
        step = lean.LeanStep(model, cache, attn[first], capacity=cfg.max_new_tokens, rows=inv)
    elif len(first) < b:
        cache.reorder_cache(inv)
    if len(first) < b:
        logits = logits[inv]  # [b, V]
    next_pos = pos[:, -1:] + 1  # [b, 1]
    alive = torch.ones(b, dtype=torch.bool, device=input_ids.device)
    live = torch.arange(b, device=input_ids.device)  # the rows the lean step still computes
    toks, lps = [], []
    texts = [""] * b
    # The lean engine's tokens are plain numbers to the caller and its cache is built after
    # the loop, so the loop runs in inference mode (less bookkeeping per operation: a few
    # microseconds on each of a token's hundreds of small operations); the model's own
    # forward (``loop``) keeps ``no_grad``, its cache being handed on as it grows.
    with torch.inference_mode(step is not None):
        for t in range(cfg.max_new_tokens):
            y, logp = draw(logits, cfg.temperature, cfg.top_p, sampler=cfg.sampler,
                           generator=generator)  # [b], [b, V]
            y = torch.where(alive, y, torch.full_like(y, pad_id))
            toks.append(y)
            lps.append(logp.gather(-1, y[:, None]).squeeze(1))
            alive = alive & ~torch.isin(y, eos)
            if stops and tokenizer is not None:
                for i in alive.nonzero().flatten().tolist():
                    texts[i] += tokenizer.decode([int(y[i])], skip_special_tokens=False)
                    if any(s in texts[i] for s in stops):
                        alive[i] = False
            if not alive.any() or t == cfg.max_new_tokens - 1:
                break
            if step is not None and not want_cache and int(alive.sum()) <= DROP_ENDED * len(live):
                # rows that have ended leave the step (their cache is not wanted); the others'
                # logits go back to their rows, so every draw sees [b, V] as before
                keep = alive[live].nonzero().flatten()
                step.keep(keep)
                live = live[keep]
            if step is not None and len(live) < b:
                logits = logits.new_zeros(b, logits.shape[-1])
                logits[live] = step(y[live], next_pos[live])
            elif step is not None:
                logits = step(y, next_pos)
            else:
                attn = torch.cat([attn, attn.new_ones(b, 1)], dim=1)
                logits = model(input_ids=y[:, None], attention_mask=attn, position_ids=next_pos,
                               cache=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
    if step is not None:
        cache = step.to_cache() if want_cache else None
    return torch.stack(toks, 1), torch.stack(lps, 1), cache


def draw(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
         greedy: bool = False, sampler: str = "race",
         generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One next token per row from ``[b, V]`` logits: ``y ~ softmax(z / T)`` restricted to the
    top-p nucleus and renormalised (``greedy``: ``argmax z``), drawn by ``sampler``
    (:attr:`SamplingConfig.sampler`) from ``generator`` (``None``: torch's global one, on the
    logits' device). Returns ``(y [b], log softmax(z / T) [b, V])``, the unrestricted log-probs
    a rollout records."""
    scores = logits.float()  # [b, V]
    if temperature != 1.0:  # (z / 1 is z: the division is skipped, not approximated)
        scores = scores / temperature
    logp = torch.log_softmax(scores, dim=-1)
    if greedy:
        return scores.argmax(dim=-1), logp
    if top_p < 1.0:
        scores = scores.masked_fill(~nucleus(logp.exp(), top_p), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if sampler == "inverse_cdf":
        return _inverse_cdf(probs, torch.rand(probs.shape[0], 1, dtype=torch.float64,
                                              device=probs.device, generator=generator)), logp
    return _categorical(probs, generator), logp


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``[b, V]`` probabilities from one uniform ``u [b, 1]`` in
    ``[0, 1)``: the first token ``i`` with ``C_i > u C_V``, ``C`` the cumulative sum (float64,
    so a row's rounding is far below any probability a sampler is asked to honour). A token of
    probability 0 (outside the nucleus) never satisfies it first: ``C_i = C_{i-1}``, so the
    token before it does whenever it would. ``P(y = i) = (C_i - C_{i-1}) / C_V = p_i``."""
    c = probs.double().cumsum(-1)  # [b, V]
    y = torch.searchsorted(c, u * c[:, -1:], right=True)[:, 0]  # [b]
    # u C_V < C_V, but keep a row whose sum rounds oddly inside the vocabulary
    return y.clamp_(max=probs.shape[-1] - 1)


def _categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``[b, V]`` probabilities by the exponential race:
    ``argmax_i p_i / E_i`` with ``E_i ~ Exp(1)`` i.i.d. is distributed as ``Categorical(p)``
    (``argmin E_i / p_i`` is the first arrival of independent Poisson clocks of rates ``p_i``).
    It is the draw ``torch.multinomial(probs, 1)`` makes on its one-sample path, from the
    same random stream (tested): written out so the rule is visible, with the noise from
    :func:`exponential_noise` (``exponential_``'s numbers drawn faster; it says the one
    rounding case where they could differ)."""
    return probs.div(exponential_noise(probs, generator)).argmax(dim=-1)


def exponential_noise(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``E ~ Exp(1)`` i.i.d., shaped like ``like``: for float32 on CPU the values
    ``like.exponential_()`` gives, from the same random stream, about 2.3x faster.

    torch's CPU kernel draws, element by element in order, a 53-bit uniform
    ``u = (random64() & (2^53 - 1)) 2^-53`` and returns ``-log1p(-u)`` computed in double, then
    cast. ``torch.rand(..., dtype=float64)`` draws the same ``u`` from the same generator, so

        E = float32(-log1p(-u))

    over the whole tensor leaves the generator in the same state and gives the same numbers up
    to one exception: the vectorised ``log1p`` and the C library's round 8% of the doubles
    differently in the last bit, which changes the float32 value only when that double lies
    within one bit of a float32 rounding boundary (about 2^-29 of those): 0 of 26.2 million
    values differed when measured, and a token would change only if that one-ulp change
    decided the race. A test checks values and state bitwise on a decode step's shape. Float64
    (where that last bit shows), half precisions (the kernel's cast rounds through float32)
    and other devices (their own kernels) draw with ``exponential_`` itself. ``generator``:
    the stream drawn from (``None``: torch's global one)."""
    if like.device.type != "cpu" or like.dtype != torch.float32:
        return torch.empty_like(like).exponential_(generator=generator)
    u = torch.rand(like.shape, dtype=torch.float64, generator=generator)
    return u.neg_().log1p_().neg_().float()


def _distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inv)``: the first row of each distinct (ids, mask) row, and for every row
    the index of its distinct row in ``first`` (``ids[first][inv] == ids``)."""
    seen: dict[tuple, int] = {}
    first, inv = [], []
    for r, key in enumerate(zip(ids.tolist(), mask.tolist())):
        k = (tuple(key[0]), tuple(key[1]))
        if k not in seen:
            seen[k] = len(first)
            first.append(r)
        inv.append(seen[k])
    return (torch.tensor(first, device=ids.device), torch.tensor(inv, device=ids.device))


def chunk_seed(seed: int, k: int) -> int:
    """The seed of chunk ``k``'s own random stream (:attr:`SamplingConfig.parallel_chunks`
    ``> 1``): ``seed`` itself for the first chunk, so a batch of one chunk samples what
    ``parallel_chunks = 1`` samples, and one derived from ``(seed, "chunk", k)`` after it."""
    return seed if k == 0 else derive_seed(seed, "chunk", k)


@contextlib.contextmanager
def intra_op_threads(n: int):
    """torch's intra-op thread count set to ``n`` inside the block, then restored. Threads
    started inside the block take ``n`` when they first run a parallel operation."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def rewrites_itself(model) -> bool:
    """Whether ``model``'s forward rewrites module state: a rotary embedding of a dynamic
    (NTK) or LongRoPE kind recomputes its frequencies from the positions it is called with.
    Two threads decoding through it would race, so chunks of such a model decode one after
    another (from the same streams: the tokens do not change)."""
    for module in model.modules():
        kind = getattr(module, "rope_type", None)
        kinds = kind.values() if isinstance(kind, dict) else (kind,)
        if any(isinstance(k, str) and ("dynamic" in k or k == "longrope") for k in kinds):
            return True
    return False


def _progress(items, total: int, show: bool):
    """``items``, behind a tqdm bar of sampled chunks when ``show``."""
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, total=total, desc="sampling", unit="batch")


def _sample(policy, tasks: Sequence[RepairTask], config: SamplingConfig | None,
            feedback: Sequence[str | None] | None, progress: bool,
            keep_cache: bool) -> tuple[list[Rollout], list[KVRow]]:
    cfg = config or SamplingConfig()
    cfg.validate()
    model, tok = policy.model, policy.tokenizer
    prompts = [build_prompt(t, tok, feedback[i] if feedback else None) for i, t in enumerate(tasks)]
    jobs = [(i, g) for i in range(len(tasks)) for g in range(cfg.group_size)]
    eos_ids = stop_token_ids(model, tok)
    pad_id = tok.pad_token_id
    was_training = model.training
    model.eval()
    torch.manual_seed(cfg.seed)
    chunks = [jobs[c0:c0 + cfg.batch_size] for c0 in range(0, len(jobs), cfg.batch_size)]
    encs = [tok([prompts[i] for i, _ in chunk], return_tensors="pt", padding=True,
                add_special_tokens=False).to(policy.device) for chunk in chunks]
    own_streams = cfg.parallel_chunks > 1
    device = torch.device(policy.device)

    def run(k: int):
        """Chunk ``k``'s ``(new [b, T], chosen log-probs [b, T], cache or None)``."""
        enc = encs[k]
        if cfg.engine in ("lean", "loop"):
            stream = (torch.Generator(device).manual_seed(chunk_seed(cfg.seed, k)) if own_streams
                      else None)
            new, chosen, cache = decode(model, enc.input_ids, enc.attention_mask, cfg, eos_ids,
                                        pad_id, tokenizer=tok, want_cache=keep_cache,
                                        generator=stream)
            return new, chosen, cache if keep_cache else None  # only kept caches outlive a chunk
        if own_streams:
            torch.manual_seed(chunk_seed(cfg.seed, k))  # generate draws from the global stream
        gen = model.generate(
            **enc, do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens, pad_token_id=pad_id,
            stop_strings=list(cfg.stop_strings) or None, tokenizer=tok,
            output_logits=True, return_dict_in_generate=True)
        logits = torch.stack(gen.logits, dim=1).float()  # [b, T, V]
        new = gen.sequences[:, enc.input_ids.shape[1]:]  # [b, T]
        logp = torch.log_softmax(logits / cfg.temperature, dim=-1)
        chosen = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [b, T]
        return new, chosen, gen.cache if keep_cache else None

    # no more threads than torch may use: each gets an equal share of its intra-op threads
    workers = min(cfg.parallel_chunks, len(chunks), torch.get_num_threads())
    # (autocast is a per-thread setting the decode threads would not inherit)
    if (workers > 1 and device.type == "cpu" and cfg.engine in ("lean", "loop")
            and not torch.is_autocast_enabled("cpu") and not rewrites_itself(model)):
        # each thread decodes whole chunks from its own stream: the order chunks finish in
        # changes nothing
        with intra_op_threads(torch.get_num_threads() // workers):
            pool = ThreadPoolExecutor(workers, thread_name_prefix="labkit-decode")
            try:
                futures = [pool.submit(run, k) for k in range(len(chunks))]
                for _ in _progress(as_completed(futures), len(futures), progress):
                    pass
                decoded = [f.result() for f in futures]
            finally:  # an error or an interrupt: chunks not yet started are dropped
                pool.shutdown(wait=True, cancel_futures=True)
    else:
        decoded = [run(k) for k in _progress(range(len(chunks)), len(chunks), progress)]

    out: list[Rollout] = []
    kv: list[KVRow] = []
    for chunk, enc, (new, chosen, cache) in zip(chunks, encs, decoded):
        P = enc.input_ids.shape[1]
        for row, (i, g) in enumerate(chunk):
            ids, eos_seen = strip_completion(new[row], pad_id, eos_ids)
            p_ids = enc.input_ids[row][enc.attention_mask[row].bool()].tolist()
            out.append(make_rollout(
                tok, task_id=tasks[i].task_id, sample=g, prompt=prompts[i], prompt_ids=p_ids,
                completion_ids=ids, logprobs=chosen[row, :len(ids)].tolist(), eos_seen=eos_seen,
                stop_strings=cfg.stop_strings, temperature=cfg.temperature))
            if keep_cache:
                kv.append(KVRow(cache=cache, row=row, offset=P - len(p_ids)))
    model.train(was_training)
    return out, kv


# ----------------------------------------------------------------------------- training forward


def collate(rollouts: Sequence[Rollout], pad_id: int, device=None) -> dict[str, torch.Tensor]:
    """Left-padded prompts + right-padded completions, the layout ``generate`` used.

    Returns ``input_ids``/``attention_mask`` ``[B, P+T]``, ``position_ids`` (cumulative mask,
    as in generation), ``completion_mask`` ``[B, T]`` and ``prompt_len`` P.
    """
    P = max(len(r.prompt_ids) for r in rollouts)
    T = max(max(len(r.completion_ids) for r in rollouts), 1)
    B = len(rollouts)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.float32)
    for b, r in enumerate(rollouts):
        p, c = r.prompt_ids, r.completion_ids
        ids[b, P - len(p):P] = torch.tensor(p)
        attn[b, P - len(p):P] = 1
        if c:
            ids[b, P:P + len(c)] = torch.tensor(c)
            attn[b, P:P + len(c)] = 1
            cmask[b, :len(c)] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "completion_mask": cmask}
    if device is not None:
        batch = {k: v.to(device) for k, v in batch.items()}
    batch["prompt_len"] = P
    return batch


def select_rows(batch: dict, idx: Sequence[int]) -> dict:
    """Rows ``idx`` of a :func:`collate` batch, narrowed to the columns they use.

    The left padding of the prompts that every selected row has, and the right padding of
    the completions that every selected row has, are cut (``prompt_len`` follows), so a
    micro-batch of short rows does not pay for the longest row of the whole batch. Padding
    is masked out of attention and positions come from ``position_ids``, so every kept
    position's log-prob is the same function of the parameters; the completion axis becomes
    ``T' <= T``, the first ``T'`` columns of the batch's (equal to float rounding: a matrix
    product over fewer padded columns may sum in another order).
    """
    P = batch["prompt_len"]
    rows = torch.as_tensor(list(idx), dtype=torch.long)
    out = {k: v[rows] for k, v in batch.items() if torch.is_tensor(v)}
    used = out["attention_mask"][:, :P].any(0).nonzero()
    p0 = int(used[0]) if len(used) else P
    done = out["completion_mask"].any(0).nonzero()
    t = int(done[-1]) + 1 if len(done) else 1
    for k in ("input_ids", "attention_mask", "position_ids"):
        out[k] = out[k][:, p0:P + t]
    out["completion_mask"] = out["completion_mask"][:, :t]
    out["prompt_len"] = P - p0
    return out


def micro_batches(batch: dict, size: int, by_length: bool = True) -> list[list[int]]:
    """The rows of a :func:`collate` batch cut into micro-batches of at most ``size`` rows.

    ``by_length``: the rows that share a prompt (a GRPO group) stay next to each other and the
    groups are ordered by their longest completion, then by prompt length, before the cut,
    so that each micro-batch, narrowed by :func:`select_rows`, pads its rows to a completion
    length close to their own (and shares each prompt once, :func:`sequence_logprobs`).
    On three real steps of the experiments' batch this cut the update's padded token
    positions by 9-13% (docs/journal/benchmarks.md). Otherwise the rows in batch order. Either way
    every row is in exactly one micro-batch, and the update's aggregate does not depend on
    the order (each micro-batch is weighted by its share of it)."""
    B = batch["completion_mask"].shape[0]
    if not by_length:
        return [list(range(i, min(B, i + size))) for i in range(0, B, size)]
    P = batch["prompt_len"]
    _, group = _distinct_rows(batch["input_ids"][:, :P], batch["attention_mask"][:, :P])
    group = group.tolist()
    length = batch["completion_mask"].sum(1).tolist()
    prompt = batch["attention_mask"][:, :P].sum(1).tolist()
    longest: dict[int, float] = {}
    for r, g in enumerate(group):
        longest[g] = max(longest.get(g, 0), length[r])
    order = sorted(range(B), key=lambda r: (longest[group[r]], prompt[r], group[r], r))
    return [order[i:i + size] for i in range(0, B, size)]


def sequence_logprobs(model, batch: dict, temperature: float = 1.0, with_entropy: bool = False,
                      share_prompts: bool = True, engine: str = "lean"
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``log softmax(z / T)`` of the completion tokens, ``[B, T]`` (and entropy).

    Teacher-forced: logits at position ``P + t - 1`` predict completion token ``t``. With
    ``share_prompts`` (and rows that repeat a prompt, as a GRPO batch's G samples do) each
    distinct prompt runs through the model once and only the completions run per row: the
    same function of the parameters (gradients flow back through the shared prompt into
    every row that uses it), with ``(G - 1) / G`` of the prompt compute left out. The
    completions attend their prompt's keys in place (``engine="lean"``, where
    :func:`labkit.policy.tail.supports` the model: :func:`~labkit.policy.tail.tail_logits`)
    or through the model's own forward with the keys and values indexed out to the rows
    (``engine="model"``). Otherwise one forward over prompt + completion. The lean engine
    computes the completion tokens only, not the right padding of shorter rows (the tail
    packed, :func:`~labkit.policy.tail.tail_logits` with ``keep``). Positions past a row's
    completion are the caller's to mask: the log-probs come masked, the entropies do not
    (there they are 0 with the lean engine, the padding's with the others).
    """
    if engine not in ("lean", "model"):
        raise ValueError(f"engine must be 'lean' or 'model', got {engine!r}")
    P = batch["prompt_len"]
    ids, attn, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    cmask = batch["completion_mask"]
    T = ids.shape[1] - P
    targets = ids[:, P:]  # [B, T]
    first, inv = _distinct_rows(ids[:, :P], attn[:, :P]) if share_prompts and T > 0 else (None, None)
    if first is None or len(first) == ids.shape[0]:
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                    logits_to_keep=T + 1)
        logits = out.logits[:, :-1, :]  # [B, T, V] (positions P-1 .. P+T-2)
    else:
        head = model(input_ids=ids[first, :P], attention_mask=attn[first, :P],
                     position_ids=pos[first, :P], use_cache=True, logits_to_keep=1)
        cache = head.cache
        logits = head.logits[inv]  # [B, 1, V]: predicts completion token 0
        if T > 1 and engine == "lean" and tail.supports(model, ids.shape[1]) is None:
            # the tail's kept inputs only: position t predicts token t + 1
            keep = cmask[:, 1:].bool()  # [B, T - 1]
            rest = tail.tail_logits(model, cache, attn[first, :P], inv, ids[:, P:-1],
                                    pos[:, P:-1], keep=keep)  # [N, V]
            lp, ent = _token_logprobs(torch.cat([logits[:, 0], rest]),
                                      torch.cat([targets[:, 0], targets[:, 1:][keep]]),
                                      temperature, with_entropy)
            B = len(keep)

            def unpack(v: torch.Tensor) -> torch.Tensor:
                """Token 0 of every row, then the tail's kept tokens -> ``[B, T]`` (0 elsewhere)."""
                return torch.cat([v[:B, None], v.new_zeros(keep.shape).masked_scatter(keep, v[B:])], 1)

            return unpack(lp) * cmask, (None if ent is None else unpack(ent))
        if T > 1:  # the other completion tokens, each row against its prompt's cache
            cache.reorder_cache(inv)  # [u, ...] -> [B, ...], differentiable (index_select)
            rest = model(input_ids=ids[:, P:-1], attention_mask=attn[:, :-1],
                         position_ids=pos[:, P:-1], cache=cache, use_cache=True).logits
            logits = torch.cat([logits, rest], dim=1)  # [B, T, V]
    logp, ent = _token_logprobs(logits, targets, temperature, with_entropy)
    return logp * cmask, ent


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(z / T)[y]`` and (``with_entropy``) ``-sum_v p(v) log p(v)`` for logits
    ``[..., V]`` and targets ``[...]``."""
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, ent


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): ``1 - C(n-c, k) / C(n, k)``."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))
