"""The experiments' TRL engine (``--set engine=trl``): what it refuses before anything trains,
and the learning experiment at its smoke budget on two processes writing a page."""

import dataclasses
import json

import pytest

from labkit.config import apply_values
from labkit.experiments import load
from labkit.experiments.config import smoke_config
from labkit.experiments.runs import finished_run, method_config
from labkit.config import to_dict
from labkit.experiments.trl_engine import EngineError, refusal
from labkit.integrations.trl_train import grpo_config
from labkit.loops.config import TrainConfig
from labkit.policy.loading import weights_fingerprint


@pytest.mark.parametrize("values, word", [
    ({"estimator": "oracle_hunk"}, "rollout stages"),
    ({"estimator": "didpo_fork", "fork.kl_to_baseline": True}, "kl_to_baseline"),
    ({"reshape": "reshaped"}, "advantage transforms"),
    ({"reshape.amplify": "piecewise"}, "advantage transforms"),
    ({"match_scale": True}, "match_scale"),
    ({"policy.lora": True}, "LoRA"),
    ({"loss.entropy_coef": 0.01}, "entropy"),
    ({"loss.kl_coef": 0.01, "loss.kl_estimator": "k1"}, "k3"),
    ({"loss.agg": "seq-mean-token-sum-norm"}, "loss_type"),
])
def test_the_trl_engine_refuses_what_it_cannot_train(values, word):
    assert refusal(TrainConfig()) is None
    assert refusal(apply_values(TrainConfig(), {"estimator": "didpo"})) is None
    assert refusal(apply_values(TrainConfig(), {"curriculum": True})) is None  # TRL's sampler is labkit's then
    forks = apply_values(TrainConfig(), {"estimator": "didpo_fork", "tasks_per_step": 3})
    assert refusal(forks) is None and refusal(forks, processes=3) is None
    assert "groups on each process" in refusal(forks, processes=2)
    assert word in refusal(apply_values(TrainConfig(), values))


def test_grpo_config_carries_the_train_config(tmp_path):
    cfg = apply_values(TrainConfig(), {"tasks_per_step": 3, "sampling.group_size": 4,
                                       "loss.kl_coef": 0.02, "optim.lr": 3e-5, "steps": 7})
    g = grpo_config(to_dict(cfg), 1, tmp_path)  # TRL checks the batch against this process's world
    assert (g.per_device_train_batch_size, g.num_generations, g.max_steps) == (12, 4, 7)
    assert (g.beta, g.learning_rate, g.loss_type, g.scale_rewards) == (0.02, 3e-5, "dapo", "group")
    with pytest.raises(ValueError, match="do not split over 5"):
        grpo_config(to_dict(cfg), 5, tmp_path)


def test_a_method_the_engine_cannot_train_is_refused_before_anything_runs(tmp_path):
    module = load("didpo")  # its methods hold the oracle, whose hunk values are labkit's stage
    exp = dataclasses.replace(smoke_config(module), engine="trl", out=str(tmp_path / "out"),
                              run_root=str(tmp_path / "runs"))
    with pytest.raises(EngineError, match="oracle_hunk.*rollout stages"):
        module.run(exp)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
    learning = load("learning")
    with pytest.raises(EngineError, match="labkit engine trains in one process"):
        learning.run(dataclasses.replace(smoke_config(learning), processes=2,
                                         run_root=str(tmp_path / "runs")))


@pytest.mark.slow
def test_learning_smoke_with_trl_on_two_processes_writes_its_page(tmp_path):
    module = load("learning")
    exp = dataclasses.replace(smoke_config(module), engine="trl", processes=2, seeds=(0,),
                              out=str(tmp_path / "out"), run_root=str(tmp_path / "runs"))
    page = module.run(exp)
    assert page.name == "learning-trl.md"  # beside the labkit engine's page, never over it
    results = json.loads(page.with_suffix(".json").read_text())
    assert results["config"]["engine"] == "trl" and "engine=trl" in results["command"]
    assert "learning-trl.html" in page.read_text()
    assert "paired_change" in results["methods"]["grpo"]
    for seed in exp.seeds:
        run = tmp_path / "runs" / "learning-trl" / "grpo" / f"seed{seed}"
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(1, exp.steps + 1))
        assert all("trl/kl" in r and "reward/mean" in r for r in rows)  # TRL trained it
        assert [e["step"] for e in evals] == [0, exp.steps]
        assert (run / "checkpoints" / f"step_{exp.steps:06d}" / "COMPLETE").exists()
        assert json.loads((run / "provenance.json").read_text())["started"]["code"]
        # a finished TRL run is found again as the experiment builds its config, not trained again
        cfg = method_config(exp, "grpo", seed, str(run))
        assert finished_run(run, cfg, weights=weights_fingerprint(exp.policy))
