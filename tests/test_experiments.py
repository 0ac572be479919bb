"""The experiments' shared statistics, the equal-wall-clock reading, and one end-to-end run
of ``python -m labkit experiment didpo`` on a tiny budget (the code path of the real one)."""

import json
import math
import statistics
import subprocess
import sys

import pytest

from labkit.experiments import load


def test_unknown_experiment_is_named():
    with pytest.raises(ValueError, match="unknown experiment .nope.; available: learning, reshaping"):
        load("nope")


def test_equal_wall_reads_the_fork_curve_at_grpo_wall_time():
    didpo = load("didpo")
    grpo = {"seeds": [{"seed": 0, "s_per_step": 99.0, "pass_at_1_start": 0.5, "pass_at_1_end": 0.6,
                       "wall_s": 40.0, "curve": [[0, 0.5], [10, 0.55], [20, 0.6]]}]}
    fork = {"seeds": [{"seed": 0, "s_per_step": 1.0, "pass_at_1_start": 0.5, "pass_at_1_end": 0.7,
                       "wall_s": 60.0, "curve": [[0, 0.5], [10, 0.52], [20, 0.7]]}]}
    costs = {"grpo": 2.0, "didpo_fork": 3.0}  # measured side by side; the runs' own s/step unused
    r = didpo.equal_wall(grpo, fork, costs)
    s = r["seeds"][0]
    assert s["steps_at_wall"] == 13          # floor(20 * 2 / 3)
    assert s["step_evaluated"] == 10         # the last evaluation at or before step 13
    assert s["pass_at_1_end"] == 0.52
    assert r["delta"][0] == pytest.approx(0.02)
    assert r["wall_s"] == pytest.approx(30.0)  # 10 steps x 3 s
    # a fork run shorter than GRPO's (fork_steps): GRPO's 20 steps x 2 s buy 4 fork steps at 10 s
    short = {"seeds": [{"seed": 0, "s_per_step": 10.0, "pass_at_1_start": 0.5, "pass_at_1_end": 0.58,
                        "wall_s": 50.0, "curve": [[0, 0.5], [2, 0.56], [4, 0.58]]}]}
    s = didpo.equal_wall(grpo, short, {"grpo": 2.0, "didpo_fork": 10.0})["seeds"][0]
    assert (s["steps_at_wall"], s["step_evaluated"], s["pass_at_1_end"]) == (4, 4, 0.58)


def test_equal_wall_never_reports_the_start_policy_as_trained():
    """A budget that ends before the first evaluation after step 0 reads step 0, the start
    policy: that seed is left out and named, not averaged in."""
    didpo = load("didpo")
    grpo = {"seeds": [{"seed": s, "curve": [[0, 0.5], [20, 0.6]]} for s in (0, 1)]}
    fork = {"seeds": [{"seed": 0, "pass_at_1_start": 0.5, "curve": [[0, 0.5], [2, 0.56]]},
                      {"seed": 1, "pass_at_1_start": 0.5, "curve": [[0, 0.5], [4, 0.9]]}]}
    r = didpo.equal_wall(grpo, fork, {"grpo": 1.0, "didpo_fork": 7.0})  # 20 / 7 -> 2 steps
    assert [s["seed"] for s in r["seeds"]] == [0]
    assert r["not_reached"] == [{"seed": 1, "steps_at_wall": 2, "first_evaluation": 4}]
    assert r["end"] == (0.56, None)
    none = didpo.equal_wall(grpo, fork, {"grpo": 1.0, "didpo_fork": 100.0})
    assert none["seeds"] == [] and "end" not in none
    lines = didpo.cost_lines({"step_costs_s": {"grpo": 1.0, "didpo_fork": 100.0},
                              "didpo_fork@wall": none})
    assert any("No seed reached one" in line for line in lines)


def test_experiment_didpo_end_to_end_tiny_budget(tmp_path):
    """Two methods, one seed, one step: trains, evaluates, writes md/json/html with the
    numbers the trainer logged."""
    sets = ["seeds=0", "steps=1", "tasks_per_step=1", "group_size=2", "eval_every=1", "eval_tasks=2",
            "eval_k=1", "train_problems=8", "methods=grpo,didpo", "ablations=", "paired_tasks=2",
            "paired_k=1", "paired_start_k=1", f"out={tmp_path}",
            f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "didpo"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(last) >= {"experiment", "report", "grpo_delta", "didpo_delta"}
    res = json.loads((tmp_path / "didpo.json").read_text())
    for m in ("grpo", "didpo"):
        seed = res["methods"][m]["seeds"][0]
        assert [p[0] for p in seed["curve"]] == [0, 1]
        assert 0.0 <= seed["pass_at_1_start"] <= 1.0 and seed["s_per_step"] > 0
        evals = (tmp_path / "runs" / "didpo" / m / "seed0" / "eval.jsonl").read_text().splitlines()
        assert json.loads(evals[-1])["eval/pass_at_1"] == seed["pass_at_1_end"]
    assert "| grpo |" in (tmp_path / "didpo.md").read_text()
    assert set(res["step_costs_s"]) == {"grpo", "didpo"} and min(res["step_costs_s"].values()) > 0
    assert res["setting"]["n_bugs"] == 2 and res["setting"]["multi_hunk"] is True
    assert res["methods"]["didpo"]["paired_change"]["over"] == "seeds"
    rolled = (tmp_path / "runs" / "didpo" / "didpo" / "seed0" / "rollouts.jsonl").read_text()
    assert "/2bugs" in rolled  # multi-hunk tasks
    assert "measured side by side" in (tmp_path / "didpo.md").read_text()
    html = (tmp_path / "didpo.html").read_text()
    assert 'src="plotly.min.js"' in html and '"name":"grpo seed 0"' in html
    assert (tmp_path / "plotly.min.js").stat().st_size > 1_000_000  # shared by every figure


def test_finished_runs_are_recognised_and_summarised(tmp_path):
    from labkit.config import to_dict
    from labkit.experiments import (ExperimentConfig, base_train_config, finished_run, record_weights,
                                    summarise_run)

    exp = ExperimentConfig(steps=2, eval_every=1)
    cfg = base_train_config(exp, 0, str(tmp_path))
    assert not finished_run(tmp_path, cfg)  # empty folder
    (tmp_path / "config.json").write_text(json.dumps(to_dict(cfg)))
    rows = [{"step": s, "time/step": 2.0, "reward/mean": 0.5 + s / 10} for s in (1, 2)]
    evals = [{"step": s, "eval/pass_at_1": 0.4 + s / 20, "time/eval": 3.0} for s in (0, 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    assert not finished_run(tmp_path, cfg)  # the final evaluation is missing
    with open(tmp_path / "eval.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "eval/pass_at_1": 0.55, "time/eval": 3.0}) + "\n")
    assert finished_run(tmp_path, cfg)
    moved = base_train_config(exp, 0, str(tmp_path / "elsewhere"))
    assert finished_run(tmp_path, moved)  # the same run, filed under another experiment
    shorter = base_train_config(ExperimentConfig(steps=1, eval_every=1), 0, str(tmp_path / "x"))
    assert not finished_run(tmp_path, shorter)  # a 1-step run is not this 2-step run ...
    assert finished_run(tmp_path, shorter, prefix=True)  # ... but is its first step (evaluated)
    assert summarise_run(tmp_path, 0, upto=1)["curve"] == [[0, 0.4], [1, 0.45]]
    shorter.optim.schedule = "cosine"  # the lr at step 1 would depend on the total: no prefix
    assert not finished_run(tmp_path, shorter, prefix=True)
    # the config names the policy ("tiny"), not its weights: a run records their fingerprint
    assert not finished_run(tmp_path, cfg, weights="01b625e45bd3")  # no record: another model
    record_weights(tmp_path, "01b625e45bd3")
    assert finished_run(tmp_path, cfg, weights="01b625e45bd3")
    assert not finished_run(tmp_path, cfg, weights="03d98fdca54b")  # the shipped model changed
    assert not finished_run(tmp_path, shorter, prefix=True, weights="03d98fdca54b")
    cfg.optim.lr = 1.0  # another config: train again
    assert not finished_run(tmp_path, cfg)
    s = summarise_run(tmp_path, 0)
    assert s["wall_s"] == 2 * 2.0 + 3 * 3.0 and s["s_per_step"] == 2.0
    assert s["curve"] == [[0, 0.4], [1, 0.45], [2, 0.55]] and s["train_reward_last"] == 0.7


def test_didpo_fork_and_ablation_steps_set_their_budgets_only():
    from labkit.experiments import base_train_config

    didpo = load("didpo")
    exp = didpo.Config(steps=40, eval_every=20, fork_steps=8, ablation_steps=20)
    for method, steps, every in (("grpo", 40, 20), ("didpo", 40, 20), ("didpo_fork", 8, 8),
                                 ("didpo_no_ae", 20, 20)):
        cfg = base_train_config(exp, 0, "runs/x")
        didpo._configure(exp)(method, cfg)
        assert (cfg.estimator, cfg.steps, cfg.eval_every) == (method, steps, every)


def test_prepare_run_dir_resumes_the_same_run_and_moves_others_aside(tmp_path):
    from labkit.config import to_dict
    from labkit.experiments import ExperimentConfig, base_train_config, prepare_run_dir, record_weights

    run = tmp_path / "seed0"
    cfg = base_train_config(ExperimentConfig(steps=6), 0, str(run))
    assert prepare_run_dir(run, cfg) is False  # nothing there
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    ck = run / "checkpoints" / "step_000002"
    ck.mkdir(parents=True)
    assert prepare_run_dir(run, cfg) is False  # no complete checkpoint: start over, keep the old
    assert not run.exists() and (tmp_path / "seed0.replaced-1" / "metrics.jsonl").exists()
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "COMPLETE").write_text("ok\n")
    assert prepare_run_dir(run, cfg) is True  # same config, a checkpoint: resume
    record_weights(run, "01b625e45bd3")
    assert prepare_run_dir(run, cfg, weights="01b625e45bd3") is True  # and the same model
    lr0, cfg.optim.lr = cfg.optim.lr, 1.0
    assert prepare_run_dir(run, cfg) is False  # another config: moved aside, not appended to
    assert (tmp_path / "seed0.replaced-2" / "config.json").exists() and not run.exists()
    cfg.optim.lr = lr0
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "COMPLETE").write_text("ok\n")
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    record_weights(run, "03d98fdca54b")
    assert prepare_run_dir(run, cfg, weights="01b625e45bd3") is False  # another starting model
    assert (tmp_path / "seed0.replaced-3" / "weights.json").exists() and not run.exists()


def test_report_rewrite_keeps_the_hand_written_commentary(tmp_path):
    from labkit.experiments import COMMENTARY, write_markdown

    md = tmp_path / "x.md"
    write_markdown(md, "# numbers v1\n")
    assert md.read_text() == "# numbers v1\n"
    md.write_text(md.read_text() + "\n" + COMMENTARY + "\n\nWhat the numbers say.\n")
    write_markdown(md, "# numbers v2\n")
    text = md.read_text()
    assert text.startswith("# numbers v2\n") and "v1" not in text
    assert text.endswith(COMMENTARY + "\n\nWhat the numbers say.\n")


def test_figures_in_a_subfolder_load_the_projects_shared_plotly_copy(tmp_path):
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs_version

    from labkit.experiments import save_figure, write_figure_html

    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 0], name="curve"))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    shared = results / "plotly.min.js"
    shared.write_text(f"/**\n* plotly.js v{get_plotlyjs_version()}\n*/\n")
    probe = results / "probes" / "p1"
    html, _ = save_figure(fig, probe, "learning")
    page = html.read_text()
    assert 'src="../../plotly.min.js"' in page and '"name":"curve"' in page
    assert not (probe / "plotly.min.js").exists()  # no second copy

    shared.write_text("/**\n* plotly.js v0.0.1\n*/\n")  # another version: not shared
    html = write_figure_html(fig, probe / "learning.html")
    assert 'src="plotly.min.js"' in html.read_text()
    assert (probe / "plotly.min.js").stat().st_size > 1_000_000
    html = write_figure_html(fig, probe / "other.html")  # the folder's own copy serves the next
    assert 'src="plotly.min.js"' in html.read_text()

    (tmp_path / "pyproject.toml").unlink()  # outside a project only the folder itself counts
    (tmp_path / "docs" / "plotly.min.js").write_text(f"/**\n* plotly.js v{get_plotlyjs_version()}\n*/\n")
    (tmp_path / "docs" / "elsewhere").mkdir()
    html = write_figure_html(fig, tmp_path / "docs" / "elsewhere" / "x.html")
    assert 'src="plotly.min.js"' in html.read_text()
    assert (tmp_path / "docs" / "elsewhere" / "plotly.min.js").stat().st_size > 1_000_000


def test_a_paired_list_that_cannot_be_filled_fails_before_any_training(tmp_path, monkeypatch):
    """run_methods builds the held-out list first: the balanced list's error comes before a
    run folder exists (it used to come after all the training)."""
    from types import SimpleNamespace

    import labkit.experiments as ex
    from labkit.env.balanced import balanced_tasks

    def load(m):  # a stream of at most 30 tasks of 3 templates
        return [SimpleNamespace(meta={"template": f"tpl{i % 3}"}) for i in range(min(m, 30))]

    def unfillable(*a, **k):  # the real balancing over that stream
        return balanced_tasks(10, 2, load)

    monkeypatch.setattr(ex, "held_out_tasks", unfillable)
    exp = ex.ExperimentConfig(seeds=(0,), steps=1, paired_tasks=10, run_root=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="only 6 tasks with at most 2 per template"):
        ex.run_methods("learning", {"grpo": lambda: None}, exp)
    assert not (tmp_path / "runs").exists()


def test_paired_difference_golden_and_bootstrap():
    from labkit.experiments.paired import paired_difference

    r = paired_difference([0.0, 0.5, 1.0, 0.25], [0.5, 0.5, 0.75, 1.0])
    assert r["mean"] == pytest.approx((0.5 + 0 - 0.25 + 0.75) / 4)
    assert (r["improved"], r["worsened"], r["tasks"]) == (2, 1, 4)
    assert -0.25 <= r["ci95"][0] <= r["mean"] <= r["ci95"][1] <= 0.75
    same = paired_difference([0.5] * 10, [0.5] * 10)
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0]
    shift = paired_difference([0.25] * 50, [0.5] * 50)  # every task up by 0.25: a tight interval
    assert shift["ci95"] == [pytest.approx(0.25), pytest.approx(0.25)]
    with pytest.raises(ValueError, match="same"):
        paired_difference([0.1], [0.1, 0.2])


def test_add_paired_reads_cached_evaluations_and_intervals_are_over_seeds(tmp_path):
    """Every run's paired evaluation is cached: nothing is evaluated, and the paired change's
    interval is a t-interval over the seeds' mean changes."""
    from labkit.experiments import ExperimentConfig, add_paired
    from labkit.experiments.paired import cache_name, held_out_tasks
    from labkit.experiments.reshaping import method_difference

    exp = ExperimentConfig(paired_tasks=3, paired_k=4, paired_start_k=4, seeds=(0, 1))
    ids = [t.task_id for t in held_out_tasks(3)]
    key = {"tasks": 3, "k": 4, "eval_seed": 4321, "temperature": 0.7, "task_ids": ids}
    start = [0.25, 0.5, 0.0]
    ends = {"raw_grpo": {0: [0.5, 0.5, 0.25], 1: [0.25, 0.75, 0.0]},
            "reshaped_grpo": {0: [0.5, 0.75, 0.25], 1: [0.5, 0.75, 0.0]}}
    results = {"methods": {m: {"seeds": []} for m in ends}}
    for m, per in ends.items():
        for seed, end in per.items():
            d = tmp_path / m / f"seed{seed}"
            d.mkdir(parents=True)
            (d / cache_name(ids)).write_text(json.dumps({**key, "start_per_task": start, "end_per_task": end}))
            results["methods"][m]["seeds"].append({"seed": seed, "run_dir": str(d)})
    add_paired(results, exp)
    raw = results["methods"]["raw_grpo"]["paired_change"]
    assert raw["per_seed"] == {"0": pytest.approx(1 / 6), "1": pytest.approx(1 / 12)}
    m, ci = 0.125, 12.706 * (1 / 12 / 2 ** 0.5) / 2 ** 0.5
    assert raw["mean"] == pytest.approx(m) and raw["ci95"] == pytest.approx([m - ci, m + ci])
    assert raw["over"] == "seeds" and raw["shown"] is False  # two seeds far apart: not shown
    diff = method_difference(results, "raw_grpo", "reshaped_grpo")
    assert diff["per_seed"] == {"0": pytest.approx(1 / 12), "1": pytest.approx(1 / 12)}
    assert diff["ci95"] == pytest.approx([1 / 12, 1 / 12]) and diff["shown"] is True
def test_experiment_learning_end_to_end_tiny_budget(tmp_path):
    """Two seeds, one step, paired evaluation on 3 tasks: the results file has the setting,
    the command that reruns it, the code commit and, per seed, the start evaluated at that
    seed's own sampling seed; pass@k at the training temperature sits beside pass@1; the page
    is its JSON rendered."""
    from labkit.experiments import learning, pages
    from labkit.experiments.config import command
    from labkit.config import from_dict

    sets = ["seeds=[0,1]", "steps=1", "tasks_per_step=1", "group_size=2", "eval_every=1",
            "eval_tasks=2", "eval_k=1", "train_problems=6", "paired_tasks=3", "paired_k=2",
            "paired_pass_k=2", "train_split=train", f"out={tmp_path}", f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "learning"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "learning.json").read_text())
    assert res["setting"]["split"] == "test" and res["setting"]["feedback"] == "dense"
    from labkit.policy.loading import weights_fingerprint
    sha = weights_fingerprint("tiny")
    assert res["setting"]["model_sha256"] == sha  # which model the numbers belong to
    assert res["seeds"] == [0, 1] and res["code_commit"]
    exp = from_dict(learning.Config, res["config"])
    assert res["command"] == command("learning", exp) and "--set 'seeds=[0,1]'" in res["command"]
    change = res["methods"]["grpo"]["paired_change"]
    assert change["over"] == "seeds" and change["tasks"] == 3 and change["seeds"] == 2
    for seed in ("0", "1"):  # each seed's change is its end minus its own start
        start = res["paired"]["start"]["pass_at_1"][seed]
        assert change["per_seed"][seed] == pytest.approx(res["methods"]["grpo"]["paired_end"][seed] - start)
    assert "mde" in change and "paired_pass_k_change" in res["methods"]["grpo"]
    md = (tmp_path / "learning.md").read_text()
    assert md == pages.rerender(tmp_path / "learning.json")
    assert res["command"] in md and sha in md and "pass@2" in md


def test_experiment_reshaping_runs_every_regime(tmp_path):
    sets = ["seeds=0", "steps=1", "tasks_per_step=1", "group_size=2", "eval_every=1", "eval_tasks=2",
            "eval_k=1", "train_problems=6", "paired_tasks=2", "paired_k=1", "paired_start_k=1",
            "regimes=dense,binary", f"out={tmp_path}", f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "reshaping"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "reshaping.json").read_text())
    assert set(res["regimes"]) == {"dense", "binary"} and res["seeds"] == [0]
    for regime, r in res["regimes"].items():
        assert set(r["methods"]) == {"raw_grpo", "reshaped_grpo"}
        assert r["setting"]["feedback"] == regime
        assert r["methods"]["raw_grpo"]["paired_change"]["over"] == "seeds"
        assert r["reshaped_minus_raw"]["ci95"] is None  # one seed
    runs = json.loads((tmp_path / "runs" / "reshaping" / "binary" / "raw_grpo" / "seed0" /
                       "config.json").read_text())
    assert runs["feedback"]["mode"] == "binary" and runs["reshape"]["w_precision"] == 0.0
    last = json.loads(p.stdout.strip().splitlines()[-1])
    assert "binary/raw_grpo_paired_change" in last


def test_training_on_val_templates_is_evaluated_elsewhere_and_on_new_instances():
    """RL on the ``val`` templates: the trainer refuses to evaluate on the split it trains on,
    and the paired check of the trained templates uses instances no training problem is."""
    from labkit.config import from_dict
    from labkit.env.tasks import load_tasks
    from labkit.experiments import ExperimentConfig, trained_template_tasks
    from labkit.loops.trainer import TrainConfig

    with pytest.raises(ValueError, match="split trained on"):
        from_dict(TrainConfig, {"tasks": {"train_split": "val", "eval_split": "val"}}).validate()
    with pytest.raises(ValueError, match="train_split must be"):
        from_dict(TrainConfig, {"tasks": {"train_split": "test", "eval_split": "val"}}).validate()
    exp = ExperimentConfig(train_split="val", train_problems=8, paired_tasks=5)
    trained = {t.task_id.split("/")[1] for t in load_tasks("synthetic", split="val", n=8, seed=0)}
    fresh = trained_template_tasks(exp)
    assert len(fresh) == 5 and all(t.split == "val" for t in fresh)
    assert not trained & {t.task_id.split("/")[1] for t in fresh}


@pytest.mark.slow
def test_held_out_tasks_a_val_reference_solves_are_found():
    """Training on ``val`` templates: the held-out ``test`` tasks some trained-on reference
    passes wholly are named (checked against a plain double loop over the references)."""
    from labkit.env.overlap import compile_reference, passes_all
    from labkit.env.tasks import synthetic_problems
    from labkit.experiments import ExperimentConfig, leaked_task_ids
    from labkit.experiments.paired import held_out_tasks

    exp = ExperimentConfig(train_split="val", train_problems=300, paired_tasks=120)
    tasks = held_out_tasks(exp.paired_tasks, "test", 0)
    got = leaked_task_ids(exp, tasks)
    refs = [compile_reference(p) for p in synthetic_problems("val", 300, seed=0)]
    by_id = {p.problem_id: p for p in synthetic_problems("test", 400, seed=0)}
    want = {t.task_id for t in tasks
            if any(passes_all(fn, by_id[t.problem_id]) for fn in refs)}
    assert got == want and 0 < len(got) < len(tasks)  # the measured leak is a few percent


@pytest.mark.slow
def test_leak_check_finds_multi_hunk_held_out_tasks_deep_in_the_stream():
    """Two-bug multi-hunk tasks skip most problems of the held-out stream, so some lie beyond
    its first 2n + 50 problems; the leak check reads each task's own hidden tests and
    signature, so it needs no scan of the stream (it raised when it scanned). Agreement with
    a plain double loop is checked on one-bug tasks above."""
    from labkit.env.tasks import synthetic_problems
    from labkit.experiments import ExperimentConfig, leaked_task_ids
    from labkit.experiments.paired import held_out_tasks

    exp = ExperimentConfig(train_split="val", train_problems=50, paired_tasks=150, n_bugs=2,
                           multi_hunk=True)
    tasks = held_out_tasks(exp.paired_tasks, "test", 0, 2, True)
    stream = synthetic_problems("test", 2 * len(tasks) + 50, seed=0)
    assert {t.problem_id for t in tasks} - {p.problem_id for p in stream}  # deeper than 2n + 50
    got = leaked_task_ids(exp, tasks)
    assert got <= {t.task_id for t in tasks}


def test_experiment_mucode_over_seeds_tiny_budget_and_reuses_finished_seeds(tmp_path):
    """Two training seeds on a tiny budget: the results file has the setting, the seeds, and
    per condition a paired change whose interval is over the seeds; a second run with the
    same settings reuses both seeds' results instead of training again."""
    sets = ["seeds=0,1", "train_problems=6", "rollouts_per_task=1", "iterations=1", "eval_tasks=4",
            "sft_steps=2", "turns=2", "verifier_epochs=1", f"out={tmp_path}",
            f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "mucode"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "mucode.json").read_text())
    assert res["seeds"] == [0, 1] and res["setting"]["train_split"] == "val"
    assert res["setting"]["eval_tasks"] == 4 and res["setting"]["split"] == "test"
    for cond, m in res["methods"].items():
        change = m["paired_change"]
        assert change["over"] == "seeds" and change["seeds"] == 2 and change["tasks"] == 4
        for s in ("0", "1"):
            start = res["per_seed"][s]["synthetic"]["start"]["conditions"][cond]
            end = res["per_seed"][s]["synthetic"]["expert_iteration"]["conditions"][cond]
            assert change["per_seed"][s] == pytest.approx(statistics.fmean(end) - statistics.fmean(start))
    assert list(res["methods"])[0] == "single-turn, N=1"
    assert (tmp_path / "mucode.html").exists() and "## Expert iteration, per seed" in (
        tmp_path / "mucode.md").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("reusing") == 2
    assert json.loads((tmp_path / "mucode.json").read_text())["methods"] == res["methods"]


def test_mucode_summary_matches_a_naive_paired_mean_and_drops_leaked_tasks():
    from labkit.experiments.mucode import summarise

    def gen(vals):
        conds = {c: list(v) for c, v in vals.items()}
        rank = {k: 0.5 for k in ("verifier/pairwise_acc", "verifier/auc", "verifier/bon_hit",
                                 "verifier/bon_random")}
        return {"conditions": conds, "verifier_ranking": {"bt": rank, "bce": rank}}

    names = ["multi-turn, BoN, public_tests", "multi-turn, BoN, random", "multi-turn, BoN, verifier",
             "multi-turn, BoN, public_then_verifier", "single-turn, BoN, public_then_verifier",
             "single-turn, BoN, random", "single-turn, BoN, verifier",
             "single-turn, BoN, verifier (BCE)"]
    start = {c: [0.0, 1.0, 0.0] for c in names}
    ends = {0: [1.0, 1.0, 0.0], 1: [0.0, 1.0, 1.0], 2: [1.0, 0.0, 1.0]}
    per_seed = {s: {"synthetic": {"start": gen(start),
                                  "expert_iteration": gen({c: e for c in names})}}
                for s, e in ends.items()}
    out = summarise(per_seed, ["a", "b", "c"], leaked={"c"})
    m = out["methods"]["multi-turn, BoN, random"]
    naive = [statistics.fmean(e[i] - start["multi-turn, BoN, random"][i] for i in range(3))
             for e in ends.values()]
    assert m["paired_change"]["mean"] == pytest.approx(statistics.fmean(naive))
    assert m["paired_change"]["ci95"] is not None and m["paired_change"]["seeds"] == 3
    clean = [statistics.fmean(e[i] - start["multi-turn, BoN, random"][i] for i in range(2))
             for e in ends.values()]
    assert m["paired_clean_change"]["mean"] == pytest.approx(statistics.fmean(clean))
    assert m["paired_clean_change"]["tasks"] == 2
    # public_tests and random are equal everywhere here: their contrast is exactly 0
    c = out["contrasts"]["expert_iteration"]["BoN: public_tests - random (multi-turn)"]
    assert c["mean"] == 0.0 and c["ci95"] == [0.0, 0.0]


def test_ablation_differences_are_paired_by_seed():
    from labkit.experiments.didpo import ablation_differences, ablation_lines, ablation_name

    def change(per_seed):
        return {"per_seed": {str(s): v for s, v in per_seed.items()}}

    name = ablation_name("didpo_no_ae", (0, 1, 2))
    assert name == "didpo_no_ae (seeds 0,1,2)" and ablation_name("x", [3]) == "x (seed 3)"
    results = {"methods": {
        "grpo": {"paired_trained_change": change({0: 0.10, 1: 0.08, 2: 0.09, 3: 0.5})},
        "didpo": {"paired_trained_change": change({0: 0.09, 1: 0.07, 2: 0.10, 3: 0.5})},
        name: {"paired_trained_change": change({0: 0.04, 1: 0.03, 2: 0.05})}}}
    d = ablation_differences(results, {"didpo_no_ae": name})
    g = d["didpo_no_ae"]["grpo"]["paired_trained"]
    assert g["per_seed"] == pytest.approx({"0": -0.06, "1": -0.05, "2": -0.04})  # seed 3: not shared
    assert g["mean"] == pytest.approx(-0.05)
    half = 4.303 * 0.01 / math.sqrt(3)  # t_{2} * sd / sqrt(n)
    assert g["ci95"] == pytest.approx([-0.05 - half, -0.05 + half]) and g["shown"]
    assert "paired" not in d["didpo_no_ae"]["grpo"]  # not measured, not invented
    assert any("didpo_no_ae | didpo |" in line for line in ablation_lines({"ablation_differences": d}))


def test_didpo_ablation_seeds_must_be_trained_seeds():
    from labkit.experiments.didpo import Config, run

    with pytest.raises(ValueError, match="ablation_seeds \\[4\\] are not in seeds"):
        run(Config(seeds=(0, 1), ablation_seeds=(0, 4)))


def test_reshaping_claim_needs_the_claimed_size_not_only_a_shown_gain():
    from labkit.experiments.reshaping import claim_verdict

    assert claim_verdict({"shown": False, "mean": 0.01, "relative_end": 0.5}).startswith("no difference")
    assert claim_verdict({"shown": True, "mean": -0.01, "relative_end": -0.05}) == "reshaping is worse here"
    assert claim_verdict({"shown": True, "mean": 0.06, "relative_end": 0.40}) == "the blog's claim holds here"
    small = claim_verdict({"shown": True, "mean": 0.006, "relative_end": 0.032})
    assert "far smaller than the claim" in small and "+3.2%" in small


def test_the_experiments_per_test_limit_passes_synthetic_references():
    """The experiments' shorter per-test limit (``sandbox.test_timeout_s``) leaves every
    synthetic reference passing (a sample of the val, test and two-bug val sets) and still
    ends a looping candidate at that limit."""
    import time

    from labkit.env.records import Candidate
    from labkit.env.sandbox import Sandbox
    from labkit.env.tasks import load_tasks
    from labkit.experiments import SYNTHETIC_TEST_TIMEOUT_S, ExperimentConfig, base_train_config

    cfg = base_train_config(ExperimentConfig(), 0, "runs/x")
    assert cfg.sandbox.test_timeout_s == SYNTHETIC_TEST_TIMEOUT_S < 1.0
    assert cfg.sampling.sampler == "race"  # every recorded result's; the faster one is asked for
    assert base_train_config(ExperimentConfig(sampler="inverse_cdf"), 0, "runs/x").sampling.sampler == \
        "inverse_cdf"
    tasks = (load_tasks("synthetic", split="val", n=40, seed=0) + load_tasks("synthetic", split="test", n=20, seed=0)
             + load_tasks("synthetic", split="val", n=40, seed=0, n_bugs=2, multi_hunk=True))
    with Sandbox(cfg.sandbox) as sb:
        res = sb.run_many([Candidate(code=t.reference_code, tests=t.tests, entry_point=t.entry_point, id=t.task_id)
                           for t in tasks])
        assert all(r.ok for r in res), [t.task_id for t, r in zip(tasks, res) if not r.ok]
        t = tasks[0]
        t0 = time.perf_counter()
        loop = sb.run(Candidate(code=f"def {t.entry_point}(*a, **k):\n    while True:\n        pass\n",
                                tests=t.tests, entry_point=t.entry_point, id="loop"))
        assert loop.status.value == "timeout" and time.perf_counter() - t0 < 0.9


def test_the_training_sampler_temperature_reaches_the_runs_and_the_report():
    from labkit.experiments import ExperimentConfig, base_train_config

    assert base_train_config(ExperimentConfig(), 0, "r").sampling.temperature == 1.6
    hot = base_train_config(ExperimentConfig(temperature=1.3), 0, "r")
    assert hot.sampling.temperature == 1.3 and hot.eval_temperature == 0.7  # evaluation stays
