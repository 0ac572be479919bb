"""Resuming a run with changes (``train --resume RUN --set k=v``): what may change is
applied, recorded in the run folder and shown by ``runs``; what may not is refused in one line
naming it, and the folder is left as it was."""

import json

import pytest
import yaml

from conftest import toy_tasks
from labkit.__main__ import main
from labkit.runs.history import config_changes, history_text
from labkit.loops.resume import refused
from labkit.runs.table import format_table, runs_table
from test_bad_inputs import run_main, snapshot


def test_which_changes_a_resume_may_make():
    old = {"steps": 8, "estimator": "didpo", "optim": {"lr": 5e-5}, "report_to": ["none"],
           "trackers": {"project": "a"}, "estimator_options": {}, "run_dir": "x"}
    new = {**old, "steps": 10, "estimator": "grpo", "optim": {"lr": 1e-3},
           "report_to": ["tensorboard"], "trackers": {"project": "b"},
           "estimator_options": {"lam": 0.5}, "run_dir": "y"}
    changes = config_changes(old, new)
    assert changes == {"estimator": ["didpo", "grpo"], "estimator_options.lam": [None, 0.5],
                       "optim.lr": [5e-5, 1e-3], "report_to": [["none"], ["tensorboard"]],
                       "steps": [8, 10], "trackers.project": ["a", "b"]}
    assert refused(changes, "constant", done=8) == [
        "estimator (didpo -> grpo)", "estimator_options.lam (null -> 0.5)", "optim.lr (5e-05 -> 0.001)"]
    assert refused({"steps": [8, 10]}, "cosine", done=8) == ["steps (8 -> 10)"]
    assert refused({"steps": [8, 6]}, "constant", done=7) == ["steps (8 -> 6)"]
    assert refused({"steps": [8, 7]}, "constant", done=7) == []
    assert history_text([{"step": 8, "changes": {"steps": [8, 10], "report_to": [["none"], ["wandb"]]}}]) \
        == 'steps 8->10 @8; report_to ["none"]->["wandb"] @8'


@pytest.fixture
def in_workdir(random_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in toy_tasks()))
    cfg = {"seed": 3, "tasks_per_step": 2, "checkpoint_every": 1, "eval_every": 0,
           "policy": {"spec": str(random_model_dir)}, "optim": {"lr": 1e-3},
           "sampling": {"group_size": 2, "max_new_tokens": 8},
           "tasks": {"source": "records", "path": "tasks.jsonl", "eval_tasks": 0}}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path


def _train(*args):
    return main(["train", "--quiet", "--config", "small.yaml", *args])


def _rows(run):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_resume_with_changes_allowed_and_refused(in_workdir, capsys):
    root = in_workdir / "runs"
    assert _train("--set", "run_dir=runs/a", "--set", "steps=2") == 0
    # refused: the method and the learning rate; one line naming both, the folder untouched
    before = snapshot(root / "a")
    status, err = run_main(["train", "--resume", "runs/a", "--set", "estimator=didpo",
                            "--set", "optim.lr=1e-2"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "estimator (grpo -> didpo), optim.lr (0.001 -> 0.01) cannot change on resume" in err
    assert snapshot(root / "a") == before
    # allowed: more steps and more checkpoints kept; recorded, and the run goes on as one run
    assert main(["train", "--quiet", "--resume", "runs/a", "--set", "steps=3",
                 "--set", "keep_checkpoints=3", "--set", "trackers.project=mine"]) == 0
    cfg = json.loads((root / "a" / "config.json").read_text())
    assert (cfg["steps"], cfg["keep_checkpoints"], cfg["trackers"]["project"]) == (3, 3, "mine")
    history = [json.loads(line) for line in (root / "a" / "config_history.jsonl").read_text().splitlines()]
    assert [(h["step"], h["changes"]) for h in history] == [
        (2, {"keep_checkpoints": [2, 3], "steps": [2, 3], "trackers.project": ["labkit", "mine"]})]
    assert _train("--set", "run_dir=runs/b", "--set", "steps=3", "--set", "keep_checkpoints=3",
                  "--set", "trackers.project=x") == 0
    assert _rows(root / "a") == _rows(root / "b")  # the resumed run equals one planned at 3 steps
    # the runs table: steps done / planned as the config now says, the change in its own
    # column; trackers.* (watch-only) never among the differing fields
    capsys.readouterr()
    table = runs_table(root)
    rows = {r["run"]: r for r in table["runs"]}
    assert (rows["a"]["steps_done"], rows["a"]["steps"], rows["a"]["status"]) == (3, 3, "finished")
    assert table["differing"] == []
    text = format_table(table).splitlines()
    assert "changed on resume" in text[0]
    assert "keep_checkpoints 2->3 @2; steps 2->3 @2; trackers.project labkit->mine @2" in text[1]
    assert text[2].split()[0] == "b" and " - " in text[2]
