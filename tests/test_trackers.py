"""Experiment trackers: two toy steps logged to TensorBoard, W&B (offline), MLflow (SQLite
store) and trackio (local store), read back with each tracker's own reader and checked
against metrics.jsonl and eval.jsonl; a run killed and resumed continues every tracker's run
with each step once; a tracker asked for and not installed stops the trainer at its start; a
tracker failing mid-run is dropped with one warning."""

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import toy_tasks
from labkit.config import to_dict
from labkit.runs.trackers import (INSTALL, SAMPLE_COLUMNS, TrackerError, flat_config, mlflow_key,
                                  pick_samples, report_to_names, samples_markdown, scalars,
                                  wandb_history, wandb_records)
from labkit.loops.trainer import Trainer
from test_trainer import _cfg

ROOT = Path(__file__).resolve().parents[1]


def _config(run_dir, model_dir, report_to, steps=2):
    cfg = _cfg(run_dir, model_dir, steps=steps, eval_every=1, eval_k=1)
    cfg.report_to = report_to
    cfg.trackers.samples_every, cfg.trackers.samples = 1, 3
    return cfg


def _train(cfg):
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=toy_tasks()[:1])
    tr.train(progress=False)
    tr.close()
    return tr


def _logged(run_dir, keep=lambda key: True):
    """What the run folder says each tracker must hold: ``{key: [(step, value), ...]}`` from
    metrics.jsonl and eval.jsonl (the trackers' x axis is the row's step)."""
    out = {}
    for name in ("metrics.jsonl", "eval.jsonl"):
        for line in (Path(run_dir) / name).read_text().splitlines():
            row = json.loads(line)
            for k, v in scalars(row).items():
                if keep(k):
                    out.setdefault(k, []).append((row["step"], v))
    return out


def _env(**extra):
    """The environment of a child training process: its own W&B service (an in-process W&B
    test leaves ``WANDB_SERVICE`` set, and a child would write through this process's)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return {**env, **extra}


def _same(got, want, rel=1e-6):
    """Every key of ``want`` is in ``got`` with the same steps, each once, and values equal
    within ``rel`` (TensorBoard keeps float32)."""
    assert set(want) <= set(got), sorted(set(want) - set(got))
    for k, rows in want.items():
        have = sorted(got[k])
        assert [s for s, _ in have] == [s for s, _ in rows], (k, have, rows)
        assert [v for _, v in have] == pytest.approx([v for _, v in rows], rel=rel, abs=1e-9), k


# ----------------------------------------------------------------------------- readers


def read_tensorboard(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return got, acc


def read_wandb(folder):
    got, config, ids = {}, None, set()
    for path in sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb")):
        for rec in wandb_records(path):
            if rec.WhichOneof("record_type") == "run":
                ids.add(rec.run.run_id)
                config = {u.key: json.loads(u.value_json) for u in rec.run.config.update}
        for step, items in wandb_history(path):
            for k, v in items.items():
                if isinstance(v, (int, float)) and not k.startswith("_"):
                    got.setdefault(k, []).append((step, v))
    return got, config, ids


def read_mlflow(run_dir, run_id):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(run_dir) / 'trackers/mlflow/mlflow.db'}")
    run = client.get_run(run_id)
    got = {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)]
           for k in run.data.metrics}
    return got, run, client


def read_trackio(trackio_dir, project, run_id):
    """trackio's own store, read in a process whose ``TRACKIO_DIR`` is the test's (trackio
    fixes its folder when imported)."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs(sys.argv[1], run_id=sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, project, run_id], check=True,
                         capture_output=True, text=True, env=_env(TRACKIO_DIR=str(trackio_dir)))
    got = {}
    for row in json.loads(out.stdout.strip().splitlines()[-1]):
        for k, v in row.items():
            if k not in ("step", "timestamp") and isinstance(v, (int, float)):
                got.setdefault(k, []).append((row["step"], v))
    return got


# ----------------------------------------------------------------------------- pure helpers


def test_report_to_names():
    assert report_to_names("tensorboard, trackio") == ["tensorboard", "trackio"]
    assert report_to_names(["none"]) == report_to_names("") == report_to_names(None) == []
    assert report_to_names(["wandb", "WandB", "mlflow"]) == ["wandb", "mlflow"]
    with pytest.raises(ValueError, match="unknown tracker.*'comet'.*tensorboard"):
        report_to_names("tensorboard,comet")
    with pytest.raises(ValueError, match="'none' beside trackers"):
        report_to_names("none,wandb")


def test_scalars_flat_config_and_samples_golden():
    assert scalars({"step": 3, "reward/mean": 0.5, "kl/k1": None, "n": 2, "ok": True,
                    "note": "x", "inf": float("inf")}) == {"reward/mean": 0.5, "n": 2.0, "ok": 1.0}
    assert flat_config({"a": {"b": 1, "c": {"d": [0.9, 0.99]}}, "e": None, "f": "x", "g": {}}) \
        == {"a.b": 1, "a.c.d": "[0.9, 0.99]", "e": "null", "f": "x"}
    assert mlflow_key("hack/sys_exit") == "hack/sys_exit" and mlflow_key("a@b(c)") == "a_b_c_"
    recs = [{"task_id": t, "sample": s, "reward": 0.5, "components": {"r_test": 1.0},
             "status": "passed", "completion": "x"} for t in ("a", "b") for s in (0, 1)]
    assert [(r["task_id"], r["sample"]) for r in pick_samples(recs, 3)] == [("a", 0), ("b", 0),
                                                                            ("a", 1)]
    assert list(pick_samples(recs, 1)[0]) == list(SAMPLE_COLUMNS)
    md = samples_markdown(4, pick_samples(recs, 1))
    assert md == ("### Completions at step 4\n\n**a** sample 0: reward 0.500, r_test 1.000, "
                  "passed\n\n```\nx\n```")


# ----------------------------------------------------------------------------- each tracker


def test_tensorboard_holds_the_run_as_metrics_jsonl(toy_model_dir, tmp_path):
    tr = _train(_config(tmp_path / "run", toy_model_dir, ["tensorboard"]))
    got, acc = read_tensorboard(tmp_path / "run/trackers/tensorboard")
    _same(got, _logged(tr.run.path))
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [1, 2]
    sample = acc.Tensors("samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert sample.startswith("### Completions at step 1") and "toy/" in sample
    assert "config/text_summary" in acc.Tags()["tensors"]
    hp = acc.PluginTagToContent("hparams")
    assert b"estimator" in hp["_hparams_/session_start_info"]
    state = json.loads((tmp_path / "run/trackers.json").read_text())
    assert state["tensorboard"] == {"logdir": "trackers/tensorboard"}


def test_wandb_offline_files_hold_the_run(toy_model_dir, tmp_path):
    tr = _train(_config(tmp_path / "run", toy_model_dir, ["wandb"]))
    state = json.loads((tmp_path / "run/trackers.json").read_text())
    got, config, ids = read_wandb(tmp_path / "run/trackers/wandb")
    _same(got, _logged(tr.run.path))
    assert ids == {state["id"]} and state["wandb"]["mode"] == "offline"
    assert config["estimator"] == "grpo" and config["sampling"]["group_size"] == 4
    tables = sorted((tmp_path / "run/trackers/wandb").glob("wandb/offline-run-*/files/media/"
                                                           "table/samples_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[0].read_text())
    assert table["columns"] == list(SAMPLE_COLUMNS) and len(table["data"]) == 3


def test_mlflow_store_holds_the_run(toy_model_dir, tmp_path):
    cfg = _config(tmp_path / "run", toy_model_dir, ["mlflow"])
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=toy_tasks()[:1])
    tr.train(progress=False)  # the last step ends the tracker runs, before any close()
    state = json.loads((tmp_path / "run/trackers.json").read_text())
    got, run, client = read_mlflow(tr.run.path, state["mlflow"]["run_id"])
    tr.close()
    _same({k: v for k, v in got.items()}, {mlflow_key(k): v for k, v in _logged(tr.run.path).items()})
    assert run.info.status == "FINISHED" and run.info.run_name == state["name"]
    assert run.data.params == {k: str(v) for k, v in flat_config(to_dict(cfg)).items()}
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "samples")) == [
        "samples/step_000001.md", "samples/step_000002.md"]


def test_trackio_local_store_holds_the_run(toy_model_dir, tmp_path):
    """Through the command line (``--set report_to=trackio``), in a process of its own: trackio
    reads ``TRACKIO_DIR`` once, when imported."""
    run, tio = tmp_path / "run", tmp_path / "trackio"
    cli = _cli_config(tmp_path, toy_model_dir, run, steps=2, eval_every=1)
    subprocess.run([sys.executable, "-m", "labkit", "train", "--quiet", "--config", str(cli),
                    "--set", "report_to=trackio"], check=True, capture_output=True, cwd=ROOT,
                   env=_env(TRACKIO_DIR=str(tio)))
    state = json.loads((run / "trackers.json").read_text())
    assert state["trackio"]["dir"] == str(tio) and state["trackio"]["project"] == "labkit"
    _same(read_trackio(tio, "labkit", state["trackio"]["id"]), _logged(run))


# ----------------------------------------------------------------------------- resume


def _cli_config(tmp_path, model_dir, run, steps, eval_every, checkpoint_every=1):
    """A YAML config for ``python -m labkit train`` on the toy tasks (one held-out task)."""
    records = tmp_path / "tasks.jsonl"
    tasks = toy_tasks() + [dataclasses.replace(toy_tasks()[0], split="val")]
    records.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    cfg = _cfg(run, model_dir, steps=steps, eval_every=eval_every, eval_k=1,
               checkpoint_every=checkpoint_every)
    cfg.tasks.path, cfg.tasks.eval_tasks = str(records), 1
    cfg.trackers.samples_every = 1
    path = tmp_path / f"{Path(run).name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return path


def _mlflow_last_step(db):
    """The last step of ``reward/mean`` in an MLflow SQLite store being written (None: none)."""
    import sqlite3

    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return con.execute("SELECT MAX(step) FROM metrics WHERE key = 'reward/mean'").fetchone()[0]
    except sqlite3.OperationalError:  # the tables are still being made
        return None


@pytest.mark.slow
def test_a_resumed_run_continues_every_tracker_run_with_each_step_once(toy_model_dir, tmp_path):
    """Killed (SIGKILL) after step 3 of 4 was logged (MLflow, written synchronously, holds
    it), with its last checkpoint at step 2, then resumed: every tracker holds one run
    holding steps 1-4 once each (TensorBoard in one folder, the same W&B id, the same MLflow
    run, the same trackio run)."""
    run, tio = tmp_path / "run", tmp_path / "trackio"
    cli = _cli_config(tmp_path, toy_model_dir, run, steps=4, eval_every=2, checkpoint_every=2)
    env = _env(TRACKIO_DIR=str(tio))
    cmd = [sys.executable, "-m", "labkit", "train", "--quiet"]
    proc = subprocess.Popen(cmd + ["--config", str(cli), "--set",
                                   "report_to=tensorboard,wandb,mlflow,trackio"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = run / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # step 3 logged, MLflow holds it
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3 \
                and _mlflow_last_step(run / "trackers/mlflow/mlflow.db") == 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(metrics.read_text().splitlines()) == 3
    first = json.loads((run / "trackers.json").read_text())
    subprocess.run(cmd + ["--resume", str(run)], check=True, cwd=ROOT, env=env,
                   capture_output=True)
    state = json.loads((run / "trackers.json").read_text())
    assert state == first  # the same runs, nothing started anew

    # the steps past the checkpoint ran twice: the resumed run's rows are in metrics.jsonl;
    # append-only stores keep the first run's row of such a step (equal, but for its timings)
    def timeless(key):
        return not key.startswith("time/")

    want = _logged(run)
    assert [s for s, _ in want["reward/mean"]] == [1, 2, 3, 4]
    assert [s for s, _ in want["eval/pass_at_1"]] == [0, 2, 4]
    got, _ = read_tensorboard(run / "trackers/tensorboard")
    _same(got, want)  # TensorBoard dropped what it held past step 2 and took it again
    files = sorted((run / "trackers/tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 2  # the resumed session's file opens by purging steps >= 3
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    assert [e.step for e in EventFileLoader(str(files[1])).Load()
            if e.WhichOneof("what") == "session_log"] == [3]
    got, _, ids = read_wandb(run / "trackers/wandb")
    assert ids == {state["id"]}
    assert len(list((run / "trackers/wandb").glob("wandb/offline-run-*"))) == 2
    _same(got, _logged(run, timeless))
    got, mrun, _ = read_mlflow(run, state["mlflow"]["run_id"])
    _same(got, {mlflow_key(k): v for k, v in _logged(run, timeless).items()})
    assert mrun.info.status == "FINISHED"
    _same(read_trackio(tio, "labkit", state["trackio"]["id"]), _logged(run, timeless))
    assert not (run / "running.json").exists()


def test_a_tracker_added_on_resume_gets_the_earlier_steps(toy_model_dir, tmp_path):
    cfg = _config(tmp_path / "run", toy_model_dir, ["none"], steps=3)
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=toy_tasks()[:1])
    tr.train(steps=2, progress=False)
    tr.close()
    assert not (tmp_path / "run/trackers.json").exists()
    cfg.report_to = ["tensorboard"]
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=toy_tasks()[:1])
    assert tr.resume() == 2
    tr.train(progress=False)
    tr.close()
    got, _ = read_tensorboard(tmp_path / "run/trackers/tensorboard")
    _same(got, _logged(tr.run.path))  # steps 1-2 and evals 0-2 from the folder, then 3


# ----------------------------------------------------------------------------- failures


def test_a_tracker_not_installed_stops_the_trainer_at_its_start(toy_model_dir, tmp_path,
                                                                 monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trackio", None)  # what an absent package gives
    cfg = _config(tmp_path / "run", toy_model_dir, ["tensorboard", "trackio"])
    cfg.policy.spec = str(tmp_path / "no-model")  # checked before the model is loaded
    with pytest.raises(TrackerError) as err:
        Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[])
    assert str(err.value) == f"report_to asks for trackio, not installed: {INSTALL}"
    from labkit.__main__ import main

    assert main(["train", "--quiet", "--set", f"run_dir={tmp_path / 'cli'}",
                 "--set", "report_to=wandb,trackio"]) == 2
    assert capsys.readouterr().err == (f"labkit: error: report_to asks for trackio, not "
                                       f"installed: {INSTALL}\n")
    assert not (tmp_path / "run").exists() and not (tmp_path / "cli").exists()


def test_a_tracker_failing_mid_run_warns_once_and_training_goes_on(toy_model_dir, tmp_path,
                                                                    caplog):
    cfg = _config(tmp_path / "run", toy_model_dir, ["tensorboard", "wandb"], steps=3)
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=toy_tasks()[:1])

    def close_the_store(step, **_):
        if step == 1:  # the W&B run is finished under the tracker: its next log raises
            next(t for t in tr.trackers.live if t.name == "wandb").run.finish()

    tr.events.on("on_step_end", close_the_store)
    with caplog.at_level(logging.WARNING, logger="labkit.runs.trackers"):
        tr.train(progress=False)
        tr.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "labkit.runs.trackers"]
    assert len(warned) == 1 and warned[0].startswith("tracker wandb failed")
    assert "training goes on without it" in warned[0]
    assert len(tr.run.read("metrics.jsonl")) == 3
    got, _ = read_tensorboard(tmp_path / "run/trackers/tensorboard")
    assert [s for s, _ in got["reward/mean"]] == [1, 2, 3]  # the other tracker carried on


def test_where_a_run_is_watched_is_not_what_it_trains(tmp_path):
    """The experiments reuse a finished run and resume an unfinished one whatever trackers
    it reported to, and a run folder from before trackers existed still counts."""
    from labkit.experiments.config import ExperimentConfig, base_train_config
    from labkit.experiments.runs import finished_run, prepare_run_dir

    exp = ExperimentConfig(steps=2, eval_every=2, report_to="tensorboard,trackio")
    cfg = base_train_config(exp, 0, str(tmp_path / "run"))
    assert cfg.report_to == ["tensorboard", "trackio"]
    older = {k: v for k, v in to_dict(cfg).items() if k not in ("report_to", "trackers")}
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "COMPLETE").write_text("ok\n")
    (run / "config.json").write_text(json.dumps(older))
    assert prepare_run_dir(run, cfg) is True  # resumed, not moved aside
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    (run / "eval.jsonl").write_text("".join(json.dumps({"step": s, "eval/pass_at_1": 0.5}) + "\n"
                                            for s in (0, 2)))
    assert finished_run(run, cfg)
    assert finished_run(run, base_train_config(ExperimentConfig(steps=2, eval_every=2), 0, "x"))
    cfg.optim.lr = 1.0
    assert not finished_run(run, cfg)  # what it trains still counts
