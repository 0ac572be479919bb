"""Data-parallel training: 2 CPU processes (gloo) under torchrun stay in sync."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_stay_in_sync(toy_model_dir, tmp_path):
    run = tmp_path / "run"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1")
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                           "--master_port", str(_free_port()), str(HERE / "_dist_worker.py"),
                           str(run), str(toy_model_dir)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = json.loads((run / "rank0.json").read_text())
    r1 = json.loads((run / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert r0["changed"] and r1["changed"]
    assert r0["digest"] == r1["digest"]  # identical parameters after every all-reduce
    assert r0["samples"] != r1["samples"]  # but each process sampled its own data
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # written once, by process 0
    assert all(r["dist/world_size"] == 2 for r in rows)
