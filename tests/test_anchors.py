"""DiDPO diff anchors: hand-built rollouts, hand-computed golden numbers, a naive token loop."""

import json
import math
import re

import pytest
import torch

from labkit.credit.advantages import ADVANTAGE_ESTIMATORS, AdvantageInput, compute_advantages
from labkit.credit.anchors import (align, anchor_records, anchors_frame, ast_units, choose_pairs,
                                   find_occurrences, groupability, merge_near_duplicates,
                                   returns_to_go, similarity, synthetic_group, task_anchors)
from labkit.credit.diffs import normalise_line, normalised_lines, root_diff
from labkit.env.records import RepairTask
from labkit.sandbox.records import TestSuite
from labkit.policy.rollout import Rollout

PREFIX = "Fixed:\n"  # chatter before the code, so code_start != 0
WORD = re.compile(r"\s*\S+")  # one token per word, leading whitespace attached


def rollout(code: str, sample: int = 0) -> Rollout:
    completion = PREFIX + code
    offsets = [m.span() for m in WORD.finditer(completion)]
    return Rollout(task_id="t", sample=sample, prompt="", prompt_ids=[1],
                   completion_ids=[0] * len(offsets), logprobs=[0.0] * len(offsets),
                   completion=completion, code=code, code_start=len(PREFIX), offsets=offsets,
                   finished=True)


def task(buggy: str) -> RepairTask:
    return RepairTask(task_id="t", problem_id="t", source="toy", prompt="", buggy_code=buggy,
                      reference_code=buggy, tests=TestSuite(), entry_point="f")


def estimate(name: str, buggy: str, rollouts, rewards, **opts):
    T = max(r.n_tokens for r in rollouts)
    mask = torch.tensor([[1.0] * r.n_tokens + [0.0] * (T - r.n_tokens) for r in rollouts],
                        dtype=torch.float64)
    r = torch.tensor(rewards, dtype=torch.float64)
    inp = AdvantageInput(r, ["t"] * len(rollouts), mask, rollouts=rollouts,
                         tasks=[task(buggy)] * len(rollouts))
    out = compute_advantages(name, inp, **opts)
    return out.advantages, out.metrics, out.artifacts.get("anchors", {}).get("t", [])


def grpo_by_hand(rewards):
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-6) for r in rewards]


def phi(L):
    return 1 - math.exp(-L / 8)


def psi(n):
    return 1 - math.exp(-(n - 1) / 8)


# A hand-worked group of four: r0 and r1 make the same fix (r1 adds a comment), r2 a near
# variant, r3 copies the buggy code.
BUGGY = "def f(x):\n    y = x - 1\n    return y\n"
GROUP = ["def f(x):\n    y = x + 1\n    return y\n",
         "def f(x):\n    y = x + 1  # fixed\n    return y\n",
         "def f(x):\n    y = x + 2\n    return y\n",
         BUGGY]
REWARDS = [1.0, 0.5, 0.0, 0.0]
FIX_TOKENS = [3, 4, 5, 6, 7]  # "\n    y", " =", " x", " +", " 1"

# Overlap: every rollout changes line A the same way; r0, r1 also change B, r2, r3 change C.
BUGGY2 = "def g(x):\n    a = x\n    b = a * 2\n    return b\n"
A, B, C = "    a = x + 1\n", "    b = a * 3\n", "    b = abs(a) // 2\n"
OVERLAP = [f"def g(x):\n{A}{B}    return b\n"] * 2 + [f"def g(x):\n{A}{C}    return b\n"] * 2
REWARDS2 = [1.0, 0.5, 0.0, 0.5]


# ----------------------------------------------------------------- groupability


def test_groupability_golden():
    assert groupability(1, 2) == pytest.approx((1 - math.exp(-1 / 8)) * (1 - math.exp(-1 / 8)))
    assert groupability(3, 5) == pytest.approx(phi(3) * psi(5))
    assert groupability(40, 1) == 0.0  # nobody else produced it
    assert groupability(1, 2, form="add") == pytest.approx((phi(1) + psi(2)) / 2)
    assert groupability(2, 1, form="add") == pytest.approx(phi(2) / 2)
    assert groupability(2, 3, form="log") == pytest.approx(math.log(1.25) * math.log(1.25))
    assert groupability(2, 3, s0=4, g0=2) == pytest.approx((1 - math.exp(-.5)) * (1 - math.exp(-1)))


def test_returns_to_go():
    assert returns_to_go([0.0, 0.0, 1.0]) == pytest.approx([0.95 ** 2, 0.95, 1.0])
    assert returns_to_go([1.0, 2.0], gamma=0.5) == pytest.approx([2.0, 2.0])
    assert returns_to_go([]) == []


# ----------------------------------------------------------------- root diffs


def test_normalisation_and_spans_into_the_completion():
    assert normalise_line("    y=x+1  # fix") == "y = x + 1"
    assert normalise_line("s = '#no comment'  # c") == "s = '#no comment'"
    assert normalise_line("    # only a comment") == ""
    assert normalise_line('"""an open docstring') == '"""an open docstring'  # kept raw
    r = rollout(GROUP[1])
    lines = normalised_lines(r.code, r.code_start)
    assert [(line.index, line.text) for line in lines] == [
        (0, "def f ( x ) :"), (1, "y = x + 1"), (2, "return y")]
    assert [r.completion[slice(*line.span)] for line in lines] == [
        "def f(x):", "y = x + 1", "return y"]  # indentation and comment outside the span


def test_root_diff_and_diff_gate():
    r = rollout(GROUP[1])
    root = root_diff(r.code, BUGGY, r.code_start)
    assert root.texts == ("y = x + 1",)
    assert r.completion[slice(*root.lines[0].span)] == "y = x + 1"
    assert root_diff(BUGGY, BUGGY).lines == ()  # copy
    buggy = "def f(x):\n    a = 1\n    b = 2\n    return a + b\n"
    assert root_diff("def f(x):\n    a=1\n    b = (2)  # two\n    return a+b\n", buggy).lines == ()
    moved = root_diff("def f(x):\n    b = 2\n    a = 1\n    return a - b\n", buggy)
    assert moved.texts == ("return a - b",)  # the moved line is re-emitted code: gated
    assert root_diff(r.code, BUGGY, code_start=-1).lines == ()  # code not found in completion


def test_hunks_and_ast_units():
    buggy = "def f(x):\n    return x - 1\n\n\ndef g(x):\n    y = x\n    return y * 3\n"
    code = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    y = abs(x)\n    return y * 2\n"
    root = root_diff(code, buggy)
    assert root.texts == ("return x + 1", "y = abs ( x )", "return y * 2")
    assert [line.hunk for line in root.lines] == [0, 1, 1]
    assert root.hunks() == [(0, 1), (1, 3)]
    assert ast_units(root, code) == [(0, 1), (1, 3)]  # f's lines, g's lines (= the hunks here)
    assert ast_units(root, "def f(:\n") == [(0, 1), (1, 3)]  # no tree: hunks only


# ----------------------------------------------------------------- sub-diffs


def test_align_equal_and_replace_blocks():
    a = ("a = 1", "b = 2", "c = x + 1")
    m = align(a, ("a = 1", "b = 2", "c = x + 2"))
    assert [(x.kind, x.a, x.b) for x in m] == [("equal", a[:2], a[:2]),
                                               ("near", ("c = x + 1",), ("c = x + 2",))]
    assert m[1].ratio == pytest.approx(16 / 18)  # 8 of 9 characters each side
    far = ("c = 2 * x",)
    assert similarity(("c = x + 1",), far) < 0.8
    assert [x.kind for x in align(a, a[:2] + far)] == ["equal"]  # replace below eta: dropped
    assert [x.kind for x in align(a, a[:2] + far, eta=0.5)] == ["equal", "near"]


def test_exact_hash_occurrences():
    seqs = [("p", "q", "r"), ("q", "r"), ("x", "q", "r", "q", "r"), ()]
    occ = find_occurrences(seqs, [("q", "r"), ("p",)])
    assert occ[("q", "r")] == {0: [1], 1: [0], 2: [1, 3]}
    assert occ[("p",)] == {0: [0]}


def test_exact_hash_groups_identical_roots_without_any_alignment():
    codes = [GROUP[0]] * 3 + ["def f(x):\n    y = abs(x) // 3\n    return y\n",
                              "def f(x):\n    y = 7\n    return y\n"]
    anchors = task_anchors([rollout(c) for c in codes], [1, 1, 0, 0, 0], BUGGY, pair_budget=0)
    assert [(a.text, a.n, a.source) for a in anchors] == [(("y = x + 1",), 3, "root")]


def test_near_duplicate_merging_is_not_transitive():
    a, b, c = ("xxxxxxxxxx",), ("xxxxxxxxyy",), ("xxxxxxyyyy",)
    assert similarity(a, b) >= 0.8 and similarity(b, c) >= 0.8 and similarity(a, c) < 0.8
    assert merge_near_duplicates([a, b, c]) == [[0, 1], [2]]
    assert merge_near_duplicates([b, a, c]) == [[0, 1, 2]]  # b represents both


def test_ast_split_is_the_fallback_only():
    buggy = "def f(x):\n    return x - 1\n\n\ndef g(x):\n    return x * 3\n"
    codes = ["def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n",
             "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return abs(x) - 4\n"]
    rs = [rollout(c) for c in codes]
    fallback = task_anchors(rs, [1.0, 0.0], buggy, pair_budget=0)
    aligned = task_anchors(rs, [1.0, 0.0], buggy)
    assert [(a.text, a.source, a.n) for a in fallback] == [(("return x + 1",), "ast", 2)]
    assert [(a.text, a.source, a.n) for a in aligned] == [(("return x + 1",), "equal", 2)]


def test_pair_budget_is_deterministic():
    assert choose_pairs(10, 8, seed=3) == choose_pairs(10, 8, seed=3)
    assert len(choose_pairs(10, 8, seed=3)) == 8
    assert choose_pairs(10, 8, seed=3) != choose_pairs(10, 8, seed=4)
    assert choose_pairs(4, 8) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]  # within budget
    assert len(choose_pairs(10, 8, exhaustive=True)) == 45
    buggy, rs, rewards = synthetic_group(G=16, seed=1)
    first = task_anchors(rs, rewards, buggy, pair_budget=2, seed="s")
    assert task_anchors(rs, rewards, buggy, pair_budget=2, seed="s") == first


# ----------------------------------------------------------------- anchors and advantages


def test_hand_worked_group_of_four():
    rs = [rollout(c, i) for i, c in enumerate(GROUP)]
    adv, metrics, anchors = estimate("didpo", BUGGY, rs, REWARDS)
    assert len(anchors) == 1
    (a,) = anchors
    assert (a.text, a.n, a.L, a.source) == (("y = x + 1",), 3, 1.0, "root")  # r2 merged (16/18)
    assert a.gs == pytest.approx(phi(1) * psi(3))
    assert [m.rollout for m in a.members] == [0, 1, 2]  # the copy r3 has an empty root
    assert [m.a_d for m in a.members] == pytest.approx([0.5, 0.0, -0.5])  # R - mean(1, .5, 0)
    assert all(m.tokens == tuple(FIX_TOKENS) for m in a.members)  # r1's comment tokens excluded
    assert all(m.spans[0] == (len(PREFIX) + 14, len(PREFIX) + 23) for m in a.members)

    a_e = grpo_by_hand(REWARDS)
    expected = torch.zeros(4, 12, dtype=torch.float64)
    for b, r in enumerate(rs):
        expected[b, :r.n_tokens] = a_e[b]
    expected[0, FIX_TOKENS] += 0.5
    expected[2, FIX_TOKENS] -= 0.5
    torch.testing.assert_close(adv, expected)
    assert metrics["anchors/count"] == 1 and metrics["anchors/mean_group_size"] == 3
    assert metrics["anchors/token_coverage"] == pytest.approx(15 / 42)  # 4 x 10 + 2 comment tokens
    assert metrics["anchors/mean_gs"] == pytest.approx(a.gs) and metrics["anchors/build_s"] >= 0


def test_diff_gate_reemitted_lines_get_episode_advantage_only():
    rs = [rollout(c, i) for i, c in enumerate(GROUP)]
    adv, _, _ = estimate("didpo", BUGGY, rs, REWARDS)
    grpo, _, _ = estimate("grpo", BUGGY, rs, REWARDS)
    unchanged = [t for t in range(10) if t not in FIX_TOKENS]  # "def" and "return" lines
    torch.testing.assert_close(adv[:, unchanged], grpo[:, unchanged])
    torch.testing.assert_close(adv[3], grpo[3])  # the copy: A_E alone


def test_overlap_goes_to_the_higher_gs_anchor():
    rs = [rollout(c, i) for i, c in enumerate(OVERLAP)]
    anchors = task_anchors(rs, REWARDS2, BUGGY2)
    assert [(a.text, a.n) for a in anchors] == [(("a = x + 1",), 4),
                                                (("a = x + 1", "b = a * 3"), 2),
                                                (("a = x + 1", "b = abs ( a ) // 2"), 2)]
    assert anchors[0].gs == pytest.approx(phi(1) * psi(4))  # 0.0367 > phi(2) psi(2) = 0.0260
    assert anchors[1].gs == pytest.approx(phi(2) * psi(2))
    assert all(m.lines == (1,) for m in anchors[0].members)  # line A stays with anchor 0
    assert all(m.lines == (2,) for a in anchors[1:] for m in a.members)  # cut to B / C
    assert [m.a_d for m in anchors[0].members] == pytest.approx([0.5, 0.0, -0.5, 0.0])
    assert [m.a_d for m in anchors[1].members] == pytest.approx([0.25, -0.25])
    assert [m.a_d for m in anchors[2].members] == pytest.approx([-0.25, 0.25])
    for b in range(4):
        owned = [set(m.tokens) for a in anchors for m in a.members if m.rollout == b]
        assert sum(map(len, owned)) == len(set().union(*owned))  # every token has one anchor
    assert len(task_anchors(rs, REWARDS2, BUGGY2, K=1)) == 1


def test_span_to_token_mapping_is_exact():
    code = "def f(x):\n    y = x + 1  # fixed\n    return y\n"
    completion = "Sure!\n```python\n" + code + "```\n"
    offsets = [m.span() for m in WORD.finditer(completion)]
    r = Rollout(task_id="t", sample=0, prompt="", prompt_ids=[1], completion_ids=[0] * len(offsets),
                logprobs=[0.0] * len(offsets), completion=completion, code=code,
                code_start=completion.index(code), offsets=offsets, finished=True)
    (a,) = task_anchors([r, rollout(GROUP[0])], [1.0, 0.0], BUGGY)
    m = a.members[0]
    assert completion[slice(*m.spans[0])] == "y = x + 1"
    assert [completion[slice(*offsets[t])] for t in m.tokens] == ["\n    y", " =", " x", " +", " 1"]


def test_naive_token_loop_agrees():
    """Second implementation: per token, scan every anchor member's spans by hand and take the
    highest GS (then the lowest id); A = A_E + lambda A_D."""
    buggy, rs, rewards = synthetic_group(G=12, seed=2)
    adv, _, anchors = estimate("didpo", buggy, rs, rewards, lam=1.5)
    assert len(anchors) >= 2
    a_e = grpo_by_hand(rewards)
    for b, r in enumerate(rs):
        for t, (s, e) in enumerate(r.offsets):
            cover = [(a.gs, -a.id, m.a_d) for a in anchors for m in a.members if m.rollout == b
                     for (p, q) in m.spans if s < q and e > p]
            a_d = max(cover)[2] if cover else 0.0
            assert adv[b, t].item() == pytest.approx(a_e[b] + 1.5 * a_d, abs=1e-9)


# ----------------------------------------------------------------- ablations


def test_ablations_change_exactly_their_part():
    rs = [rollout(c, i) for i, c in enumerate(OVERLAP)]
    full, _, anchors = estimate("didpo", BUGGY2, rs, REWARDS2)
    grpo, _, _ = estimate("grpo", BUGGY2, rs, REWARDS2)
    a_d = full - grpo  # [B, T] the diff term
    assert a_d.abs().sum() > 0

    no_ae, _, _ = estimate("didpo_no_ae", BUGGY2, rs, REWARDS2)
    torch.testing.assert_close(no_ae, a_d)
    no_ad, m, _ = estimate("didpo_no_ad", BUGGY2, rs, REWARDS2)
    torch.testing.assert_close(no_ad, grpo)
    assert "anchors/count" not in m  # nothing built
    double, _, _ = estimate("didpo", BUGGY2, rs, REWARDS2, lam=2.0)
    torch.testing.assert_close(double - grpo, 2 * a_d)

    whole, _, wanchors = estimate("didpo_whole_diff", BUGGY2, rs, REWARDS2)
    assert [(a.text, a.source) for a in wanchors] == [(a.text, "root") for a in anchors[1:]]
    assert all(m.lines == (1, 2) for a in wanchors for m in a.members)  # not cut: no sub-diff
    assert sorted({round(v, 9) for v in (whole - grpo)[0].tolist()}) == [0.0, 0.25]  # pair mean

    _, _, sanchors = estimate("didpo", BUGGY2, rs, REWARDS2, divide_std=True)
    sd = math.sqrt(sum((r - 0.5) ** 2 for r in REWARDS2) / 3)
    assert [m.a_d for m in sanchors[0].members] == pytest.approx([0.5 / (sd + 1e-6), 0.0,
                                                                  -0.5 / (sd + 1e-6), 0.0])


def test_additive_gs_selects_unshared_subdiffs():
    codes = OVERLAP + ["def g(x):\n    a = 0\n    b = a * 2\n    return b\n"]  # a lone edit
    rs = [rollout(c, i) for i, c in enumerate(codes)]
    rewards = REWARDS2 + [1.0]
    mul = task_anchors(rs, rewards, BUGGY2)
    add = task_anchors(rs, rewards, BUGGY2, gs_form="add")
    assert all(a.n > 1 for a in mul)
    lone = [a for a in add if a.n == 1]
    assert [(a.text, a.gs, a.members[0].a_d) for a in lone] == [(("a = 0",), phi(1) / 2, 0.0)]
    assert {a.text for a in add} - {a.text for a in mul} == {("a = 0",)}
    adv, _, _ = estimate("didpo_additive_gs", BUGGY2, rs, rewards)
    grpo, _, _ = estimate("grpo", BUGGY2, rs, rewards)
    torch.testing.assert_close(adv[4], grpo[4])  # covered, but A_D = R - R = 0


# ----------------------------------------------------------------- records


def test_registry_records_and_frame():
    for name in ("didpo", "didpo_no_ae", "didpo_no_ad", "didpo_whole_diff", "didpo_additive_gs"):
        assert name in ADVANTAGE_ESTIMATORS
    anchors = task_anchors([rollout(c) for c in OVERLAP], REWARDS2, BUGGY2)
    recs = anchor_records(anchors, step=3, task_id="t")
    back = json.loads(json.dumps(recs))
    assert back[0]["step"] == 3 and back[0]["text"] == ["a = x + 1"]
    assert back[1]["members"][0]["lines"] == [2]
    frame = anchors_frame(anchors)
    assert len(frame) == 8 and frame.groupby("id")["a_d"].sum().tolist() == pytest.approx([0, 0, 0])
    assert frame.loc[0, "group_mean"] == pytest.approx(0.5)


def test_estimator_needs_rollouts():
    inp = AdvantageInput(torch.zeros(2), ["t", "t"], torch.ones(2, 3))
    with pytest.raises(ValueError, match="rollouts"):
        compute_advantages("didpo", inp)


# The within-rollout anti-correlation of A_D, by hand (docs/didpo.md). Line 2 holds the bug
# (x - 1 should be x + 1); line 3 is fine. r0 makes the fix F and a stray edit S on line 3;
# r1 and r2 make the fix only; r3 makes the stray edit only.
BUGGY3 = "def h(x):\n    y = x - 1\n    z = y * 2\n    return z\n"
FIX, STRAY = "    y = x + 1\n", "    z = y * 3\n"
ANTI = [f"def h(x):\n{FIX}{STRAY}    return z\n", f"def h(x):\n{FIX}    z = y * 2\n    return z\n",
        f"def h(x):\n{FIX}    z = y * 2\n    return z\n", f"def h(x):\n    y = x - 1\n{STRAY}    return z\n"]
R3 = [0.75, 1.0, 1.0, 0.25]


def test_a_real_fix_gets_a_lower_a_d_than_a_stray_edit_in_the_same_rollout():
    """A_D = R_i - mean over the rollouts sharing the edit: the fix is shared with the
    successful r1 and r2 (group mean 11/12), the stray edit with the failing r3 (mean 1/2),
    so in r0 the fix gets 0.75 - 11/12 = -1/6 and the stray edit 0.75 - 1/2 = +1/4: the
    opposite of their true effects. The labelled non-paper variant (group mean minus task
    mean, task mean 3/4) gets the signs right: +1/6 and -1/4."""
    rolls = [rollout(c, sample=i) for i, c in enumerate(ANTI)]
    for form, fix_ad, stray_ad in (("paper", -1 / 6, 0.25), ("group_mean", 1 / 6, -0.25)):
        anchors = task_anchors(rolls, R3, BUGGY3, ad_form=form)
        by_text = {a.text: a for a in anchors}
        fix = next(a for t, a in by_text.items() if "x + 1" in " ".join(t))
        stray = next(a for t, a in by_text.items() if "y * 3" in " ".join(t))
        assert sorted(m.rollout for m in fix.members) == [0, 1, 2]
        assert sorted(m.rollout for m in stray.members) == [0, 3]
        r0_fix = next(m.a_d for m in fix.members if m.rollout == 0)
        r0_stray = next(m.a_d for m in stray.members if m.rollout == 0)
        assert (r0_fix, r0_stray) == (pytest.approx(fix_ad), pytest.approx(stray_ad)), form
    assert "didpo_group_mean" in ADVANTAGE_ESTIMATORS
