"""The command line: last line one JSON object (bad input, one clear line and exit 2, is
tests/test_bad_inputs.py's table)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "humanevalpack_small.jsonl"
PACK = ["--source", "humanevalpack", "--path", str(FIXTURE)]


def labkit(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tasks_validate_reports_every_task():
    p = labkit("tasks", "validate", *PACK)
    assert p.returncode == 0, p.stderr
    rep = last_json(p)
    assert rep["tasks"] == rep["reference_pass"] == rep["buggy_fail"] > 0
    assert rep["failures"] == []


def test_sandbox_run_reference_and_broken_code(tmp_path):
    from labkit.env.humanevalpack import load_humanevalpack

    task = load_humanevalpack(FIXTURE)[0]
    good = tmp_path / "fix.py"
    good.write_text(task.reference_code)
    p = labkit("sandbox", "run", "--task", task.task_id, "--code", str(good), *PACK)
    out = last_json(p)
    assert p.returncode == 0 and out["status"] == "passed" and out["passed"] == out["total"] > 0
    assert out["protections"] and "flags" in out
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    p = labkit("sandbox", "run", "--task", task.task_id, "--code", str(bad), *PACK)
    out = last_json(p)
    assert p.returncode == 1 and out["status"] == "error" and out["passed"] == 0
    assert "invalid code" in p.stderr
