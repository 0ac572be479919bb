"""Every mistake a user can make on the command line is one line on stderr that says what to
do, with exit status 2 (130 for Ctrl-C), and leaves no state behind.

The table runs each case through the command line's own ``main`` in this process (no
interpreter and torch import per case), in a working folder it compares before and after.
Ctrl-C needs a real process and a real signal: it runs in a subprocess."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import toy_tasks
from labkit.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
PACK = ["--source", "humanevalpack", "--path", str(ROOT / "tests" / "fixtures" / "humanevalpack_small.jsonl")]
RECORDS = ["--set", "tasks.source=records", "--set", "tasks.path=tasks.jsonl",
           "--set", "tasks.eval_tasks=0"]
HELD = ["--set", "run_dir=held"]


def train(*args):
    return ["train", "--quiet", *args]


# (id, argv, what the line says, exit status)
CASES = [
    # -- train: the config, checked when it is built -----------------------------------
    ("unknown_key", train("--set", "stepz=3"), "unknown key 'stepz' (did you mean 'steps'?)", 2),
    ("not_key_value", train("--set", "steps"), "is not of the form key=value", 2),
    ("empty_key_part", train("--set", "loss..kl_coef=1"), "has an empty part; write dotted keys", 2),
    ("value_not_section", train("--set", "steps.x=1"), "'steps' is a value, not a section", 2),
    ("unknown_section", train("--set", "lossx.kl_coef=1"), "unknown key 'lossx' (did you mean 'loss'?)", 2),
    ("not_an_integer", train("--set", "steps=many"), "steps: expected an integer, got 'many'", 2),
    ("negative_steps", train("--set", "steps=-1"), "steps >= 0", 2),
    ("unknown_estimator", train("--set", "estimator=gpro"), "unknown estimator 'gpro'", 2),
    ("estimator_option_typo", train("--set", "estimator=didpo", "--set", "estimator_options.lamda=0.5"),
     "didpo takes no option 'lamda' (did you mean 'lam'?)", 2),
    ("estimator_option_type", train("--set", "estimator=didpo", "--set", "estimator_options.lam=high"),
     "estimator_options.lam: expected a number, got 'high'", 2),
    ("estimator_option_value", train("--set", "estimator=didpo", "--set", "estimator_options.eta=2"),
     "estimator_options: eta must be in (0, 1]", 2),
    ("estimator_options_not_mapping", train("--set", "estimator_options=5"),
     "estimator_options: expected a mapping, got 5", 2),
    ("option_of_another_estimator", train("--set", "estimator_options={lam: 0.5}"),
     "grpo takes no option 'lam'", 2),
    ("unknown_recipe", train("--set", "reshape=reshapd"), "unknown reshaping recipe 'reshapd'", 2),
    ("negative_lr", train("--set", "optim.lr=-1e-3"), "optim.lr must be > 0", 2),
    ("zero_lr", train("--set", "optim.lr=0"), "optim.lr must be > 0", 2),
    ("unknown_schedule", train("--set", "optim.schedule=cosin"), "optim.schedule: 'cosin' is not one of", 2),
    ("not_a_bool", train("--set", "curriculum=maybe"), "curriculum: expected true/false", 2),
    ("eval_on_the_train_split", train("--set", "tasks.eval_split=train"), "is the split trained on", 2),
    ("unknown_task_source", train("--set", "tasks.source=mbpp"), "tasks.source must be one of", 2),
    ("task_file_not_named", train("--set", "tasks.source=records"), "set tasks.path to it", 2),
    ("unknown_tracker", train("--set", "report_to=tensorbored"), "unknown tracker(s) ['tensorbored']", 2),
    ("zero_temperature", train("--set", "sampling.temperature=0"), "temperature must be > 0", 2),
    ("missing_config_file", train("--config", "missing.yaml"), "does not exist", 2),
    ("yaml_syntax_error", train("--config", "broken.yaml"), "broken.yaml:3:1: not valid YAML", 2),
    ("yaml_unknown_key", train("--config", "typo.yaml"), "typo.yaml: unknown key(s) ['stepz']", 2),
    ("unknown_flag", ["train", "--bogus"], "unrecognized arguments: --bogus", 2),
    # -- train: what needs a file, the model's size, the run folder or the tasks ---------
    ("policy_missing", train("--set", "policy.spec=nowhere"), "policy 'nowhere': no such folder", 2),
    ("policy_not_a_model", train("--set", "policy.spec=empty"), "has no config.json", 2),
    ("completion_past_positions", train("--set", "sampling.max_new_tokens=100000"),
     "sampling.max_new_tokens=100000 does not fit policy 'tiny': it has 768 positions", 2),
    ("task_file_missing", train("--set", "tasks.source=records", "--set", "tasks.path=none.jsonl"),
     "tasks.path 'none.jsonl': no such file", 2),
    ("no_training_tasks", train(*RECORDS, "--set", "tasks.train_split=val", "--set", "tasks.eval_split=test"),
     "no training tasks from tasks.source='records'", 2),
    ("folder_holds_a_run", train(*HELD), "held already holds a run (2 steps logged)", 2),
    # -- train --resume ----------------------------------------------------------------
    ("resume_not_a_run", train("--resume", "nowhere"), "--resume 'nowhere': not a run folder", 2),
    ("resume_with_config", train("--resume", "held", "--config", "typo.yaml"), "drop --config", 2),
    ("resume_moves_run_dir", train("--resume", "held", "--set", "run_dir=elsewhere"),
     "--set run_dir cannot go with --resume", 2),
    ("resume_changes_the_method", train("--resume", "held", "--set", "estimator=didpo", "--set", "optim.lr=1e-3"),
     "estimator (grpo -> didpo), optim.lr (0.0001 -> 0.001) cannot change on resume", 2),
    ("resume_steps_below_checkpoint", train("--resume", "held", "--set", "steps=1"),
     "steps (4 -> 1) cannot change on resume", 2),
    ("resume_steps_under_decay", train("--resume", "held", "--set", "steps=9"),
     "cannot move under the cosine schedule", 2),
    ("resume_corrupt_checkpoint", train("--resume", "corrupt"),
     "trainable.pt cannot be read (UnpicklingError)): restore one", 2),
    # -- eval --------------------------------------------------------------------------
    ("eval_policy_missing", ["eval", "--policy", "nowhere"], "no such folder", 2),
    ("eval_policy_not_a_model", ["eval", "--policy", "empty"], "has no config.json", 2),
    ("eval_cap_needs_synthetic", ["eval", "--source", "humaneval", "--per-template", "3"],
     "needs --source synthetic", 2),
    ("eval_cap_zero", ["eval", "--source", "synthetic", "--per-template", "0"], "--per-template must be >= 1", 2),
    ("eval_k_zero", ["eval", "--k", "0"], "must be >= 1, got 0", 2),
    ("eval_negative_temperature", ["eval", "--temperature", "-1"], "temperature must be > 0", 2),
    ("eval_completion_past_positions", ["eval", "--max-new-tokens", "100000"], "it has 768 positions", 2),
    ("eval_k_not_a_number", ["eval", "--k", "many"], "argument --k: invalid int value: 'many'", 2),
    # -- tasks and the sandbox -----------------------------------------------------------
    ("sandbox_unknown_task", ["sandbox", "run", "--task", "nope", "--code", "cand.py", *PACK],
     "unknown task 'nope'", 2),
    ("sandbox_missing_code", ["sandbox", "run", "--task", "x", "--code", "missing.py", *PACK], "no such file", 2),
    ("tasks_pack_without_path", ["tasks", "validate", "--source", "humanevalpack"], "needs --path", 2),
    ("tasks_pack_missing_file", ["tasks", "validate", "--source", "humanevalpack", "--path", "no.jsonl"],
     "no such file", 2),
    ("tasks_synthetic_without_n", ["tasks", "validate", "--source", "synthetic"], "pass --n N", 2),
    ("tasks_show_unknown", ["tasks", "show", "--task", "nope", *PACK], "unknown task 'nope'", 2),
    ("tasks_overlap_same_splits", ["tasks", "overlap", "--split", "val", "--against", "val"],
     "are both 'val'", 2),
    # -- the other commands --------------------------------------------------------------
    ("runs_missing_folder", ["runs", "nowhere"], "no such folder", 2),
    ("experiment_unknown", ["experiment", "nope"], "unknown experiment 'nope'", 2),
    ("experiment_unknown_key", ["experiment", "reshaping", "--set", "stepz=1"], "unknown key 'stepz'", 2),
    ("mucode_unknown_key", ["mucode", "--set", "nope=1"], "unknown key 'nope'", 2),
    ("pretrain_unknown_key", ["pretrain-tiny", "--set", "nope=1"], "unknown key 'nope'", 2),
    ("paired_not_a_run", ["paired", "nowhere"], "'nowhere' is not a run folder", 2),
    ("paired_without_runs", ["paired"], "the following arguments are required: runs", 2),
    ("unknown_command", ["trian"], "invalid choice: 'trian'", 2),
]


def _write_run(folder: Path, cfg: dict, step: int, *, corrupt: bool = False) -> None:
    """A run folder as a trainer leaves it after ``step`` steps: its config, its logs and a
    complete checkpoint (whose weights file is garbage when ``corrupt``)."""
    ckpt = folder / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s + 1}) + "\n" for s in range(step)))
    (ckpt / "trainable.pt").write_bytes(b"not a checkpoint" if corrupt else b"")
    (ckpt / "COMPLETE").write_text("ok\n")


@pytest.fixture(scope="module")
def workdir(random_model_dir, tmp_path_factory):
    """The working folder every case runs in: a task file, configs (a small valid one, one
    broken, one with a typo), an empty folder, a candidate, a run stopped at step 2 (cosine
    schedule) and one whose checkpoint is corrupt."""
    from labkit.config import from_dict, to_dict
    from labkit.loops.config import TrainConfig

    root = tmp_path_factory.mktemp("work")
    (root / "tasks.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in toy_tasks()))
    (root / "broken.yaml").write_text("steps: 3\nloss: {kl_coef: [0.1\n")
    (root / "typo.yaml").write_text("stepz: 3\n")
    (root / "empty").mkdir()
    (root / "cand.py").write_text("def f(x):\n    return x\n")
    small = {"steps": 4, "policy": {"spec": str(random_model_dir)}, "optim": {"lr": 1e-4},
             "tasks": {"source": "records", "path": str(root / "tasks.jsonl"), "eval_tasks": 0},
             "sampling": {"group_size": 2, "max_new_tokens": 8}, "eval_every": 0}
    held = to_dict(from_dict(TrainConfig, {**small, "run_dir": "held",
                                           "optim": {"lr": 1e-4, "schedule": "cosine"}}))
    _write_run(root / "held", held, 2)
    (root / "small.yaml").write_text(yaml.safe_dump(small))
    _write_run(root / "corrupt", to_dict(from_dict(TrainConfig, {**small, "run_dir": "corrupt"})), 2,
               corrupt=True)
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its bytes (folders: ``dir``)."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def run_main(argv, capsys) -> tuple[int, str]:
    try:
        status = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        status = e.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("argv, says, status", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_leaves_nothing(argv, says, status, workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    before = snapshot(workdir)
    got, err = run_main(argv, capsys)
    lines = err.strip().splitlines()
    assert got == status, (got, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "labkit" in lines[0].split(": error: ")[0], lines[0]
    assert says in lines[0], lines[0]
    assert snapshot(workdir) == before


def test_the_table_covers_every_kind_of_mistake():
    """At least 34 cases, each named once, of every command a user types."""
    names = [c[0] for c in CASES]
    assert len(names) >= 34 and len(set(names)) == len(names)
    commands = {c[1][0] for c in CASES}
    assert {"train", "eval", "tasks", "sandbox", "runs", "experiment", "mucode", "pretrain-tiny",
            "paired"} <= commands


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(random_model_dir, tmp_path):
    """Ctrl-C from a terminal (SIGINT to the process group) while training: the step under way
    finishes and is checkpointed, one line says where it stopped and how to resume, exit 130."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in toy_tasks()))
    cfg = {"run_dir": "run", "steps": 200, "tasks_per_step": 2, "checkpoint_every": 1000,
           "policy": {"spec": str(random_model_dir)}, "eval_every": 0,
           "sampling": {"group_size": 2, "max_new_tokens": 8},
           "tasks": {"source": "records", "path": "tasks.jsonl", "eval_tasks": 0}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "train", "--quiet", "--config", "run.yaml"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 130, (out, err)
    assert len(lines) == 1 and lines[0].startswith("labkit: stopped at step "), err
    step = int(lines[0].split("stopped at step ")[1].split(";")[0])
    assert lines[0].endswith("; resume with python -m labkit train --resume run")
    assert 1 <= step < 200 and "Ctrl-C again stops at once" in out
    assert json.loads(out.strip().splitlines()[-1]) == {"run_dir": "run", "steps": step, "stopped": True}
    assert (tmp_path / "run" / "checkpoints" / f"step_{step:06d}" / "COMPLETE").exists()
    assert [json.loads(r)["step"] for r in metrics.read_text().splitlines()] == list(range(1, step + 1))
    assert not (tmp_path / "run" / "running.json").exists()


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["crash", "ctrl_c"])
def test_a_run_that_ends_before_its_first_step_leaves_no_state(error, workdir, monkeypatch, capsys):
    """The run folder was written (config.json, the step-0 evaluation, the running mark) when
    the first step fails or a hard Ctrl-C arrives: all of it is removed, so the next `train`
    into the same folder starts clean instead of refusing it."""
    from labkit.loops.trainer import Trainer

    def fail(self):
        raise error

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(Trainer, "train_step", fail)
    before = snapshot(workdir)
    argv = train("--config", "small.yaml", "--set", "run_dir=fresh")
    if isinstance(error, KeyboardInterrupt):
        status, err = run_main(argv, capsys)
        assert status == 130 and err == "labkit: stopped before the first step; nothing was saved\n"
    else:
        with pytest.raises(RuntimeError, match="boom"):
            main(argv)
    assert snapshot(workdir) == before
