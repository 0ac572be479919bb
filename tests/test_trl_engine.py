"""The experiments' TRL engine (``--set engine=trl``): what it refuses before anything trains,
and the learning experiment at its smoke budget on two processes writing a page."""

import dataclasses
import json

import pytest
import torch

from labkit.config import apply_values
from labkit.experiments import load
from labkit.experiments.config import smoke_config
from labkit.experiments.paired import policy_at
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
    """With LoRA, as a real checkpoint trains: TRL's adapters are saved under the names labkit's
    LoRA policy gives them, so the paired evaluation loads them."""
    module = load("learning")
    exp = dataclasses.replace(smoke_config(module), engine="trl", processes=2, seeds=(0,), lora=True,
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
        saved = torch.load(run / "checkpoints" / f"step_{exp.steps:06d}" / "trainable.pt")
        trained = policy_at(run)
        names = {n for n, p in trained.model.named_parameters() if p.requires_grad}
        assert set(saved) == names and all("lora_" in n for n in names)
        assert any(float(saved[n].abs().sum()) > 0 for n in names if "lora_B" in n)  # B moved from 0
        assert json.loads((run / "provenance.json").read_text())["started"]["code"]
        # a finished TRL run is found again as the experiment builds its config, not trained again
        cfg = method_config(exp, "grpo", seed, str(run))
        assert finished_run(run, cfg, weights=weights_fingerprint(exp.policy))


def test_a_page_sets_the_other_engines_page_beside_it_paired_by_seed_and_task(tmp_path):
    """learning.json (labkit) and then learning-trl.json (TRL) in one folder: the TRL page's
    'Both engines' section holds TRL - labkit, paired by seed and task id (the TRL page lists
    its tasks in another order), equal to a naive difference; other settings are not set side
    by side."""
    import random
    import statistics

    from labkit.experiments import stats
    from labkit.experiments.pages import engine_comparison, page_text, write_page

    rng = random.Random(0)
    ids = [f"t{i}" for i in range(12)]
    lab = {s: [rng.choice([-0.25, 0.0, 0.25, 0.5]) for _ in ids] for s in (0, 1, 2)}
    trl = {s: [rng.choice([-0.25, 0.0, 0.25]) for _ in ids] for s in (0, 1, 2)}
    order = list(reversed(range(12)))

    def results(engine, per, task_order):
        change = stats.paired_change({s: [v[i] for i in task_order] for s, v in per.items()},
                                     [ids[i] for i in task_order])
        return {"experiment": "learning", "config": {"engine": engine, "seeds": [0, 1, 2],
                                                     "steps": 10, "out": "x"},
                "methods": {"grpo": {"paired_change": change}}, "page": None}

    render = lambda r: "# page"
    write_page(results("labkit", lab, range(12)), tmp_path, render)
    r = results("trl", trl, order)
    r["page"] = "learning-trl"
    md = write_page(r, tmp_path, render)
    saved = json.loads(md.with_suffix(".json").read_text())
    row = saved["engines"]["methods"]["grpo"]
    naive = statistics.fmean(trl[s][i] - lab[s][i] for s in (0, 1, 2) for i in range(12))
    assert row["trl_minus_labkit"]["mean"] == pytest.approx(naive, abs=1e-12)
    assert row["trl_minus_labkit"]["per_seed"]["0"] == pytest.approx(
        statistics.fmean(trl[0][i] - lab[0][i] for i in range(12)), abs=1e-12)
    text = md.read_text()
    assert "## Both engines" in text and "| grpo |" in text and text == page_text(render, saved)
    other = results("labkit", lab, range(12))
    other["config"]["steps"] = 20
    assert engine_comparison({**r, "config": {**r["config"]}}, tmp_path)["comparable"]
    (tmp_path / "learning.json").write_text(json.dumps(other))
    got = engine_comparison(r, tmp_path)
    assert not got["comparable"] and got["differs"] == ["steps"]
