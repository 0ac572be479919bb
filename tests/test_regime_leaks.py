"""Each feedback regime pays only what it reveals.

For every weak regime, two training runs differ only in what the regime hides from the
learner (the hidden outcomes beyond the visible examples, the unflipped truth, the fraction
behind a pass/fail or a coarse level); everything the learner is told is the same. Every
reward, advantage and told signal of every step must then be the same too: a difference means
some part of the reward (the progress bonus, the curriculum, the precision gate's baseline...)
reads the hidden truth. The runs use the whole blog recipe with the progress bonus paid at the
first pass after a failure, and the curriculum on, so that each reader is exercised.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import toy_tasks
from labkit.config import from_dict
from labkit.credit.reshaping import recipe
from labkit.env import feedback as feedback_module
from labkit.sandbox.records import SandboxResult, Status, TestOutcome, TestSuite
from labkit.sandbox.pool import Sandbox
from labkit.loops.trainer import TrainConfig, Trainer

VISIBLE = ("case_0", "case_1")


def _tasks():
    """The toy tasks with two of their four tests as the visible examples."""
    return [dataclasses.replace(t, public_tests=TestSuite(cases=tuple(
        c for c in t.tests.cases if c.name in VISIBLE))) for t in toy_tasks()]


def _with(result: SandboxResult, oks: list[bool]) -> SandboxResult:
    """``result`` with its outcomes replaced by ``oks`` (status and counts to match)."""
    outs = tuple(TestOutcome(o.name, ok, o.graded_in) for o, ok in zip(result.outcomes, oks))
    passed = sum(oks)
    status = Status.PASSED if passed == result.total else Status.FAILED
    return dataclasses.replace(result, outcomes=outs, passed=passed, status=status)


def hide_beyond_visible(result: SandboxResult) -> SandboxResult:
    """``public``: flip every outcome of a test that is not a visible example."""
    return _with(result, [o.ok if o.name in VISIBLE else not o.ok for o in result.outcomes])


def invert_truth(result: SandboxResult) -> SandboxResult:
    """``noisy``: invert every true outcome (the test inverts every flip to match, so the
    flipped outcomes the learner is told stay the same)."""
    return _with(result, [not o.ok for o in result.outcomes])


def change_fraction_of_failures(result: SandboxResult) -> SandboxResult:
    """``binary``: a failing program passes every test but its first failing one (the
    fraction changes, the verdict 'not all passed' does not)."""
    if result.ok:
        return result
    first = next(i for i, o in enumerate(result.outcomes) if not o.ok)
    return _with(result, [i != first for i in range(len(result.outcomes))])


def change_within_level(result: SandboxResult) -> SandboxResult:
    """``coarse`` at 4 levels over 4 tests: 0 and 1 passes read the same level (0)."""
    passed = sum(o.ok for o in result.outcomes)
    if passed == 0:
        return _with(result, [i == 0 for i in range(len(result.outcomes))])
    if passed == 1:
        return _with(result, [False] * len(result.outcomes))
    return result


class HidingSandbox:
    """A real sandbox whose results are changed by ``hide`` where they have all their tests'
    outcomes (a program that did not load is the same in every regime)."""

    def __init__(self, sandbox: Sandbox, hide):
        self.sandbox, self.hide = sandbox, hide

    def run_many(self, candidates):
        out = []
        for r in self.sandbox.run_many(candidates):
            complete = r.outcomes and len(r.outcomes) == r.total
            out.append(self.hide(r) if complete else r)
        return out


def _run(tmp_path, model_dir, mode: str, sandbox, name: str) -> list[dict]:
    cfg = from_dict(TrainConfig, {
        "run_dir": str(tmp_path / name), "seed": 5, "steps": 3, "tasks_per_step": 3,
        "policy": {"spec": str(model_dir), "reference": "auto"},
        "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 24},
        "tasks": {"source": "records", "eval_tasks": 0},
        "feedback": {"mode": mode, "progress_patience": 1, "noise_p": 0.3},
        "loss": {"kl_coef": 0.01, "micro_batch_size": 6}, "optim": {"lr": 1e-3},
        "curriculum": True, "eval_every": 0, "checkpoint_every": 10, "log_rollouts": -1,
    })
    cfg.reshape = dataclasses.replace(recipe("reshaped"), w_progress=1.0, warmup_steps=1,
                                      ema_baseline=0.5, focus_threshold=0.3)
    tr = Trainer(cfg, train_tasks=_tasks(), eval_tasks=[], sandbox=sandbox)
    try:
        tr.train(progress=False)
    finally:
        tr.close()
    rows = [json.loads(line) for line in (tmp_path / name / "rollouts.jsonl").read_text().splitlines()]
    return [{"step": r["step"], "task": r["task_id"], "reward": r["reward"],
             "advantages": r["advantages"], "told": r["components"]["r_feedback"],
             "progress": r["components"]["r_progress"], "truth": r["components"]["r_test"]}
            for r in rows]


REGIMES = {"public": hide_beyond_visible, "noisy": invert_truth,
           "binary": change_fraction_of_failures, "coarse": change_within_level}


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(REGIMES))
def test_a_regime_pays_only_what_it_reveals(mode, toy_model_dir, tmp_path, monkeypatch):
    with Sandbox() as sandbox:
        told = _run(tmp_path, toy_model_dir, mode, HidingSandbox(sandbox, lambda r: r), "truth")
        if mode == "noisy":  # the truth inverted and every flip inverted: the same told outcomes
            flips = feedback_module.noise_flips
            monkeypatch.setattr(feedback_module, "noise_flips",
                                lambda rng, n, p: [not e for e in flips(rng, n, p)])
        hidden = _run(tmp_path, toy_model_dir, mode, HidingSandbox(sandbox, REGIMES[mode]), "hidden")
    # the change reached what the regime hides...
    assert [r["truth"] for r in told] != [r["truth"] for r in hidden]
    # ...and nothing the learner is paid or steered by
    for a, b in zip(told, hidden, strict=True):
        assert (a["step"], a["task"], a["told"], a["progress"]) == (b["step"], b["task"], b["told"], b["progress"])
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-12)
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-9)


def test_a_weak_regime_refuses_a_test_term_that_reads_hidden_tests(tmp_path):
    with pytest.raises(ValueError, match="reads the hidden tests.*test_reward=feedback"):
        from_dict(TrainConfig, {"feedback": {"mode": "public"}, "reshape": {"test_reward": "fraction"}})
    cfg = from_dict(TrainConfig, {"feedback": {"mode": "public"}})
    cfg.reshape.test_reward = "binary"
    with pytest.raises(ValueError, match="reads the hidden tests.*test_reward=feedback"):
        cfg.validate()
    cfg.feedback.mode = "dense"
    cfg.validate()  # dense feedback reveals every hidden test
