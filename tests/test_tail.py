"""The update's split attention (each prompt's keys read in place, the tail's own keys
causal, merged by log-sum-exp) against a naive softmax over the copied keys, and the update's
log-probs and gradients through it against the model's own forward."""

import pytest
import torch
from tiny_models import llama, lora, qwen2

from labkit.policy import lean, tail
from labkit.policy.rollout import sequence_logprobs


def _naive(q, kp, vp, ks, vs, prompt_mask, rows, scale):
    """Each row's prompt keys copied out, concatenated with its own, one softmax."""
    b, H, T, D = q.shape
    n = H // kp.shape[1]
    K = torch.cat([kp[rows].repeat_interleave(n, 1), ks], 2)
    V = torch.cat([vp[rows].repeat_interleave(n, 1), vs], 2)
    s = q @ K.transpose(-1, -2) * scale  # [b, H, T, P + T]
    P = kp.shape[2]
    s[..., :P] = s[..., :P].masked_fill(~prompt_mask.bool()[rows][:, None, None], float("-inf"))
    later = torch.ones(T, T, dtype=torch.bool).triu(1)
    s[..., P:] = s[..., P:].masked_fill(later, float("-inf"))
    return torch.softmax(s, -1) @ V


def _inputs(rows, u=3, H=6, H_kv=2, P=7, T=5, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(rows)
    q, ks, vs = (torch.randn(b, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    kp, vp = (torch.randn(u, H_kv, P, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(u, P, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[-1, :1] = 0
    return q, kp, vp, ks, vs, mask, torch.tensor(rows)


@pytest.mark.parametrize("rows", [[0, 0, 1, 1, 2, 2], [2, 0, 1, 0, 0, 2, 1]],
                         ids=["whole-groups", "uneven-interleaved"])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)], ids=["gqa", "mha"])
def test_split_attention_equals_one_softmax_over_the_copied_keys(rows, heads):
    """Output and every input's gradient equal the naive form's (float64)."""
    H, H_kv = heads
    q, kp, vp, ks, vs, mask, rows = _inputs(rows, H=H, H_kv=H_kv)
    slots = lean.Slots(rows, kp.shape[0])
    bias = torch.zeros(3, 1, 1, 7, dtype=torch.float64).masked_fill_(~mask.bool()[:, None, None],
                                                                    float("-inf"))
    scale = 0.5
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got, want = [], []
    for fn, out in ((lambda *x: tail.SplitAttention.apply(*x, bias, slots, scale), got),
                    (lambda *x: _naive(*x, mask, rows, scale), want)):
        xs = [x.clone().requires_grad_() for x in (q, kp, vp, ks, vs)]
        o = fn(*xs)
        o.backward(grad)
        out.extend([o.detach()] + [x.grad for x in xs])
    for name, a, b in zip(["out", "q", "k_prompt", "v_prompt", "k_own", "v_own"], got, want):
        assert torch.allclose(a, b, atol=1e-12), (name, (a - b).abs().max())


def test_split_attention_gradcheck():
    q, kp, vp, ks, vs, mask, rows = _inputs([1, 0, 1], u=2, H=2, H_kv=1, P=4, T=3, D=2, seed=3)
    bias = torch.zeros(2, 1, 1, 4, dtype=torch.float64)
    bias[1, ..., 0] = float("-inf")
    slots = lean.Slots(rows, 2)
    xs = [x.requires_grad_() for x in (q, kp, vp, ks, vs)]
    assert torch.autograd.gradcheck(lambda *x: tail.SplitAttention.apply(*x, bias, slots, 0.7), xs)


def test_slots_golden():
    """Rows of prompts [1, 0, 1, 2, 1]: three rows share prompt 1, so ``r = 3``; each row's
    slot is ``prompt * r + rank``; a grid of whole groups in order is the rows themselves."""
    s = lean.Slots(torch.tensor([1, 0, 1, 2, 1]), 3)
    assert s.r == 3 and s.slot.tolist() == [3, 0, 4, 6, 5] and not s.whole
    x = torch.arange(5.0).view(5, 1, 1, 1, 1)
    grid = s.to_grid(x)  # [u=3, 1, r*1*1=3, 1]
    assert grid[:, 0, :, 0].tolist() == [[1, 0, 0], [0, 2, 4], [3, 0, 0]]
    assert torch.equal(s.to_rows(grid, 1, 1), x)
    w = lean.Slots(torch.tensor([0, 0, 1, 1]), 2)
    assert w.whole and w.r == 2


def _lora_llama():
    return lora(llama())


def _batch(u=3, g=4, P=9, T=7, seed=0):
    """A collate-shaped batch: ``u`` left-padded prompts, ``g`` rows each, completions of
    several lengths (right padded)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 90, (u, P), generator=gen)
    pmask = torch.ones(u, P, dtype=torch.long)
    pmask[0, :3] = 0
    pmask[2, :1] = 0
    ids = torch.cat([prompts.repeat_interleave(g, 0), torch.randint(3, 90, (u * g, T), generator=gen)], 1)
    attn = torch.cat([pmask.repeat_interleave(g, 0), torch.ones(u * g, T, dtype=torch.long)], 1)
    cmask = torch.ones(u * g, T)
    for i in range(u * g):
        n = 1 + (i * 5) % T
        attn[i, P + n:], cmask[i, n:], ids[i, P + n:] = 0, 0, 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos,
            "completion_mask": cmask, "prompt_len": P}


@pytest.mark.parametrize("make", [llama, qwen2, _lora_llama], ids=["llama", "qwen2-gqa-bias", "lora"])
def test_lean_tail_gives_the_model_forwards_log_probs_and_gradients(make, monkeypatch):
    """``engine="lean"`` (split attention, prompt keys in place) and ``engine="model"`` (the
    model's forward over copied keys): the same log-probs, entropies and parameter gradients
    to float rounding (entropies where there is a token: at padding they are the caller's to
    mask), and the lean path did run."""
    model = make()
    assert tail.supports(model, 16) is None
    calls = []
    real = tail.tail_logits
    monkeypatch.setattr(tail, "tail_logits", lambda *a, **k: calls.append(1) or real(*a, **k))
    batch = _batch()
    got = {}
    for engine in ("lean", "model"):
        model.zero_grad()
        logp, ent = sequence_logprobs(model, batch, 0.9, with_entropy=True, engine=engine)
        (logp.sum() + 0.1 * (ent * batch["completion_mask"]).sum()).backward()
        got[engine] = (logp.detach(), ent.detach(),
                       [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert calls == [1]
    (l1, e1, g1), (l2, e2, g2) = got["lean"], got["model"]
    m = batch["completion_mask"]
    assert torch.allclose(l1, l2, atol=1e-5) and torch.allclose(e1 * m, e2 * m, atol=1e-5)
    assert len(g1) == len(g2) > 0
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def test_lean_tail_with_a_group_split_over_micro_batches():
    """Rows of uneven groups in any order (a micro-batch cut inside a group): the same
    log-probs as the model's forward."""
    model = qwen2()
    batch = _batch(g=3)
    keep = torch.tensor([4, 0, 1, 5, 6, 2])  # prompt 1 twice, prompt 0 three times, prompt 2 once
    sub = {k: (v[keep] if torch.is_tensor(v) else v) for k, v in batch.items()}
    with torch.no_grad():
        a, _ = sequence_logprobs(model, sub, 1.0, engine="lean")
        b, _ = sequence_logprobs(model, sub, 1.0, engine="model")
    assert torch.allclose(a, b, atol=1e-5)


def test_supports_names_what_the_split_attention_does_not_handle():
    model = llama()
    assert "dtype" in tail.supports(model.to(torch.bfloat16))
    q = qwen2()
    q.config.attention_dropout = 0.1
    assert tail.supports(q) is None  # in eval mode dropout is off
    q.train()
    assert "dropout" in tail.supports(q)
    with pytest.raises(ValueError, match="engine"):
        sequence_logprobs(llama(), _batch(), engine="fast")


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2-gqa-bias"])
def test_packed_tail_equals_the_padded_tail_at_kept_positions(make):
    """``keep``: the kept positions' logits and gradients as the padded tail computes them,
    and what stands in the padding (its tokens) changes nothing."""
    model = make()
    batch = _batch()
    P, ids, attn, pos = batch["prompt_len"], batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    keep = batch["completion_mask"][:, 1:].bool()
    assert not keep.all() and keep.any()  # rows of several lengths
    first = torch.tensor([0, 4, 8])
    rows = torch.arange(12) // 4
    out = []
    for packed, tail_ids in ((False, ids[:, P:-1]), (True, ids[:, P:-1]),
                             (True, ids[:, P:-1].masked_fill(~keep, 77))):
        model.zero_grad()
        head = model(input_ids=ids[first, :P], attention_mask=attn[first, :P],
                     position_ids=pos[first, :P], use_cache=True)
        z = tail.tail_logits(model, head.cache, attn[first, :P], rows, tail_ids, pos[:, P:-1],
                             keep=keep if packed else None)
        z = z if packed else z[keep]  # [N, V]
        (z.square().mean()).backward()
        out.append((z.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (z0, g0), (z1, g1), (z2, g2) = out
    assert z1.shape == (int(keep.sum()), z0.shape[-1])
    assert torch.allclose(z0, z1, atol=1e-5) and torch.equal(z1, z2)
    assert len(g0) == len(g1) > 0
    for a, b, c in zip(g0, g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4) and torch.equal(b, c)


def test_lean_tail_with_no_kept_tail_token():
    """Completions of at most one token in a batch with more columns (a caller's own padding):
    the packed tail is empty, and both engines give the same log-probs and a backward."""
    model = llama()
    batch = _batch()
    P = batch["prompt_len"]
    batch["completion_mask"][:, 1:] = 0
    batch["attention_mask"][:, P + 1:] = 0
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    got = []
    for engine in ("lean", "model"):
        logp, ent = sequence_logprobs(model, batch, 1.0, with_entropy=True, engine=engine)
        (logp.sum() + ent[:, 0].sum()).backward()
        got.append((logp.detach(), ent[:, 0].detach()))
    assert torch.allclose(got[0][0], got[1][0], atol=1e-5) and torch.allclose(got[0][1], got[1][1], atol=1e-5)
    assert (got[0][0][:, 1:] == 0).all()
