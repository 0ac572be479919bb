"""Counterfactual forking: positions, proposals, prefix-cache reuse against a naive
re-encoding, lineage, and edit-level counterfactuals on hand-built diffs."""

import dataclasses
import math

import pytest
import torch

from labkit.loops.hunks import hunk_effects
from labkit.sandbox.records import Candidate, IOCase, SandboxResult, Status, TestSuite
from labkit.env.records import RepairTask
from labkit.policy import forking as fk
from labkit.policy.loading import load_policy
from labkit.policy.prompts import extract_code
from labkit.policy.rollout import KVRow, Rollout, SamplingConfig, sample, sample_with_cache

# ----------------------------------------------------------------------------- hand-built diffs

BUGGY = ("def f(xs):\n"
         "    total = 0\n"
         "    for x in xs:\n"
         "        total -= x\n"
         "    y = 1\n"
         "    total = total\n"
         "    return total\n")
FIXED = ("def f(xs):\n"
         "    # sum\n"
         "    total = 0\n"
         "    for x in xs:\n"
         "        total += x\n"
         "    y = 1\n"
         "    return total\n")


def _char_rollout(code: str, task_id: str = "t", sample_index: int = 0) -> Rollout:
    """A rollout whose completion is ``code`` with one token per character."""
    n = len(code)
    return Rollout(task_id=task_id, sample=sample_index, prompt="", prompt_ids=[1],
                   completion_ids=list(range(n)), logprobs=[0.0] * n, completion=code, code=code,
                   code_start=0, offsets=[(i, i + 1) for i in range(n)], finished=True)


def test_split_hunks_golden():
    hunks = fk.split_hunks(BUGGY, FIXED)
    assert [(h.kind, h.before, h.after) for h in hunks] == [
        ("insert", (1, 1), (1, 2)), ("replace", (3, 4), (4, 5)), ("delete", (5, 6), (6, 6))]
    assert hunks[1].before_lines == ("        total -= x\n",)
    assert hunks[1].after_lines == ("        total += x\n",)
    assert fk.split_hunks(BUGGY, BUGGY) == []
    # adjacent changes form one hunk
    merged = fk.split_hunks("a\nb\nc\n", "a\nB\nC\nD\n")
    assert [(h.before, h.after) for h in merged] == [((1, 3), (1, 4))]


def test_revert_hunks():
    hunks = fk.split_hunks(BUGGY, FIXED)
    assert fk.revert_hunks(FIXED, hunks, []) == FIXED
    assert fk.revert_hunks(FIXED, hunks, range(len(hunks))) == BUGGY
    assert fk.revert_hunks(FIXED, hunks, [1]) == FIXED.replace("total += x", "total -= x")
    assert fk.revert_hunks(FIXED, hunks, [0]) == FIXED.replace("    # sum\n", "")
    assert fk.revert_hunks(FIXED, hunks, [2]) == FIXED.replace(
        "    return total\n", "    total = total\n    return total\n")
    assert fk.revert_hunks(FIXED, hunks, [0, 2]) == BUGGY.replace("total -= x", "total += x")


def test_hunk_spans_and_diff_positions():
    hunks = fk.split_hunks(BUGGY, FIXED)
    line = FIXED.splitlines(keepends=True)
    start = [sum(len(s) for s in line[:i]) for i in range(len(line) + 1)]
    assert fk.hunk_char_span(FIXED, hunks[0]) == (start[1], start[2])
    assert fk.hunk_char_span(FIXED, hunks[1]) == (start[4], start[5])
    assert fk.hunk_char_span(FIXED, hunks[2]) == (start[6], start[6])  # where the deletion was
    r = _char_rollout(FIXED)
    expected = list(range(start[1], start[2])) + list(range(start[4], start[5])) + [start[6]]
    assert fk.changed_tokens(r, BUGGY) == expected
    assert fk.changed_tokens(_char_rollout(BUGGY), BUGGY) == []
    # the strategy samples inside the edit only
    got = fk.choose_positions([r], fk.PositionConfig(strategy="diff", fraction=0.1, budget=100),
                              buggy_code={"t": BUGGY})[0]
    assert len(got) == math.ceil(0.1 * len(FIXED)) and set(got) <= set(expected)
    with pytest.raises(ValueError, match="buggy code"):
        fk.choose_positions([r], fk.PositionConfig(strategy="diff"))


def test_uniform_positions_count_range_and_seed():
    rs = [_char_rollout("x" * 50, sample_index=i) for i in range(3)]
    cfg = fk.PositionConfig(fraction=0.2, budget=32, seed=3)
    pos = fk.choose_positions(rs, cfg)
    for p in pos:
        assert len(p) == 10 and p == sorted(set(p)) and all(0 <= t < 50 for t in p)
    assert pos == fk.choose_positions(rs, cfg)  # deterministic
    assert pos[0] != pos[1]  # each rollout has its own stream
    assert pos != fk.choose_positions(rs, fk.PositionConfig(fraction=0.2, seed=4))
    assert [len(p) for p in fk.choose_positions(rs, fk.PositionConfig(budget=4))] == [4, 4, 4]
    assert fk.fork_count(0, 0.2, 8) == 0 and fk.fork_count(1, 0.2, 8) == 1


def test_entropy_positions_and_registry():
    r = _char_rollout("abcdef")
    ent = [[0.1, 0.9, 0.3, 0.9, 0.0, 0.5]]
    got = fk.choose_positions([r], fk.PositionConfig(strategy="entropy", fraction=0.5),
                              entropy=ent)
    assert got == [[1, 3, 5]]
    with pytest.raises(ValueError, match="already registered"):
        fk.register_positions("uniform")(lambda r, k, rng, inputs: [])
    assert fk.register_positions("uniform")(fk.uniform_positions) is fk.uniform_positions
    with pytest.raises(ValueError, match="unknown position strategy"):
        fk.choose_positions([r], fk.PositionConfig(strategy="nope"))


def test_alternative_probs_golden():
    z = torch.tensor([[2.0, 1.0, 0.0, -float("inf")]])
    y = torch.tensor([0])
    e = math.e
    q = fk.alternative_probs(z, y, temperature=1.0)
    assert torch.allclose(q, torch.tensor([[0.0, e / (e + 1), 1 / (e + 1), 0.0]]))
    # the nucleus at 0.5 is {y}: fall back to all of p without y
    assert torch.allclose(fk.alternative_probs(z, y, 1.0, top_p=0.5), q)
    # the nucleus at 0.9 is {0, 1}: the alternative must be 1
    assert torch.equal(fk.alternative_probs(z, y, 1.0, top_p=0.9), torch.tensor([[0., 1., 0., 0.]]))
    assert torch.equal(fk.alternative_probs(z, y, 1.0, banned=[1]), torch.tensor([[0., 0., 1., 0.]]))
    # no other token has mass: keep the factual one
    stuck = torch.tensor([[0.0, -float("inf"), -float("inf")]])
    assert torch.equal(fk.alternative_probs(stuck, y, 1.0), torch.tensor([[1., 0., 0.]]))
    # temperature sharpens p
    hot = fk.alternative_probs(z, y, temperature=0.5)
    assert torch.allclose(hot[0, 1], torch.tensor(e**2 / (e**2 + 1)))


# ----------------------------------------------------------------------------- edit-level effects

SUM_TESTS = TestSuite(cases=(IOCase(args=([1, 2, 3],), expected=6), IOCase(args=([],), expected=0),
                             IOCase(args=([5],), expected=5)))


def _sum_task() -> RepairTask:
    return RepairTask(task_id="t", problem_id="t", source="hand", prompt="", buggy_code=BUGGY,
                      reference_code=FIXED, tests=SUM_TESTS, entry_point="f")


def _run_in_process(candidates):
    """A trusted stand-in for the sandbox (the programs here are hand-written)."""
    out = []
    for c in candidates:
        env: dict = {}
        exec(c.code, env)
        passed = sum(env[c.entry_point](*case.args) == case.expected for case in c.tests.cases)
        total = c.tests.total
        out.append(SandboxResult(status=Status.PASSED if passed == total else Status.FAILED,
                                 passed=passed, total=total))
    return out


def test_hunk_effects_with_a_fake_runner():
    calls: list[list[Candidate]] = []

    def run(cands):
        calls.append(list(cands))
        return _run_in_process(cands)

    rs = [_char_rollout(FIXED, sample_index=0), _char_rollout(FIXED, sample_index=1)]
    effects = hunk_effects(rs, {"t": _sum_task()}, run=run)
    assert len(calls) == 1 and len(calls[0]) == 4  # one batch; identical programs run once
    assert [(e.sample, e.k) for e in effects] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    by_k = {e.k: e for e in effects if e.sample == 0}
    assert by_k[1].reward == 1.0 and by_k[1].reward_without == pytest.approx(1 / 3)
    assert by_k[1].effect == pytest.approx(2 / 3)
    assert by_k[0].effect == 0.0 and by_k[2].effect == 0.0
    assert FIXED[slice(*by_k[1].char_span)] == "        total += x\n"
    assert by_k[1].tokens == tuple(range(*by_k[1].char_span))  # one token per character
    # a custom reward: all tests or nothing
    strict = hunk_effects(rs[:1], {"t": _sum_task()}, run=run, reward=lambda r: float(r.ok))
    assert [e.effect for e in strict] == [0.0, 1.0, 0.0]


def test_hunk_effects_in_the_sandbox():
    sandbox = pytest.importorskip("labkit.sandbox.pool")
    effects = hunk_effects([_char_rollout(FIXED)], {"t": _sum_task()}, run=sandbox.run_many)
    assert [round(e.effect, 6) for e in effects] == [0.0, round(2 / 3, 6), 0.0]
    assert all(e.reward == 1.0 for e in effects)


# ----------------------------------------------------------------------------- forks of a real model


def _task(i: int) -> RepairTask:
    return RepairTask(task_id=f"t{i}", problem_id=f"p{i}", source="s", prompt="", entry_point="f",
                      buggy_code="def f(x):\n    return x + 1\n" + "# pad\n" * i,
                      reference_code="def f(x):\n    return x\n", tests=TestSuite())


SAMPLING = SamplingConfig(group_size=2, temperature=1.0, max_new_tokens=16, batch_size=4,
                          stop_strings=())


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """32-wide matrices: a second intra-op thread only adds synchronisation, which on a
    shared 2-core machine costs milliseconds per op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def policy(random_model_dir):
    """The fixture's model with its matrices redrawn at std 0.3: at the usual init (0.02) a
    32-wide model is nearly a unigram model, its outputs hardly depend on the context, and a
    misplaced key or position would go unnoticed."""
    policy = load_policy(str(random_model_dir))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.dim() == 2:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return policy


@pytest.fixture(scope="module")
def sampled(policy):
    """Six rollouts of three prompt lengths, sampled in two chunks (two source caches)."""
    return sample_with_cache(policy, [_task(0), _task(4), _task(9)], SAMPLING)


def _positions(rollouts):
    """Different t per rollout: the first step, a middle one, the last one."""
    return [sorted({0, (i + 3) % r.n_tokens, r.n_tokens - 1}) for i, r in enumerate(rollouts)]


def _naive(policy, parent: Rollout, t: int, alt: int, config: fk.ForkConfig):
    """Re-encode prompt + y_<t + alt and decode greedily; the log-probs of alt and of the
    continuation under the same temperature."""
    x = torch.tensor([parent.prompt_ids + parent.completion_ids[:t]])
    with torch.no_grad():
        z_t = policy.model(input_ids=x).logits[0, -1]
        lp_alt = torch.log_softmax(z_t / config.temperature, -1)[alt].item()
        xa = torch.cat([x, torch.tensor([[alt]])], dim=1)
        budget = config.max_new_tokens - t - 1
        if budget == 0:
            return [], [lp_alt]
        gen = policy.model.generate(input_ids=xa, attention_mask=torch.ones_like(xa),
                                    do_sample=False, max_new_tokens=budget,
                                    pad_token_id=policy.tokenizer.pad_token_id,
                                    output_logits=True, return_dict_in_generate=True)
    cont = gen.sequences[0, xa.shape[1]:]
    logits = torch.stack(gen.logits, 1)[0].float() / config.temperature
    lps = torch.log_softmax(logits, -1).gather(-1, cont[:, None])[:, 0]
    return cont.tolist(), [lp_alt] + lps.tolist()


def test_sample_with_cache_matches_sample(policy, sampled):
    rs, kv = sampled
    assert [r.completion_ids for r in rs] == [r.completion_ids for r in
                                              sample(policy, [_task(0), _task(4), _task(9)], SAMPLING)]
    assert len({id(k.cache) for k in kv}) == 2
    assert len({len(r.prompt_ids) for r in rs}) == 3


def test_forks_reuse_prefix_cache_and_match_naive_greedy(policy, sampled):
    rs, kv = sampled
    cfg = fk.ForkConfig.from_sampling(SAMPLING, greedy=True, batch_size=5)
    positions = _positions(rs)
    batch = fk.fork(policy, rs, positions, cfg, kv=kv)
    n = sum(len(p) for p in positions)
    assert len(batch.forks) == n
    for f in batch.forks:
        parent = rs[[(r.task_id, r.sample) for r in rs].index((f.task_id, f.parent_sample))]
        cont, lps = _naive(policy, parent, f.t, f.alt_token, cfg)
        assert f.rollout.completion_ids == parent.completion_ids[:f.t] + [f.alt_token] + cont
        assert torch.allclose(torch.tensor(f.rollout.logprobs[f.t:]), torch.tensor(lps), atol=1e-4)
        assert f.rollout.logprobs[:f.t] == parent.logprobs[:f.t]
    # honest cost: one recomputed position per fork against |x| + t re-encoded naively
    prefix = sum(len(rs[i].prompt_ids) + t for i, ts in enumerate(positions) for t in ts)
    assert batch.stats.recomputed_positions == n and batch.stats.prefix_positions == prefix
    # the same forks from a cache built by one forward, and from naive re-encoding
    rebuilt = fk.fork(policy, rs, positions, cfg)
    props = fk.propose_alternatives(policy.baseline(), rs, positions, cfg,
                                    policy.tokenizer.pad_token_id)
    naive = fk.continue_forks(policy, rs, props, cfg, kv=None)
    for other in (rebuilt, naive):
        assert [f.rollout.completion_ids for f in other.forks] == \
               [f.rollout.completion_ids for f in batch.forks]
    longest = {i: len(rs[i].prompt_ids) + max(ts) for i, ts in enumerate(positions)}
    assert rebuilt.stats.recomputed_positions == n + sum(v - 1 for v in longest.values())
    assert naive.stats.recomputed_positions == prefix
    # the comparison has power: a cache misaligned by one column changes the log-probs
    shifted = [KVRow(k.cache, k.row, k.offset + 1) for k in kv]
    late = [p for p in props if p.t >= 2]
    bad = fk.continue_forks(policy, rs, late, cfg, kv=shifted)
    good = fk.continue_forks(policy, rs, late, cfg, kv=kv)
    assert not torch.allclose(torch.tensor(bad.forks[0].rollout.logprobs),
                              torch.tensor(good.forks[0].rollout.logprobs), atol=1e-4)
    with pytest.raises(ValueError, match="holds no"):
        fk.continue_forks(policy, rs, late, cfg, kv=[KVRow(k.cache, k.row, -1) for k in kv])


@pytest.mark.parametrize("stop", [(), ("e",)])
def test_lean_fork_decode_equals_generate(policy, sampled, stop, lean_attention):
    """The lean continuation loop and transformers' ``generate`` give the same greedy forks:
    the same tokens (per-row budgets, EOS and stop strings included) and log-probs, from the
    kept cache and from re-encoding. A stop string that occurs makes the check bite: the
    forks then end early, and both engines must end them at the same token."""
    rs, kv = sampled
    tok = policy.tokenizer
    positions = _positions(rs)
    runs = {}
    for engine in ("lean", "generate"):
        cfg = fk.ForkConfig.from_sampling(SAMPLING, greedy=True, batch_size=4, engine=engine,
                                          stop_strings=stop)
        props = fk.propose_alternatives(policy.baseline(), rs, positions, cfg, tok.pad_token_id)
        runs[engine] = [fk.continue_forks(policy, rs, props, cfg, kv=k) for k in (kv, None)]
    for lean_batch, gen_batch in zip(runs["lean"], runs["generate"]):
        assert [f.rollout.completion_ids for f in lean_batch.forks] == \
               [f.rollout.completion_ids for f in gen_batch.forks]
        for a, b in zip(lean_batch.forks, gen_batch.forks):
            assert torch.allclose(torch.tensor(a.rollout.logprobs), torch.tensor(b.rollout.logprobs),
                                  atol=1e-4)
        assert lean_batch.stats.generated_tokens == gen_batch.stats.generated_tokens
    lengths = [len(f.rollout.completion_ids) for f in runs["lean"][0].forks]
    full = [f.t + 1 + max(SAMPLING.max_new_tokens - f.t - 1, 0) for f in runs["lean"][0].forks]
    if stop:  # some forks stopped at the stop string, before their budget
        assert any(n < m for n, m in zip(lengths, full))
        for f in runs["lean"][0].forks:
            text = tok.decode(f.rollout.completion_ids[f.t + 1:-1], skip_special_tokens=False)
            assert "e" not in text
    assert fk.ForkConfig.from_sampling(SAMPLING).engine == "lean"
    assert fk.ForkConfig.from_sampling(dataclasses.replace(SAMPLING, engine="generate")).engine == \
        "generate"
    with pytest.raises(ValueError, match="engine"):
        fk.ForkConfig(engine="vllm").validate()
    # the parents' sampler carries over to the forks; generate cannot take the inverse CDF
    assert fk.ForkConfig.from_sampling(dataclasses.replace(SAMPLING, sampler="inverse_cdf")).sampler == \
        "inverse_cdf"
    with pytest.raises(ValueError, match="draws with torch.multinomial"):
        fk.ForkConfig(engine="generate", sampler="inverse_cdf").validate()


def test_fork_lineage_and_records(policy, sampled):
    rs, kv = sampled
    cfg = fk.ForkConfig.from_sampling(SAMPLING, seed=1)
    positions = fk.choose_positions(rs, fk.PositionConfig(fraction=0.25, seed=1))
    batch = fk.fork(policy, rs, positions, cfg, kv=kv)
    sites = [(r.task_id, r.sample, t) for r, ts in zip(rs, positions) for t in ts]
    assert [(f.task_id, f.parent_sample, f.t) for f in batch.forks] == sites
    tok = policy.tokenizer
    for f in batch.forks:
        parent = next(r for r in rs if (r.task_id, r.sample) == (f.task_id, f.parent_sample))
        r = f.rollout
        assert f.factual_token == parent.completion_ids[f.t] and f.differs
        assert r.completion_ids[:f.t] == parent.completion_ids[:f.t]
        assert r.completion_ids[f.t] == f.alt_token
        assert (r.task_id, r.sample, r.prompt_ids) == (parent.task_id, parent.sample,
                                                        parent.prompt_ids)
        assert r.meta == {"fork_of": [f.task_id, f.parent_sample], "fork_t": f.t}
        assert r.n_tokens == len(r.logprobs) == len(r.offsets) <= cfg.max_new_tokens
        assert all(lp <= 0 for lp in r.logprobs)
        full = tok.decode(r.completion_ids, skip_special_tokens=False)
        assert "".join(full[a:b] for a, b in r.offsets) == full
        assert r.code == extract_code(r.completion)
        assert f.logp_alt_baseline <= 0 and f.to_dict()["rollout"]["task_id"] == f.task_id
    again = fk.fork(policy, rs, positions, cfg, kv=kv)
    assert [f.rollout.completion_ids for f in again.forks] == \
           [f.rollout.completion_ids for f in batch.forks]
    with pytest.raises(ValueError, match="temperature"):
        fk.fork(policy, rs, positions, fk.ForkConfig(temperature=0.5), kv=kv)


def test_proposals_follow_the_baseline(policy, sampled):
    rs, _ = sampled
    base = policy.baseline()
    cfg = fk.ForkConfig.from_sampling(SAMPLING, greedy=True)
    positions = _positions(rs)
    props = fk.propose_alternatives(base, rs, positions, cfg, policy.tokenizer.pad_token_id)
    for p in props:
        r = rs[p.parent]
        with torch.no_grad():
            z = base(input_ids=torch.tensor([r.prompt_ids + r.completion_ids[:p.t]])).logits[0, -1]
        logp = torch.log_softmax(z / cfg.temperature, -1)
        masked = z.clone()
        masked[[p.factual, policy.tokenizer.pad_token_id]] = -float("inf")
        assert p.alt == int(masked.argmax()) != p.factual
        assert p.logp_alt == pytest.approx(logp[p.alt].item(), abs=1e-4)
        assert p.logp_factual == pytest.approx(logp[p.factual].item(), abs=1e-4)


def test_entropy_strategy_on_the_model(policy, sampled):
    rs, _ = sampled
    ent = fk.token_entropy(policy.model, rs, policy.tokenizer.pad_token_id)
    assert [len(e) for e in ent] == [r.n_tokens for r in rs]
    pos = fk.choose_positions(rs, fk.PositionConfig(strategy="entropy", fraction=0.25), entropy=ent)
    for e, p in zip(ent, pos):
        top = sorted(range(len(e)), key=lambda i: (-e[i], i))[:len(p)]
        assert p == sorted(top)
