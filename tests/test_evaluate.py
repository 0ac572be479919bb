"""Held-out evaluation: the summary's figures against a naive recount of the same samples."""

import ast

from conftest import toy_tasks
from labkit.sandbox.pool import Sandbox
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import load_policy
from labkit.policy.rollout import SamplingConfig, sample


def _top_level_defs(code: str) -> set[str] | None:
    try:
        return {n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)}
    except SyntaxError:
        return None


def test_evaluate_summary_matches_a_recount_of_the_same_samples(toy_model_dir):
    policy = load_policy(str(toy_model_dir), reference="none")
    tasks = toy_tasks()
    cfg = EvalConfig(k=4, temperature=1.0, max_new_tokens=24, greedy=False, seed=7)
    with Sandbox() as sb:
        rep = evaluate(policy, tasks, cfg, sandbox=sb)
    per = rep["per_task"]
    assert rep["tasks"] == 4 and len(per) == 4
    assert rep["pass_at_1"] == sum(p["correct"] for p in per) / 16
    assert rep["pass_at_1"] <= rep["pass_at_2"] <= rep["pass_at_4"] <= 1
    assert rep["zero_var_groups_frac"] == sum(p["all_equal"] for p in per) / 4
    assert rep["token_entropy"] > 0
    # the same seed draws the same samples: recount kept names with a parser
    rollouts = sample(policy, tasks, SamplingConfig(group_size=4, temperature=1.0, max_new_tokens=24,
                                                    batch_size=cfg.batch_size, seed=7))
    kept = 0
    for t, r in zip([t for t in tasks for _ in range(4)], rollouts):
        defs = _top_level_defs(r.code)
        if defs is not None:  # parseable: the parser's answer is the truth
            kept += t.entry_point in defs
        else:
            kept += r.code.startswith(f"def {t.entry_point}(")
    assert rep["name_kept_rate"] == kept / 16
    assert sum(p["names_kept"] for p in per) == kept


def test_evaluate_refuses_an_empty_task_list_with_a_clear_error(toy_model_dir):
    import pytest

    policy = load_policy(str(toy_model_dir), reference="none")
    with pytest.raises(ValueError, match="no tasks to evaluate"):
        evaluate(policy, [], EvalConfig(k=2, greedy=False))
