"""The lean decode step computes the model's own forward, token by token (Llama and Qwen2
shapes, GQA, attention bias, LoRA), and sampling with it gives the loop engine's tokens."""

import pytest
import torch
from tiny_models import llama, lora, qwen2
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from labkit.policy import lean
from labkit.policy.rollout import SamplingConfig, _distinct_rows, sample


def _check_against_forward(model, steps=6, padded=True, flat=False):
    """Prefill a left-padded batch (``padded=False``: prompts of one length), then compare
    LeanStep (the shared-prefix products, or ``flat``: one fused kernel over each row's own
    buffer) with ``model(...)`` per token."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (3, 9), generator=g)
    att = torch.ones_like(ids)
    if padded:
        att[0, :4] = 0
        att[2, :1] = 0
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    caches = []
    for _ in range(2):
        c = DynamicCache(config=lean.causal_lm(model).config)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=att, position_ids=pos, cache=c, use_cache=True)
        caches.append(c)
    step = lean.LeanStep(model, caches[0], att, capacity=steps, flat=flat)
    assert step.flat == flat
    for buf in step.K + step.V:  # the buffers are not zeroed: no call may read a column
        buf[:, :, step.S:] = float("nan")  # before it is written
    if flat:  # the padding is masked among the row's own columns, no mask without it
        assert step.P == 0 and (step.bias_s is not None) == padded
    else:  # without padding the prefix mask is not added
        assert step._padded == padded
    p = pos[:, -1:] + 1
    for _ in range(steps):
        y = torch.randint(3, 90, (3,), generator=g)
        got = step(y, p)
        att = torch.cat([att, att.new_ones(3, 1)], 1)
        with torch.no_grad():
            want = model(input_ids=y[:, None], attention_mask=att, position_ids=p, cache=caches[1],
                         use_cache=True).logits[:, -1]
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
        p = p + 1
    # the cache it hands back holds the same keys and values as the model's own
    back = step.to_cache()
    for mine, theirs in zip(back.layers, caches[1].layers):
        assert torch.allclose(mine.keys, theirs.keys, atol=1e-5)
        assert torch.allclose(mine.values, theirs.values, atol=1e-5)
    with pytest.raises(RuntimeError, match="buffer full"):
        step(y, p)


@pytest.mark.parametrize("flat", [False, True], ids=["shared-prefix", "flat"])
@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2-gqa-bias"])
def test_lean_step_matches_the_model_forward(make, flat):
    model = make()
    assert lean.supports(model) is None
    _check_against_forward(model, flat=flat)


def test_lean_step_runs_lora_layers_unfused():
    model = lora(qwen2())
    assert lean.supports(model) is None
    _check_against_forward(model)
    _check_against_forward(model, flat=True)
    step = lean.LeanStep(model, _prefilled(model), torch.ones(1, 2, dtype=torch.long), capacity=1)
    # the wrapped projections are called as modules (their adapters apply), not fused
    attn = lean.causal_lm(model).model.layers[0].self_attn
    assert not lean._plain(attn.q_proj) and lean._plain(attn.k_proj)
    assert step.mlp[0] is lean.causal_lm(model).model.layers[0].mlp


@pytest.mark.parametrize("flat", [False, True], ids=["shared-prefix", "flat"])
def test_lean_step_matches_the_forward_on_prompts_of_one_length(flat):
    _check_against_forward(qwen2(), padded=False, flat=flat)


def test_lean_step_calls_wrapped_output_and_down_projections_as_modules():
    model = lora(llama(), targets=("o_proj", "down_proj"))
    _check_against_forward(model)
    step = lean.LeanStep(model, _prefilled(model), torch.ones(1, 2, dtype=torch.long), capacity=1)
    layer = lean.causal_lm(model).model.layers[0]
    assert step.o_proj[0] is layer.self_attn.o_proj  # the adapter's module, not F.linear
    assert not lean._plain(layer.mlp.down_proj) and lean._plain(layer.mlp.gate_proj)


def _prefilled(model):
    c = DynamicCache(config=lean.causal_lm(model).config)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6]]), cache=c, use_cache=True)
    return c


def test_supports_names_what_it_does_not_handle():
    from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert "gpt2" in lean.supports(gpt2)
    mis = MistralForCausalLM(MistralConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, sliding_window=8))
    assert "sliding-window" in lean.supports(mis, max_len=64)
    assert lean.supports(mis, max_len=8) is None
    assert "hidden_act" in lean.supports(LlamaForCausalLM(LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, hidden_act="gelu")))


def test_distinct_rows_golden():
    ids = torch.tensor([[1, 2], [3, 4], [1, 2], [1, 2], [3, 4]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 1], [1, 1]])
    first, inv = _distinct_rows(ids, mask)
    assert first.tolist() == [0, 1, 3]  # row 3 differs from row 0 by its mask
    assert inv.tolist() == [0, 1, 0, 2, 1]
    assert torch.equal(ids[first][inv], ids)


def test_lean_engine_samples_the_loop_engines_tokens(random_model_dir, lean_attention):
    from labkit.env.records import RepairTask
    from labkit.sandbox.records import TestSuite
    from labkit.policy.loading import load_policy

    policy = load_policy(str(random_model_dir))
    tasks = [RepairTask(task_id=f"t{i}", problem_id=f"p{i}", source="s", prompt="", entry_point="f",
                        buggy_code="def f(x):\n    return x\n" + "# pad\n" * i,
                        reference_code="def f(x):\n    return x\n", tests=TestSuite()) for i in (0, 3)]
    runs = {e: sample(policy, tasks, SamplingConfig(group_size=3, temperature=1.0, max_new_tokens=20,
                                                    engine=e, seed=4)) for e in ("lean", "loop")}
    for a, b in zip(runs["lean"], runs["loop"]):
        assert a.completion_ids == b.completion_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2-gqa-bias"])
def test_lean_step_shares_a_prefix_between_rows(make):
    """Rows that share a prefill row (uneven counts, interleaved) read its keys in place and
    get the logits of ``model(...)`` on the cache expanded to the rows; the cache handed
    back is that expanded cache."""
    model = make()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 90, (2, 7), generator=g)
    att = torch.ones_like(ids)
    att[1, :3] = 0
    rows = torch.tensor([1, 0, 1, 1, 0])
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    shared, expanded = (DynamicCache(config=lean.causal_lm(model).config) for _ in range(2))
    with torch.no_grad():
        for c in (shared, expanded):
            model(input_ids=ids, attention_mask=att, position_ids=pos, cache=c, use_cache=True)
    expanded.reorder_cache(rows)
    step = lean.LeanStep(model, shared, att, capacity=4, rows=rows, flat=False)
    assert step.r == 3 and step.Kp[0] is shared.layers[0].keys  # read in place, not copied
    a, p = att[rows], pos[rows][:, -1:] + 1
    for _ in range(4):
        y = torch.randint(3, 90, (5,), generator=g)
        got = step(y, p)
        a = torch.cat([a, a.new_ones(5, 1)], 1)
        with torch.no_grad():
            want = model(input_ids=y[:, None], attention_mask=a, position_ids=p, cache=expanded,
                         use_cache=True).logits[:, -1]
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
        p = p + 1
    for mine, theirs in zip(step.to_cache().layers, expanded.layers):
        assert torch.allclose(mine.keys, theirs.keys, atol=1e-5)
        assert torch.allclose(mine.values, theirs.values, atol=1e-5)


def _two_prefilled(model, seed: int, length: int, pad: int):
    """Two caches of the same prefill of two prompts, the first left padded by ``pad``;
    returns them with the generator, the attention mask and the positions."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (2, length), generator=g)
    att = torch.ones_like(ids)
    att[0, :pad] = 0
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    caches = [DynamicCache(config=lean.causal_lm(model).config) for _ in range(2)]
    with torch.no_grad():
        for c in caches:
            model(input_ids=ids, attention_mask=att, position_ids=pos, cache=c, use_cache=True)
    return caches, g, att, pos


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2-gqa-bias"])
def test_lean_step_flat_for_small_buffers_agrees_with_the_shared_prefix_path(make, monkeypatch):
    """Small buffers take one fused kernel over each row's own copy of its prefix (the
    default below ``FLAT_BYTES``), larger ones the shared-prefix products. Both give the
    same logits to float rounding, with rows sharing a padded prefix, after rows are
    dropped, and in the cache they hand back."""
    model = make()
    caches, g, att, pos = _two_prefilled(model, seed=9, length=7, pad=3)
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    flat = lean.LeanStep(model, caches[0], att, capacity=5, rows=rows)
    monkeypatch.setattr(lean, "FLAT_BYTES", 0)
    shared = lean.LeanStep(model, caches[1], att, capacity=5, rows=rows)
    assert flat.flat and flat.P == 0 and flat.S == 7  # the prefix copied into each row
    assert not shared.flat and shared.P == 7 and shared.S == 0
    p = pos[rows][:, -1:] + 1
    for t in range(4):
        y = torch.randint(3, 90, (p.shape[0],), generator=g)
        if t == 2:  # rows that ended leave both steps
            keep = torch.tensor([0, 2, 5])
            flat.keep(keep)
            shared.keep(keep)
            y, p = y[keep], p[keep]
        got, want = flat(y, p), shared(y, p)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
        p = p + 1
    for mine, theirs in zip(flat.to_cache().layers, shared.to_cache().layers):
        assert mine.keys.shape == theirs.keys.shape == (3, mine.keys.shape[1], 11, mine.keys.shape[3])
        assert torch.allclose(mine.keys, theirs.keys, atol=1e-6)
        assert torch.allclose(mine.values, theirs.values, atol=1e-6)


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2-gqa-bias"])
def test_lean_step_whole_grid_skips_the_scatter_with_the_same_logits(make):
    """Rows in prompt order, the same count per prompt (a sampling chunk before any row is
    dropped): the query grid is the rows themselves. The step then skips the scatter and
    gather and returns exactly (bitwise) the logits of the general path; after a row is
    dropped it takes the general path again."""
    model = make()
    caches, g, att, pos = _two_prefilled(model, seed=5, length=6, pad=2)
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    fast, general = (lean.LeanStep(model, c, att, capacity=4, rows=rows, flat=False) for c in caches)
    assert fast.slots.whole
    general.slots.whole = False
    p = pos[rows][:, -1:] + 1
    for t in range(3):
        y = torch.randint(3, 90, (6,), generator=g)
        if t == 2:  # a row of the first prompt has ended: uneven counts, the general path
            keep = torch.tensor([0, 2, 3, 4, 5])
            fast.keep(keep)
            general.keep(keep)
            assert not fast.slots.whole
            y, p = y[keep], p[keep]
        assert torch.equal(fast(y, p), general(y, p))
        p = p + 1


def test_lean_decode_drops_ended_rows_without_changing_tokens(random_model_dir, lean_attention, monkeypatch):
    """Without a kept cache the lean decode stops computing rows that have ended; every row's
    tokens and log-probs equal the decode that keeps all rows (with the cache kept)."""
    from labkit.policy.loading import load_policy
    from labkit.policy.rollout import decode, stop_token_ids

    policy = load_policy(str(random_model_dir))
    tok = policy.tokenizer
    enc = tok(["def f(x):\n    return x\n", "x = 1\n"], return_tensors="pt", padding=True,
              add_special_tokens=False)
    ids, att = enc.input_ids.repeat_interleave(6, 0), enc.attention_mask.repeat_interleave(6, 0)
    eos = set(stop_token_ids(policy.model, tok)) | {7, 11, 13}  # extra ends: rows end apart
    kept = []
    monkeypatch.setattr(lean.LeanStep, "keep", (lambda f: lambda self, idx: (kept.append(len(idx)),
                                                                           f(self, idx)))(lean.LeanStep.keep))
    runs = {}
    for want in (False, True):
        torch.manual_seed(5)
        cfg = SamplingConfig(temperature=1.0, max_new_tokens=40, engine="lean")
        runs[want] = decode(policy.model, ids, att, cfg, eos, tok.pad_token_id, want_cache=want)[:2]
    assert kept and min(kept) < 12  # rows were dropped, only without the cache
    toks = runs[False][0]
    assert torch.equal(toks, runs[True][0])
    # log-probs agree wherever a row is still writing (its end token included); after it,
    # the positions are padding that no rollout keeps
    ended = torch.isin(toks, torch.tensor(sorted(eos))).long().cumsum(1)
    writing = (ended == 0) | ((ended == 1) & torch.isin(toks, torch.tensor(sorted(eos))))
    assert (~writing).any()
    assert torch.allclose(runs[False][1][writing], runs[True][1][writing], atol=1e-5)


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2-gqa-bias"])
def test_lean_step_transposed_prefix_keys_give_the_same_logits(make):
    """The prefix keys are copied once, transposed, for the score product. With more than one
    query per prefix (r g > 1) the logits match those of the product over a transposed view
    (bitwise at the shipped model's shapes on the machines measured; the kernel may round
    otherwise at other shapes); with one query per prefix, a matrix-vector product whose
    rounding depends on the layout, the step keeps the view and the logits are bitwise equal."""
    model = make()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 90, (2, 11), generator=g)
    att = torch.ones_like(ids)
    att[1, :4] = 0
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    cfg = lean.causal_lm(model).config
    heads_per_kv = cfg.num_attention_heads // cfg.num_key_value_heads
    for rows in (torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 1])):
        caches = [DynamicCache(config=cfg) for _ in range(2)]
        with torch.no_grad():
            for c in caches:
                model(input_ids=ids, attention_mask=att, position_ids=pos, cache=c, use_cache=True)
        copied, viewed = (lean.LeanStep(model, c, att, capacity=4, rows=rows, flat=False)
                          for c in caches)
        assert copied.KpT[0].is_contiguous() and torch.equal(copied.KpT[0], copied.Kp[0].mT)
        viewed.KpT = [k.mT for k in viewed.Kp]
        p = pos[rows][:, -1:] + 1
        for _ in range(4):
            y = torch.randint(3, 90, (rows.numel(),), generator=g)
            got, want = copied(y, p), viewed(y, p)
            if copied.r * heads_per_kv == 1:  # one query per prefix: the view itself
                assert torch.equal(got, want)
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-6), (got - want).abs().max()
            p = p + 1
