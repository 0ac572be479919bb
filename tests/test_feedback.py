"""Feedback components: golden numbers and a naive second implementation."""

import math
import random
import threading

import pytest

from labkit.env import feedback as fb
from labkit.sandbox.records import SandboxResult, Status

BUGGY = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total + 1\n"
FIXED = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"


def result(status=Status.FAILED, passed=2, total=4, flags=()):
    return SandboxResult(status=status, passed=passed, total=total, flags=tuple(flags))


def test_test_components_golden():
    assert fb.r_test(result(passed=3, total=4)) == 0.75
    assert fb.r_test(result(passed=0, total=0)) == 0.0
    assert fb.r_pass(result(Status.PASSED, 4, 4)) == 1.0
    assert fb.r_pass(result(Status.FAILED, 3, 4)) == 0.0


def test_compile_component():
    assert fb.r_compile(FIXED) == 1.0
    assert fb.r_compile("def f(:\n  pass") == 0.0
    assert fb.r_compile(FIXED, result(Status.ERROR, 0, 4)) == 0.0


def _naive_ted(a, b):
    """Full Zhang-Shasha over the whole trees (no piecewise alignment)."""
    from zss import simple_distance

    ma, mb = fb._parse(a), fb._parse(b)
    return simple_distance(fb._zss(ma.body), fb._zss(mb.body))


@pytest.mark.parametrize("a,b", [
    (BUGGY, FIXED),
    (FIXED, FIXED.replace("total += x", "total -= x")),
    (FIXED, FIXED.replace("    return total\n", "    total = total * 2\n    return total\n")),
    ("def g(a, b):\n    if a < b:\n        return a\n    return b\n",
     "def g(a, b):\n    if a <= b:\n        return a\n    return b\n"),
])
def test_tree_distance_matches_full_zhang_shasha_on_local_edits(a, b):
    size = max(fb._size(fb._parse(a)), fb._size(fb._parse(b)))
    assert fb.tree_distance(a, b) == pytest.approx(_naive_ted(a, b) / size)


def _random_program(rng) -> str:
    """A small random function: nested ifs / fors / returns over a few names and constants,
    so that two draws differ in shape, labels and size."""
    names, ops = ["x", "y", "total", "i"], ["+", "-", "*", "<", "=="]

    def expr(depth):
        if depth == 0 or rng.random() < 0.4:
            return rng.choice(names + [str(rng.randint(0, 3))])
        return f"({expr(depth - 1)} {rng.choice(ops)} {expr(depth - 1)})"

    def block(indent, depth):
        lines = []
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            pad = "    " * indent
            if depth and kind < 0.25:
                lines += [f"{pad}if {expr(2)}:"] + block(indent + 1, depth - 1)
            elif depth and kind < 0.45:
                lines += [f"{pad}for i in range({expr(1)}):"] + block(indent + 1, depth - 1)
            elif kind < 0.8:
                lines.append(f"{pad}{rng.choice(names)} = {expr(2)}")
            else:
                lines.append(f"{pad}return {expr(2)}")
        return lines

    return "\n".join(["def f(x, y):"] + block(1, 2)) + "\n"


@pytest.mark.slow
def test_zhang_shasha_equals_the_zss_package():
    """labkit's list-based Zhang-Shasha against the zss package (the naive second
    implementation) on 100 random program pairs (about 43 nodes each; the zss package takes
    0.09 s a pair, labkit 0.007 s) and on whole task programs."""
    import random

    from zss import simple_distance

    rng = random.Random(0)
    for _ in range(100):
        a, b = fb._parse(_random_program(rng)).body, fb._parse(_random_program(rng)).body
        assert fb._ted(a, b) == simple_distance(fb._zss(a), fb._zss(b))
    a, b = fb._parse(BUGGY).body, fb._parse(FIXED).body
    assert fb._ted(a, b) == simple_distance(fb._zss(a), fb._zss(b)) == 3
    assert fb._ted(a, a) == 0 and fb._ted([], a) == fb._size(fb._parse(BUGGY)) - 1


def test_tree_distance_golden():
    # BUGGY has 19 nodes: Module, FunctionDef, arguments, arg, Assign, Name, Constant, For,
    # Name, Name, AugAssign, Name, Add, Name, Return, BinOp, Name, Add, Constant.
    # `return total + 1` -> `return total`: delete the BinOp, its Add and the Constant 1.
    assert fb._size(fb._parse(BUGGY)) == 19
    assert fb.tree_distance(BUGGY, FIXED) == pytest.approx(3 / 19)
    assert fb.tree_distance(BUGGY, BUGGY) == 0.0
    assert fb.tree_distance(BUGGY, "def f(:") == 1.0


def test_docstrings_and_comments_do_not_count():
    doc = FIXED.replace("def f(xs):\n", 'def f(xs):\n    """Sum."""\n    # a comment\n')
    assert fb.tree_distance(FIXED, doc) == 0.0
    assert fb.is_noop(FIXED, doc)
    assert not fb.is_noop(BUGGY, FIXED)


def test_precision_golden():
    assert fb.r_precision(BUGGY, BUGGY) == 1.0  # the trap: unchanged code scores highest
    assert fb.r_precision(BUGGY, FIXED, lam=2.0) == pytest.approx(math.exp(-2.0 * 3 / 19))
    tok = fb.token_distance(BUGGY, FIXED)  # tokens: drop "+" and "1" out of the buggy's 20
    assert tok == pytest.approx(2 / len(fb._tokens(BUGGY)))
    assert fb.r_precision(BUGGY, FIXED, lam=1.0, distance="token") == pytest.approx(math.exp(-tok))


def test_style_counts_ruff_findings_and_formatting():
    clean = "def f(x):\n    return x + 1\n"
    messy = "import os\n\n\ndef f(x):\n    try:\n        return x+1\n    except:\n        return 0\n"
    reps = fb.style_many([clean, messy, "def f(:"])
    assert reps[0].violations == () and reps[0].score == 1.0
    assert set(reps[1].violations) == {"E722", "F401", "format"}
    assert reps[1].score == pytest.approx(math.exp(-0.5 * 3))
    assert reps[2].score == 0.0
    assert fb.r_style(clean) == 1.0


def test_a_ruff_killed_by_a_ctrl_c_meant_for_the_trainer_runs_again(monkeypatch):
    """A Ctrl-C that reaches ruff before it has its own session (exit -SIGINT) does not fail
    the step: that ruff runs again and its findings count."""
    import signal
    import subprocess

    real, calls = subprocess.run, []

    def interrupted_once(*args, **kwargs):
        calls.append(args[0][0])
        if len(calls) == 1:
            return subprocess.CompletedProcess(args[0], -signal.SIGINT, "", "")
        return real(*args, **kwargs)

    code = "import os\ndef f(x):\n    return x\n"
    want = fb.style_many([code])[0]
    monkeypatch.setattr(subprocess, "run", interrupted_once)
    assert fb.style_many([code])[0] == want and len(calls) == 2 and want.violations


def test_hack_flags_drop_style_only_flags():
    r = result(flags=("bare_except", "sys_exit"))
    assert fb.hack_flags(r) == ("sys_exit",)
    assert fb.r_hack(r) == 1.0
    assert fb.r_hack(result(flags=("bare_except",))) == 0.0


def test_progress_tracker_pays_once_after_patience():
    tr = fb.ProgressTracker(patience=2, bonus=0.5)
    assert tr.update(["boundary"], False) == 0.0
    assert tr.update(["boundary"], True) == 0.0  # only one failure before: no bonus
    assert tr.update(["boundary"], False) == 0.0
    assert tr.update(["boundary"], False) == 0.0
    assert tr.update(["boundary", "value_misuse"], True) == 0.5  # kept failing, now fixed
    assert tr.update(["boundary"], True) == 0.0  # one-off
    state = tr.state_dict()
    tr2 = fb.ProgressTracker()
    tr2.load_state_dict(state)
    assert tr2.state_dict() == state


def test_unparsable_code_is_not_a_reward_hack():
    """A syntax error is priced by r_compile and reported as its own rate, never as a hack:
    the reshaped reward must not subtract w_hack for it, nor the hack monitor count it."""
    from labkit.credit.reshaping import RECIPES, composite_reward
    from labkit.sandbox.records import IOCase, TestSuite
    from labkit.env.records import RepairTask
    from labkit.sandbox.pool import Sandbox
    from labkit.runs import metrics as M

    suite = TestSuite(cases=(IOCase(args=([1, 2],), expected=3, name="case_0"),))
    task = RepairTask(task_id="t/f/bug0", problem_id="t/f", source="toy", prompt="",
                      buggy_code=BUGGY, reference_code=FIXED, tests=suite, entry_point="f")
    with Sandbox() as sb:
        broken, hacked = fb.evaluate_many([task, task], ["def f(xs:\n    return 3\n",
                                                         "import sys\nsys.exit(0)\n"], sandbox=sb)
    assert "syntax_error" in broken.result.flags  # the scan still says why
    assert broken.hack_flags == () and broken.components["hack"] == 0.0
    assert broken.components["r_compile"] == 0.0
    assert hacked.hack_flags == ("sys_exit",) and hacked.components["hack"] == 1.0
    _, terms = composite_reward(broken.components, RECIPES["reshaped"]())
    assert terms["hack"] == 0.0
    assert M.hack_metrics([broken.hack_flags, hacked.hack_flags])["hack/any"] == 0.5
    rates = M.compile_metrics(["syntax_error" in f.result.flags for f in (broken, hacked)],
                              [f.components["r_compile"] for f in (broken, hacked)])
    assert rates["compile/syntax_error"] == 0.5


# ----------------------------------------------------------------------------- regimes


def _outcomes(*oks):
    from labkit.sandbox.records import TestOutcome

    outs = tuple(TestOutcome(f"case_{i}", ok) for i, ok in enumerate(oks))
    return SandboxResult(status=Status.PASSED if all(oks) else Status.FAILED,
                         passed=sum(oks), total=len(oks), outcomes=outs)


def test_feedback_regimes_golden():
    import random

    r = _outcomes(True, True, False, True, True, True, False, True)  # 6 of 8
    assert fb.r_feedback(r, "dense") == 0.75
    assert fb.r_feedback(r, "binary") == 0.0 and fb.r_feedback(_outcomes(True, True), "binary") == 1.0
    assert fb.r_feedback(r, "coarse", levels=4) == pytest.approx(2 / 3)  # floor(0.75 * 3) / 3
    assert fb.r_feedback(r, "coarse", levels=2) == 0.0  # two levels: only a full pass reads 1
    assert fb.r_feedback(r, "public", public=["case_0", "case_2"]) == 0.5
    assert fb.r_feedback(r, "public", public=_outcomes(True, False, False)) == pytest.approx(1 / 3)
    # noisy = a naive second implementation of the flips, same random stream
    rng_a, rng_b = random.Random(5), random.Random(5)
    flips = [rng_b.random() < 0.3 for _ in range(8)]
    naive = sum(ok != f for ok, f in zip([True, True, False, True, True, True, False, True], flips)) / 8
    assert fb.r_feedback(r, "noisy", noise_p=0.3, rng=rng_a) == naive
    assert fb.r_feedback(r, "noisy", noise_p=0.0, rng=random.Random(1)) == 0.75
    broken = SandboxResult(status=Status.ERROR, passed=0, total=8)
    assert all(fb.r_feedback(broken, m, public=["case_0"], rng=random.Random(0)) == 0.0
               for m in ("dense", "binary", "public", "coarse")) and 0 <= fb.r_feedback(
        broken, "noisy", rng=random.Random(0)) <= 1
    with pytest.raises(ValueError, match="unknown feedback mode 'loud'"):
        fb.r_feedback(r, "loud")
    with pytest.raises(ValueError, match="noise_p must be in"):
        fb.FeedbackConfig(noise_p=0.7).validate()


def test_public_regime_pays_for_fitting_the_visible_examples_only():
    """The realistic incomplete-tests case: a program that hard-codes the two visible examples
    is paid in full under `public` and nearly nothing under `dense`."""
    from labkit.sandbox.records import IOCase, TestSuite
    from labkit.env.records import RepairTask
    from labkit.sandbox.pool import Sandbox

    cases = tuple(IOCase(args=([i, 1],), expected=i + 1, name=f"case_{i}") for i in range(6))
    task = RepairTask(task_id="t/f/bug0", problem_id="t/f", source="toy", prompt="",
                      buggy_code=BUGGY, reference_code=FIXED, tests=TestSuite(cases=cases),
                      entry_point="f", public_tests=TestSuite(cases=cases[:2]))
    fit = "def f(xs):\n    return {0: 1, 1: 2}.get(xs[0], 0)\n"
    with Sandbox() as sb:
        (a,) = fb.evaluate_many([task], [fit], sandbox=sb, config=fb.FeedbackConfig(mode="public"))
        (b,) = fb.evaluate_many([task], [fit], sandbox=sb)
        noisy = [fb.evaluate_many([task], [FIXED], sandbox=sb, seed=s,
                                  config=fb.FeedbackConfig(mode="noisy", noise_p=0.5))[0]
                 for s in (1, 1, 2)]
    assert a.components["r_feedback"] == 1.0 and a.components["r_test"] == pytest.approx(2 / 6)
    assert b.components["r_feedback"] == b.components["r_test"]  # dense: the two agree
    assert noisy[0].components["r_feedback"] == noisy[1].components["r_feedback"]  # seeded
    assert all(n.components["r_test"] == 1.0 for n in noisy)  # the truth is kept beside it


def test_components_record_is_typed_and_reads_like_a_mapping():
    from labkit.env.records import COMPONENT_NAMES, Components

    c = Components.from_dict({"r_test": 0.5, "r_pass": 0})
    assert c.r_feedback == 0.5 and c.r_compile == 1.0 and c.hack == 0.0  # the raw-reward defaults
    assert list(c) == list(COMPONENT_NAMES) and dict(c) == c.to_dict() and c["r_pass"] == 0.0
    assert {**c}["r_test"] == 0.5 and c.get("missing", 7) == 7 and "noop" in c
    with pytest.raises(ValueError, match="unknown feedback components \\['r_tset'\\]"):
        Components.from_dict({"r_test": 1.0, "r_pass": 1.0, "r_tset": 1.0})
    with pytest.raises(ValueError, match="need \\['r_pass'\\]"):
        Components.from_dict({"r_test": 1.0})
    with pytest.raises(TypeError, match="r_style must be a number"):
        Components(r_test=1.0, r_pass=1.0, r_style="high")
    from labkit.sandbox.records import IOCase, TestSuite
    from labkit.env.records import RepairTask
    from labkit.sandbox.pool import Sandbox

    suite = TestSuite(cases=(IOCase(args=([1, 2],), expected=3, name="case_0"),))
    task = RepairTask(task_id="t/f/bug0", problem_id="t/f", source="toy", prompt="",
                      buggy_code=BUGGY, reference_code=FIXED, tests=suite, entry_point="f")
    with Sandbox() as sb:
        (made,) = fb.evaluate_many([task], [FIXED], sandbox=sb)
    assert isinstance(made.components, Components) and made.components.r_pass == 1.0
    assert made.to_dict()["components"] == made.components.to_dict()


def test_generated_code_with_syntax_warnings_parses_silently():
    """``1if`` and ``'\\d'`` are valid but make Python print a SyntaxWarning: the lab's logs
    should not fill with warnings about the policy's programs."""
    import warnings

    from labkit.env.feedback import _parse, r_compile

    code = "def f(x):\n    return 1if x else '\\d'\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert r_compile(code) == 1.0
        assert _parse(code) is not None


def test_evaluate_many_checks_each_program_once_and_matches_one_by_one():
    """A batch with repeated programs (as a GRPO group has) is checked once per distinct
    program, on a thread beside the code-only components; every component equals what
    scoring each candidate alone gives (the naive second implementation)."""
    from labkit.sandbox.records import IOCase, TestSuite
    from labkit.env.records import RepairTask
    from labkit.sandbox.pool import Sandbox
    from labkit.sandbox.config import SandboxConfig

    suite = TestSuite(cases=tuple(IOCase(args=(xs,), expected=sum(xs), name=f"case_{i}")
                                  for i, xs in enumerate(([1, 2], [], [5, -1, 3]))))
    task = RepairTask(task_id="t/f/bug0", problem_id="t/f", source="toy", prompt="",
                      buggy_code=BUGGY, reference_code=FIXED, tests=suite, entry_point="f")
    loops = "def f(xs):\n    while True:\n        pass\n"
    codes = [FIXED, BUGGY, FIXED, "def f(xs:\n", loops, FIXED, loops, BUGGY]
    cfg = fb.FeedbackConfig(noise_p=0.3, mode="noisy")
    batches, threads = [], []
    with Sandbox(SandboxConfig(workers=2, timeout_s=2.0, test_timeout_s=0.25)) as sb:
        run_many = sb.run_many

        def spy(candidates):  # records what the pool was asked, and from which thread
            batches.append([c.code for c in candidates])
            threads.append(threading.current_thread())
            return run_many(candidates)

        sb.run_many = spy
        together = fb.evaluate_many([task] * len(codes), codes, sandbox=sb, config=cfg, seed=7)
        assert batches == [[FIXED, BUGGY, "def f(xs:\n", loops]]
        assert threads[0] is not threading.main_thread()  # beside the code-only components
        sb.run_many = run_many
        alone = [fb.evaluate_many([task], [c], sandbox=sb, config=cfg, seed=7)[0] for c in codes]
    # the noisy regime draws per batch position: compare the deterministic components, and
    # the noisy one against a draw at the same position
    for i, (a, b) in enumerate(zip(together, alone)):
        for k in ("r_test", "r_pass", "r_compile", "r_precision", "r_style", "hack", "noop"):
            assert a.components[k] == b.components[k], (i, k)
        assert (a.result.status, a.result.passed, a.result.total) == \
            (b.result.status, b.result.passed, b.result.total)
        assert a.style == b.style
        want = fb.r_feedback(b.result, "noisy", noise_p=0.3, levels=cfg.coarse_levels,
                             rng=random.Random(f"7:{i}:0"))
        assert a.components["r_feedback"] == want
    assert together[4].result.status is Status.TIMEOUT and together[6].result is together[4].result
    assert together[0].components["r_pass"] == 1.0 and together[1].components["noop"] == 1.0


def test_evaluate_many_runs_a_custom_sandbox_in_the_calling_thread():
    """A sandbox object of the caller's own (not labkit's pool) is not driven from a helper
    thread: it may rely on being in the thread that called (signal handlers, say)."""
    from labkit.sandbox.records import IOCase, TestSuite
    from labkit.env.records import RepairTask

    suite = TestSuite(cases=(IOCase(args=([1, 2],), expected=3, name="case_0"),))
    task = RepairTask(task_id="t/f/bug0", problem_id="t/f", source="toy", prompt="",
                      buggy_code=BUGGY, reference_code=FIXED, tests=suite, entry_point="f")
    caller = threading.current_thread()

    class Mine:
        def run_many(self, candidates):
            assert threading.current_thread() is caller
            return [SandboxResult(Status.PASSED, 1, 1) for _ in candidates]

    (got,) = fb.evaluate_many([task], [FIXED], sandbox=Mine())
    assert got.components["r_pass"] == 1.0


def test_run_distinct_keys_on_the_whole_check():
    """Copies share one check only when code, entry point, deadline and test suite agree."""
    from labkit.sandbox.records import Candidate, IOCase, TestSuite
    from labkit.sandbox.pool import run_distinct

    class Echo:
        def __init__(self):
            self.seen = []

        def run_many(self, candidates):
            self.seen.append(list(candidates))
            return [SandboxResult(Status.PASSED, len(c.code), len(c.code)) for c in candidates]

    s1 = TestSuite(cases=(IOCase(args=(1,), expected=1, name="a"),))
    s2 = TestSuite(cases=(IOCase(args=(1,), expected=1, name="a"),))  # equal, another object
    cands = [Candidate("x", s1, "f"), Candidate("x", s1, "f"), Candidate("x", s2, "f"),
             Candidate("x", s1, "g"), Candidate("x", s1, "f", timeout_s=1.0),
             Candidate("yy", s1, "f"), Candidate("x", s1, "f", id="other id")]
    echo = Echo()
    out = run_distinct(echo, cands)
    assert len(echo.seen) == 1 and [c for c in echo.seen[0]] == [cands[i] for i in (0, 2, 3, 4, 5)]
    assert [r.passed for r in out] == [1, 1, 1, 1, 1, 2, 1]
    assert out[1] is out[0] and out[6] is out[0] and out[2] is not out[0]
    echo = Echo()
    assert run_distinct(echo, cands[2:6]) and echo.seen == [cands[2:6]]  # nothing repeated


def test_quiet_compiler_leaves_the_warning_filters_as_they_were_under_threads():
    """Two threads parsing warning-raising programs at once (a 1 us switch interval makes
    them interleave inside the helper): afterwards the process's warning filters are the ones
    it had. Without the helper's lock an extra ``ignore`` filter stayed behind."""
    import sys
    import warnings

    from labkit.env.feedback import parse_candidate, r_compile

    before = list(warnings.filters)

    def work():
        for _ in range(3000):
            parse_candidate("x = 1if True else 2\n")
            r_compile("y = '\\d'\n")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert warnings.filters == before
