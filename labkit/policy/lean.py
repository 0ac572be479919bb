"""A lean one-token decode step for Llama-family decoders (Llama, Qwen2, Mistral).

Sampling a small model is dominated by per-call overhead, not arithmetic: one
``model(...)`` call for one new token walks through input checking, mask construction,
cache bookkeeping and output dataclasses that cost more than the matrix products of a
few-million-parameter model. :class:`LeanStep` computes the same function with the
model's own modules (its embedding, norms, projections, MLPs and rotary embedding, so LoRA
layers and rope variants are whatever the model has) and a key/value buffer allocated once:

    x      = E[y]                                           (embedding of the new token)
    for each layer l:
        h      = RMSNorm_l(x)
        q, k, v = W_q h (+b), W_k h (+b), W_v h (+b)          (per head)
        q, k   = rope(q, pos), rope(k, pos)                  (cos/sin table of the buffer)
        K_l[:, :, L], V_l[:, :, L] = k, v                    (write one column)
        x      = x + W_o softmax(q K_l^T * s + mask) V_l       (GQA: K, V shared by groups)
        x      = x + MLP_l(RMSNorm'_l(x))
    logits = W_lm RMSNorm(x)

The prefill (the whole prompt) still runs through ``model(...)``; its cache seeds the
buffer. :func:`supports` says why a model is not handled (then sampling uses the model's
own forward per token). Agreement with ``model.forward`` is tested (logits within float
tolerance) for Llama and Qwen2 shapes, with and without LoRA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_TYPES = {"llama", "qwen2", "mistral"}


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


class LeanStep:
    """One new token per row per call, against a key/value buffer of ``capacity`` columns.

    ``cache`` is the prefill's transformers cache (``[b, H_kv, P, D]`` per layer, left
    padded as ``attention_mask`` says); the buffer copies it. ``__call__(y, pos)`` appends
    token ``y`` ``[b]`` at positions ``pos`` ``[b, 1]`` and returns the logits ``[b, V]``
    of the next token. :meth:`to_cache` hands back a ``DynamicCache`` of the columns so far.
    """

    def __init__(self, model, cache, attention_mask: torch.Tensor, capacity: int):
        lm = causal_lm(model)
        self.lm, self.inner = lm, lm.model
        self.layers = list(self.inner.layers)
        k0 = cache.layers[0].keys
        b, h_kv, P, d = k0.shape
        self.L = P
        self.K = [k0.new_zeros(b, h_kv, P + capacity, d) for _ in self.layers]
        self.V = [k0.new_zeros(b, h_kv, P + capacity, d) for _ in self.layers]
        for i, layer in enumerate(cache.layers):
            self.K[i][:, :, :P] = layer.keys
            self.V[i][:, :, :P] = layer.values
        # additive mask: 0 where a column is attended, -inf on the prompts' left padding
        self.bias = k0.new_zeros(b, 1, 1, P + capacity)
        self.bias[:, 0, 0, :P].masked_fill_(~attention_mask.bool(), float("-inf"))
        # cos/sin of every position the buffer can hold, from the model's rotary module
        # (its rope variant and scaling), looked up per step instead of recomputed
        cos, sin = self.inner.rotary_emb(k0.new_zeros(1, 1, d),
                                         torch.arange(P + capacity, device=k0.device)[None])
        self.cos, self.sin = cos[0], sin[0]  # [P + capacity, D]
        a = self.layers[0].self_attn
        self.head_dim, self.scaling = a.head_dim, a.scaling
        self.kv_heads = h_kv
        self.qkv = [_qkv(layer.self_attn) for layer in self.layers]
        self.mlp = [_mlp(layer.mlp) for layer in self.layers]

    @torch.no_grad()
    def __call__(self, y: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        L = self.L
        if L >= self.K[0].shape[2]:
            raise RuntimeError(f"lean decode buffer full ({L} columns); raise its capacity")
        x = self.inner.embed_tokens(y)  # [b, H]
        b, d, h_kv = x.shape[0], self.head_dim, self.kv_heads
        cos, sin = self.cos[pos[:, 0]][:, None], self.sin[pos[:, 0]][:, None]  # [b, 1, D]
        bias = self.bias[..., :L + 1]  # [b, 1, 1, L+1]
        for i, (layer, qkv, mlp) in enumerate(zip(self.layers, self.qkv, self.mlp)):
            q, k, v = qkv(_rms(layer.input_layernorm, x))
            q = _rope(q.view(b, -1, d), cos, sin)  # [b, H, D]
            self.K[i][:, :, L] = _rope(k.view(b, -1, d), cos, sin)  # [b, H_kv, D]
            self.V[i][:, :, L] = v.view(b, -1, d)
            # one query per row: heads grouped by their key/value head (GQA without copies)
            scores = torch.matmul(q.view(b, h_kv, -1, d), self.K[i][:, :, :L + 1].transpose(-1, -2))
            w = torch.softmax(scores * self.scaling + bias, dim=-1)  # [b, H_kv, H/H_kv, L+1]
            o = torch.matmul(w, self.V[i][:, :, :L + 1])  # [b, H_kv, H/H_kv, D]
            x = x + layer.self_attn.o_proj(o.reshape(b, -1))
            x = x + mlp(_rms(layer.post_attention_layernorm, x))
        self.L = L + 1
        return self.lm.lm_head(_rms(self.inner.norm, x))

    def to_cache(self):
        """The columns written so far as a transformers ``DynamicCache`` (views, no copy)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.lm.config)
        for i in range(len(self.layers)):
            cache.update(self.K[i][:, :, :self.L], self.V[i][:, :, :self.L], i)
        return cache


def _plain(*modules) -> bool:
    """Plain ``nn.Linear`` layers (no LoRA or other wrapper), safe to fuse."""
    return all(type(m) is torch.nn.Linear for m in modules)


def _fused(*linears: torch.nn.Linear):
    """One matrix product for several linears on the same input; returns the split outputs.
    (The weights are read now: a :class:`LeanStep` lives for one sampling call.)"""
    w = torch.cat([m.weight for m in linears])
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in linears])
    sizes = [m.out_features for m in linears]
    return lambda h: F.linear(h, w, bias).split(sizes, dim=-1)


def _qkv(attn):
    """``h -> (q, k, v)``: fused when the projections are plain, else the modules' own calls."""
    mods = (attn.q_proj, attn.k_proj, attn.v_proj)
    if _plain(*mods):
        return _fused(*mods)
    return lambda h: tuple(m(h) for m in mods)


def _mlp(mlp):
    """``h -> W_down (silu(W_gate h) * W_up h)``, gate and up fused when plain."""
    if _plain(mlp.gate_proj, mlp.up_proj):
        gate_up = _fused(mlp.gate_proj, mlp.up_proj)

        def run(h):
            g, u = gate_up(h)
            return mlp.down_proj(F.silu(g) * u)
        return run
    return mlp


def _rms(norm, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm, ``w * x / sqrt(mean(x^2) + eps)`` computed in float32."""
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin``, rotate_half(x) = (-x2, x1) for halves x1, x2."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
