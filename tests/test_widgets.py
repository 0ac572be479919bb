"""Widgets without a browser: pure helpers against golden numbers, each widget built from
hand-written records or a tiny run folder, its traitlets and callbacks driven directly."""

import html
import json
import math
import re
import statistics
from types import SimpleNamespace

import ipywidgets
import pytest

from labkit.credit.reshaping import ReshapeConfig
from labkit.runs.events import EventBus
from widgets import colors
from widgets.anchorview import (AnchorView, anchor_label, anchor_token_values, anchors_table,
                                member_outlines, members_table, pick_task, records_by_rollout)
from widgets.dashboard import TrainingDashboard, metrics_to_series, strip_matrix
from widgets.diffview import DiffView, changed_lines, render_tokens_html
from widgets.inspector import AdvantageInspector, group_frame
from widgets.tuner import RewardTuner, compare, kendall_tau, recompute

BUGGY = "def inc(x):\n    return x - 1\n"
# the copying trap: copying the buggy code keeps most tests and all the "precision"
COPY = {"r_test": 0.8, "r_pass": 0.0, "r_compile": 1.0, "r_precision": 1.0, "r_style": 1.0,
        "r_progress": 0.0, "hack": 0.0, "noop": 1.0}
FIX = dict(COPY, r_test=1.0, r_pass=1.0, r_precision=0.4, noop=0.0)
WRONG = dict(COPY, r_test=0.5, r_precision=0.9, noop=0.0)
BROKEN = dict(COPY, r_test=0.0, r_compile=0.0, r_precision=0.2, noop=0.0)
TRAP = ReshapeConfig(w_test=1.0, w_precision=0.5, w_style=0.0, w_progress=0.0, w_hack=0.0,
                     gate_precision="none", adv_clip=0.0)


def record(sample, components, reward=0.0, adv=0.0, task_id="toy/inc/bug0", step=3,
           completion="def inc(x):\n    return x + 1\n", **extra):
    """A rollouts.jsonl row: one token per whitespace-separated chunk of the completion."""
    offsets = [[m.start(), m.end()] for m in re.finditer(r"\S+\s*", completion)]
    return {"step": step, "task_id": task_id, "sample": sample, "buggy_code": BUGGY,
            "completion": completion, "code": completion, "code_start": 0, "offsets": offsets,
            "completion_ids": list(range(len(offsets))), "logprobs": [-0.5] * len(offsets),
            "components": components, "reward": reward, "advantages": [adv] * len(offsets),
            "status": "passed" if components["r_pass"] else "failed", "flags": [], **extra}


def trap_batch(**extra):
    """Step 3: the trap group (copy, fix, wrong edit, broken) and a group of equal rewards."""
    group_a = [record(i, c, **extra) for i, c in enumerate((COPY, FIX, WRONG, BROKEN))]
    group_b = [record(i, FIX, task_id="toy/dbl/bug0", **extra) for i in range(2)]
    return group_a + group_b


def visible_text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]*>", "", fragment))


@pytest.fixture
def run_dir(tmp_path):
    """A finished run written by hand: 3 steps of metrics, 2 evals, rollouts of steps 2-3."""
    def jsonl(name, rows):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    jsonl("metrics.jsonl", [{"step": s, "reward/mean": 0.1 * s, "kl/k3": 0.01 * s,
                             "clip/frac": None, "time/generate": 1.5} for s in (1, 2, 3)])
    jsonl("eval.jsonl", [{"step": 0, "eval/pass_at_1": 0.25}, {"step": 3, "eval/pass_at_1": 0.5}])
    early = [record(i, WRONG, reward=0.5, step=2, task_id="toy/sq/bug0") for i in range(2)]
    scored = ((FIX, 1.0, 1.5), (WRONG, 0.0, -0.5), (WRONG, 0.0, -0.5), (BROKEN, 0.0, -0.5))
    late = [record(i, c, reward=r, adv=a) for i, (c, r, a) in enumerate(scored)]
    jsonl("rollouts.jsonl", early + late + [record(0, FIX, task_id="toy/neg/bug0")])
    (tmp_path / "config.json").write_text(json.dumps({"reshape": {"w_precision": 0.3}}))
    return tmp_path


# ----------------------------------------------------------------------------- colors


def test_diverging_colors_golden():
    assert colors.diverging_color(0.0, 1.0) == "rgb(255, 255, 255)"
    assert colors.diverging_color(1.0, 1.0) == "rgb(178, 24, 43)"
    assert colors.diverging_color(-1.0, 1.0) == "rgb(33, 102, 172)"
    assert colors.diverging_color(0.5, 1.0) == "rgb(217, 140, 149)"  # halfway, rounded half up
    assert colors.diverging_color(-3.0, 1.0) == "rgb(33, 102, 172)"  # beyond the scale: the end
    assert colors.diverging_color(None, 1.0) == "transparent"
    assert colors.diverging_color(math.nan, 1.0) == "transparent"
    assert colors.symmetric_scale([-2.0, 1.0, None, math.nan]) == 2.0
    assert colors.symmetric_scale([]) == colors.symmetric_scale([0.0, 0.0]) == 1.0
    assert colors.ink_color(-0.7, 1.0) == "white" and colors.ink_color(0.2, 1.0) == "inherit"
    assert colors.escape("<a href=\"x\">&'") == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    legend = colors.legend_html(2.0)
    assert "-2" in legend and "+2" in legend and "labkit-legend" in legend


# ----------------------------------------------------------------------------- diffview


def test_render_tokens_keeps_every_character_once_in_order():
    text = 'if a < b & c:\n    s = "x"\'y\'\n'
    # a gap before token 0, overlapping tokens, an empty token, one past the end
    offsets = [[1, 5], [3, 8], [8, 8], [8, 14], [14, 20], [20, 99]]
    values = [1.0, -0.5, 0.0, 0.25, None]
    out = render_tokens_html(text, offsets, values, logprobs=[-0.1] * 6, kls=[0.02] * 6,
                             outlines=[(6, 16, "anchor <1>"), (10, 12, "inner")])
    assert visible_text(out) == text
    assert "&lt;" in out and "&amp;" in out and "&quot;x&quot;" in out
    # 5 non-empty tokens; the outline ends at 6, 10, 12 and 16 cut four more pieces
    assert len(re.findall(r"labkit-tok\b", out)) == 9
    assert "background:rgb(178, 24, 43)" in out  # the largest |A| takes the end colour
    assert "advantage +1.000" in out and "log-prob -0.100" in out and "KL 0.0200" in out
    assert "outline: anchor &lt;1&gt;" in out and out.count("labkit-outline") == 5
    assert visible_text(render_tokens_html("", [], [])) == ""


def test_changed_lines_golden():
    before = "a\nb\nc\nd\n"
    assert changed_lines(before, before) == set()
    assert changed_lines(before, "a\nB\nc\nd\n") == {1}
    assert changed_lines(before, "a\nc\nd\n") == {1}  # deleted
    assert changed_lines(before, "a\nb\nnew\nc\nd\n") == {2}  # inserted before line 2
    assert changed_lines(before, before + "e\n") == {3}  # appended after the last line


def test_diffview_from_record_and_one_render_per_record():
    rec = record(0, FIX, reward=1.0, adv=1.5)
    view = DiffView.from_record(rec)
    assert view.completion == rec["completion"] and view.values == rec["advantages"]
    assert "labkit-diffview" in view._dom_classes
    left, right = view.children[1].children
    assert "labkit-changed" in left.value  # `return x - 1` differs in the fix
    assert visible_text(right.value).endswith(rec["completion"])
    renders = []
    right.observe(renders.append, names="value")
    view.show_record(record(1, WRONG, adv=-0.5, completion="def inc(x):\n    return 1\n"),
                     outlines=[(4, 7, "name")])
    assert len(renders) == 1 and "labkit-outline" in right.value
    view.values = [0.0] * len(view.offsets)
    assert len(renders) == 2


# ----------------------------------------------------------------------------- inspector


def test_group_frame_estimators_golden():
    recs = [record(i, FIX if i == 0 else WRONG, reward=1.0 if i == 0 else 0.0) for i in range(4)]
    frame = group_frame(recs)
    assert frame["A grpo"].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    assert frame["A dr_grpo"].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert frame["A rloo"].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert frame["r_precision"].tolist() == [0.4, 0.9, 0.9, 0.9]


def test_inspector_selects_into_diffview(run_dir):
    insp = AdvantageInspector.from_run(run_dir)
    assert [r["sample"] for r in insp.records] == [0, 1, 2, 3]  # latest step, widest spread
    assert insp.frame["advantage"].tolist() == [1.5, -0.5, -0.5, -0.5]
    insp._picker.value = 2
    assert insp.selected == 2 and insp.diff.caption.startswith("step 3 · toy/inc/bug0 · sample 2")
    insp.selected = 0
    assert insp._picker.value == 0 and "sample 0" in insp.diff.caption
    assert "labkit-inspector" in insp._dom_classes
    assert AdvantageInspector.from_run(run_dir, step=2).records[0]["task_id"] == "toy/sq/bug0"
    with pytest.raises(Exception, match="one step and task_id"):
        AdvantageInspector(trap_batch())
    with pytest.raises(LookupError, match="toy/nope"):
        AdvantageInspector.from_run(run_dir, task_id="toy/nope")


def test_default_group_is_the_one_with_signal():
    """A group whose rollouts all passed has every advantage 0: the default skips it for the
    group whose rewards spread widest (the first logged among equals)."""
    from widgets.records import group

    flat = [record(i, FIX, reward=1.0) | {"task_id": "toy/flat/bug0"} for i in range(4)]
    mixed = [record(i, FIX if i < 2 else WRONG, reward=1.0 if i < 2 else 0.0) for i in range(4)]
    assert {r["task_id"] for r in group(flat + mixed)} == {mixed[0]["task_id"]}
    assert {r["task_id"] for r in group(mixed + flat)} == {mixed[0]["task_id"]}
    assert {r["task_id"] for r in group(flat)} == {"toy/flat/bug0"}


# ----------------------------------------------------------------------------- tuner


def test_kendall_tau_golden():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))  # tau-b
    assert math.isnan(kendall_tau([1, 1], [1, 2]))


def test_recompute_copying_trap_golden():
    batch = trap_batch()
    trap = recompute(batch, TRAP)
    a = trap[trap.task_id == "toy/inc/bug0"]
    assert a["reward"].tolist() == pytest.approx([1.3, 1.2, 0.95, 0.1])  # copying wins
    assert a["rank"].tolist() == [1, 2, 3, 4]
    assert a["advantage"].tolist() == pytest.approx([0.75654, 0.573136, 0.114627, -1.444303],
                                                    abs=1e-6)
    edit = recompute(batch, ReshapeConfig(**{**vars(TRAP), "gate_precision": "edit"}))
    a = edit[edit.task_id == "toy/inc/bug0"]
    assert a["reward"].tolist() == pytest.approx([0.8, 1.2, 0.95, 0.1])  # the fix wins
    assert a["rank"].tolist() == [3, 1, 2, 4]
    assert a["advantage"].tolist() == pytest.approx([0.079537, 0.927931, 0.397685, -1.405152],
                                                    abs=1e-6)
    r = a["reward"].tolist()  # and against a naive GRPO (in float64; the tuner, like the
    naive = [(x - statistics.fmean(r)) / (statistics.stdev(r) + 1e-6) for x in r]  # trainer, in float32)
    assert a["advantage"].tolist() == pytest.approx(naive, abs=1e-6)
    b = edit[edit.task_id == "toy/dbl/bug0"]
    assert b["advantage"].tolist() == [0.0, 0.0] and b["rank"].tolist() == [1, 1]
    # "improved" pays precision only above the buggy code's tests (0.8): not the wrong edit
    improved = recompute(trap_batch(buggy_r_test=0.8),
                         ReshapeConfig(**{**vars(TRAP), "gate_precision": "improved"}))
    assert improved["reward"].tolist()[:4] == pytest.approx([0.8, 1.2, 0.5, 0.0])
    cmp = compare(trap, edit)
    assert cmp["moved"].tolist()[:4] == [-2, 1, 1, 0]
    clipped = recompute(batch, ReshapeConfig(**{**vars(TRAP), "adv_clip": 1.0}))
    assert clipped["advantage"].max() == pytest.approx(0.75654, abs=1e-6)
    assert clipped["advantage"].min() == -1.0
    with pytest.raises(ValueError, match="one step"):
        recompute(batch + [record(0, FIX, step=4)], TRAP)


def test_tuner_slider_recomputes_table(run_dir):
    tuner = RewardTuner(trap_batch(), start=TRAP)
    table = tuner._table.value
    assert tuner.frame["moved"].eq(0).all() and "<b>0</b> of 6" in tuner._summary.value
    tuner.controls["gate_precision"].value = "edit"
    assert tuner.config.gate_precision == "edit"
    assert tuner.frame["rank"].tolist()[:4] == [3, 1, 2, 4] and tuner._table.value != table
    assert "<b>3</b> of 6" in tuner._summary.value and "0.333" in tuner._summary.value
    tuner.controls["w_precision"].value = 0.0
    assert tuner.frame["reward"].tolist()[:4] == pytest.approx([0.8, 1.0, 0.5, 0.0])
    tuner.config = ReshapeConfig(**{**vars(TRAP), "amplify": "signed_power", "w_test": 3.0})
    assert tuner.controls["w_test"].value == 3.0  # the slider widened instead of clamping
    assert not tuner.controls["amplify_power"].disabled
    tuner._reset.click()
    assert tuner.config == TRAP and tuner.controls["gate_precision"].value == "none"
    tuner.estimator = "dr_grpo"
    assert tuner.frame["A"].tolist()[:4] == pytest.approx([0.4125, 0.3125, 0.0625, -0.7875])
    tuner.controls["focus_threshold"].value = 0.35  # damps |A| < 0.35 by 0.1
    assert tuner.frame["A"].tolist()[:4] == pytest.approx([0.4125, 0.03125, 0.00625, -0.7875])
    assert tuner.out.outputs == ()
    assert "labkit-tuner" in tuner._dom_classes
    from_run = RewardTuner.from_run(run_dir)
    assert from_run.start.w_precision == 0.3 and len(from_run.records) == 5


def test_tuner_loads_the_named_recipes():
    from labkit.credit.reshaping import RECIPES, recipe

    tuner = RewardTuner(trap_batch(), start=TRAP)
    assert list(tuner._recipe.options) == ["(custom)", *RECIPES]
    tuner._recipe.value = "reshaped"
    assert tuner.config == recipe("reshaped") and tuner.controls["normalise"].value == "batch"
    assert tuner.start == TRAP  # the comparison still starts from where it started


def test_tuner_shows_errors_in_its_output():
    tuner = RewardTuner(trap_batch(), start=TRAP)
    good = tuner.records
    tuner.records = [dict(r, components={"r_pass": 0.0}) for r in good]  # no r_test
    assert "KeyError: 'r_test'" in tuner.out.outputs[-1]["text"]
    tuner.records = good
    assert tuner.out.outputs == ()


# ----------------------------------------------------------------------------- dashboard


def test_metrics_to_series_golden():
    rows = [{"step": 1, "a": 1.0, "b": None}, {"step": 2, "a": math.nan}, {"a": 2, "b": 0.5}]
    assert metrics_to_series(rows, ["a", "b", "c"]) == {
        "a": ([1, 2], [1.0, 2.0]), "b": ([2], [0.5]), "c": ([], [])}


def test_strip_matrix_pads_and_labels():
    recs = [record(0, FIX, adv=1.0), record(1, WRONG, adv=-1.0, completion="x = 1\n")]
    z, text, labels = strip_matrix(recs)
    assert [len(row) for row in z] == [6, 6] and z[1] == [-1.0] * 3 + [None] * 3
    assert text[1][:3] == ["'x '", "'= '", "'1\\n'"] and labels == ["toy/inc/bug0 #0",
                                                                   "toy/inc/bug0 #1"]


def _stub_trainer():
    stub = SimpleNamespace(events=EventBus(), stops=0, cfg=SimpleNamespace(run_dir="runs/stub-run"))
    stub.request_stop = lambda: setattr(stub, "stops", stub.stops + 1)
    return stub


def _n_subscribers(bus: EventBus) -> int:
    return sum(len(fns) for fns in bus._subs.values())


def test_dashboard_follows_events_and_stops_the_trainer():
    dash, trainer = TrainingDashboard(), _stub_trainer()
    dash.attach(trainer)
    dash.attach(trainer)  # re-running the cell
    assert _n_subscribers(trainer.events) == 5  # start, rollout, step end, eval, end (static copy)
    trace = {t.name: t for t in dash.curves.data}
    trainer.events.emit("on_train_start", trainer=trainer)
    assert "stub-run: started: step 1 (the first point comes after" in dash._status.value
    for step in (1, 2):
        trainer.events.emit("on_rollout", trainer=trainer, step=step - 1, rollouts=[None] * 6)
        trainer.events.emit("on_step_end", trainer=trainer, step=step,
                            metrics={"step": step, "reward/mean": step / 10, "kl/k3": 0.01,
                                     "time/step": 31.2}, records=trap_batch())
    trainer.events.emit("on_eval", trainer=trainer, step=2, metrics={"step": 2,
                                                                     "eval/pass_at_1": 0.5})
    assert trace["reward/mean"].x == (1, 2) and trace["reward/mean"].y == (0.1, 0.2)
    assert trace["eval/pass_at_1"].y == (0.5,) and trace["clip/frac"].x == ()
    assert len(dash.strip.data[0].z) == 6 and "step 2" in dash._status.value
    assert dash._status.value.count("stub-run: step 2 in 31 s: reward 0.200") == 1  # run, seconds
    assert dash.curves.data[0].legendgroup == "reward"  # one legend group per panel
    # a resumed run repeats step 2: the newest row replaces the old one
    trainer.events.emit("on_step_end", trainer=trainer, step=2,
                        metrics={"step": 2, "reward/mean": 0.3}, records=trap_batch())
    assert trace["reward/mean"].y == (0.1, 0.3)

    dash._stop.click()
    assert trainer.stops == 1 and dash.stop_requested
    # the step in flight still reports, and the line keeps saying a stop is coming
    trainer.events.emit("on_step_end", trainer=trainer, step=3,
                        metrics={"step": 3, "reward/mean": 0.4}, records=trap_batch())
    assert "step 3" in dash._status.value and "stop requested" in dash._status.value
    other = _stub_trainer()
    dash.attach(other)
    assert _n_subscribers(trainer.events) == 0 and _n_subscribers(other.events) == 5
    dash.close()
    assert _n_subscribers(other.events) == 0 and dash._stop.disabled


def test_dashboard_keeps_a_finished_run_as_an_overlay():
    """``keep`` freezes the comparable curves of one run as dotted traces in their panels, so
    the next run is drawn against them; empty curves are not kept."""
    dash, trainer = TrainingDashboard(), _stub_trainer()
    dash.attach(trainer)
    for step in (1, 2):
        trainer.events.emit("on_step_end", trainer=trainer, step=step,
                            metrics={"step": step, "reward/r_test": step / 4, "train/pass_at_1": 0.1},
                            records=trap_batch())
    n = len(dash.curves.data)
    dash.keep("grpo")
    dash.rows, dash.eval_rows = [], []
    kept = {t.name: t for t in dash.curves.data[n:]}
    assert set(kept) == {"reward/r_test (grpo)", "train/pass_at_1 (grpo)"}  # no eval, no KL yet
    assert kept["reward/r_test (grpo)"].y == (0.25, 0.5) and kept["reward/r_test (grpo)"].line.dash == "dot"
    live = next(t for t in dash.curves.data if t.name == "reward/r_test")
    assert live.x == () and kept["reward/r_test (grpo)"].xaxis == live.xaxis  # same panel


def test_dashboard_errors_do_not_reach_the_trainer():
    dash = TrainingDashboard().attach(_stub_trainer())
    trainer = dash.trainer
    bad = [{"step": 1, "task_id": "t", "sample": 0, "advantages": [1.0], "offsets": [[0, 1]]}]
    trainer.events.emit("on_step_end", trainer=trainer, step=1, metrics={"step": 1},
                        records=bad)  # no "completion": the strip fails, training goes on
    assert "KeyError" in dash.out.outputs[-1]["text"]
    dash.detach()


def test_dashboard_replay(run_dir):
    dash = TrainingDashboard.replay(run_dir)
    trace = {t.name: t for t in dash.curves.data}
    assert trace["reward/mean"].x == (1, 2, 3) and trace["kl/k3"].y == pytest.approx((0.01, 0.02,
                                                                                       0.03))
    assert trace["eval/pass_at_1"].x == (0, 3) and trace["time/generate"].y == (1.5, 1.5, 1.5)
    assert trace["clip/frac"].x == ()
    assert len(dash.strip.data[0].z) == 5 and dash._stop.disabled
    assert dash._stop.layout.display == "none" and "replay of" in dash._status.value  # no Stop
    assert dash.curves.data[0].name == "reward/mean"  # what browser tests poll
    dash.batch = [dict(r, advantages=[0.0] * len(r["advantages"])) for r in dash.batch]
    assert "no signal this step" in dash.strip.layout.title.text  # a blank strip says why
    with pytest.raises(FileNotFoundError):
        TrainingDashboard.replay(run_dir / "missing")


# ----------------------------------------------------------------------------- anchors


def anchor(id, members, gs, spans, tokens, text=("return x + 1",), source="root", L=1.0):
    """An anchors.jsonl line; members are (rollout, reward, a_d), all crediting ``spans``
    (completion characters) and ``tokens`` on code line 1."""
    return {"step": 3, "task_id": "toy/inc/bug0", "id": id, "text": list(text), "source": source,
            "L": L, "n": len(members), "gs": gs,
            "members": [{"rollout": b, "size": 1, "reward": r, "a_d": a, "lines": [1],
                         "spans": [list(s) for s in spans], "tokens": list(tokens)}
                        for b, r, a in members]}


# record()'s completion "def inc(x):\n    return x + 1\n": `return x + 1` is characters
# 16-28, tokens 2-5; the second anchor also lists token 5, to test which anchor wins
ANCHORS = [anchor(0, [(0, 1.0, 0.5), (1, 0.0, -0.5)], 0.3, [(16, 28)], [2, 3, 4, 5]),
           anchor(1, [(1, 0.0, -0.25), (3, 0.5, 0.25)], 0.1, [(0, 11)], [0, 1, 5],
                  text=("def inc(x):", "pass"))]


def test_anchor_helpers_golden():
    table = anchors_table(ANCHORS)
    assert table["anchor"].tolist() == [0, 1] and table["mean R"].tolist() == [0.5, 0.25]
    assert table["members"].tolist() == ["0 1", "1 3"]
    assert table["A_D"].tolist() == ["+0.50 -0.50", "-0.25 +0.25"]
    assert table["sub-diff"].tolist() == ["return x + 1", "def inc(x):  (+1 lines)"]
    members = members_table(ANCHORS[1])
    assert members["rollout"].tolist() == [1, 3] and members["A_D"].tolist() == [-0.25, 0.25]
    assert members["lines"].tolist() == ["2", "2"] and members["tokens"].tolist() == [3, 3]
    assert member_outlines(ANCHORS[0]) == {0: [(16, 28, "anchor 0 · A_D +0.500")],
                                           1: [(16, 28, "anchor 0 · A_D -0.500")]}
    # token 5 is listed by both anchors in rollout 1: the higher-GS anchor (id 0) wins
    assert anchor_token_values(ANCHORS, 1, 7) == [-0.25, -0.25, -0.5, -0.5, -0.5, -0.5, 0.0]
    assert anchor_token_values(ANCHORS, 3, 4) == [0.25, 0.25, 0.0, 0.0]  # token 5 beyond T
    assert anchor_token_values(ANCHORS, 2, 3) == [0.0, 0.0, 0.0]  # in no anchor
    assert anchor_label(ANCHORS[0]) == "#0  GS 0.300  n 2  L 1.0  return x + 1"
    recs = [record(3, FIX), record(0, FIX)]
    placed = records_by_rollout(recs, ANCHORS)
    assert [r and r["sample"] for r in placed] == [0, None, None, 3]
    rows = [dict(a, step=s, task_id=t) for s, t in ((2, "a"), (3, "b"), (3, "c")) for a in ANCHORS]
    assert pick_task(rows)[:2] == (3, "b") and pick_task(rows, 3, "c")[2][1]["id"] == 1
    with pytest.raises(LookupError, match="steps with anchors: \\[2, 3\\]"):
        pick_task(rows, step=9)
    with pytest.raises(LookupError, match="tasks there: \\['b', 'c'\\]"):
        pick_task(rows, 3, "z")
    with pytest.raises(LookupError, match="didpo"):
        pick_task([])


def test_anchorview_in_memory_selects_and_outlines():
    from labkit.credit.anchors import synthetic_group, task_anchors

    buggy, rollouts, rewards = synthetic_group(G=8, seed=0)
    found = task_anchors(rollouts, rewards, buggy)
    assert len(found) >= 2
    view = AnchorView.from_task(found, rollouts, rewards, buggy, caption="synthetic")
    assert "labkit-anchorview" in view._dom_classes and view.color_by == "a_d"
    for a in view.anchors:  # A_D against a naive recomputation from the group's rewards
        group = [rewards[m["rollout"]] for m in a["members"]]
        assert [m["a_d"] for m in a["members"]] == pytest.approx(
            [r - statistics.fmean(group) for r in group])
    for k in (1, 0):
        view._picker.value = k  # what a click in the list does
        a = view.anchors[k]
        assert view.selected == k and "font-weight: bold" in view._table.value
        shown = view._members.children
        assert [v.caption.split(" · ")[0] for v in shown] == [
            f"rollout {m['rollout']}" for m in a["members"]]
        for v, m in zip(shown, a["members"]):
            assert v.caption.endswith(f"sample {m['rollout']} · reward {m['reward']:.3f}")
            framed = re.findall(r'labkit-outline[^>]*>([^<]*)<', v._right.value)
            spans = "".join(rollouts[m["rollout"]].completion[s:e] for s, e in m["spans"])
            assert html.unescape("".join(framed)) == spans and "labkit-anchor-member" in v._dom_classes
            assert v.values == anchor_token_values(view.anchors, m["rollout"], len(v.offsets))
    views = list(view._members.children)
    renders = []
    views[0]._right.observe(renders.append, names="value")
    view.selected = 1
    view.selected = 0
    assert len(renders) == 2 and view._members.children[0] is views[0]  # reused, one render each
    assert view._picker.value == 0 and view.out.outputs == ()
    view.anchors = view.anchors[:1]
    assert view._picker.options == ((anchor_label(view.anchors[0]), 0),)
    view.anchors = []
    assert "no anchors" in view._table.value and view._members.children == ()
    with pytest.raises(Exception, match="color_by"):
        view.color_by = "reward"


def test_anchorview_from_run(run_dir):
    lines = [dict(a, step=3) for a in ANCHORS] + [dict(ANCHORS[0], step=2, task_id="toy/sq/bug0")]
    (run_dir / "anchors.jsonl").write_text("".join(json.dumps(a) + "\n" for a in lines))
    view = AnchorView.from_run(run_dir)
    assert view.caption == "toy/inc/bug0 at step 3" and len(view.anchors) == 2
    assert view.color_by == "advantages"
    first = view._members.children[0]
    assert first.values == [1.5] * len(first.offsets) and "sample 0" in first.caption
    view.color_by = "a_d"
    assert first.values == anchor_token_values(ANCHORS, 0, len(first.offsets))
    assert "A_D (anchors)" in first._legend.value
    view.selected = 1  # rollout 3 was logged; with only samples 0-3 at step 3 all are there
    assert len(view._members.children) == 2
    (run_dir / "rollouts.jsonl").write_text("")
    missing = AnchorView.from_run(run_dir, step=3)
    assert all("not in the records" in w.value for w in missing._members.children)
    assert AnchorView.from_run(run_dir, step=2).caption == "toy/sq/bug0 at step 2"


def test_tuner_rereads_a_batch_under_another_feedback_regime():
    """Records carry their per-test outcomes: under `binary` a 6-of-8 program is told 0, so its
    group's ranking and advantages change; `as run` keeps the stored r_feedback."""
    from labkit.env.feedback import FeedbackConfig

    def rec(sample, oks):
        comps = {"r_test": sum(oks) / len(oks), "r_pass": float(all(oks)),
                 "r_feedback": sum(oks) / len(oks)}
        return record(sample, comps, tests=[[f"case_{i}", ok] for i, ok in enumerate(oks)],
                      tests_total=len(oks), public_tests=["case_0", "case_7"])
    batch = [rec(0, [True] * 8), rec(1, [True] * 6 + [False] * 2), rec(2, [False] * 8)]
    start = recompute(batch, TRAP)
    binary = recompute(batch, TRAP, feedback=FeedbackConfig(mode="binary"))
    public = recompute(batch, TRAP, feedback=FeedbackConfig(mode="public"))
    assert start["reward"].tolist() == pytest.approx([1.0, 0.75, 0.0])
    assert binary["reward"].tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert public["reward"].tolist() == pytest.approx([1.0, 0.5, 0.0])
    tuner = RewardTuner(batch, start=TRAP)
    before = tuner.frame["A"].tolist()
    tuner._feedback.value = "binary"
    assert tuner.frame["A"].tolist() != before and tuner.frame["A@start"].tolist() == before
    with pytest.raises(ValueError, match="no per-test outcomes"):
        recompute(trap_batch(), TRAP, feedback=FeedbackConfig(mode="noisy"))


def test_component_effects_say_which_components_can_act():
    """Batch normalisation is affine in the rewards: inert under GRPO's standardisation, a
    rescaling under Dr. GRPO. A clip acts under GRPO only below (G-1)/sqrt(G)."""
    from labkit.credit.reshaping import max_standardised_advantage, recipe
    from widgets.tuner import component_effects

    assert max_standardised_advantage(8) == pytest.approx(7 / 8 ** 0.5)  # 2.47
    blog = recipe("reshaped")
    grpo = component_effects(trap_batch(), blog, "grpo").set_index("component")["acts"]
    dr = component_effects(trap_batch(), blog, "dr_grpo").set_index("component")["acts"]
    assert grpo.to_dict() == {"composite": True, "normalise": False, "adv_clip": False}
    assert dr["normalise"] and not dr["adv_clip"]
    one_of_eight = [record(i, {"r_test": float(i == 0), "r_pass": float(i == 0)}) for i in range(8)]
    clip = ReshapeConfig(**{**vars(recipe("raw")), "adv_clip": 2.0})
    assert component_effects(one_of_eight, clip, "grpo")["acts"].tolist() == [True]  # 2.47 -> 2
    assert component_effects(trap_batch(), recipe("reshaped_grpo"), "grpo")["acts"].all()


def test_widgets_carry_a_static_rendering_for_pages_without_a_kernel(tmp_path, random_model_dir):
    """Every widget's display data has ``text/html``: its figures as plotly divs, its HTML
    and controls as they are now; no widget model is needed to read it."""
    from widgets import DiffView, TrainingDashboard
    from widgets.static import static_html

    dash = TrainingDashboard()
    dash.rows = [{"step": 1, "reward/mean": 0.25}, {"step": 2, "reward/mean": 0.75}]
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # JupyterLab still gets the widget
    page = bundle["text/html"]
    assert page.count("plotly-graph-div") == 2 and "0.75" in page  # curves and strip, current data
    assert "TrainingDashboard(" not in page and "<button" not in page
    view = DiffView(buggy_code="x = 1\n", completion="x = 2\n", code="x = 2\n")
    assert "x = 2" in static_html(view) and "labkit-diffview" in static_html(view)


def test_widgets_fit_a_notebook_column():
    """The tuner's labels are shown whole (a fixed label width for the longest name) with the
    field's docstring as tooltip, and its table scrolls in a box of bounded height; the
    inspector puts the advantages before the components and scrolls sideways."""
    from labkit.docs.reference import field_docs

    tuner = RewardTuner(trap_batch())
    docs = field_docs(ReshapeConfig)
    for name, control in tuner.controls.items():
        assert control.style.description_width == "120px" and control.tooltip == docs[name]
    boxes = [c for c in tuner.children if isinstance(c, ipywidgets.Box) and tuner._table in c.children]
    assert boxes and boxes[0].layout.max_height == "340px"
    insp = AdvantageInspector([r for r in trap_batch() if r["task_id"] == trap_batch()[0]["task_id"]])
    cols = list(insp.frame.columns)
    assert cols.index("A grpo") < cols.index("r_test")
    assert any(insp._table in c.children for c in insp.children if isinstance(c, ipywidgets.Box))
