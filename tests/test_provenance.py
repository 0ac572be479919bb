"""A run knows its code: what ``provenance.json`` records, and runs of two commits that are
never mixed unless ``allow_code_drift`` says so (and the page then says it)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import provenance

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    p = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return p.stdout.strip()


def _repo(tmp_path: Path) -> Path:
    """A git repository holding this checkout's code as it is now (committed once)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(ROOT / ".gitignore", repo / ".gitignore")  # bytecode written at run time is not code
    for name in provenance.CODE_PATHS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, repo / name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "A")
    return repo


def test_code_identity_sees_commits_and_uncommitted_code_only_under_the_code_paths(tmp_path):
    repo = _repo(tmp_path)
    a = provenance.code_identity(repo)
    assert a["commit"] == _git(repo, "rev-parse", "HEAD") and not a["dirty"] and a["diff_sha256"] is None
    (repo / "docs").mkdir()
    (repo / "docs" / "page.md").write_text("a page written into the tree\n")
    assert provenance.code_identity(repo) == a  # pages are not code
    (repo / "labkit" / "new_module.py").write_text("X = 1\n")
    b = provenance.code_identity(repo)
    assert b["dirty"] and b["commit"] == a["commit"] and provenance.label(b).startswith(a["commit"][:12] + "+dirty.")
    assert provenance.drift([a], b) and provenance.drift([b], b) is None
    (repo / "labkit" / "new_module.py").write_text("X = 2\n")  # other uncommitted changes
    assert "other uncommitted changes" in provenance.drift([b], provenance.code_identity(repo))
    rec = provenance.record_start(tmp_path / "run", repo)
    assert rec["started"]["code"]["dirty"] and (tmp_path / "run" / provenance.DIFF_FILE).exists()
    assert "# untracked: labkit/new_module.py" in (tmp_path / "run" / provenance.DIFF_FILE).read_text()
    assert set(rec["started"]) == {"code", "versions", "cpu", "utc"} and rec["started"]["versions"]["torch"]
    assert "recorded no code commit" in provenance.drift([None], a)


def _labkit(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)


def test_runs_of_two_commits_are_refused_together_unless_drift_is_allowed(tmp_path):
    """An experiment and a training run at commit A; a committed change makes commit B. At B,
    reusing A's finished runs, taking A's methods from its record and resuming A's run are each
    refused with one line naming both commits; ``allow_code_drift`` lets them through and the
    page and the run's record say so."""
    repo = _repo(tmp_path)
    exp = ["experiment", "learning", "--smoke", "--set", "seeds=[0]", "--set", "paired_tasks=3",
           "--set", "paired_pass_k=0", "--set", "steps=1", "--set", "eval_every=1", "--set",
           "eval_tasks=2", "--set", "screen_tasks=0", "--set", f"run_root={tmp_path / 'runs'}"]
    p = _labkit(repo, *exp, "--set", f"out={tmp_path / 'a'}")
    assert p.returncode == 0, p.stderr[-2000:]
    train = ["train", "--quiet", "--set", f"run_dir={tmp_path / 'run'}", "--set", "steps=2",
             "--set", "checkpoint_every=1", "--set", "tasks_per_step=1", "--set", "sampling.group_size=2",
             "--set", "sampling.max_new_tokens=32", "--set", "eval_every=0", "--set", "tasks.train_problems=4",
             "--set", "tasks.eval_tasks=0", "--set", "tasks.train_split=val", "--set", "tasks.eval_split=test"]
    p = _labkit(repo, *train)
    assert p.returncode == 0, p.stderr[-2000:]
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000002")  # as if stopped after step 1
    a = _git(repo, "rev-parse", "HEAD")[:12]

    init = repo / "labkit" / "__init__.py"
    init.write_text(init.read_text() + "\n# a committed change\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "B")
    b = _git(repo, "rev-parse", "HEAD")[:12]

    def refused(p, what):
        errors = [line for line in p.stderr.splitlines() if line.startswith("labkit: error:")]
        assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert what in errors[0], errors[0]
        assert f"trained at commit {a}" in errors[0] and f"this code is {b}" in errors[0], errors[0]

    refused(_labkit(repo, *exp, "--set", f"out={tmp_path / 'b'}"), "reuse")
    record = ["--set", f"run_root={tmp_path / 'runs2'}", "--set", f"reuse_recorded={tmp_path / 'a' / 'learning.json'}"]
    refused(_labkit(repo, *exp[:-2], *record, "--set", f"out={tmp_path / 'c'}"), "reuse_recorded")
    refused(_labkit(repo, "train", "--quiet", "--resume", str(tmp_path / "run")), "resume")

    p = _labkit(repo, *exp[:-2], *record, "--set", f"out={tmp_path / 'c'}", "--set", "allow_code_drift=true")
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "c" / "learning.json").read_text())
    assert res["recorded"]["methods"] == ["grpo"] and res["provenance"]["runs"] == [a]
    assert res["provenance"]["code"] == b and res["provenance"]["allow_code_drift"]
    page = (tmp_path / "c" / "learning.md").read_text()
    assert f"`{a}`" in page and f"`{b}`" in page and "allow_code_drift" in page

    p = _labkit(repo, "train", "--quiet", "--resume", str(tmp_path / "run"), "--allow-code-drift")
    assert p.returncode == 0, p.stderr[-2000:]
    rec = provenance.read(tmp_path / "run")
    assert [provenance.label(c) for c in provenance.identities(rec)] == [a, b]


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "results").glob("*.json")), ids=lambda p: p.name)
def test_every_results_json_names_its_command_code_and_model(path):
    data = json.loads(path.read_text())
    if data.get("record") == "sources":  # typed from papers and the seed blog: no command made it
        assert data.get("note") and data["sources"], f"{path.name}: a sources record needs its note"
        assert all(s.get("paper") or s.get("software") for s in data["sources"]), path.name
        return
    assert data.get("command"), f"{path.name}: no command"
    assert data.get("code_commit"), f"{path.name}: no code commit"
    model = data.get("setting", {}).get("model_sha256") or data.get("model_sha256")
    assert model, f"{path.name}: no model hash"
