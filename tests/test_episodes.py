"""Multi-turn episodes: the feedback text, the turn prompt, the selectors, step records,
and the batched runner on a toy model with the real sandbox."""

import dataclasses
import random

import pytest
from conftest import toy_tasks

from labkit.sandbox.records import AssertTest, IOCase, SandboxResult, Status, TestOutcome, TestSuite
from labkit.mucode.episodes import (NO_PUBLIC_TESTS, SELECTORS, CandidateView, Episode,
                                    EpisodeConfig, Turn, format_feedback, run_episodes,
                                    step_records, summarise, turn_prompt)

SUITE = TestSuite(cases=(IOCase(args=([1, 2],), expected=3, name="case_0"),
                         IOCase(args=([],), expected=0, name="case_1"),
                         IOCase(args=([5],), expected=5, name="case_2")),
                  asserts=(AssertTest("assert candidate([0, 0]) == 0\n", name="a0"),))


def _result(outcomes, status=Status.FAILED, error=""):
    passed = sum(o.ok for o in outcomes)
    return SandboxResult(status=status, passed=passed, total=len(outcomes),
                         outcomes=tuple(outcomes), error=error)


# ----------------------------------------------------------------------------- feedback


def test_feedback_golden_text():
    res = _result([TestOutcome("case_0", False, detail="expected 3 (int), got 2 (int)"),
                   TestOutcome("case_1", False, detail="raised ZeroDivisionError: division by zero"),
                   TestOutcome("case_2", True), TestOutcome("a0", False, "child", "raised AssertionError")])
    assert format_feedback(res, SUITE, "total") == (
        "Public tests: 1 of 4 passed.\n"
        "- total([1, 2]): expected 3 (int), got 2 (int)\n"
        "- total([]): raised ZeroDivisionError: division by zero\n"
        "- assert candidate([0, 0]) == 0: raised AssertionError")


def test_feedback_truncates_failures_lines_and_total():
    outs = [TestOutcome(f"case_{i}", False, detail="expected 1 (int), got 2 (int)") for i in range(3)]
    suite = TestSuite(cases=tuple(IOCase(args=(i,), expected=1, name=f"case_{i}") for i in range(3)))
    text = format_feedback(_result(outs), suite, "f", max_failures=1)
    assert text == ("Public tests: 0 of 3 passed.\n- f(0): expected 1 (int), got 2 (int)\n"
                    "- ... and 2 more failed.")
    long = [TestOutcome("case_0", False, detail="raised ValueError: " + "bad " * 100)]
    text = format_feedback(_result(long), suite, "f", max_line_chars=40)
    assert text.splitlines()[1] == "- f(0): raised ValueError: bad bad ba..."
    assert len(text.splitlines()[1]) == 40
    assert len(format_feedback(_result(long), suite, "f", max_chars=50)) == 50


def test_feedback_when_the_program_did_not_run():
    outs = [TestOutcome(n, False, detail="not run") for n in ("case_0", "case_1", "case_2", "a0")]
    res = _result(outs, Status.ERROR, "could not load the candidate: SyntaxError: invalid syntax")
    assert format_feedback(res, SUITE, "total") == (
        "Public tests: 0 of 4 passed.\n"
        "The program did not run: could not load the candidate: SyntaxError: invalid syntax")
    assert format_feedback(res, TestSuite(), "total") == NO_PUBLIC_TESTS


def test_turn_prompt_format():
    task = toy_tasks()[0]
    assert turn_prompt(task, None, None) == (
        "### Fix the bug in this Python function.\n### Buggy\ndef inc(x):\n    return x - 1\n"
        "### Fixed\n")
    assert turn_prompt(task, "def inc(x):\n    return x\n", "Public tests: 0 of 1 passed.") == (
        "### Fix the bug in this Python function.\n### Buggy\ndef inc(x):\n    return x\n"
        "### Feedback\nPublic tests: 0 of 1 passed.\n### Fixed\n")
    # an empty previous attempt shows the original buggy program
    assert turn_prompt(task, "  \n", "fb").startswith(turn_prompt(task, None, None)[:-len("### Fixed\n")])


# ----------------------------------------------------------------------------- selectors


VIEWS = [CandidateView(1, 3, 0.9), CandidateView(3, 3, -1.0), CandidateView(3, 3, 0.2),
         CandidateView(0, 3, 2.0)]


def test_selectors_golden_choices():
    rng = random.Random(0)
    assert SELECTORS.names() == ["oracle", "public_tests", "public_then_verifier", "random", "verifier"]
    assert SELECTORS.get("public_tests")(VIEWS, rng) == 1  # first of the two 3/3
    assert SELECTORS.get("verifier")(VIEWS, rng) == 3  # highest score, fails all public tests
    assert SELECTORS.get("public_then_verifier")(VIEWS, rng) == 2  # best score among 3/3
    picks = [SELECTORS.get("random")(VIEWS, random.Random(s)) for s in range(400)]
    assert set(picks) == {0, 1, 2, 3}
    assert all(abs(picks.count(i) / 400 - 0.25) < 0.08 for i in range(4))


def test_the_oracle_selector_reads_the_hidden_verdict_and_nothing_else_does():
    import dataclasses

    views = [dataclasses.replace(v, hidden_ok=ok) for v, ok in zip(VIEWS, (False, False, False, True))]
    assert SELECTORS.get("oracle")(views, random.Random(0)) == 3  # passes, though 0/3 public
    none = [dataclasses.replace(v, hidden_ok=False) for v in VIEWS]
    assert SELECTORS.get("oracle")(none, random.Random(0)) == SELECTORS.get("public_tests")(none, random.Random(0))
    with pytest.raises(ValueError, match="hidden verdicts"):
        SELECTORS.get("oracle")(VIEWS, random.Random(0))
    from labkit.mucode.episodes import READS_HIDDEN

    assert READS_HIDDEN == {"oracle"}


def test_selectors_ties_and_missing_scores():
    tie = [CandidateView(0, 2, 0.5), CandidateView(0, 2, 0.5)]
    assert SELECTORS.get("verifier")(tie, random.Random(0)) == 0
    assert SELECTORS.get("public_then_verifier")(tie, random.Random(0)) == 0
    with pytest.raises(ValueError, match="verifier scores"):
        SELECTORS.get("verifier")([CandidateView(1, 1)], random.Random(0))
    # no public tests: every fraction is 0, so public_tests falls back to the first
    assert SELECTORS.get("public_tests")([CandidateView(0, 0), CandidateView(0, 0)],
                                         random.Random(0)) == 0


# ----------------------------------------------------------------------------- step records


def _turn(k, passed, public_ok):
    return Turn(turn=k, prompt=f"p{k}", feedback_in=None if k == 1 else f"fb{k}",
                candidates=[f"code{k}"], completions=[f"code{k}"],
                public=[(1, 1) if public_ok else (0, 1)], hidden_ok=[passed], scores=[None],
                chosen=0)


def test_step_records_return_to_go():
    ep = Episode("t", 0, [_turn(1, False, False), _turn(2, False, False), _turn(3, True, True)],
                 stop="public_pass")
    recs = step_records(ep, gamma=0.5)
    assert [r["return_to_go"] for r in recs] == [0.25, 0.5, 1.0]
    assert [r["reward"] for r in recs] == [0.0, 0.0, 1.0]
    assert [r["observation"] for r in recs] == ["", "fb2", "fb3"]
    assert [r["action"] for r in recs] == ["code1", "code2", "code3"]
    assert ep.reward == 1.0 and step_records(Episode("u", 0), 0.5) == []


def test_thought_is_the_completion_outside_the_code():
    t = Turn(1, "p", None, ["def f():\n    return 1\n"],
             ["I will fix it.\n```python\ndef f():\n    return 1\n```"], [(1, 1)], [True], [None], 0)
    assert t.thought == "I will fix it.\n```python\n\n```"


# ----------------------------------------------------------------------------- runner


def _public_toy():
    return [dataclasses.replace(t, public_tests=TestSuite(cases=t.tests.cases[:2]))
            for t in toy_tasks()]


def test_run_episodes_on_a_small_model(random_model_dir):
    from labkit.policy.loading import load_policy

    pol = load_policy(str(random_model_dir), reference="none")
    tasks = _public_toy()
    cache: dict = {}
    cfg = EpisodeConfig(turns=2, n_candidates=2, selector="public_tests", max_new_tokens=16,
                        seed=3)
    eps = run_episodes(pol, tasks, cfg, cache=cache)
    assert len(eps) == 4 and all(e.fits for e in eps)
    for e in eps:
        assert 1 <= len(e.turns) <= 2 and len(e.turns[0].candidates) == 2
        # early stop exactly when the chosen attempt passes the public tests
        assert (e.stop == "public_pass") == e.turns[-1].public_ok
        assert all(not t.public_ok for t in e.turns[:-1])
        assert e.turns[0].feedback_in is None
        if len(e.turns) == 2:
            assert e.turns[1].feedback_in == e.turns[0].feedback_out
            assert "### Feedback\nPublic tests: " in e.turns[1].prompt
            assert e.turns[0].code.strip() in e.turns[1].prompt or not e.turns[0].code.strip()
        # the public selector took the best public fraction of turn 1
        fr = [p / t for p, t in e.turns[0].public]
        assert fr[e.turns[0].chosen] == max(fr)
    # a second selector shares turn 1's candidates through the cache
    again = run_episodes(pol, tasks, dataclasses.replace(cfg, selector="random"), cache=cache)
    assert [e.turns[0].candidates for e in again] == [e.turns[0].candidates for e in eps]
    s = summarise(eps)
    assert s["episodes"] == 4 and 1 <= s["turns/mean"] <= 2
    assert s["pass/final"] == sum(e.reward for e in eps) / 4


def test_run_episodes_handles_prompts_that_do_not_fit(random_model_dir):
    from labkit.policy.loading import load_policy

    pol = load_policy(str(random_model_dir), reference="none")
    pol.model.config.max_position_embeddings = 20  # only the runner reads it
    eps = run_episodes(pol, _public_toy()[:2], EpisodeConfig(turns=2, max_new_tokens=8))
    assert [(e.fits, e.stop, len(e.turns)) for e in eps] == [(False, "no_fit", 0)] * 2
    assert summarise(eps)["fit/fraction"] == 0.0
    with pytest.raises(ValueError, match="needs a verifier"):
        run_episodes(pol, _public_toy()[:1], EpisodeConfig(selector="verifier"))


def test_runner_logic_with_scripted_candidates(monkeypatch):
    """A scripted generator: turn 1 proposes the buggy program twice, later turns propose the
    reference and the buggy program. Checks early stopping, the feedback carried into the next
    prompt, the selectors' choices and that selectors share turn 1's samples."""
    from types import SimpleNamespace

    import labkit.mucode.episodes as E

    calls = []

    def fake_sample(policy, tasks, cfg, feedback=None):
        calls.append(len(tasks))
        out = []
        for task, fb in zip(tasks, feedback):
            ref = next(t for t in _public_toy() if t.task_id == task.task_id).reference_code
            codes = [task.buggy_code] * 2 if fb is None else [ref, task.buggy_code]
            out += [SimpleNamespace(code=c, completion=c) for c in codes[: cfg.group_size]]
        return out

    monkeypatch.setattr(E, "sample", fake_sample)
    policy = SimpleNamespace(tokenizer=None, model=SimpleNamespace(config=SimpleNamespace()))
    tasks = _public_toy()
    cfg = EpisodeConfig(turns=3, n_candidates=2)
    eps = run_episodes(policy, tasks, cfg, selectors=["public_tests", "random"])
    assert calls[0] == 4  # turn 1: one sample per task, shared by both selectors
    by = {(e.task_id, e.selector): e for e in eps}
    for t in tasks:
        e = by[(t.task_id, "public_tests")]
        assert [len(e.turns), e.stop, e.reward] == [2, "public_pass", 1.0]
        assert e.turns[1].chosen == 0 and e.turns[1].hidden_ok == [True, False]
        assert e.turns[1].feedback_in == e.turns[0].feedback_out
        assert by[(t.task_id, "random")].turns[0].candidates == e.turns[0].candidates
    inc = by[("toy/inc/bug0", "public_tests")]
    assert inc.turns[1].feedback_in == ("Public tests: 0 of 2 passed.\n"
                                        "- inc(0): expected 1 (int), got -1 (int)\n"
                                        "- inc(1): expected 2 (int), got 0 (int)")
    assert inc.turns[1].prompt == turn_prompt(tasks[0], tasks[0].buggy_code,
                                              inc.turns[1].feedback_in)
    s = summarise([by[(t.task_id, "public_tests")] for t in tasks])
    assert s["pass/turn1"] == 0.0 and s["pass/final"] == 1.0 and s["stop/public_pass"] == 1.0
