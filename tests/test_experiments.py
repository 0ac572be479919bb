"""The experiments: run management (reuse, resume, move aside), the paired evaluation, the
pages rendered from their JSON (the committed ones included), and each experiment end to end
on a tiny budget (the code path of the real one)."""

import json
import os
import statistics
import subprocess
import sys

import pytest
from pathlib import Path

from labkit.config import apply_overrides, to_record
from labkit.experiments import load
from labkit.experiments.config import NOT_IN_COMMAND, command
from labkit.docs.findings import table as findings_table


def test_step_costs_are_measured_once_per_run_root(tmp_path, monkeypatch):
    """A restarted didpo experiment reads its side-by-side costs back (so ``didpo_fork@wall``
    keeps its steps); another training config or other code measures anew."""
    from labkit import provenance
    from labkit.experiments import didpo

    measured = []

    def fake(exp, methods, rounds=2):
        measured.append(methods)
        return {m: 1.0 + len(measured) + i for i, m in enumerate(methods)}

    monkeypatch.setattr(didpo, "measure_step_costs", fake)
    exp = didpo.Config(run_root=str(tmp_path))
    first, where = didpo.step_costs(exp, ("grpo", "didpo_fork"))
    assert where == "measured" and first == {"grpo": 2.0, "didpo_fork": 3.0}
    again, where = didpo.step_costs(didpo.Config(run_root=str(tmp_path)), ("grpo", "didpo_fork"))
    assert again == first and where.endswith("step_costs.json") and len(measured) == 1
    part, where = didpo.step_costs(didpo.Config(run_root=str(tmp_path), seeds=(2,)), ("didpo_fork",))
    assert part == {"didpo_fork": 3.0} and len(measured) == 1
    other, where = didpo.step_costs(didpo.Config(run_root=str(tmp_path), lr=1e-4), ("grpo", "didpo_fork"))
    assert where == "measured" and other == {"grpo": 3.0, "didpo_fork": 4.0}
    moved = {**provenance.code_identity(), "commit": "0" * 40}
    monkeypatch.setattr(provenance, "code_identity", lambda *a, **k: moved)
    _, where = didpo.step_costs(didpo.Config(run_root=str(tmp_path), lr=1e-4), ("grpo", "didpo_fork"))
    assert where == "measured" and len(measured) == 3


def test_unknown_experiment_is_named():
    with pytest.raises(ValueError, match="unknown experiment .nope.; available: learning, reshaping"):
        load("nope")


def test_experiment_didpo_end_to_end_tiny_budget(tmp_path):
    """Every method and control, one seed, one step: trains, measures the costs side by side,
    trains the fork at GRPO's wall time and the scale-matched variants, evaluates, writes the
    page with its controls."""
    sets = ["seeds=0", "steps=2", "tasks_per_step=1", "group_size=2", "eval_every=2", "eval_tasks=2",
            "eval_k=1", "train_problems=40", "paired_tasks=2", "paired_k=1", "paired_pass_k=2",
            "paired_per_template=0", "cost_rounds=1", "scale_matched=[oracle_hunk]",
            f"out={tmp_path}", f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "didpo"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "didpo.json").read_text())
    assert set(res["methods"]) == {"grpo", "didpo", "didpo_fork", "oracle_hunk", "oracle_hunk_shuffled",
                                   "oracle_hunk@rms", "didpo_fork@wall"}
    for m in ("grpo", "oracle_hunk"):
        seed = res["methods"][m]["seeds"][0]
        evals = (tmp_path / "runs" / "didpo" / m / "seed0" / "eval.jsonl").read_text().splitlines()
        assert json.loads(evals[-1])["eval/pass_at_1"] == seed["pass_at_1_end"]
    runs = tmp_path / "runs" / "didpo"
    oracle_rows = [json.loads(x) for x in (runs / "oracle_hunk" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert all("hunks/programs" in r and "time/hunk" in r for r in oracle_rows)
    cfg = json.loads((runs / "oracle_hunk@rms" / "seed0" / "config.json").read_text())
    assert cfg["estimator"] == "oracle_hunk" and cfg["match_scale"] is True
    wall = json.loads((runs / "didpo_fork@wall" / "seed0" / "config.json").read_text())
    assert wall["steps"] == res["wall_steps"] == max(1, int(2 * res["step_costs_s"]["grpo"]
                                                            / res["step_costs_s"]["didpo_fork"]))
    assert [c["role"] for c in res["primary"]["contrasts"]] == ["claim", "positive", "negative"]
    assert res["primary"]["contrasts"][0]["size_abs"] == 0.056
    kept = json.loads((runs / "step_costs.json").read_text())
    assert res["step_costs_from"] == "measured" and kept["costs"] == res["step_costs_s"]
    assert "DiDPO - GRPO" in findings_table(tmp_path)
    assert res["methods"]["oracle_hunk"]["abs_adv_per_token"] is not None
    md = (tmp_path / "didpo.md").read_text()
    assert "The claim and its controls" in md and "measured side by side" in md
    html = (tmp_path / "didpo.html").read_text()
    assert 'src="plotly.min.js"' in html and '"name":"grpo"' in html


def test_finished_runs_are_recognised_and_summarised(tmp_path):
    from labkit.config import to_dict
    from labkit.experiments.config import ExperimentConfig, base_train_config
    from labkit.experiments.runs import finished_run, record_weights, summarise_run

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


def test_prepare_run_dir_resumes_the_same_run_and_moves_others_aside(tmp_path):
    from labkit.config import to_dict
    from labkit.experiments.config import ExperimentConfig, base_train_config
    from labkit.experiments.runs import prepare_run_dir, record_weights

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
    assert (tmp_path / "seed0.replaced-3" / "provenance.json").exists() and not run.exists()


def test_figures_in_a_subfolder_load_the_projects_shared_plotly_copy(tmp_path):
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs_version

    from labkit.experiments.pages import save_figure, write_figure_html

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

    import labkit.experiments.paired as ex
    from labkit.env.balanced import balanced_tasks
    from labkit.experiments.config import ExperimentConfig
    from labkit.experiments.runs import run_methods

    def load(m):  # a stream of at most 30 tasks of 3 templates
        return [SimpleNamespace(meta={"template": f"tpl{i % 3}"}) for i in range(min(m, 30))]

    def unfillable(*a, **k):  # the real balancing over that stream
        return balanced_tasks(10, 2, load)

    monkeypatch.setattr(ex, "held_out_tasks", unfillable)
    exp = ExperimentConfig(seeds=(0,), steps=1, paired_tasks=10, run_root=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="only 6 tasks with at most 2 per template"):
        run_methods("learning", {"grpo": lambda: None}, exp)
    assert not (tmp_path / "runs").exists()


def test_task_interval_golden_and_bootstrap():
    from labkit.experiments.paired import task_interval

    r = task_interval([0.0, 0.5, 1.0, 0.25], [0.5, 0.5, 0.75, 1.0])
    assert r["mean"] == pytest.approx((0.5 + 0 - 0.25 + 0.75) / 4)
    assert (r["improved"], r["worsened"], r["tasks"]) == (2, 1, 4)
    assert -0.25 <= r["ci95"][0] <= r["mean"] <= r["ci95"][1] <= 0.75
    same = task_interval([0.5] * 10, [0.5] * 10)
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="same"):
        task_interval([0.1], [0.1, 0.2])


def test_add_paired_reads_cached_evaluations_and_each_seed_has_its_own_start(tmp_path, monkeypatch):
    """Every evaluation is cached under a name of what it evaluated; a seed's change is its end
    minus the start evaluated at that seed's own sampling seed; nothing is evaluated twice."""
    import labkit.experiments.paired as paired
    from labkit.experiments.config import ExperimentConfig, base_train_config
    from labkit.config import to_dict

    calls = []

    def fake_correct(load, tasks, k, temperature, seed, proto, path, sandbox):
        calls.append((str(path.parent), k, temperature, seed))
        bump = 0 if path.parent.name == "paired-start" else 1  # ends one better than starts
        return [(seed + i + bump) % (k + 1) for i in range(len(tasks))]

    monkeypatch.setattr(paired, "_correct", fake_correct)
    monkeypatch.setattr(paired, "paired_list", lambda exp: [type("T", (), {"task_id": f"t{i}"})()
                                                           for i in range(3)])
    monkeypatch.setattr(paired, "latest_checkpoint", lambda d: Path(d) / "checkpoints" / "step_1")
    exp = ExperimentConfig(paired_tasks=3, paired_k=4, paired_pass_k=2, seeds=(0, 1), train_split="train",
                           run_root=str(tmp_path))
    results = {"methods": {}}
    for m in ("a", "b"):
        seeds = []
        for s in (0, 1):
            d = tmp_path / m / f"seed{s}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(json.dumps(to_dict(base_train_config(exp, s, str(d)))))
            seeds.append({"seed": s, "run_dir": str(d)})
        results["methods"][m] = {"seeds": seeds}
    paired.add_paired(results, exp)
    proto = paired.Protocol.of(exp)
    for s in (0, 1):
        e = proto.seed_for(s)
        start = [((e + i) % 5) / 4 for i in range(3)]
        end = [((e + i + 1) % 5) / 4 for i in range(3)]
        ch = results["methods"]["a"]["paired_change"]
        assert ch["per_task"][str(s)] == pytest.approx([b - a for a, b in zip(start, end)])
    assert proto.seed_for(0) != proto.seed_for(1)
    starts = [c for c in calls if c[0].endswith("paired-start")]
    assert len(starts) == 4  # two seeds x (pass@1, pass@k), once each for both methods
    assert {c[1:3] for c in calls} == {(4, 0.7), (2, 1.6)}


def test_experiment_learning_smoke_end_to_end(tmp_path):
    """``experiment learning --smoke``: two seeds, tiny budget, the whole pipeline. The results
    file has the setting, the command that rebuilds it (``--smoke``), each run's code and the
    full training config, per seed the start evaluated at that seed's own sampling seed, the
    claim read against its size; the page says it is a smoke run and is its JSON rendered, and
    a smoke run is never published to docs/results."""
    from labkit import provenance
    from labkit.experiments import learning, pages
    from labkit.experiments.config import command, smoke_config
    from labkit.config import from_dict
    from labkit.policy.loading import weights_fingerprint

    cmd = [sys.executable, "-m", "labkit", "experiment", "learning", "--smoke",
           "--set", f"out={tmp_path}", "--set", f"run_root={tmp_path / 'runs'}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "learning.json").read_text())
    assert res["config"]["smoke"] is True and res["seeds"] == [0, 1]
    assert res["setting"]["split"] == "test" and res["setting"]["feedback"] == "dense"
    sha = weights_fingerprint("tiny")
    assert res["setting"]["model_sha256"] == sha  # which model the numbers belong to
    exp = from_dict(learning.Config, res["config"])
    assert res["command"] == command("learning", exp) == (  # where runs are kept is no setting
        f"python -m labkit experiment learning --smoke --set out={tmp_path}")
    assert smoke_config(learning).steps == res["setting"]["steps"] == learning.SMOKE["steps"]
    grpo = res["methods"]["grpo"]
    assert grpo["train_config"]["loss"]["kl_coef"] == 0.01 and grpo["train_config"]["optim"]["grad_clip"] == 1.0
    now = provenance.label(provenance.code_identity())
    assert {provenance.label(s["code"]) for s in grpo["seeds"]} == {now} == set(res["provenance"]["runs"])
    change = grpo["paired_change"]
    assert change["over"] == "seeds and tasks" and change["tasks"] == 6 and change["seeds"] == 2
    assert len(change["task_ids"]) == 6 and "mde" in change and "paired_pass_k_change" in grpo
    for seed in ("0", "1"):  # each seed's change is its end minus its own start
        start = res["paired"]["start"]["pass_at_1"][seed]
        assert change["per_seed"][seed] == pytest.approx(grpo["paired_end"][seed] - start)
    claim = res["primary"]["contrasts"][0]
    assert res["primary"]["key"] == "paired_clean" and claim["size_abs"] == 0.05
    assert claim["verdict"] in ("supported", "refuted at this scale", "undecided")
    md = (tmp_path / "learning.md").read_text()
    assert md == pages.rerender(tmp_path / "learning.json")
    assert "**Smoke run**" in md and res["command"] in md and sha in md and "pass@2" in md
    with pytest.raises(pages.PublishError, match="smoke run is not published"):
        pages.check_publishable(res, pages.RESULTS)


def test_experiment_reshaping_trains_the_sparse_mix_with_its_controls(tmp_path):
    sets = ["seeds=0", "steps=1", "tasks_per_step=1", "group_size=2", "eval_every=1", "eval_tasks=2",
            "eval_k=1", "train_problems=60", "paired_tasks=2", "paired_k=1", "paired_pass_k=2",
            "paired_per_template=0", "methods=[raw_grpo,raw_grpo_flip30,reshaped_full,full-focus]",
            f"out={tmp_path}", f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "reshaping"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "reshaping.json").read_text())
    assert set(res["methods"]) == {"raw_grpo", "raw_grpo_flip30", "reshaped_full", "full-focus"}
    runs = tmp_path / "runs" / "reshaping"

    def cfg(m):
        return json.loads((runs / m / "seed0" / "config.json").read_text())

    assert cfg("raw_grpo")["feedback"]["mode"] == "binary"
    assert cfg("raw_grpo_flip30")["feedback"] == {**cfg("raw_grpo")["feedback"], "mode": "flipped", "noise_p": 0.3}
    full, no_focus = cfg("reshaped_full"), cfg("full-focus")
    assert full["curriculum"] and full["reshape"]["amplify"] == "piecewise" and full["reshape"]["focus_threshold"] > 0
    assert no_focus["reshape"]["focus_threshold"] == 0 and no_focus["reshape"]["amplify"] == "piecewise"
    assert full["tasks"]["templates"] == list(load("reshaping").Config().templates)
    roles = [(c["role"], c["variant"], c.get("base")) for c in res["primary"]["contrasts"]]
    assert roles == [("claim", "reshaped_full", "raw_grpo"), ("positive", "raw_grpo", "raw_grpo_flip30")]
    claim = res["primary"]["contrasts"][0]  # +35% of raw GRPO's end on the claim's list
    key = res["primary"]["key"]
    raw_end = res[key]["start_mean"]["pass_at_1"] + res["methods"]["raw_grpo"][f"{key}_change"]["mean"]
    assert claim["size_abs"] == pytest.approx(0.35 * raw_end)
    assert res["methods"]["raw_grpo"]["zero_std_frac"] is not None
    assert "clean - 30%-flipped pass/fail labels" in (tmp_path / "reshaping.md").read_text()
    assert "full recipe - raw GRPO" in findings_table(tmp_path)

    # A new method beside the recorded ones: only it trains, the rest come from the record,
    # and it is compared task by task with them.
    again = [s for s in sets if not s.startswith(("methods=", "out=", "run_root="))]
    again += ["methods=[raw_grpo,reshaped_full,full-amplify]", f"out={tmp_path / 'again'}",
              f"run_root={tmp_path / 'runs2'}", f"reuse_recorded={tmp_path / 'reshaping.json'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "reshaping"] + [a for s in again for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    res2 = json.loads((tmp_path / "again" / "reshaping.json").read_text())
    assert sorted(os.listdir(tmp_path / "runs2" / "reshaping")) == ["full-amplify"]
    assert res2["recorded"]["methods"] == ["raw_grpo", "reshaped_full"]
    assert res2["recorded"]["from"] == str(tmp_path / "reshaping.json")
    assert "reuse_recorded" not in res2["command"]  # the command rebuilds every row
    for m in ("raw_grpo", "reshaped_full"):
        assert res2["methods"][m] == res["methods"][m]
    assert res2["paired"]["start"] == res["paired"]["start"]  # the same start, evaluated again
    page = (tmp_path / "again" / "reshaping.md").read_text()
    assert "full-amplify - reshaped_full" in page and "Taken from an earlier record" in page


def test_reshaping_regimes_write_their_own_page_with_the_binary_control_runs():
    """Under ``public`` or ``noisy`` feedback the claim's two methods are told the weak signal,
    while the positive control's pair trains exactly the binary page's runs (so they are found
    again there, not trained twice), on a page of its own."""
    from labkit.config import apply_values
    from labkit.docs import findings
    from labkit.experiments.runs import method_config

    reshaping = load("reshaping")
    binary = reshaping.Config()
    public = apply_values(reshaping.Config(), {"feedback": "noisy"})
    assert reshaping.page_of(binary) == "reshaping" and reshaping.page_of(public) == "reshaping-noisy"
    assert "raw_grpo_binary" not in reshaping.methods_of(binary)
    assert reshaping.methods_of(public) == ("raw_grpo", "reshaped_full", "raw_grpo_binary", "raw_grpo_flip30")
    shared = {"tasks.templates": tuple(binary.templates)}

    def cfg(exp, method):
        return to_record(method_config(exp, method, 0, "-", shared))

    assert cfg(public, "raw_grpo")["feedback"]["mode"] == "noisy"
    for ours, theirs in (("raw_grpo_binary", "raw_grpo"), ("raw_grpo_flip30", "raw_grpo_flip30")):
        assert cfg(public, ours) == cfg(binary, theirs)  # the binary page's very runs
        assert f"reshaping/{theirs}" == reshaping.aliases_of(public)[ours][0]
    assert reshaping.aliases_of(public)["raw_grpo_binary"][1] == "reshaping-public/raw_grpo_binary"
    claim, control = reshaping.primary("noisy")
    assert (claim.variant, claim.base, claim.label) == ("reshaped_full", "raw_grpo", "full recipe - raw GRPO, noisy feedback")
    assert (control.variant, control.base, control.direction) == ("raw_grpo_binary", "raw_grpo_flip30", +1)
    assert [c.variant for c in reshaping.primary("binary")] == ["reshaped_full", "raw_grpo"]
    assert set(findings.PLAIN) >= {f"reshaping-{r}" for r in reshaping.REGIMES if r != "binary"}
    sources = json.loads((Path(__file__).parents[1] / "docs" / "results" / "sources.json").read_text())
    claimed = {c["contrast"]: c["relative"] for s in sources["sources"] for c in s.get("claims", [])
               if c["experiment"] == "reshaping"}
    assert {reshaping.primary(r)[0].label: reshaping.BLOG_RELATIVE_GAIN for r in reshaping.REGIMES} == claimed
    with pytest.raises(ValueError, match="not 'dense'; pick one of them"):
        apply_values(reshaping.Config(), {"feedback": "dense"}).validate()


def test_recorded_methods_pair_only_with_the_same_start():
    """A method taken from a record pairs with new ones only if the start policy, evaluated
    again, reads as in the record; otherwise the paired evaluation stops and says why."""
    from labkit.experiments.paired import _changes

    pe = {"task_ids": ["a", "b"], "start": {"0": {"pass_at_1": [0.0, 1.0]}},
          "runs": {"r": {"seed": 0, "pass_at_1": [1.0, 1.0]}}}
    results = {"methods": {"m": {"seeds": [{"seed": 0, "run_dir": "r"}]}},
               "recorded": {"from": "old.json", "methods": ["x"], "start": {"paired": {"pass_at_1": {"0": 0.5}}}}}
    _changes(results, ["m"], pe, "paired")
    assert results["methods"]["m"]["paired_change"]["per_task"] == {"0": [1.0, 0.0]}
    results["recorded"]["start"]["paired"]["pass_at_1"]["0"] = 0.25
    with pytest.raises(ValueError, match="reads .* here and .* in old.json.*rerun every method"):
        _changes(results, ["m"], pe, "paired")


def test_a_record_of_another_setting_is_refused(tmp_path):
    from labkit import provenance
    from labkit.experiments.runs import recorded_methods

    reshaping = load("reshaping")
    now = provenance.code_identity()
    record = {"experiment": "reshaping", "config": to_record(reshaping.Config(steps=7)),
              "setting": {"model_sha256": "abc"}, "methods": {"raw_grpo": {"paired_change": {
                  "per_task": {"0": [0.0], "1": [0.0], "2": [1.0]}}, "seeds": [{"code": now}] * 3}}}
    path = tmp_path / "reshaping.json"
    path.write_text(json.dumps(record))
    assert recorded_methods(reshaping.Config(), "reshaping", "abc") == ({}, {})  # not asked for
    ours = reshaping.Config(reuse_recorded=str(path), methods=("raw_grpo", "full-focus"))
    with pytest.raises(ValueError, match="differs in steps"):
        recorded_methods(ours, "reshaping", "abc")
    ours.steps = 7
    with pytest.raises(ValueError, match="other weights"):
        recorded_methods(ours, "reshaping", "xyz")
    assert list(recorded_methods(ours, "reshaping", "abc")[0]) == ["raw_grpo"]
    ours.seeds = (0, 3)  # a seed the record lacks: trained, not taken
    assert recorded_methods(ours, "reshaping", "abc")[0] == {}
    ours.seeds = (0, 1, 2)
    other = {**now, "commit": "0" * 40}  # runs of another commit are refused, unless allowed
    record["methods"]["raw_grpo"]["seeds"] = [{"code": other}] * 3
    path.write_text(json.dumps(record))
    with pytest.raises(provenance.CodeDriftError, match="method raw_grpo: it was trained at commit 000000000000"):
        recorded_methods(ours, "reshaping", "abc")
    ours.allow_code_drift = True
    assert list(recorded_methods(ours, "reshaping", "abc")[0]) == ["raw_grpo"]
    ours.allow_code_drift = False
    record["methods"]["raw_grpo"]["seeds"] = [{"code": now}] * 3
    # fields that only add methods (didpo's scale-matched and equal-wall rows) may differ
    didpo = load("didpo")
    record.update(experiment="didpo", config=to_record(didpo.Config(scale_matched=(), equal_wall=False)))
    path.write_text(json.dumps(record))
    assert list(recorded_methods(didpo.Config(reuse_recorded=str(path)), "didpo", "abc")[0]) == ["raw_grpo"]


def test_reshaping_methods_switch_off_one_component_each():
    from labkit.experiments.methods import LEAVE_ONE_OUT, METHODS, variants_of
    from labkit.loops.trainer import TrainConfig

    full = METHODS["reshaped_full"].configure(TrainConfig())
    assert full.curriculum and full.reshape.amplify == "piecewise" and full.reshape.focus_threshold == 0.5
    assert full.reshape.w_precision > 0
    assert variants_of("reshaped_full", list(METHODS)) == [f"full-{n}" for n in LEAVE_ONE_OUT]
    for name in LEAVE_ONE_OUT:
        c = METHODS[f"full-{name}"].configure(TrainConfig())
        on = {"composite": c.reshape.w_precision > 0, "amplify": c.reshape.amplify != "none",
              "focus": c.reshape.focus_threshold > 0, "curriculum": c.curriculum}
        assert [k for k, v in on.items() if not v] == [name]
    with pytest.raises(ValueError, match="unknown method 'full-nothing'"):
        apply_overrides(load("reshaping").Config(), ["methods=[raw_grpo,full-nothing]"])


def test_a_method_is_config_overrides_its_stages_and_a_label_and_its_options_are_not_in_its_name():
    """The registry builds every method's config: options (scale, wall time) are fields of the
    method, found by what they vary, never read off a name; two different methods under one
    name are refused; a new method is one registration."""
    from labkit.experiments.methods import METHODS, Method, variant
    from labkit.loops.trainer import TrainConfig

    rms = METHODS[variant("oracle_hunk", scale="rms")]
    cfg = rms.configure(TrainConfig())
    assert (cfg.estimator, cfg.match_scale, rms.stages) == ("oracle_hunk", True, ("hunks",))
    assert METHODS["didpo_fork"].stages == ("forks",) and METHODS["grpo"].stages == ()
    wall = METHODS[variant("didpo_fork", wall="grpo")]
    cfg = wall.configure(TrainConfig(), wall_steps=7)
    assert (cfg.estimator, cfg.steps, cfg.checkpoint_every, cfg.eval_every) == ("didpo_fork", 7, 2, 7)
    with pytest.raises(ValueError, match="needs the steps"):
        wall.configure(TrainConfig())
    flip = METHODS["raw_grpo_flip30"].configure(TrainConfig())
    assert (flip.feedback.mode, flip.feedback.noise_p) == ("flipped", 0.3)
    with pytest.raises(ValueError, match="already registered"):
        METHODS.add("grpo", Method("GRPO", {"estimator": "didpo"}))
    METHODS.add("grpo", METHODS["grpo"])  # the same method again: nothing changes
    with pytest.raises(ValueError, match="no method is 'grpo' with scale='rms'"):
        variant("grpo", scale="rms")
    with pytest.raises(ValueError, match="scale_matched: unknown method 'nope'"):
        apply_overrides(load("didpo").Config(), ["scale_matched=[nope]"])
    with pytest.raises(ValueError, match="no method is 'grpo' with scale='rms'"):
        apply_overrides(load("didpo").Config(), ["scale_matched=[grpo]"])
    didpo = load("didpo")
    assert didpo.trained(didpo.Config(scale_matched=("didpo",))) == [
        "grpo", "didpo", "didpo_fork", "oracle_hunk", "oracle_hunk_shuffled", "didpo@rms",
        "didpo_fork@wall"]


def test_training_on_val_templates_is_evaluated_elsewhere_and_on_new_instances():
    """RL on the ``val`` templates: the trainer refuses to evaluate on the split it trains on,
    and the paired check of the trained templates uses instances no training problem is."""
    from labkit.config import from_dict
    from labkit.env.tasks import load_tasks
    from labkit.experiments.config import ExperimentConfig
    from labkit.experiments.paired import trained_template_tasks
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
    from labkit.experiments.config import ExperimentConfig
    from labkit.experiments.paired import leaked_task_ids
    from labkit.experiments.paired import held_out_tasks

    exp = ExperimentConfig(train_split="val", train_problems=150, paired_tasks=64)
    tasks = held_out_tasks(exp.paired_tasks, "test", 0)
    got = leaked_task_ids(exp, tasks)
    refs = [compile_reference(p) for p in synthetic_problems("val", 150, seed=0)]
    by_id = {p.problem_id: p for p in synthetic_problems("test", 64, seed=0)}
    want = {t.task_id for t in tasks
            if any(passes_all(fn, by_id[t.problem_id]) for fn in refs)}
    assert got == want and 0 < len(got) < len(tasks)  # the measured leak is a few percent


def test_leak_check_reads_tasks_deep_in_the_stream():
    """Held-out lists can hold tasks beyond the stream's first 2n + 50 problems (two-bug
    multi-hunk lists skip most problems; per-template caps draw further). The leak check
    reads each task's own hidden tests and signature, so it needs no scan of the stream (it
    raised when it scanned): checked on the last tasks of a longer draw, against a plain
    double loop over the references."""
    from labkit.env.overlap import compile_reference, passes_all
    from labkit.env.tasks import load_tasks, synthetic_problems
    from labkit.experiments.config import ExperimentConfig
    from labkit.experiments.paired import leaked_task_ids

    stream = synthetic_problems("test", 64, seed=0)
    tasks = load_tasks("synthetic", split="test", n=64, seed=0)[-3:]
    assert {t.problem_id for t in tasks} - {p.problem_id for p in stream[: 2 * len(tasks) + 50]}
    exp = ExperimentConfig(train_split="val", train_problems=150, paired_tasks=len(tasks))
    refs = [compile_reference(p) for p in synthetic_problems("val", 150, seed=0)]
    by_id = {p.problem_id: p for p in stream}
    want = {t.task_id for t in tasks if any(passes_all(fn, by_id[t.problem_id]) for fn in refs)}
    assert leaked_task_ids(exp, tasks) == want


def test_experiment_mucode_over_seeds_tiny_budget_and_reuses_finished_seeds(tmp_path):
    """Two training seeds on a tiny budget: every generator (expert iteration and its controls)
    has, per condition, a paired change whose interval is over the seeds; the controls are
    recorded; a second run with the same settings reuses both seeds' results."""
    sets = [f"out={tmp_path}", f"run_root={tmp_path / 'runs'}"]
    cmd = [sys.executable, "-m", "labkit", "experiment", "mucode", "--smoke"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "mucode.json").read_text())
    assert res["seeds"] == [0, 1] and res["setting"]["eval_tasks"] == 4
    assert set(res["generators"]) == {"expert_iteration", "ei_filtered", "ei_oracle", "sft_self"}
    for conds in res["generators"].values():
        change = conds["single-turn, N=1"]["paired_change"]
        assert change["over"] == "seeds and tasks" and change["seeds"] == 2 and change["tasks"] == 4
    assert set(res["analysis"]) == {"multi_turn", "drop"}
    assert [c["role"] for c in res["primary"]["contrasts"]] == ["claim", "positive", "negative", "claim", "positive"]
    starts = res["generators"]["expert_iteration"]["single-turn, N=1"]["start"]
    assert res["generators"]["expert_iteration"]["single-turn, pass@k"]  # pass@k beside pass@1
    # each training seed evaluates the start with its own sampling seed
    from labkit.experiments.mucode import Config, eval_seed
    assert eval_seed(Config(), 0) != eval_seed(Config(), 1) and starts["ci95"] is not None
    relabel = {g: json.loads((tmp_path / "runs" / "seed0" / g / "config.json").read_text())["relabel"]
               for g in res["generators"]}
    assert relabel == {"expert_iteration": "verifier", "ei_filtered": "verifier_public",
                       "ei_oracle": "oracle", "sft_self": "self"}
    # the drop's split: expert iteration minus correct experts only, seed by seed
    one = {g: res["generators"][g]["multi-turn, N=1 (random pick)"]["paired_clean_change"]["per_seed"]
           for g in ("expert_iteration", "ei_oracle")}
    wrong = res["analysis"]["drop"]["wrong_labels"]
    assert wrong["mean"] == pytest.approx(statistics.fmean(
        one["expert_iteration"][s] - one["ei_oracle"][s] for s in one["ei_oracle"]))
    page = (tmp_path / "mucode.md").read_text()
    assert "wrong labels (`expert_iteration` - `ei_oracle`)" in page
    # the verifiers trained until their held-in loss stopped falling (at most 2 passes here)
    assert "## The verifiers on held-out tasks" in page
    assert "Training stopped after 1 pass(es) without a 1% fall of the held-in loss, or at 2 passes" in page
    last = res["training"]["0"]["expert_iteration"][-1]
    assert 1 <= last["verifier/best_epoch"] <= last["verifier/epochs"] <= 2
    assert len(res["bce_verifier"]["1"]["heldin_losses"]) == res["bce_verifier"]["1"]["epochs"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("reusing") == 2
    assert json.loads((tmp_path / "mucode.json").read_text())["generators"] == res["generators"]
    assert "expert iteration - start, multi-turn" in findings_table(tmp_path)


def test_mucode_summary_matches_a_naive_paired_mean_and_drops_leaked_tasks():
    from labkit.experiments.mucode import summarise

    def gen(vals):
        conds = {c: list(v) for c, v in vals.items()}
        rank = {k: 0.5 for k in ("verifier/pairwise_acc", "verifier/auc", "verifier/bon_hit",
                                 "verifier/bon_random")}
        return {"conditions": conds, "verifier_ranking": {"bt": rank, "bce": rank}}

    names = ["multi-turn, BoN, public_tests", "multi-turn, BoN, random", "single-turn, BoN, random"]
    start = {c: [0.0, 1.0, 0.0] for c in names}
    ends = {0: [1.0, 1.0, 0.0], 1: [0.0, 1.0, 1.0], 2: [1.0, 0.0, 1.0]}
    per_seed = {s: {"synthetic": {"start": gen(start), "expert_iteration": gen({c: e for c in names})}}
                for s, e in ends.items()}
    out = summarise(per_seed, ["a", "b", "c"], leaked={"c"})
    m = out["generators"]["expert_iteration"]["multi-turn, BoN, random"]
    naive = [statistics.fmean(e[i] - start["multi-turn, BoN, random"][i] for i in range(3))
             for e in ends.values()]
    assert m["paired_change"]["mean"] == pytest.approx(statistics.fmean(naive))
    assert m["paired_change"]["ci95"] is not None and m["paired_change"]["seeds"] == 3
    clean = [statistics.fmean(e[i] - start["multi-turn, BoN, random"][i] for i in range(2))
             for e in ends.values()]
    assert m["paired_clean_change"]["mean"] == pytest.approx(statistics.fmean(clean))
    assert m["paired_clean_change"]["tasks"] == 2
    c = out["contrasts"]["expert_iteration"]["BoN: public_tests - random (multi-turn)"]
    assert c["mean"] == 0.0 and c["ci95"] == [0.0, 0.0]


def test_the_experiments_per_test_limit_passes_synthetic_references():
    """The experiments' shorter per-test limit (``sandbox.test_timeout_s``) leaves every
    synthetic reference passing (a sample of the val, test and two-bug val sets) and still
    ends a looping candidate at that limit."""
    import time

    from labkit.sandbox.records import Candidate
    from labkit.sandbox.pool import Sandbox
    from labkit.env.tasks import load_tasks
    from labkit.experiments.config import SYNTHETIC_TEST_TIMEOUT_S, ExperimentConfig, base_train_config

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
    from labkit.experiments.config import ExperimentConfig, base_train_config

    assert base_train_config(ExperimentConfig(), 0, "r").sampling.temperature == 1.6
    hot = base_train_config(ExperimentConfig(temperature=1.3), 0, "r")
    assert hot.sampling.temperature == 1.3 and hot.eval_temperature == 0.7  # evaluation stays


RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _committed_pages():
    return sorted(p for p in [*RESULTS.glob("*.json"), *RESULTS.glob("pilots/*/*.json")]
                  if json.loads(p.read_text()).get("experiment") in ("learning", "reshaping", "didpo",
                                                                     "credit", "mucode"))


def test_every_committed_results_page_is_its_json_rendered_and_rerunnable():
    """A results page is reproducible from its JSON: the page is what rendering the JSON gives
    (every number and verdict sentence generated), it prints the command that reruns it, and
    that command is the one its recorded config gives; it was measured on the shipped model."""
    import shlex

    from labkit.config import apply_overrides
    from labkit.experiments import pages
    from labkit.policy.loading import weights_fingerprint

    found = _committed_pages()
    assert found, "no results page to check"
    shipped = weights_fingerprint("tiny")
    for path in found:
        data = json.loads(path.read_text())
        md = path.with_suffix(".md").read_text()
        assert md == pages.rerender(path), f"{path.name}: the page is not its JSON rendered"
        assert f"`{data['command']}`" in md, path.name
        assert data["setting"]["model_sha256"] == shipped, f"{path.name}: not the shipped model"
        module = load(data["experiment"])
        args = [a for a in shlex.split(data["command"]) if a != "--set"][5:]
        rebuilt = apply_overrides(module.Config(), args)
        skip = {"out", "run_root", *NOT_IN_COMMAND} if "provenance" in data else {"out", "run_root"}
        recorded = {k: v for k, v in data["config"].items() if k not in skip}
        assert {k: v for k, v in json.loads(json.dumps(vars(rebuilt))).items()
                if k in recorded} == recorded, path.name


def test_a_page_name_keeps_a_second_testbed_beside_the_main_page():
    """``page``: a pilot or second testbed of an experiment names its page and its runs'
    folder, so neither its page nor its runs are taken for the main page's."""
    from labkit.experiments.runs import engine_folder

    module = load("didpo")
    exp = module.Config()
    assert engine_folder("didpo", exp) == "didpo"
    headroom = apply_overrides(exp, ["page=didpo-headroom"])
    assert engine_folder("didpo", headroom) == "didpo-headroom"
    assert engine_folder("didpo", apply_overrides(headroom, ["engine=trl"])) == "didpo-headroom-trl"
    assert "--set page=didpo-headroom" in command("didpo", headroom)


def test_a_claim_can_be_read_on_the_screened_list_chosen_before_the_run():
    from labkit.config import ConfigError
    from labkit.experiments.claims import primary_key

    module = load("didpo")
    assert primary_key(module.Config()) == "paired_clean"  # trained on val: the clean list
    assert primary_key(to_record(apply_overrides(module.Config(), ["train_split=train"]))) == "paired"
    with pytest.raises((ConfigError, ValueError), match="set screen_tasks"):
        apply_overrides(module.Config(), ["claim_on=screened"])
    with pytest.raises((ConfigError, ValueError), match="claim_on must be one of"):
        apply_overrides(module.Config(), ["claim_on=best"])
    screened = apply_overrides(module.Config(), ["claim_on=screened", "screen_tasks=80"])
    assert primary_key(screened) == primary_key(to_record(screened)) == "paired_screened"


def test_a_didpo_pilot_reads_the_oracles_headroom_and_plans_the_seeds():
    """A page that trained GRPO and the oracle but not DiDPO says, per evaluation, whether the
    oracle's gain reaches the headroom DiDPO's claim needs, and the seeds a full run needs."""
    import random

    from labkit.experiments import stats

    didpo = load("didpo")
    rng = random.Random(0)
    ids = [f"t{i}" for i in range(60)]
    grpo = {s: [rng.choice((0.0, 0.0, 0.25)) for _ in ids] for s in (0, 1)}
    gain = {s: [g + rng.choice((0.0, 0.25, 0.25)) for g in grpo[s]] for s in (0, 1)}
    small = {s: [g + (0.25 if i % 10 == s else 0.0) for i, g in enumerate(grpo[s])] for s in (0, 1)}
    results = {"methods": {
        "grpo": {"paired_clean_change": stats.paired_change(grpo, ids),
                 "paired_screened_change": stats.paired_change(grpo, ids)},
        "oracle_hunk": {"paired_clean_change": stats.paired_change(small, ids),
                        "paired_screened_change": stats.paired_change(gain, ids)}},
        "paired_clean": {"tasks": 60}, "paired_screened": {"tasks": 60}}
    lines = didpo.pilot_lines(results)
    clean = next(x for x in lines if x.startswith("| paired clean"))
    screened = next(x for x in lines if x.startswith("| paired screened"))
    assert clean.split("|")[4].strip() == "no"  # +0.025: short of the headroom
    assert screened.split("|")[4].strip() == "yes"  # about +0.17, interval above 0
    assert screened.split("|")[5].strip().isdigit()
    one = {"methods": {m: {"paired_clean_change": stats.paired_change({0: per[0]}, ids)}
                       for m, per in (("grpo", grpo), ("oracle_hunk", gain))},
           "paired_clean": {"tasks": 60}}
    row = next(x for x in didpo.pilot_lines(one) if x.startswith("| paired clean"))
    assert row.split("|")[4].strip() == "not decided (one seed)"  # no interval, no traceback
    results["methods"]["didpo"] = results["methods"]["grpo"]
    assert didpo.pilot_lines(results) == []  # DiDPO trained: a full page, no pilot reading
