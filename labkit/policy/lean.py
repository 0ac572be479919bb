"""A lean one-token decode step for Llama-family decoders (Llama, Qwen2, Mistral).

Sampling a small model is dominated by per-call overhead, not arithmetic: one
``model(...)`` call for one new token walks through input checking, mask construction,
cache bookkeeping and output dataclasses that cost more than the matrix products of a
few-million-parameter model. :class:`LeanStep` computes the same function with the
model's own modules (its embedding, norms, projections, MLPs and rotary embedding, so LoRA
layers and rope variants are whatever the model has) and key/value buffers allocated once (a prompt's prefix is stored and read once for all the
rows that share it, see :class:`LeanStep`):

    x      = E[y]                                           (embedding of the new token)
    for each layer l:
        h      = RMSNorm_l(x)
        q, k, v = W_q h (+b), W_k h (+b), W_v h (+b)          (per head)
        q, k   = rope(q, pos), rope(k, pos)                  (cos/sin table of the buffer)
        K_l[:, :, L], V_l[:, :, L] = k, v                    (write one column)
        x      = x + W_o softmax(q K_l^T * s + mask) V_l       (GQA: K, V shared by groups;
                                                             the prompt's part once per prompt)
        x      = x + MLP_l(RMSNorm'_l(x))
    logits = W_lm RMSNorm(x)

The prefill (the whole prompt) still runs through ``model(...)``; its cache seeds the
buffer. :func:`supports` says why a model is not handled (then sampling uses the model's
own forward per token). Agreement with ``model.forward`` is tested (logits within float
tolerance) for Llama and Qwen2 shapes, with and without LoRA.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

_TYPES = {"llama", "qwen2", "mistral"}

FLAT_BYTES = 4 * 2**20
"""Largest per-layer key/value buffer (both, every row's prefix copied in) for which
:class:`LeanStep` attends in one fused kernel instead of the shared-prefix products. Below it a
decode step is bound by the number of operations, not by reading keys: at 8 rows of a
40-token prompt (1.3 MB) the fused kernel takes 36 us per layer against 108 us; at 16 rows of
250 tokens (7 MB, no prompt shared) 434 against 379 us (docs/journal/benchmarks.md)."""


def causal_lm(model):
    """The ``*ForCausalLM`` inside a PEFT wrapper (LoRA layers stay in place), or ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports(model, max_len: int | None = None) -> str | None:
    """``None`` if :class:`LeanStep` computes ``model``'s forward, else the reason it does not."""
    lm = causal_lm(model)
    cfg = getattr(lm, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in _TYPES:
        return f"model_type {mtype!r} (lean step knows {sorted(_TYPES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    window = getattr(cfg, "sliding_window", None)
    uses_window = getattr(cfg, "use_sliding_window", mtype == "mistral")
    if window is not None and uses_window and (max_len is None or max_len > window):
        return f"sliding-window attention (window {window})"
    inner = getattr(lm, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no decoder layers / rotary embedding where a Llama-family model has them"
    attn = inner.layers[0].self_attn
    if any(hasattr(attn, a) for a in ("q_norm", "k_norm")):
        return "query/key norms in attention"
    return None


class Slots:
    """Rows in a per-prompt grid: row ``i`` sits in slot ``(rows[i], j)`` of a ``[u, r]``
    grid, ``j`` its rank among the rows sharing prompt ``rows[i]``, ``r`` the most rows any
    prompt has (a slot no row fills holds zeros). With every slot filled in order (``whole``:
    a sampling chunk's or a GRPO micro-batch's whole groups, rows of a group adjacent) the
    grid is the rows themselves and no scatter or gather runs. The queries of a prompt's rows
    stacked this way meet its keys in one product (:class:`LeanStep`, one query per row) or
    one fused-attention call (:class:`labkit.policy.tail.SplitAttention`, a completion's
    ``T`` queries per row)."""

    def __init__(self, rows: torch.Tensor, u: int):
        self.u = u
        counts = torch.bincount(rows, minlength=u)
        self.r = int(counts.max())
        order = torch.argsort(rows, stable=True)
        start = torch.cumsum(counts, 0) - counts  # first sorted position of each prompt
        rank = torch.empty_like(rows)
        rank[order] = torch.arange(rows.numel(), device=rows.device) - start[rows[order]]
        self.slot = rows * self.r + rank  # [b]
        self.whole = bool(rows.numel() == u * self.r
                          and torch.equal(self.slot, torch.arange(rows.numel(), device=rows.device)))

    def to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, h, n, T, ...]`` -> ``[u, h, r n T, ...]`` (a prompt's rows one after another)."""
        _, h, n, T, *rest = x.shape
        g = x
        if not self.whole:
            g = x.new_zeros(self.u * self.r, h, n, T, *rest).index_copy_(0, self.slot, x)
        return g.view(self.u, self.r, h, n, T, *rest).transpose(1, 2).reshape(
            self.u, h, self.r * n * T, *rest)

    def to_rows(self, x: torch.Tensor, n: int, T: int) -> torch.Tensor:
        """Inverse of :meth:`to_grid`: ``[u, h, r n T, ...]`` -> ``[b, h, n, T, ...]``."""
        u, h, _, *rest = x.shape
        g = x.view(u, h, self.r, n, T, *rest).transpose(1, 2).reshape(u * self.r, h, n, T, *rest)
        return g if self.whole else g.index_select(0, self.slot)


class LeanStep:
    """One new token per row per call, attending a shared prefix and its own suffix.

    ``cache`` is the prefill's transformers cache (``[u, H_kv, P, D]`` per layer, left padded
    as ``attention_mask`` ``[u, P]`` says). ``rows`` ``[b]`` names each decoded row's prefill
    row (a GRPO chunk's G copies of a prompt name one; ``None``: row ``i`` is prefill row
    ``i``). The prefix keys and values are used in place, once per distinct row, and each
    row writes its new tokens into its own suffix buffer of ``capacity`` columns. Attention
    is the same softmax over ``[prefix, suffix]``, computed as two products:

        s_p = q K_p[rows]^T s + mask_p,  s_s = q K_s^T s + mask_s,  m = max(s_p, s_s)
        o   = (exp(s_p - m) V_p[rows] + exp(s_s - m) V_s) / (sum exp(s_p - m) + sum exp(s_s - m))

    where ``q K_p[rows]^T`` is one matrix product per distinct prefix over all the rows that
    share it (queries grouped by prefix, as grouped-query attention groups heads), so the
    prefix's keys are read once per step instead of once per row: at a GRPO batch (16
    prompts of ~250 tokens, 128 rows) that is most of a decode step's memory traffic.

    A row's suffix may start with columns of its own (``suffix``, left padded as
    ``suffix_mask`` says): a fork's tokens between the shared prompt and its fork point.

    A small step (``flat``; by default when the per-layer buffers with every row's prefix
    copied in take at most :data:`FLAT_BYTES`) copies each row's prefix into its own buffer
    once and attends with one ``scaled_dot_product_attention`` call per layer: the same
    softmax, in one kernel instead of the two products' couple of dozen operations, rounded as
    that kernel rounds (it is what ``model(...)`` calls with the ``sdpa`` attention).

    ``__call__(y, pos)`` appends token ``y`` ``[b]`` at positions ``pos`` ``[b, 1]`` and
    returns the logits ``[b, V]`` of the next token. :meth:`to_cache` hands back a per-row
    ``DynamicCache`` of every column so far (the prefix expanded to the rows; with a padded
    ``suffix`` its padding columns stay in place, so that cache is for inspection only).
    """

    def __init__(self, model, cache, attention_mask: torch.Tensor, capacity: int,
                 rows: torch.Tensor | None = None, suffix=None,
                 suffix_mask: torch.Tensor | None = None, flat: bool | None = None):
        lm = causal_lm(model)
        self.lm, self.inner = lm, lm.model
        self.layers = list(self.inner.layers)
        k0 = cache.layers[0].keys
        u, h_kv, P, d = k0.shape
        dev = k0.device
        rows = torch.arange(u, device=dev) if rows is None else rows.to(dev)
        b = rows.numel()
        self.Kp = [layer.keys for layer in cache.layers]  # [u, H_kv, P, D], not copied
        self.Vp = [layer.values for layer in cache.layers]
        s0 = 0 if suffix is None else suffix[0][0].shape[2]
        if flat is None:
            flat = b * (P + s0 + capacity) * h_kv * d * k0.element_size() * 2 <= FLAT_BYTES
        self.flat = flat
        if flat:  # every row's prefix becomes the first columns of its own buffer
            own = [(k[rows], v[rows]) for k, v in zip(self.Kp, self.Vp)]
            if suffix is not None:
                own = [(torch.cat((pk, k), 2), torch.cat((pv, v), 2))
                       for (pk, pv), (k, v) in zip(own, suffix)]
                suffix_mask = torch.cat((attention_mask[rows], suffix_mask), 1)
            else:
                suffix_mask = attention_mask[rows]
            suffix = own
            self.Kp = [k[:, :, :0] for k in self.Kp]  # no shared prefix left
            self.Vp = [v[:, :, :0] for v in self.Vp]
            attention_mask, P = attention_mask[:, :0], 0
        self.P, self.S = P, 0
        # the prefix keys once more, transposed and contiguous ([u, H_kv, D, P]): the score
        # product over a transposed view packs the keys on every call, about twice its time
        self.KpT = [k.transpose(-1, -2).contiguous() for k in self.Kp]
        # suffixes: the rows' own columns (``suffix``: per layer ``[b, H_kv, S0, D]`` already
        # there, left padded as ``suffix_mask`` ``[b, S0]`` says), then ``capacity`` new ones
        # (not zeroed: a column is written before any call reads it, and zeroing the
        # experiments' 64-row buffers, 126 MB per chunk, took about 5% of a decode call)
        s0 = 0 if suffix is None else suffix[0][0].shape[2]
        self.K = [k0.new_empty(b, h_kv, s0 + capacity, d) for _ in self.layers]
        self.V = [k0.new_empty(b, h_kv, s0 + capacity, d) for _ in self.layers]
        self.bias_s = None
        if suffix is not None:
            for i, (k, v) in enumerate(suffix):
                self.K[i][:, :, :s0], self.V[i][:, :, :s0] = k, v
            self.S = s0
            if not (flat and bool(suffix_mask.all())):  # (a flat step without padding: no mask)
                self.bias_s = k0.new_zeros(b, 1, 1, s0 + capacity)
                self.bias_s[:, 0, 0, :s0].masked_fill_(~suffix_mask.bool(), float("-inf"))
        # additive mask of the prefix: 0 where a column is attended, -inf on left padding
        pad = ~attention_mask.bool()
        self.bias = k0.new_zeros(u, 1, 1, P).masked_fill_(pad[:, None, None], float("-inf"))
        self._padded = bool(pad.any())  # else adding the mask changes no score
        self.u = u
        self._group(rows)  # also resets the prefix-score buffer [u, H_kv, r g, P]
        # cos/sin of every position the buffer can hold, from the model's rotary module
        # (its rope variant and scaling), looked up per step instead of recomputed
        cos, sin = self.inner.rotary_emb(k0.new_zeros(1, 1, d),
                                         torch.arange(P + s0 + capacity, device=dev)[None])
        self.cos, self.sin = cos[0], sin[0]  # [P + S0 + capacity, D]
        a = self.layers[0].self_attn
        self.head_dim, self.scaling = a.head_dim, a.scaling
        self.kv_heads = h_kv
        self.qkv = [_qkv(layer.self_attn) for layer in self.layers]
        self.mlp = [_mlp(layer.mlp) for layer in self.layers]
        self.o_proj = [_linear(layer.self_attn.o_proj) for layer in self.layers]
        self.norms = [(_norm(layer.input_layernorm), _norm(layer.post_attention_layernorm))
                      for layer in self.layers]
        self.final_norm = _norm(self.inner.norm)
        self.lm_head = _linear(self.lm.lm_head)
        emb = self.inner.embed_tokens
        # a plain embedding's lookup (``padding_idx`` only shapes its gradient)
        self.embed = (partial(F.embedding, weight=emb.weight)
                      if type(emb) is torch.nn.Embedding and emb.max_norm is None else emb)

    def _group(self, rows: torch.Tensor) -> None:
        """The query grouping (:class:`Slots`): row ``i`` in slot ``(rows[i], j)`` of a
        ``[u, r]`` grid, ``j`` its rank among the rows sharing its prefix."""
        self.rows = rows
        self.slots = Slots(rows, self.u)
        self.r = self.slots.r
        self._scores = None

    def keep(self, idx: torch.Tensor) -> None:
        """Go on with rows ``idx`` only (e.g. the ones that have not ended): their suffixes are
        copied out, the shared prefixes stay. Later calls take and return those rows only;
        :meth:`to_cache` then covers them only. Only the columns written so far are copied
        (a buffer's columns past them are written before any call reads them)."""
        S = self.S

        def rows_of(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_empty(idx.numel(), *buf.shape[1:])
            out[:, :, :S] = buf[:, :, :S].index_select(0, idx)
            return out
        self.K = [rows_of(k) for k in self.K]
        self.V = [rows_of(v) for v in self.V]
        if self.bias_s is not None:
            self.bias_s = self.bias_s.index_select(0, idx)
        self._group(self.rows.index_select(0, idx))

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """Rows ``[b, H_kv, g, ...]`` -> per prefix ``[u, H_kv, r g, ...]`` (empty slots 0):
        :meth:`Slots.to_grid` with one query per row. Only for small per-row tensors
        (queries, maxima): the prefix-sized ones stay in the grid layout."""
        return self.slots.to_grid(x.unsqueeze(3))

    def _to_rows(self, x: torch.Tensor, g: int) -> torch.Tensor:
        """Inverse of :meth:`_to_grid`: ``[u, H_kv, r g, ...]`` -> ``[b, H_kv, g, ...]``."""
        return self.slots.to_rows(x, g, 1).squeeze(3)

    def _attend(self, i: int, q: torch.Tensor) -> torch.Tensor:
        """``softmax([q K_p^T s + mask_p, q K_s^T s + mask_s]) [V_p; V_s]`` for ``q``
        ``[b, H_kv, g, D]``, the two parts normalised together (one maximum ``m`` and one
        sum ``l`` over both). The prefix's scores are computed in a buffer kept across steps
        and layers (``[u, H_kv, r g, P]``): a fresh prefix-sized tensor per layer and step
        costs more in page faults than its arithmetic on CPU."""
        S, g = self.S, q.shape[2]
        if self.flat:  # each row's own columns only, prefix included: one fused kernel
            mask = None if self.bias_s is None else self.bias_s[..., :S + 1]
            return F.scaled_dot_product_attention(q, self.K[i][:, :, :S + 1], self.V[i][:, :, :S + 1],
                                                  attn_mask=mask, scale=self.scaling)
        if self._scores is None or self._scores.shape[2] != self.r * g:
            self._scores = q.new_empty(self.u, self.kv_heads, self.r * g, self.P)
        # A matrix-vector product (one query per prefix, e.g. greedy evaluation) takes a kernel
        # whose rounding depends on the layout, so it keeps the view. With r g > 1 the two
        # layouts gave bitwise the same scores at the shipped model's shapes; at other shapes
        # they may differ in the last bits (a test checks both cases).
        keys_t = self.KpT[i] if self.r * g > 1 else self.Kp[i].transpose(-1, -2)
        s_p = torch.matmul(self._to_grid(q), keys_t, out=self._scores)
        s_p.mul_(self.scaling)  # [u, H_kv, r g, P]
        if self._padded:
            s_p.add_(self.bias)
        s_s = torch.matmul(q, self.K[i][:, :, :S + 1].transpose(-1, -2)).mul_(self.scaling)
        if self.bias_s is not None:
            s_s.add_(self.bias_s[..., :S + 1])  # [b, H_kv, g, S+1]
        m = torch.maximum(self._to_rows(s_p.amax(-1, keepdim=True), g),
                          s_s.amax(-1, keepdim=True))  # [b, H_kv, g, 1]
        e_p = s_p.sub_(self._to_grid(m)).exp_()
        e_s = s_s.sub_(m).exp_()
        total = self._to_rows(e_p.sum(-1, keepdim=True), g) + e_s.sum(-1, keepdim=True)
        o = (self._to_rows(torch.matmul(e_p, self.Vp[i]), g)
             + torch.matmul(e_s, self.V[i][:, :, :S + 1]))  # [b, H_kv, g, D]
        return o / total

    @torch.inference_mode()
    def __call__(self, y: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        S = self.S
        if S >= self.K[0].shape[2]:
            raise RuntimeError(f"lean decode buffer full ({S} columns); raise its capacity")
        x = self.embed(y)  # [b, H]
        b, d, h_kv = x.shape[0], self.head_dim, self.kv_heads
        cos, sin = self.cos[pos[:, 0]][:, None], self.sin[pos[:, 0]][:, None]  # [b, 1, D]
        for i, (norms, qkv, o_proj, mlp) in enumerate(zip(self.norms, self.qkv, self.o_proj, self.mlp)):
            qk, v = qkv(norms[0](x))
            qk = _rope(qk.view(b, -1, d), cos, sin)  # [b, H + H_kv, D]: rotated at once
            # one query per row: heads grouped by their key/value head (GQA without copies)
            q = qk[:, :-h_kv].view(b, h_kv, -1, d)  # [b, H_kv, g, D]
            self.K[i][:, :, S] = qk[:, -h_kv:]  # [b, H_kv, D]
            self.V[i][:, :, S] = v.view(b, -1, d)
            o = self._attend(i, q)
            x = x + o_proj(o.reshape(b, -1))
            x = x + mlp(norms[1](x))
        self.S = S + 1
        return self.lm_head(self.final_norm(x))

    def to_cache(self):
        """Every column so far, per row, as a transformers ``DynamicCache``: the prefix
        expanded to the rows, then the suffix (a copy)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.lm.config)
        for i in range(len(self.layers)):
            keys = torch.cat([self.Kp[i][self.rows], self.K[i][:, :, :self.S]], dim=2)
            values = torch.cat([self.Vp[i][self.rows], self.V[i][:, :, :self.S]], dim=2)
            cache.update(keys, values, i)
        return cache


def _plain(*modules) -> bool:
    """Plain ``nn.Linear`` layers (no LoRA or other wrapper), safe to fuse."""
    return all(type(m) is torch.nn.Linear for m in modules)


def _fused(*linears: torch.nn.Linear, sizes: tuple[int, ...] | None = None):
    """One matrix product for several linears on the same input; returns the outputs split
    by ``sizes`` (default: one per linear). (The weights are read now: a :class:`LeanStep`
    lives for one sampling call.)"""
    w = torch.cat([m.weight for m in linears])
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in linears])
    sizes = sizes or [m.out_features for m in linears]
    return lambda h: F.linear(h, w, bias).split(sizes, dim=-1)


def _qkv(attn):
    """``h -> (qk, v)``: the query and key projections side by side (``[b, (H + H_kv) D]``,
    rotated together) and the values. One matrix product whose output is sliced when the
    projections are plain, else the modules' own calls (queries and keys concatenated)."""
    mods = (attn.q_proj, attn.k_proj, attn.v_proj)
    if _plain(*mods):
        n_qk = attn.q_proj.out_features + attn.k_proj.out_features
        return _fused(*mods, sizes=(n_qk, attn.v_proj.out_features))
    return lambda h: (torch.cat((attn.q_proj(h), attn.k_proj(h)), dim=-1), attn.v_proj(h))


def _mlp(mlp):
    """``h -> W_down (silu(W_gate h) * W_up h)``, gate and up fused when plain."""
    if _plain(mlp.gate_proj, mlp.up_proj):
        gate_up = _fused(mlp.gate_proj, mlp.up_proj)
        down = _linear(mlp.down_proj)

        def run(h):
            g, u = gate_up(h)
            return down(F.silu(g) * u)
        return run
    return mlp


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin``, rotate_half(x) = (-x2, x1) for halves x1, x2."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _linear(m):
    """``m`` as a function: ``F.linear`` on its parameters when it is a plain ``nn.Linear``
    (without a module call's overhead per token), else the module itself (e.g. LoRA)."""
    if _plain(m):
        return partial(F.linear, weight=m.weight, bias=m.bias)
    return m


def _norm(norm):
    """The model's RMSNorm as a function, ``x -> w * x / sqrt(mean(x^2) + eps)`` computed in
    float32, with its weight and epsilon bound once."""
    w, eps = norm.weight, norm.variance_epsilon

    def run(x):
        return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    return run
