"""An experiment survives SIGKILL: killed in the middle of a training seed and again in the
middle of its paired evaluation, the same command reuses the finished seed, resumes the
interrupted one, evaluates only what it had not, and writes the same results as a run that
was never interrupted (measured times aside)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.experiments import learning

ROOT = Path(__file__).resolve().parents[1]
SETS = ["seeds=[0,1]", "steps=3", "tasks_per_step=1", "group_size=2", "eval_every=3", "eval_tasks=2",
        "eval_k=1", "train_problems=6", "paired_tasks=3", "paired_k=2", "paired_pass_k=2",
        "train_split=train", "paired_per_template=0"]
# the screened evaluation as --smoke has it (its default size is most of the run's time)
SETS += [f"{k}={list(v) if isinstance(v, tuple) else v}".replace(" ", "")
         for k, v in learning.SMOKE.items() if k.startswith("screen")]
TIMES = {"wall_s", "s_per_step", "code_commit", "run_dir", "command", "time"}


def _cmd(out: Path) -> list[str]:
    sets = SETS + [f"out={out}", f"run_root={out / 'runs'}"]
    return [sys.executable, "-m", "labkit", "experiment", "learning"] + [a for s in sets for a in ("--set", s)]


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(_cmd(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 600) -> None:
    t0 = time.time()
    while not ready():
        assert proc.poll() is None, "the experiment ended before the point it was to be killed at"
        assert time.time() - t0 < timeout, "the kill point was never reached"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _without_times(x):
    if isinstance(x, dict):
        return {k: _without_times(v) for k, v in x.items() if k not in TIMES}
    if isinstance(x, list):
        return [_without_times(v) for v in x]
    return x


@pytest.mark.slow
def test_an_experiment_killed_twice_finishes_as_if_never_interrupted(tmp_path):
    runs = tmp_path / "killed" / "runs" / "learning" / "grpo"
    proc = _start(tmp_path / "killed")
    # 1. mid training of the second seed: after its first checkpoint, before its last step
    _kill_when(proc, lambda: (runs / "seed1" / "checkpoints").is_dir()
               and any((runs / "seed1" / "checkpoints").glob("step_*/COMPLETE")))
    assert not (tmp_path / "killed" / "learning.json").exists()
    # 2. mid paired evaluation: after the first cached evaluation, before the page
    proc = _start(tmp_path / "killed")
    cache = tmp_path / "killed" / "runs" / "paired-start"
    _kill_when(proc, lambda: cache.is_dir() and any(cache.glob("paired-*.json")))
    assert not (tmp_path / "killed" / "learning.json").exists()
    # 3. the same command again finishes
    done = subprocess.run(_cmd(tmp_path / "killed"), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "seed 0: reusing the finished run" in done.stdout
    clean = subprocess.run(_cmd(tmp_path / "clean"), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert clean.returncode == 0, clean.stderr[-2000:]
    a = json.loads((tmp_path / "killed" / "learning.json").read_text())
    b = json.loads((tmp_path / "clean" / "learning.json").read_text())
    a["config"].pop("out"), a["config"].pop("run_root"), b["config"].pop("out"), b["config"].pop("run_root")
    assert _without_times(a) == _without_times(b)
    assert (tmp_path / "killed" / "runs" / "learning" / "grpo" / "seed1" / "metrics.jsonl").read_text() \
        .count('"step": 3') == 1  # the resumed seed logged each step once
