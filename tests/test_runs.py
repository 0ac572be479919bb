"""The runs table (``python -m labkit runs``, ``widgets.RunsTable``) on three run folders: one
finished, one stopped between steps, one killed mid-run; and a run read while it trains."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import toy_tasks
from labkit.config import to_dict
from labkit.credit.reshaping import recipe
from labkit.runs.table import differing_fields, format_wall, recipe_name, run_status, runs_table
from labkit.loops.trainer import Trainer
from test_trainer import _cfg

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def three_runs(toy_model_dir, tmp_path_factory):
    """``runs/finished`` (2 of 2 steps, evaluated at 0 and 2, read while training too),
    ``runs/stopped`` (1 of 3 steps, the reshaped_grpo recipe, lr 2e-3) and ``runs/killed``
    (SIGKILL after its first step, a custom reshaping, kl_coef 0.05, from the command line)."""
    root = tmp_path_factory.mktemp("table") / "runs"
    seen = {}

    cfg = _cfg(root / "finished", toy_model_dir, steps=2, eval_every=2, eval_k=1)
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=toy_tasks()[:1])
    tr.events.on("on_step_end", lambda step, **_: seen.setdefault(
        step, {r["run"]: r["status"] for r in runs_table(root)["runs"]}))
    tr.train(progress=False)
    tr.close()

    cfg = _cfg(root / "stopped", toy_model_dir, steps=3, reshape=recipe("reshaped_grpo"))
    cfg.optim.lr = 2e-3
    tr = Trainer(cfg, train_tasks=toy_tasks(), eval_tasks=[])
    tr.train(steps=1, progress=False)
    tr.close()

    records = root.parent / "tasks.jsonl"
    records.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in toy_tasks()))
    cfg = _cfg(root / "killed", toy_model_dir, steps=3)
    cfg.tasks.path, cfg.loss.kl_coef, cfg.reshape.w_style = str(records), 0.05, 0.123
    (root.parent / "killed.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "train", "--quiet", "--config",
                             str(root.parent / "killed.yaml")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = root / "killed" / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return root, seen


def test_the_runs_table_on_three_run_folders(three_runs):
    root, seen = three_runs
    table = runs_table(root)
    rows = {r["run"]: r for r in table["runs"]}
    assert list(rows) == ["finished", "killed", "stopped"]
    assert {n: r["status"] for n, r in rows.items()} == {
        "finished": "finished", "killed": "stopped", "stopped": "stopped"}
    assert seen[1]["finished"] == "running"  # read from inside its own training
    assert (root / "killed" / "running.json").exists()  # the kill left its mark: a dead pid
    assert not (root / "finished" / "running.json").exists()

    fin, stop, kill = rows["finished"], rows["stopped"], rows["killed"]
    assert (fin["steps_done"], fin["steps"]) == (2, 2) and (stop["steps_done"], stop["steps"]) == (1, 3)
    assert 1 <= kill["steps_done"] < 3 and kill["steps"] == 3
    assert [r["recipe"] for r in (fin, stop, kill)] == ["raw", "reshaped_grpo", "custom"]
    assert {r["estimator"] for r in rows.values()} == {"grpo"}
    assert {r["feedback"] for r in rows.values()} == {"dense"} and {r["seed"] for r in rows.values()} == {3}
    metrics = [json.loads(line) for line in (root / "finished/metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (root / "finished/eval.jsonl").read_text().splitlines()]
    assert fin["reward_last"] == metrics[-1]["reward/mean"]
    assert (fin["pass_at_1_start"], fin["pass_at_1_end"]) == (evals[0]["eval/pass_at_1"],
                                                              evals[-1]["eval/pass_at_1"])
    assert fin["wall_s"] == pytest.approx(sum(r["time/step"] for r in metrics)
                                          + sum(e["time/eval"] for e in evals))
    assert stop["pass_at_1_start"] is None
    # what differs: the stopped run's lr, the killed run's KL, task file and reshaping (a
    # custom recipe opens the reshape fields); not the seed, steps or estimator (own columns)
    assert {"optim.lr", "loss.kl_coef", "tasks.path", "reshape.w_style"} <= set(table["differing"])
    assert not {"seed", "steps", "estimator", "feedback.mode", "run_dir", "optim.betas"} \
        & set(table["differing"])
    assert kill["differs"]["loss.kl_coef"] == 0.05 and fin["differs"]["loss.kl_coef"] == 0.01


def test_runs_on_the_command_line(three_runs):
    root, _ = three_runs
    out = subprocess.run([sys.executable, "-m", "labkit", "runs", str(root)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].split()[:10] == ["run", "estimator", "recipe", "feedback", "seed", "steps",
                                   "reward", "pass@1", "wall", "status"]
    assert out[1].split()[0] == "finished" and out[1].split()[5] == "2/2"
    assert "stopped" in out[2] and "custom" in out[2] and out[3].split()[:3] == ["stopped", "grpo",
                                                                                  "reshaped_grpo"]
    summary = json.loads(out[-1])
    assert (summary["runs"], summary["finished"], summary["stopped"], summary["running"]) == (3, 1, 2, 0)
    js = subprocess.run([sys.executable, "-m", "labkit", "runs", str(root), "--json"], cwd=ROOT,
                        capture_output=True, text=True, check=True).stdout
    assert json.loads(js) == json.loads(json.dumps(runs_table(root)))
    bad = subprocess.run([sys.executable, "-m", "labkit", "runs", str(root / "nowhere")],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such folder" in bad.stderr


def test_runs_table_widget_replays_a_clicked_run(three_runs):
    from widgets import RunsTable
    from widgets.static import static_html

    root, _ = three_runs
    table = RunsTable(root)
    assert [r["run"] for r in table.runs] == ["finished", "killed", "stopped"]
    assert table.selected == "" and table.dashboard is None
    table._pick.value = "stopped"  # a click in the list
    assert table.selected == str(root / "stopped") and len(table.dashboard.rows) == 1
    table.select("finished")
    assert len(table.dashboard.rows) == 2 and len(table.dashboard.eval_rows) == 2
    assert table._view.children == (table.dashboard,)
    page = static_html(table)
    assert "labkit-runs-table" in page and "reshaped_grpo" in page and "replay: <b>finished</b>" in page
    table.refresh()
    assert table.selected == str(root / "finished") and not table.out.outputs
    with pytest.raises(KeyError, match="no run 'nope'"):
        table.select("nope")


def test_runs_helpers_golden():
    assert run_status(2, 2, None, None, 0.0) == "finished"
    assert run_status(1, 2, None, None, 0.0) == "stopped"
    assert run_status(1, 2, {"pid": 1}, True, 1e9) == "running"
    assert run_status(1, 2, {"pid": 1}, False, 0.0) == "stopped"  # a dead process
    assert run_status(2, 2, {"pid": 1}, None, 60.0) == "running"  # another host, logs fresh
    assert run_status(1, 2, {"pid": 1}, None, 7200.0) == "stopped"  # another host, logs stale
    assert recipe_name(to_dict(recipe("reshaped"))) == "reshaped"
    assert recipe_name({**to_dict(recipe("raw")), "w_style": 0.5}) == "custom"
    a, b = {"x": 1, "reshape": {"w": 1}, "seed": 0}, {"x": 2, "reshape": {"w": 2}, "seed": 1, "y": 3}
    assert differing_fields([a, b]) == ["x", "y"]
    assert differing_fields([a, b], recipes_named=False) == ["reshape.w", "x", "y"]
    assert [format_wall(s) for s in (0, 45.4, 725, 3720)] == ["-", "45s", "12m05s", "1h02m"]
