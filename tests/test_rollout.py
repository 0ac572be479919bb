"""Rollouts: batched sampling, offsets, determinism, and log-prob recomputation."""

import pytest
import torch

from labkit.env.records import RepairTask
from labkit.sandbox.records import TestSuite
from labkit.policy.loading import load_policy
from labkit.policy.rollout import (SamplingConfig, collate, pass_at_k, sample, select_rows,
                                   sequence_logprobs, token_offsets)


def _task(i, body="return x + 1"):
    return RepairTask(task_id=f"t{i}", problem_id=f"p{i}", source="s", prompt="", entry_point="f",
                      buggy_code=f"def f(x):\n    {body}\n" + "# pad\n" * i,
                      reference_code="def f(x):\n    return x\n", tests=TestSuite())


@pytest.fixture(scope="module")
def policy(random_model_dir):
    return load_policy(str(random_model_dir))


def test_sample_records_and_offsets(policy):
    cfg = SamplingConfig(group_size=3, temperature=1.0, max_new_tokens=24, stop_strings=())
    rs = sample(policy, [_task(0), _task(2)], cfg)
    assert [r.task_id for r in rs] == ["t0"] * 3 + ["t2"] * 3
    assert [r.sample for r in rs] == [0, 1, 2] * 2
    for r in rs:
        assert len(r.completion_ids) == len(r.logprobs) == len(r.offsets) > 0
        full = policy.tokenizer.decode(r.completion_ids, skip_special_tokens=False)
        # the offsets tile the decoded text exactly
        assert "".join(full[a:b] for a, b in r.offsets) == full
        assert all(lp <= 0 for lp in r.logprobs)


def test_sampling_is_deterministic_under_seed(policy):
    cfg = SamplingConfig(group_size=2, max_new_tokens=16, seed=7, stop_strings=())
    a = sample(policy, [_task(0)], cfg)
    b = sample(policy, [_task(0)], cfg)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_sampling(policy, temperature):
    cfg = SamplingConfig(group_size=4, temperature=temperature, max_new_tokens=20, stop_strings=())
    rs = sample(policy, [_task(0), _task(3)], cfg)  # different prompt lengths: left padding
    batch = collate(rs, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, ent = sequence_logprobs(policy.model, batch, temperature=temperature, with_entropy=True)
    for b, r in enumerate(rs):
        got = logp[b, :len(r.logprobs)]
        assert torch.allclose(got, torch.tensor(r.logprobs), atol=2e-4), (got, r.logprobs)
    assert (ent >= 0).all()
    assert batch["completion_mask"].sum() == sum(len(r.completion_ids) for r in rs)


@pytest.mark.parametrize("engine,sampler", [("lean", "race"), ("loop", "race"), ("generate", "race"),
                                            ("lean", "inverse_cdf"), ("loop", "inverse_cdf")])
def test_every_engine_agree_with_the_training_forward(policy, engine, sampler):
    cfg = SamplingConfig(group_size=3, temperature=0.9, top_p=0.8, max_new_tokens=12, engine=engine,
                         sampler=sampler)
    rs = sample(policy, [_task(0), _task(2)], cfg)
    batch = collate(rs, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = sequence_logprobs(policy.model, batch, temperature=0.9)
    for b, r in enumerate(rs):
        assert torch.allclose(logp[b, :len(r.logprobs)], torch.tensor(r.logprobs), atol=2e-4)


def test_decode_loop_matches_generate_when_near_greedy(policy):
    """At T -> 0 both engines take the argmax: the same tokens, the same stopping."""
    cfg = SamplingConfig(group_size=2, temperature=1e-4, max_new_tokens=16)
    a = sample(policy, [_task(0), _task(3)], cfg)
    b = sample(policy, [_task(0), _task(3)], SamplingConfig(**{**cfg.__dict__, "engine": "generate"}))
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    assert [r.finished for r in a] == [r.finished for r in b]


def test_nucleus_golden():
    from labkit.policy.rollout import nucleus

    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # mass strictly before each token (sorted): 0, 0.5, 0.8, 0.95 -> kept while < top_p
    assert nucleus(p, 0.8).tolist() == [[True, True, False, False]]
    assert nucleus(p, 0.81).tolist() == [[True, True, True, False]]
    assert nucleus(p, 1.0).tolist() == [[True, True, True, True]]


def test_token_offsets_fallback_is_exact(policy):
    tok = policy.tokenizer
    text = "def f(x):\n    return x + 1\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert token_offsets(tok, ids) == [tuple(o) for o in tok(
        text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    # a non-canonical segmentation (every token spelled character by character), as a
    # sampled completion can be: re-encoding does not give the ids back, so the prefix
    # decoding fallback must produce the spans
    odd = [tok.convert_tokens_to_ids(ch) for t in tok.convert_ids_to_tokens(ids) for ch in t]
    assert len(odd) > len(ids) and tok.decode(odd) == text
    spans = token_offsets(tok, odd)
    assert len(spans) == len(odd)
    assert "".join(text[a:b] for a, b in spans) == text
    assert all(b - a == 1 for a, b in spans)


def test_pass_at_k_golden():
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(8, 2, 8) == 1.0
    assert pass_at_k(8, 1, 2) == pytest.approx(1 - (7 / 8) * (6 / 7))


def test_exponential_race_draws_the_categorical():
    from labkit.policy.rollout import _categorical

    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0]).expand(40000, 4)
    freq = torch.bincount(_categorical(p), minlength=4).float() / 40000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.01), freq
    assert freq[3] == 0  # a token outside the nucleus (p = 0) is never drawn
    q = torch.softmax(torch.randn(64, 50), -1)
    torch.manual_seed(3)
    want = torch.multinomial(q, 1)[:, 0]
    torch.manual_seed(3)
    assert torch.equal(_categorical(q), want)  # torch's own one-sample draw, same stream


def test_exponential_noise_is_exponential_s_values_and_stream():
    """The race's noise, vectorised, is bitwise what ``Tensor.exponential_`` draws on CPU (at
    a decode step's shape and an odd one) and leaves the generator where it would."""
    from labkit.policy.rollout import exponential_noise

    torch.manual_seed(11)
    for shape, dtype in [((64, 1024), torch.float32)] * 8 + [((3, 7), torch.float32),
                                                            ((1, 1), torch.float32),
                                                            ((5, 9), torch.float64),
                                                            ((5, 9), torch.bfloat16)]:
        like = torch.empty(shape, dtype=dtype)
        start = torch.get_rng_state()
        want = torch.empty(shape, dtype=dtype).exponential_()
        after = torch.get_rng_state()
        torch.set_rng_state(start)
        got = exponential_noise(like)
        assert got.dtype == dtype and got.shape == like.shape
        assert torch.equal(got, want)
        assert torch.equal(torch.get_rng_state(), after)
        assert (got >= 0).all()


def test_shared_prompt_forward_equals_the_full_forward_and_its_gradient(policy):
    """A GRPO batch's G copies of a prompt run once: same log-probs, same gradients."""
    cfg = SamplingConfig(group_size=3, temperature=1.0, max_new_tokens=14, stop_strings=())
    rs = sample(policy, [_task(0), _task(3)], cfg)
    batch = collate(rs, policy.tokenizer.pad_token_id)
    model = policy.model
    grads = []
    for share in (True, False):
        model.zero_grad()
        logp, ent = sequence_logprobs(model, batch, 1.0, with_entropy=True, share_prompts=share)
        (logp.sum() + 0.1 * (ent * batch["completion_mask"]).sum()).backward()
        grads.append(([p.grad.clone() for p in model.parameters()], logp.detach(), ent.detach()))
    (g1, l1, e1), (g2, l2, e2) = grads
    assert torch.allclose(l1, l2, atol=1e-5) and torch.allclose(e1, e2, atol=1e-5)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()
    model.zero_grad()


def test_select_rows_cuts_only_padding_and_keeps_every_log_prob(policy):
    """A micro-batch of the short rows is narrowed to the columns they use (the long prompt's
    left padding and the long completions' right padding go), and its log-probs and
    gradients equal the full-width batch's rows."""
    cfg = SamplingConfig(group_size=3, temperature=1.0, max_new_tokens=14, stop_strings=())
    rs = sample(policy, [_task(0), _task(6)], cfg)  # task 6: six more prompt lines
    rs[1].completion_ids = rs[1].completion_ids[:3]  # a short completion among the rows
    batch = collate(rs, policy.tokenizer.pad_token_id)
    P, T = batch["prompt_len"], batch["completion_mask"].shape[1]
    rows = [0, 1, 2]
    sub = select_rows(batch, rows)
    t = sub["completion_mask"].shape[1]
    assert t == max(len(rs[i].completion_ids) for i in rows) <= T
    assert sub["prompt_len"] == max(len(rs[i].prompt_ids) for i in rows) < P
    assert torch.equal(sub["completion_mask"], batch["completion_mask"][rows, :t])
    assert torch.equal(sub["input_ids"], batch["input_ids"][rows, P - sub["prompt_len"]:P + t])
    model = policy.model
    got = []
    for b, cut in ((batch, False), (sub, True)):
        model.zero_grad()
        logp, _ = sequence_logprobs(model, b, 1.0)
        logp = logp if cut else logp[rows, :t]
        logp.sum().backward()
        got.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    (l1, g1), (l2, g2) = got
    assert torch.allclose(l1, l2, atol=1e-5)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()
    model.zero_grad()
    with pytest.raises(IndexError):
        select_rows(batch, [len(rs)])


def test_micro_batches_keep_groups_together_ordered_by_their_longest_completion(policy):
    """Three groups of 2 rows whose longest completions are 9, 3 and 6 tokens: cut into
    micro-batches of 2, each group is one micro-batch, the groups go shortest first, every row
    once; ``by_length=False`` keeps the batch order. The update's summed gradient over the
    micro-batches is the same either way (to float rounding)."""
    from labkit.policy.rollout import micro_batches

    cfg = SamplingConfig(group_size=2, temperature=1.0, max_new_tokens=12, stop_strings=())
    rs = sample(policy, [_task(0), _task(6), _task(2)], cfg)
    for r, n in zip(rs, (9, 4, 2, 3, 6, 1)):
        r.completion_ids = (r.completion_ids * 12)[:n]
    batch = collate(rs, policy.tokenizer.pad_token_id)
    assert micro_batches(batch, 2) == [[2, 3], [4, 5], [0, 1]]
    assert micro_batches(batch, 2, by_length=False) == [[0, 1], [2, 3], [4, 5]]
    cut4 = micro_batches(batch, 4)
    assert cut4 == [[2, 3, 4, 5], [0, 1]] and sorted(sum(cut4, [])) == list(range(6))
    model = policy.model
    grads = []
    for by_length in (False, True):
        model.zero_grad()
        for mb in micro_batches(batch, 2, by_length):
            logp, _ = sequence_logprobs(model, select_rows(batch, mb), 1.0)
            logp.sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def _naive_inverse_cdf(probs, u):
    """Walk each row's cumulative sum until it passes ``u`` times the row's total."""
    out = []
    for row, v in zip(probs.double().tolist(), u[:, 0].tolist()):
        target, acc = v * sum(row), 0.0
        for i, p in enumerate(row):
            acc += p
            if acc > target:
                out.append(i)
                break
        else:
            out.append(len(row) - 1)
    return out


def test_inverse_cdf_draws_the_categorical_and_equals_a_naive_walk():
    from labkit.policy.rollout import _inverse_cdf, draw

    torch.manual_seed(0)
    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0]).expand(40000, 6)
    y = _inverse_cdf(p, torch.rand(40000, 1, dtype=torch.float64))
    freq = torch.bincount(y, minlength=6).float() / 40000
    assert torch.allclose(freq, p[0], atol=0.01), freq
    assert freq[[0, 2, 5]].sum() == 0  # tokens of probability 0 (outside the nucleus) never come
    # the edges: u = 0 takes the first token with mass, u just below 1 the last one
    u = torch.tensor([[0.0], [1 - 2 ** -53], [0.25], [0.6]], dtype=torch.float64)
    assert _inverse_cdf(p[:4], u).tolist() == [1, 4, 1, 3] == _naive_inverse_cdf(p[:4], u)
    q = torch.softmax(3 * torch.randn(64, 300), -1).masked_fill(torch.rand(64, 300) < 0.3, 0.0)
    u = torch.rand(64, 1, dtype=torch.float64)
    assert _inverse_cdf(q, u).tolist() == _naive_inverse_cdf(q, u)
    # through draw(): the nucleus is honoured, and one uniform per row is all it takes from
    # the random stream
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(20000, 4)
    torch.manual_seed(1)
    y, logp = draw(logits, 1.0, top_p=0.7, sampler="inverse_cdf")
    after = torch.rand(1)
    torch.manual_seed(1)
    torch.rand(20000, 1, dtype=torch.float64)
    assert torch.equal(after, torch.rand(1))
    kept = torch.softmax(logits[0, :2], -1)  # the 0.7 nucleus of softmax([2, 1, 0, -1]): 2 tokens
    freq = torch.bincount(y, minlength=4).float() / 20000
    assert torch.allclose(freq[:2], kept, atol=0.015) and freq[2:].sum() == 0, freq


def test_the_inverse_cdf_sampler_samples_the_policy_like_the_race(policy):
    """Both samplers through :func:`sample`: each deterministic under its seed, other tokens
    than each other (another random stream), and each first token drawn as often as the
    policy's ``softmax(z / T)`` says (within 4 standard errors over 2,000 draws, for every
    token of probability > 0.01);
    ``generate`` refuses the inverse CDF with a clear error."""
    from labkit.policy.prompts import build_prompt

    T, n = 0.1, 2000  # a cold sampler: the random model's first token has a few likely values
    ids = policy.tokenizer(build_prompt(_task(0), policy.tokenizer), return_tensors="pt",
                           add_special_tokens=False).input_ids
    with torch.no_grad():
        p = torch.softmax(policy.model(input_ids=ids).logits[0, -1].float() / T, -1)
    likely = (p > 0.01).nonzero().flatten()
    assert len(likely) >= 3  # the check compares several tokens' frequencies
    firsts = {}
    for sampler in ("race", "inverse_cdf"):
        cfg = SamplingConfig(group_size=n, temperature=T, max_new_tokens=1, seed=5, batch_size=n,
                             sampler=sampler)
        rs = sample(policy, [_task(0)], cfg)
        assert [r.completion_ids for r in rs] == [r.completion_ids for r in sample(policy, [_task(0)], cfg)]
        eos = policy.tokenizer.eos_token_id  # a completion that ended at once holds no token
        firsts[sampler] = torch.tensor([r.completion_ids[0] if r.completion_ids else eos for r in rs])
        freq = torch.bincount(firsts[sampler], minlength=len(p)).float()[:len(p)] / n
        se = (p * (1 - p) / n).sqrt()
        assert ((freq[likely] - p[likely]).abs() <= 4 * se[likely] + 1e-3).all(), \
            (sampler, freq[likely], p[likely])
    assert not torch.equal(firsts["race"], firsts["inverse_cdf"])
    with pytest.raises(ValueError, match="engine 'generate' draws with torch.multinomial"):
        SamplingConfig(engine="generate", sampler="inverse_cdf").validate()
    with pytest.raises(ValueError, match="sampler must be one of"):
        SamplingConfig(sampler="gumbel").validate()


def _chunk_by_chunk(policy, tasks, cfg, threads):
    """A naive second form of ``parallel_chunks > 1``: each chunk (here one task's group)
    sampled alone, one after another, from torch's global stream seeded with its chunk's
    seed, at ``threads`` intra-op threads (float rounding can depend on them)."""
    import dataclasses

    from labkit.policy.rollout import chunk_seed, intra_op_threads

    out = []
    with intra_op_threads(threads):
        for k, task in enumerate(tasks):
            one = dataclasses.replace(cfg, parallel_chunks=1, seed=chunk_seed(cfg.seed, k))
            out += sample(policy, [task], one)
    return out


@pytest.mark.parametrize("engine,sampler", [("lean", "race"), ("lean", "inverse_cdf"),
                                            ("loop", "race"), ("generate", "race")])
def test_parallel_chunks_draw_each_chunk_from_its_own_stream(policy, engine, sampler, monkeypatch):
    """``parallel_chunks = 2``: the chunks decode on two threads at one intra-op thread each,
    and every chunk's completions and log-probs are what that chunk sampled alone from its own
    seed; the first chunk's seed is ``seed``, so it matches a ``parallel_chunks = 1`` run's.
    The intra-op thread count is restored afterwards; at one intra-op thread the chunks run
    one after another in the calling thread, with the same numbers."""
    import threading

    import labkit.policy.rollout as rollout

    tasks = [_task(0), _task(2), _task(3)]  # three chunks of G rows: prompts of other lengths
    cfg = SamplingConfig(group_size=3, temperature=1.0, max_new_tokens=12, batch_size=3,
                         seed=11, engine=engine, sampler=sampler, parallel_chunks=2)
    seen = []
    decode = rollout.decode

    def spy(*args, **kwargs):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return decode(*args, **kwargs)

    monkeypatch.setattr(rollout, "decode", spy)
    threads = torch.get_num_threads()
    with rollout.intra_op_threads(2):
        got = sample(policy, tasks, cfg)
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == threads
    # the two decode threads get one intra-op thread each; generate runs here, on two
    want = _chunk_by_chunk(policy, tasks, cfg, 2 if engine == "generate" else 1)
    assert [(r.task_id, r.sample) for r in got] == [(r.task_id, r.sample) for r in want]
    assert [r.completion_ids for r in got] == [r.completion_ids for r in want]
    assert [r.logprobs for r in got] == [r.logprobs for r in want]
    if engine == "generate":  # the global stream: one chunk after another, in this thread
        assert seen == []
    else:
        parallel = seen[:3]
        assert all(name.startswith("labkit-decode") for name, _ in parallel), parallel
        assert {n for _, n in parallel} == {1}
        # one intra-op thread: the chunks one after another in this thread, the same numbers
        seen.clear()
        with rollout.intra_op_threads(1):
            serial = sample(policy, tasks, cfg)
        assert [name for name, _ in seen] == [threading.current_thread().name] * 3
        assert [(r.completion_ids, r.logprobs) for r in serial] == \
            [(r.completion_ids, r.logprobs) for r in got]
    assert rollout.chunk_seed(cfg.seed, 0) == cfg.seed  # the first chunk samples what "1" does
    assert len({rollout.chunk_seed(cfg.seed, k) for k in range(100)}) == 100


def test_parallel_chunks_is_checked():
    with pytest.raises(ValueError, match="parallel_chunks must be >= 1, got 3, 256, 64 and 0"):
        SamplingConfig(group_size=3, parallel_chunks=0).validate()


def test_parallel_chunks_of_a_self_rewriting_rope_decode_one_after_another(random_model_dir, tmp_path,
                                                                           monkeypatch):
    """A dynamic-NTK rotary embedding rewrites its frequencies as it runs: its chunks decode in
    the calling thread, one after another, from the same per-chunk streams (the tokens of
    each chunk sampled alone from its seed). So do any model's under CPU autocast."""
    import json
    import shutil
    import threading

    import labkit.policy.rollout as rollout

    folder = tmp_path / "dynamic"
    shutil.copytree(random_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "dynamic", "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    dynamic = load_policy(str(folder))
    assert rollout.rewrites_itself(dynamic.model)
    assert not rollout.rewrites_itself(load_policy(str(random_model_dir)).model)
    names = []
    decode = rollout.decode
    monkeypatch.setattr(rollout, "decode", lambda *a, **k: names.append(
        threading.current_thread().name) or decode(*a, **k))
    tasks = [_task(0), _task(2)]
    cfg = SamplingConfig(group_size=2, max_new_tokens=10, batch_size=2, seed=3, parallel_chunks=2)
    with rollout.intra_op_threads(2):
        got = sample(dynamic, tasks, cfg)
    assert names == [threading.current_thread().name] * 2
    want = _chunk_by_chunk(dynamic, tasks, cfg, 2)
    assert [(r.completion_ids, r.logprobs) for r in got] == [(r.completion_ids, r.logprobs) for r in want]
    # under CPU autocast (a per-thread setting) the plain model's chunks stay here too
    names.clear()
    plain = load_policy(str(random_model_dir))
    with rollout.intra_op_threads(2), torch.autocast("cpu", dtype=torch.bfloat16):
        sample(plain, tasks, cfg)
    assert names == [threading.current_thread().name] * 2
