"""muCODE expert iteration: local experts, relabelling, the loop end to end on a small model,
and the ``python -m labkit mucode`` command."""

import dataclasses
import json

import pytest
import torch
from conftest import toy_tasks

from labkit.sandbox.records import TestSuite
from labkit.mucode.episodes import Episode, EpisodeConfig, Turn
from labkit.mucode.loop import (MucodeConfig, MucodeTasks, choose_experts, collect_programs,
                                collected_examples, relabel, run_mucode, split_tasks)
from labkit.mucode.verifier import VerifierConfig
from labkit.policy.sft import SFTConfig


def _turn(k, prompt, cands, oks, chosen=0):
    return Turn(turn=k, prompt=prompt, feedback_in=None, candidates=cands, completions=cands,
                public=[(0, 1)] * len(cands), hidden_ok=oks, scores=[None] * len(cands),
                chosen=chosen)


def test_choose_experts_golden():
    codes = {"a": ["x = 1", "x = 2", "x = 3"], "b": ["", "y = 1"], "c": ["", " "],
             "d": ["z = 1", "z = 2"]}
    scores = {"a": [0.1, 0.7, -2.0], "b": [9.0, -1.0], "c": [1.0, 2.0], "d": [0.5, 0.5]}
    # argmax per task; empty programs never win; ties keep the first; c has no expert
    assert choose_experts(codes, scores) == {"a": "x = 2", "b": "y = 1", "d": "z = 1"}


def test_local_experts_are_chosen_from_everything_collected_so_far():
    """A program that passed in iteration 1 stays a candidate expert in iteration 2, as the
    verifier's data does (the pool accumulates; experts used to come from one iteration)."""
    pool = {}
    collect_programs(pool, [Episode("a", 0, [_turn(1, "P", ["good", "bad"], [True, False])])])
    collect_programs(pool, [Episode("a", 0, [_turn(1, "P", ["bad", "worse"], [False, False])]),
                            Episode("b", 0, [_turn(1, "Q", ["b1"], [False])])])
    assert pool == {"a": {"good": True, "bad": False, "worse": False}, "b": {"b1": False}}
    scores = {"a": [0.9, 0.1, 0.0], "b": [0.0]}
    assert choose_experts({t: list(p) for t, p in pool.items()}, scores) == {"a": "good", "b": "b1"}


def test_relabel_golden():
    eps = [Episode("a", 0, [_turn(1, "P1", ["c1"], [False]), _turn(2, "P2", ["c2"], [False])]),
           Episode("a", 1, [_turn(1, "P1", ["c3"], [True])]),  # same prompt as above: one pair
           Episode("b", 0, [_turn(1, "Q1", ["d1"], [False])]),  # no expert for b: dropped
           Episode("c", 0, [_turn(1, "R1", ["e1"], [True])])]
    pairs = relabel(eps, {"a": "def f():\n    return 1\n\n", "c": "def g(): pass"})
    assert pairs == [("P1", "def f():\n    return 1\n"), ("P2", "def f():\n    return 1\n"),
                     ("R1", "def g(): pass\n")]


def test_collected_examples_labels_every_candidate_once():
    tasks = toy_tasks()
    eps = [Episode(tasks[0].task_id, 0, [_turn(1, "P", ["A", "B"], [True, False]),
                                         _turn(2, "P2", ["B", "C"], [False, False])])]
    ex = collected_examples(tasks, eps)
    assert [(e.group, e.label) for e in ex] == [(tasks[0].task_id, 1.0), (tasks[0].task_id, 0.0),
                                               (tasks[0].task_id, 0.0)]
    assert "### Candidate\nA\n" in ex[0].text


def test_split_tasks_is_stable_and_disjoint():
    tasks = toy_tasks() * 1
    a, b = split_tasks(tasks, 0.5, 0)
    assert {t.task_id for t in a}.isdisjoint({t.task_id for t in b})
    assert len(a) + len(b) == len(tasks) and split_tasks(tasks, 0.5, 0) == (a, b)
    assert split_tasks(tasks, 0.0, 0) == (tasks, [])


def _public_toy():
    return [dataclasses.replace(t, public_tests=TestSuite(cases=t.tests.cases[:2]))
            for t in toy_tasks()]


def _nll(model, tok, pairs):
    from labkit.policy.sft import _collate, tokenize_pairs

    ex, _ = tokenize_pairs(tok, pairs, 640)
    with torch.no_grad():
        return model(**_collate(ex, list(range(len(ex))), tok.pad_token_id)).loss.item()


def test_expert_iteration_end_to_end(random_model_dir, tmp_path):
    from labkit.runs.events import EventBus
    from labkit.policy.loading import load_policy
    from labkit.policy.prompts import plain_prompt

    tasks = _public_toy()
    cfg = MucodeConfig(
        run_dir=str(tmp_path / "run"), iterations=1, rollouts_per_task=2,
        tasks=MucodeTasks(verifier_holdout=0.25),
        collect=EpisodeConfig(turns=2, n_candidates=1, max_new_tokens=24),
        verifier=VerifierConfig(backbone=str(random_model_dir), epochs=2, max_len=96),
        sft=SFTConfig(lr=3e-3, batch_size=8, max_steps=8, warmup_steps=2, log_every=4),
        evaluate=EpisodeConfig(turns=1, n_candidates=2, max_new_tokens=16))
    seen = []
    bus = EventBus()
    for ev in ("on_train_start", "on_rollout", "on_step_end", "on_eval", "on_checkpoint",
               "on_train_end"):
        bus.on(ev, lambda ev=ev, **kw: seen.append(ev) or owners.append(kw["trainer"]))
    owners = []
    pol = load_policy(str(random_model_dir), reference="none")
    result = run_mucode(cfg, policy=pol, train_tasks=tasks, eval_tasks=tasks[:2], events=bus)

    assert seen == ["on_train_start", "on_eval", "on_rollout", "on_step_end", "on_checkpoint",
                    "on_eval", "on_train_end"]
    # every event carries the loop itself, as the RL trainer's do
    assert all(type(o).__name__ == "ExpertIteration" for o in owners) and len(set(map(id, owners))) == 1
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and [e["step"] for e in evals] == [0, 1]
    row = rows[0]
    assert row["collect/episodes"] == 8 and 1 <= row["collect/turns/mean"] <= 2
    assert row["sft/steps"] == 8 and row["sft/pairs"] >= row["expert/tasks"] >= 1
    # before the first iteration there is no verifier, so only the verifier-free selectors ran
    assert "eval/random/pass/final" in evals[0] and "eval/verifier/pass/final" not in evals[0]
    assert "eval/public_then_verifier/pass/final" in evals[1]
    steps = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    assert {s["turn"] for s in steps} <= {1, 2} and all("return_to_go" in s for s in steps)
    ck = run / "checkpoints" / "iter_001"
    assert (ck / "config.json").is_file() and (ck / "verifier" / "verifier.pt").is_file()
    experts = json.loads((ck / "experts.json").read_text())
    assert experts and set(experts) <= {t.task_id for t in tasks}
    # learning happened: the generator now prefers the experts it was relabelled with
    by_id = {t.task_id: t for t in tasks}
    pairs = [(plain_prompt(by_id[k]), v.rstrip() + "\n") for k, v in experts.items()]
    fresh = load_policy(str(random_model_dir), reference="none")
    assert _nll(result.policy.model, pol.tokenizer, pairs) < _nll(fresh.model, fresh.tokenizer, pairs)
    assert result.data and result.verifier is not None


def test_mucode_cli_from_a_config_file(random_model_dir, tmp_path):
    from labkit.__main__ import main

    yaml_file = tmp_path / "mucode.yaml"
    yaml_file.write_text(
        f"run_dir: {tmp_path / 'cli'}\niterations: 1\nrollouts_per_task: 1\n"
        f"policy: {{spec: {random_model_dir}}}\n"
        "tasks: {source: synthetic, train_problems: 3, eval_tasks: 0, verifier_holdout: 0.0}\n"
        "collect: {turns: 1, max_new_tokens: 16}\n"
        f"verifier: {{backbone: {random_model_dir}, epochs: 1, max_len: 64}}\n"
        "sft: {max_steps: 2, batch_size: 4, warmup_steps: 1}\n")
    assert main(["mucode", "--config", str(yaml_file), "--set", "seed=1"]) == 0
    assert (tmp_path / "cli" / "metrics.jsonl").is_file()
    assert (tmp_path / "cli" / "checkpoints" / "iter_001" / "experts.json").is_file()


def test_mucode_cli_errors(tmp_path, capsys):
    from labkit.__main__ import main

    assert main(["mucode", "--set", "nonsense=1"]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert main(["mucode", "--set", "eval_selectors=random,psychic"]) == 2
    assert "unknown selectors" in capsys.readouterr().err
    assert main(["mucode", "--config", str(tmp_path / "missing.yaml")]) == 2
    with pytest.raises(SystemExit):
        main(["mucode", "--bogus"])


def test_a_cached_seed_result_belongs_to_the_starting_weights(toy_model_dir, random_model_dir):
    """A seed's ``result.json`` is reused only for the same settings *and* weights: the config
    names the policy (``tiny``), and the shipped model behind that name can be rebuilt."""
    from labkit.experiments.mucode import Config, _fingerprint

    a = _fingerprint(Config(policy=str(toy_model_dir)), 0)
    assert a == _fingerprint(Config(policy=str(toy_model_dir), out="elsewhere"), 0)
    other = _fingerprint(Config(policy=str(random_model_dir)), 0)
    assert other["weights_sha256"] != a["weights_sha256"]
    assert {k: v for k, v in other.items() if k not in ("policy", "weights_sha256")} == \
        {k: v for k, v in a.items() if k not in ("policy", "weights_sha256")}
