"""The update's completions against shared prompts, without copying a prompt to its rows.

:func:`~labkit.policy.rollout.sequence_logprobs` runs each distinct prompt once and then
every row's completion (the *tail*) against its prompt's keys and values. Through the
model's own forward the tail needs the prompt's keys and values copied out to each of the G
rows that share it (``[B, H_kv, P, D]`` per layer: an ``index_select`` forward and a
``scatter_add`` backward), and attends every query to ``[prompt; completion]`` under a
``[B, 1, T, P + T]`` mask. :func:`tail_logits` computes the same function with the model's
own modules (embedding, norms, projections with their LoRA layers, MLPs, rotary embedding)
and :class:`SplitAttention`, which attends the two parts apart and merges them exactly:

    o_p, l_p = softmax(q K_p^T s + mask_p) V_p, logsumexp(q K_p^T s + mask_p)   (prompt)
    o_s, l_s = softmax(q K_s^T s + causal) V_s,  logsumexp(q K_s^T s + causal)   (own tail)
    l = log(e^{l_p} + e^{l_s}),   o = e^{l_p - l} o_p + e^{l_s - l} o_s

which is ``softmax([q K_p^T s + mask_p, q K_s^T s + causal]) [V_p; V_s]``. The prompt part
is one fused-attention call per layer over each prompt's keys with the queries of all its
rows (and, under grouped-query attention, of all heads sharing a key head) stacked, so a
prompt's keys are read once and never copied; the own part is causal over the row's own
columns. Backward: the fused kernel's backward, run for each part with the *merged* output
``o`` and log-sum-exp ``l``, gives that part's exact gradients, because the softmax's
gradient needs of the whole row only ``P = exp(S - l)`` and ``rowsum(dO * o)``; the
queries' gradient is the sum over the two parts.

CPU only (the kernel is ATen's CPU flash attention, what ``scaled_dot_product_attention``
runs on CPU); :func:`supports` says when the model's own forward is used instead.
"""

from __future__ import annotations

import torch

from labkit.policy import lean

_DTYPES = (torch.float32, torch.float64)
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def supports(model, max_len: int | None = None) -> str | None:
    """``None`` if :func:`tail_logits` computes ``model``'s forward here, else the reason it
    does not (then the update uses the model's own forward)."""
    reason = lean.supports(model, max_len)
    if reason is not None:
        return reason
    lm = lean.causal_lm(model)
    p = next(lm.parameters())
    if p.device.type != "cpu":
        return f"device {p.device.type} (the split attention uses the CPU flash kernel)"
    if p.dtype not in _DTYPES:
        return f"dtype {p.dtype} (tested for {[str(d) for d in _DTYPES]})"
    if lm.training and getattr(lm.config, "attention_dropout", 0.0):
        return f"attention dropout {lm.config.attention_dropout} in training"
    return None


class SplitAttention(torch.autograd.Function):
    """``softmax([q K_p^T s + mask_p, q K_s^T s + causal]) [V_p; V_s]`` for the queries ``q``
    ``[b, H, T, D]`` of each row's tail, ``K_p, V_p`` ``[u, H_kv, P, D]`` the keys and values
    of the prompts (row ``i``'s is ``slots``' prompt of row ``i``; ``bias_p`` ``[u, 1, 1, P]``
    adds ``-inf`` on their left padding, or ``None``) and ``K_s, V_s`` ``[b, H, T, D]`` the
    tail's own (causal: query ``t`` sees columns ``<= t``). Returns ``[b, H, T, D]``; the two
    parts are computed apart and merged by their log-sum-exps (module docstring)."""

    @staticmethod
    def forward(ctx, q, kp, vp, ks, vs, bias_p, slots: lean.Slots, scale: float):
        b, H, T, D = q.shape
        n = H // kp.shape[1]  # query heads per key head, stacked with the rows
        qg = slots.to_grid(q.reshape(b, -1, n, T, D))
        op, lp = _flash(qg, kp, vp, 0.0, False, attn_mask=bias_p, scale=scale)
        op = slots.to_rows(op, n, T).reshape(b, H, T, D)
        lp = slots.to_rows(lp, n, T).reshape(b, H, T)
        os_, ls = _flash(q, ks, vs, 0.0, True, scale=scale)
        lse = torch.logaddexp(lp, ls)
        out = (op * (lp - lse).exp().unsqueeze(-1) + os_ * (ls - lse).exp().unsqueeze(-1)).to(q.dtype)
        ctx.save_for_backward(q, qg, kp, vp, ks, vs, out, lse)
        ctx.bias_p, ctx.slots, ctx.scale, ctx.n = bias_p, slots, scale, n
        return out

    @staticmethod
    def backward(ctx, grad):
        q, qg, kp, vp, ks, vs, out, lse = ctx.saved_tensors
        slots, n, scale = ctx.slots, ctx.n, ctx.scale
        b, H, T, D = q.shape
        grad = grad.contiguous()

        def grid(x):
            return slots.to_grid(x.reshape(b, -1, n, T, *x.shape[3:]))

        gqp, gkp, gvp = _flash_backward(grid(grad), qg, kp, vp, grid(out), grid(lse), 0.0,
                                        False, attn_mask=ctx.bias_p, scale=scale)
        gqs, gks, gvs = _flash_backward(grad, q, ks, vs, out, lse, 0.0, True, scale=scale)
        gq = slots.to_rows(gqp, n, T).reshape(b, H, T, D) + gqs
        return gq, gkp, gvp, gks, gvs, None, None, None


def tail_logits(model, cache, prompt_mask: torch.Tensor, rows: torch.Tensor,
                ids: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Logits ``[b, T, V]`` of the tail tokens ``ids`` ``[b, T]`` at positions ``pos``, each
    row attending its prompt's keys and values in ``cache`` (the distinct prompts' forward,
    ``[u, H_kv, P, D]`` per layer, left padded as ``prompt_mask`` ``[u, P]`` says; row ``i``'s
    prompt is ``rows[i]``) and then its own tail, causally: what the model's forward over
    ``[prompt; tail]`` gives at the tail's positions (to float rounding), differentiable
    through the cache into the prompts' forward. The tail is right padded: a padding
    column is never seen by an earlier one, and its own output is the caller's to ignore.

    ``keep`` ``[b, T]`` (bool, each row's kept positions a prefix of its tail): only those
    positions are computed and their logits come back packed, ``[N, V]`` in row-major order
    of ``keep``. The token-wise work (embedding, norms, projections, MLP, the vocabulary
    projection) then runs on the ``N`` kept tokens only; the attention alone sees the padded
    ``[b, H, T, D]`` layout, the padding's queries, keys and values zero (a padding column
    comes after every kept one, so the causal part never reads it)."""
    lm = lean.causal_lm(model)
    inner = lm.model
    b, T = ids.shape
    u, P = prompt_mask.shape
    slots = lean.Slots(rows, u)
    bias = None
    if not bool(prompt_mask.all()):
        bias = torch.zeros(u, 1, 1, P, dtype=cache.layers[0].keys.dtype, device=ids.device)
        bias.masked_fill_(~prompt_mask.bool()[:, None, None], float("-inf"))
    where = None if keep is None else keep.reshape(-1).nonzero().squeeze(1)  # [N]
    flat_ids, flat_pos = ids.reshape(-1), pos.reshape(-1)
    if where is not None:
        flat_ids, flat_pos = flat_ids[where], flat_pos[where]
    x = inner.embed_tokens(flat_ids)  # [N, d], N = b T unless ``keep``
    cos, sin = inner.rotary_emb(x, flat_pos[None])
    cos, sin = cos[0, :, None], sin[0, :, None]  # [N, 1, D]

    def heads(t: torch.Tensor) -> torch.Tensor:
        """``[N, h, d]`` -> ``[b, h, T, d]`` (the padding zero)."""
        if where is not None:
            t = t.new_zeros(b * T, *t.shape[1:]).index_copy(0, where, t)
        return t.view(b, T, *t.shape[1:]).transpose(1, 2)

    for i, layer in enumerate(inner.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        # [N, h, d] (unflatten, not a view with -1: N may be 0)
        q, k, v = (proj(h).unflatten(-1, (-1, a.head_dim)) for proj in (a.q_proj, a.k_proj, a.v_proj))
        q, k, v = heads(lean._rope(q, cos, sin)), heads(lean._rope(k, cos, sin)), heads(v)
        n = q.shape[1] // k.shape[1]
        if n > 1:  # grouped-query attention: the tail's own keys per query head (a few columns)
            k, v = k.repeat_interleave(n, 1), v.repeat_interleave(n, 1)
        o = SplitAttention.apply(q, cache.layers[i].keys, cache.layers[i].values, k, v, bias,
                                 slots, a.scaling)
        o = o.transpose(1, 2).reshape(b * T, -1)
        x = x + a.o_proj(o if where is None else o.index_select(0, where))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    logits = lm.lm_head(inner.norm(x))  # [N, V]
    return logits if where is not None else logits.view(b, T, -1)
