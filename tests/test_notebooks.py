"""The notebook sequence: clean in git, and every notebook runs with its smoke budget.

Two kinds of tests:

* the strip-outputs guard (fast): every ``notebooks/NN_*.ipynb`` in git has no outputs and
  no execution counts, its first code cell is tagged ``parameters`` with ``smoke = False``
  and ``out_dir``, the kernel is the standard ``python3``, and no code names an absolute
  path or a URL; ``python -m labkit.lab`` helpers (``record``, ``notebooks``, the report)
  on hand-made inputs;
* one smoke run per notebook (slow): papermill executes it with ``smoke=True`` (``--cwd
  notebooks``, kernel ``python3``) and the test checks the numbers it recorded in
  ``<out_dir>/<name>.json`` against what must hold (identities, bounds, counts), not only
  that it ran.

Strip outputs after working on a notebook: ``python -c "from labkit.lab import clear_outputs;
clear_outputs()"``.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

from labkit import lab

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = ["00_tour", "01_tasks_and_sandbox", "02_reward_reshaping", "03_counterfactual_forking",
            "04_anchor_grouping", "05_training", "06_mucode", "07_bring_your_own_model",
            "08_scale_out"]
PATHS = [ROOT / "notebooks" / f"{n}.ipynb" for n in EXPECTED]
ABSOLUTE = re.compile(r"""(["'])(/(home|root|work|tmp|Users|usr|opt|mnt|data)/|~/|[A-Za-z]:\\)""")


def test_the_sequence_is_complete():
    assert [p.stem for p in lab.notebooks()] == EXPECTED


# ----------------------------------------------------------------------------- the guard


@pytest.mark.parametrize("path", PATHS, ids=EXPECTED)
def test_notebook_is_clean_in_git(path):
    raw = path.read_text()
    nb = nbformat.reads(raw, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"] == lab.KERNELSPEC, f"{path.name}: strip it (labkit.lab.clear_outputs)"
    assert nb.metadata.get("language_info", {"name": "python"}) == {"name": "python"}
    assert "papermill" not in nb.metadata and "widgets" not in nb.metadata, \
        f"{path.name}: run metadata left in; strip it (labkit.lab.clear_outputs)"
    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        assert c.outputs == [] and c.execution_count is None, \
            f"{path.name}: outputs or execution counts in git; strip them " \
            "(labkit.lab.clear_outputs)"
        assert not {"papermill", "execution", "collapsed", "scrolled"} & set(c.metadata)
    first = code[0]
    assert "parameters" in first.metadata.get("tags", []), f"{path.name}: first code cell untagged"
    assert re.search(r"(?m)^smoke = False\b", first.source), "no `smoke = False` parameter"
    assert re.search(r"(?m)^out_dir = ", first.source), "no `out_dir` parameter"
    for c in code:
        m = ABSOLUTE.search(c.source)
        assert not m, f"{path.name}: absolute path in code: {c.source[m.start():m.start() + 40]!r}"
        assert "http://" not in c.source and "https://" not in c.source, \
            f"{path.name}: a URL in code"
    # the smoke branch comes right after the parameters (derived values in the next cell)
    assert code[1].source.startswith("if smoke:"), \
        f"{path.name}: the second code cell is not `if smoke:`"
    call = f'record(out_dir, "{path.stem}", '
    assert call in "".join(c.source for c in code), \
        f"{path.name}: does not record its numbers under its own name"


def test_absolute_path_pattern_has_power():
    assert ABSOLUTE.search('load_policy("/home/me/model")')
    assert ABSOLUTE.search("open('/tmp/x')")
    assert not ABSOLUTE.search('out_dir = "../runs/notebooks"')


# ----------------------------------------------------------------------------- lab helpers


def test_record_rounds_and_refuses_nan(tmp_path):
    got = lab.record(tmp_path, "x", {"a": 1 / 3, "b": [1, 2.5], "c": None, "d": True,
                                     "e": {"f": 2}})
    assert got == {"a": 0.333333, "b": [1, 2.5], "c": None, "d": True, "e": {"f": 2}}
    assert json.loads((tmp_path / "x.json").read_text()) == got
    with pytest.raises(ValueError, match="non-finite"):
        lab.record(tmp_path, "y", {"a": math.nan})


def test_lab_jobs_are_checked(tmp_path):
    """Notebooks run at once have no times of their own, so they are never recorded."""
    with pytest.raises(lab.LabError, match="jobs must be >= 1"):
        lab.run_lab(tmp_path, jobs=0)
    with pytest.raises(lab.LabError, match="one at a time"):
        lab.run_lab(tmp_path, jobs=2, record_to=tmp_path / "lab.jsonl")
    assert not (tmp_path / "lab.jsonl").exists()


def test_notebook_selection():
    assert [p.stem for p in lab.notebooks(["00", "05_training"])] == ["00_tour", "05_training"]
    with pytest.raises(lab.LabError, match="no notebook"):
        lab.notebooks(["42"])


def test_report_is_static_with_plotly_inline_once(tmp_path):
    import plotly.graph_objects as go
    import plotly.io as pio

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a title"), nbformat.v4.new_code_cell("fig")]
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="curve-xyz"))
    nb.cells[1].outputs = [
        nbformat.v4.new_output("display_data", data={lab.PLOTLY_MIME: json.loads(pio.to_json(fig)),
                                                     "text/plain": "Figure"}),
        nbformat.v4.new_output("display_data", data={lab.WIDGET_MIME: {"model_id": "m"},
                                                     "text/plain": "DiffView(...)"}),
        nbformat.v4.new_output("display_data", data={
            "text/html": "<script src='https://cdn.plot.ly/plotly.min.js'></script>plotly"})]
    nbformat.write(nb, tmp_path / "00_x.ipynb")
    page = lab.write_report(tmp_path, [{"notebook": "00_x", "status": "ok", "seconds": 1.0,
                                        "numbers": {"k": 1}}]).read_text()
    assert "curve-xyz" in page and "a title" in page and "href='00_x.json'" in page
    assert "open the notebook in JupyterLab" in page
    assert not re.search(r"<script[^>]+src=[\"']?http", page)
    assert "plotly.min.js'></script>" not in page  # a renderer's loader output is dropped
    assert page.count("window.Plotly") >= 1  # plotly.js inline
    assert page.count("<script type='text/javascript'>") == 1  # ... once


def test_report_front_page_says_what_was_found_and_draws_tagged_figures_and_widgets(tmp_path):
    """The front page: a sentence per notebook written from its numbers, the plotly outputs
    of ``front-page`` cells, a key-numbers table, contents linking each notebook's
    sections; a widget's static rendering replaces its text form."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from labkit.docs.report import findings

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Training three ways"),
                nbformat.v4.new_code_cell("fig"), nbformat.v4.new_code_cell("dash")]
    nb.cells[1].metadata["tags"] = ["front-page"]
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="front-curve"))
    nb.cells[1].outputs = [nbformat.v4.new_output(
        "display_data", data={lab.PLOTLY_MIME: json.loads(pio.to_json(fig)), "text/plain": "Figure"})]
    nb.cells[2].outputs = [nbformat.v4.new_output("display_data", data={
        lab.WIDGET_MIME: {"model_id": "m"}, "text/plain": "TrainingDashboard(children=(...",
        "text/html": "<div class='labkit-static'><div class='plotly-graph-div'>static</div></div>"})]
    nbformat.write(nb, tmp_path / "05_training.ipynb")
    numbers = {"methods": ["grpo", "didpo"], "steps": {"grpo": 12, "didpo": 12},
               "r_test_first": {"grpo": 0.41, "didpo": 0.40}, "r_test_last": {"grpo": 0.63, "didpo": 0.6},
               "eval_pass_at_1": {"grpo": [0.31, 0.33], "didpo": [0.3]}}
    assert findings("05_training", numbers) == [
        "grpo: training test reward 0.41 -> 0.63 in 12 steps; held-out pass@1 0.31 -> 0.33.",
        "didpo: training test reward 0.40 -> 0.60 in 12 steps."]
    assert "lack what the summary reads" in findings("05_training", {"methods": ["x"]})[0]
    page = lab.write_report(tmp_path, [{"notebook": "05_training", "status": "ok", "seconds": 3.0,
                                        "numbers": numbers}]).read_text()
    front = page[:page.index("<section class='nb'")]
    assert "What this lab found" in front and "0.41 -&gt; 0.63" in front
    # the page opens on the findings: the plain sentence first, the contents folded last
    assert front.index("What this lab found") < front.index("<dt>") < front.index("<details")
    assert "<p class='plain'>Three ways to train on the same few tasks" in front
    assert "the share of tests passed went grpo up, didpo up" in front
    assert "front-curve" in front  # the tagged cell's figure is on the front page
    assert "<a href='#Training-three-ways'>Training three ways</a>" in front  # contents
    assert front.index("front-curve") < front.index("<details class='toc'>")
    assert "TrainingDashboard(children" not in page and "labkit-static" in page
    # the committed multi-seed results: the README's findings rows, sentence for sentence,
    # each after its plain-words sentence
    from labkit.docs.findings import plain_rows, rows

    assert rows(), "docs/results holds no experiment record"
    for simple, (said, seen, name) in zip(plain_rows(), rows()):
        assert f"<li><p class='plain'>{html.escape(simple)}</p>{html.escape(said)} <em>Could this " \
               f"testbed see it? {html.escape(seen)}.</em> <code>docs/results/{name}</code>" in front, said


def test_clear_outputs_strips(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1")
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "1"},
                                           execution_count=1)]
    cell.execution_count = 1
    cell.metadata["papermill"] = {"duration": 1}
    cell.metadata.update(collapsed=True, jupyter={"outputs_hidden": True})  # view state
    recorded = nbformat.v4.new_code_cell("summary = record(...)")
    recorded.metadata["tags"] = ["record"]  # running it in JupyterLab dropped outputs_hidden
    nb.cells = [cell, recorded]
    nb.metadata["papermill"] = {}
    # what JupyterLab writes from the running kernel
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7", "mimetype": "text/x-python"}
    p = tmp_path / "n.ipynb"
    nbformat.write(nb, p)
    assert lab.clear_outputs([p]) == [p]
    back = nbformat.read(p, as_version=4)
    assert back.cells[0].outputs == [] and back.cells[0].execution_count is None
    assert "papermill" not in back.metadata and "papermill" not in back.cells[0].metadata
    assert back.metadata["kernelspec"] == lab.KERNELSPEC and back.metadata["language_info"] == {"name": "python"}
    assert back.cells[0].metadata == {}  # view state goes
    assert back.cells[1].metadata == {"tags": ["record"], "jupyter": {"outputs_hidden": True}}
    assert lab.clear_outputs([p]) == []


# ----------------------------------------------------------------------------- smoke runs


def _between(x, lo, hi):
    return x is not None and lo - 1e-9 <= x <= hi + 1e-9


def check_00(n):
    assert n["rollouts"] == n["tasks"] * 4 == 8
    assert _between(n["reward_mean"], 0, 1) and _between(n["pass_rate"], 0, 1)
    assert n["max_abs_group_adv_mean"] < 1e-6  # GRPO advantages sum to 0 in every group
    if n["nonzero_std_groups"]:
        assert abs(n["adv_std_in_nonzero_groups"] - 1) < 1e-3  # unit std inside a group
    # The trainer's step samples its own groups: it moves the policy iff one of them has signal
    # (at the first step the policy is the reference, so the KL term has no gradient).
    if n["step_zero_std_frac"] < 1:
        assert n["param_delta"] > 0  # the step moved the policy
    else:
        assert n["param_delta"] == 0  # no signal, no update
    assert n["step_clip_frac"] < 0.05  # on-policy first step: ratio ~ 1
    assert n["step_kl_k3"] is not None and 0 <= n["step_kl_k3"] < 1e-3
    assert n["records"] == 8
    assert n["diffview_tokens"] == n["completion_tokens"] > 0


def check_01(n):
    assert n["operators"] >= 20 and 10 <= n["operators_with_site"] <= n["operators"]
    assert n["mutants"] == n["operators_with_site"]
    assert n["mutants_caught"] >= 0.6 * n["mutants"]
    assert n["reference_status"] == "passed" and n["buggy_status"] != "passed"
    assert n["hacks_rewarded"] == 0  # no hack passes
    assert n["hacks_flagged"] >= n["hacks"] - 1  # all but the plain infinite loop are flagged
    assert n["reference_r_test"] == 1 and n["copy_r_precision"] == 1 and n["copy_noop"] == 1
    assert n["unparsable_r_compile"] == 0 and 0 < n["unused_import_r_style"] < 1
    assert sum(n["splits"].values()) == n["humaneval_tasks"]


def check_02(n):
    assert n["records"] == 24 and n["raw_equals_r_test"] is True  # the full batch, 3 tasks x 8
    if n["trap_minus_default_on_copies"] is not None:
        assert n["trap_minus_default_on_copies"] > 0  # the trap pays copies more
    assert n["norm_used"][0] in ("batch", "skipped") and set(n["norm_used"][1:3]) == {"running"}
    if n["norm_batch_out_std"] is not None:
        assert abs(n["norm_batch_out_std"] - 1) < 1e-3
    assert n["clip_max"] == 2.0
    means = n["regime_mean_reward"]
    from labkit.env.feedback import FEEDBACK_MODES

    assert set(means) == set(FEEDBACK_MODES)
    assert means["binary"] <= means["dense"] + 1e-9 and means["coarse"] <= means["dense"] + 1e-9
    assert n["regime_no_signal_groups"]["binary"] >= n["regime_no_signal_groups"]["dense"]
    acts = n["normalise_acts"]
    assert acts["grpo"] is False and acts["batch_norm"] is False  # affine: undone
    if n["regime_no_signal_groups"]["dense"] < 3:  # some group has signal: Dr. GRPO rescales it
        assert acts["dr_grpo"] is True
    assert n["curriculum_argmax_success"] == 0.5 and abs(n["curriculum_weight_at_0"] - 0.05) < 1e-9
    if n["regime_no_signal_groups"]["dense"] < 3:  # some group is not all ties
        assert n["tau_raw"] == 1.0 and _between(n["tau_default"], -1, 1)
    else:
        assert n["tau_raw"] is None
    assert n["tuner_rows"] == n["records"]
    assert n["short_steps"] == {"raw": 1, "reshaped": 1}
    assert all(_between(v, 0, 1) for v in n["short_pass_at_1_last"].values())


def check_03(n):
    assert n["rollouts"] == 4 and 0 < n["forks"] <= n["rollouts"] * 3
    assert n["positions_per_rollout_max"] <= 3  # the smoke budget
    assert n["forks_differ_frac"] > 0.5
    assert n["recomputed_positions"] == n["forks"]  # one re-encoded position per fork
    assert n["recomputed_fraction"] < 0.1 and n["prefix_positions"] > 10 * n["forks"]
    assert _between(n["dr_abs_max"], 0, 1) and _between(n["dr_nonzero_frac"], 0, 1)
    assert _between(n["fork_token_coverage"], 0, 1)
    assert n["effect_identity_max_err"] < 1e-12
    if n["hunks"]:
        assert _between(n["effect_min"], -1, 1) and _between(n["effect_max"], -1, 1)


def check_04(n):
    assert n["anchors"] >= 2 and n["anchor_view_anchors"] == n["anchors"]
    assert all(abs(s) < 1e-9 for s in n["a_d_group_sums"])  # A_D is centred in its group
    assert n["anchor_gs"] == sorted(n["anchor_gs"], reverse=True)  # greedy by GS
    assert all(k >= 2 for k in n["anchor_n"])  # an anchor is shared
    assert n["gs_formula_err"] < 1e-12
    assert n["didpo_minus_grpo_outside_anchors"] < 1e-9  # outside anchors, A = A_E
    assert 0 < n["didpo_token_coverage"] < 1
    assert n["agreement_hunks"] >= 1 and n["forks"] >= 1
    from labkit.experiments.credit import ESTIMATORS

    assert set(n["spearman"]) == set(ESTIMATORS)  # the estimators and the controls
    assert all(v is None or _between(v, -1, 1) for v in n["spearman"].values())
    assert all(v is None or _between(v, 0, 1) for v in n["sign_agreement"].values())


def check_05(n):
    methods = ["grpo", "reshaped", "didpo"]
    assert n["methods"] == methods and n["stopped_early"] is False
    assert n["steps"] == {m: 1 for m in methods} and n["metric_rows"] == {m: 1 for m in methods}
    assert n["eval_rows"] == {m: 2 for m in methods}  # before and after
    assert all(_between(v, 0, 1) for v in n["train_pass_at_1_last"].values())
    assert all(len(v) == 2 and all(_between(x, 0, 1) for x in v)
               for v in n["eval_pass_at_1"].values())
    assert all(v >= 0 for v in n["kl_k3_last"].values())
    assert n["didpo_anchor_count_mean"] is not None and n["didpo_anchor_count_mean"] >= 0
    assert n["replay_points"] == 1 and n["dashboard_points"] == 1  # the last run: 1 step
    assert n["runs_table_status"] == {m: "finished" for m in methods}  # the RunsTable's rows
    assert n["inspector_rows"] >= 1
    assert n["train_tasks"] == 2 and set(n["r_test_first"]) == set(methods)
    assert all(_between(v, 0, 1) for v in {**n["r_test_first"], **n["r_test_last"]}.values())
    # the methods' records are not identical: same samples at step 1, other credit / reward
    # same samples at step 1, so DiDPO's tokens differ from GRPO's exactly where A_D is not 0
    assert (n["credit_spread_step1"]["didpo vs grpo"] > 0) == (n["didpo_ad_nonzero_step1"] > 0)
    assert n["step1_rewards_differ"]["grpo vs reshaped"] is True


def check_06(n):
    assert n["episodes"] == 4 and 1 <= n["max_turns_seen"] <= 2
    assert n["return_to_go_ok"] is True
    assert n["iterations"] == 1 and 1 <= n["sft_steps"][0] <= 2 and n["evals"] == 0
    assert n["examples"] >= 1 and _between(n["expert_pass_frac"][0], 0, 1)
    assert set(n["verifier"]) == {"bce", "bt"}
    assert sorted(n["bon_selectors"]) == ["oracle", "public_tests", "public_then_verifier", "random",
                                          "verifier"]
    assert all(_between(v, 0, 1) for v in n["bon_pass_final"].values())
    # no selector beats the oracle pick among the same turn-1 candidates
    assert all(v <= n["bon_turn1_pass_at_n"] + 1e-9 for v in n["bon_pass_turn1"].values())


def check_07(n):
    assert n["device"] in ("cpu", "cuda", "cuda:0")
    assert 0 < n["trainable_fraction"] < 0.2 and n["trainable"] < n["parameters"]
    assert set(n["adapted_modules"]) >= {"q_proj", "v_proj"}
    assert n["steps"] == 1
    assert n["base_weight_max_change"] == 0  # LoRA leaves the base weights alone
    if n["steps_with_signal"]:
        assert n["lora_weight_max_change"] > 0
    assert n["multiprocess_world_size"] is None  # not run in smoke


def check_08(n):
    assert n["tasks"] == 2 and n["steps"] == 1
    assert n["grpo_reward_calls"] == 1 and n["rewards_equal"] is True
    assert {"labkit/r_test", "labkit/r_feedback", "labkit/hack"} <= set(n["logged_components"])
    assert len(n["didpo_advantages_shape"]) == 2 and n["credit_equal"] is True


CHECKS = {name: globals()[f"check_{name[:2]}"] for name in EXPECTED}


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_smoke_run_records_sane_numbers(name, smoke_lab):
    row = next(r for r in smoke_lab["notebooks"] if r["notebook"] == name)
    out = Path(smoke_lab["out"])
    assert row["status"] == "ok", f"{name}: {row.get('error')} (see {out / (name + '.ipynb')})"
    numbers = row["numbers"]
    assert numbers is not None, f"{name} wrote no {name}.json"
    assert numbers["smoke"] is True and numbers["seconds"] > 0
    CHECKS[name](numbers)


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_executed_notebook_figures_do_not_mislead(name, smoke_lab):
    """Every plotly figure an executed notebook shows passes :mod:`labkit.docs.figcheck`: axes say
    what they show, no category on a continuous colour scale, no trace hidden under an
    identical one."""
    from labkit.docs.figcheck import notebook_problems

    found = notebook_problems(Path(smoke_lab["out"]) / f"{name}.ipynb")
    assert found == [], "\n".join(f"cell {i}: {p}" for i, p in found)


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_executed_notebook_prints_its_exercises_and_no_known_warning(name, smoke_lab):
    """The line under the exercises shows, in the notebook, the numbers each outcome names as
    this run recorded them; no cell shows a warning of :data:`labkit.lab.KNOWN_WARNINGS`."""
    from labkit.exercises import _brief, of

    nb = nbformat.read(Path(smoke_lab["out"]) / f"{name}.ipynb", as_version=4)
    numbers = json.loads((Path(smoke_lab["out"]) / f"{name}.json").read_text())
    text = lambda c: "".join(o.get("text", "") for o in c.get("outputs", []))  # noqa: E731
    shown = "".join(text(c) for c in nb.cells if c.cell_type == "code" and "readout(" in c.source)
    for ex in of(name):
        read = [k for k in ex.reads() if k in numbers]
        assert read, f"{name}: the exercise names no recorded number"
        for k in read:
            assert f"{k} = {_brief(numbers[k])}" in shown, f"{name}: {k} not shown in\n{shown}"
    warned = [text(c) for c in nb.cells if c.cell_type == "code"
              and any(m in text(c) for _, m in lab.KNOWN_WARNINGS)]
    assert not warned, warned


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_record_cell_is_tagged_hidden_and_shows_nothing(path):
    """The numbers a notebook records are plumbing: one cell, tagged ``record``, its output
    collapsed in JupyterLab, ending on an assignment (nothing displayed), and only it calls
    ``record``."""
    nb = nbformat.read(str(path), as_version=4)
    calls = [c for c in nb.cells if c.cell_type == "code" and "record(out_dir" in c.source]
    assert len(calls) == 1
    cell = calls[0]
    assert lab.RECORD_TAG in cell.metadata.get("tags", [])
    assert cell.metadata.get("jupyter") == {"outputs_hidden": True}
    assert not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", cell.source.strip().splitlines()[-1])


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_every_notebook_teaches_in_the_same_shape(path):
    """Opens with what you will learn, what to know first and minutes to run; a "What to look
    at" reading after every figure; takeaways with a link to the page that answers its
    question at scale (the link resolves, as every link into docs/ does); then its "Try this"
    exercises, a cell printing what they read in this run, and "Check your understanding":
    two or three questions, each answer folded."""
    nb = nbformat.read(str(path), as_version=4)
    intro = nb.cells[1].source
    assert nb.cells[1].cell_type == "markdown" and "**You will learn**" in intro
    assert "**Know first:**" in intro and "**Minutes to run:**" in intro
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "fig.show()" in cell.source:
            after = nb.cells[i + 1]
            assert after.cell_type == "markdown" and after.source.startswith("**What to look at.**"), \
                f"cell {i}: a figure with no reading after it"
    rec = next(i for i, c in enumerate(nb.cells) if "record(out_dir" in c.source)
    take = nb.cells[rec - 1].source
    assert take.startswith("## Takeaways") and "**At scale:**" in take
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for target in re.findall(r"\]\((\.\./[^)#\s]+)", cell.source):
                assert (path.parent / target).resolve().is_file(), f"{path.name}: dead link {target}"
    tail = nb.cells[rec + 1:]
    tries = [c for c in tail if c.source.startswith("**Try this.**")]
    assert tries and all(c.cell_type == "markdown" for c in tries)
    assert tail[len(tries)].cell_type == "code" and \
        f'readout("{path.stem}", summary, globals())' in tail[len(tries)].source
    questions = tail[-1]
    assert len(tail) == len(tries) + 2 and questions.cell_type == "markdown"
    assert questions.source.startswith("## Check your understanding")
    asked = re.findall(r"(?m)^\*\*\d\. .+\?\*\*$", questions.source)
    folded = re.findall(r"<details><summary>Answer</summary>\n\n.+?\n\n</details>",
                        questions.source, re.S)
    assert 2 <= len(asked) == len(folded) <= 3, f"{path.name}: {len(asked)} questions, {len(folded)} answers"


def test_notebooks_show_their_exercises_as_registered():
    """Each "Try this" cell is an exercise of :mod:`labkit.exercises`, word for word, and each
    registered exercise appears in its notebook."""
    from labkit.exercises import EXERCISES

    shown = {(p.stem, c.source) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")
             for c in nbformat.read(str(p), as_version=4).cells if c.source.startswith("**Try this.**")}
    assert shown == {(e.notebook, e.markdown()) for e in EXERCISES}


@pytest.mark.slow
@pytest.mark.xdist_group("smoke-lab")  # it takes the smoke lab by name: on its worker (conftest.py)
@pytest.mark.parametrize("index", range(len(__import__("labkit.exercises").exercises.EXERCISES)))
def test_every_exercise_does_what_it_promises(index, tmp_path, request):
    """Run the notebook at the exercise's parameters and compare with a run at the defaults
    (the suite's smoke run for a smoke exercise, else a run at the same short budget): the
    promised outcome holds after the change and not before it."""
    from labkit.exercises import EXERCISES

    ex = EXERCISES[index]
    path = ROOT / "notebooks" / f"{ex.notebook}.ipynb"
    if ex.smoke:
        smoke_lab = request.getfixturevalue("smoke_lab")
        base = next(r for r in smoke_lab["notebooks"] if r["notebook"] == ex.notebook)
    else:
        base = lab.run_notebook(path, tmp_path / "base", parameters=dict(ex.budget))
    tried = lab.run_notebook(path, tmp_path / "try", smoke=ex.smoke,
                             parameters={**ex.budget, **ex.parameters})
    assert base["status"] == "ok" and tried["status"] == "ok", (base.get("error"), tried.get("error"))
    assert ex.not_before(base["numbers"]), f"the outcome already holds before the change: {base['numbers']}"
    assert ex.check(tried["numbers"], base["numbers"]), f"{ex.markdown()}\ngot {tried['numbers']}"


def test_a_smoke_exercise_takes_no_budget():
    from labkit.exercises import Exercise

    with pytest.raises(ValueError, match="smoke budget"):
        Exercise("00_tour", {"seed": 1}, "", lambda n, b: True, lambda b: True,
                 budget={"n_tasks": 2}, smoke=True)


def test_saving_a_tracked_notebook_in_jupyter_strips_it(tmp_path):
    """``make jupyter`` saves notebooks/NN_*.ipynb without outputs (the pre-save hook), whatever
    folder the server serves (the hook's path is relative to it); other notebooks keep theirs.
    The Makefile starts JupyterLab with the hook's config. (``tests/test_browser.py`` saves
    through a real server started as ``make jupyter`` starts it.)"""
    from types import SimpleNamespace

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("1 + 1", execution_count=3)
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=3)]
    nb.cells = [cell]

    def saved(path, root=None):
        model = {"type": "notebook", "content": json.loads(nbformat.writes(nb))}
        manager = None if root is None else SimpleNamespace(root_dir=str(root))
        lab.pre_save_hook(model, path=path, contents_manager=manager)
        return bool(model["content"]["cells"][0]["outputs"])

    repo = tmp_path / "repo"
    assert not saved("notebooks/00_tour.ipynb")
    assert not saved("notebooks/00_tour.ipynb", root=repo)  # served: the repository
    assert not saved("05_training.ipynb", root=repo / "notebooks")  # served: notebooks/
    assert not saved("repo/notebooks/05_training.ipynb", root=tmp_path)  # a folder above
    assert saved("scratch/Untitled.ipynb", root=repo)
    assert saved("Untitled.ipynb", root=repo / "notebooks")  # not a numbered notebook
    assert saved("05_training.ipynb", root=repo / "runs")  # a copy outside notebooks/
    assert "--config=.jupyter/jupyter_server_config.py" in (ROOT / "Makefile").read_text()
    assert "lab_contents_manager()" in (ROOT / ".jupyter" / "jupyter_server_config.py").read_text()
    manager = lab.lab_contents_manager()(root_dir=str(tmp_path))
    assert lab.pre_save_hook in manager._pre_save_hooks


def test_known_third_party_warnings_are_quiet_in_the_lab_kernels(monkeypatch):
    """``make lab`` and ``make jupyter`` start kernels with ``PYTHONWARNINGS`` ignoring
    :data:`labkit.lab.KNOWN_WARNINGS` (and only those)."""
    import subprocess
    import sys

    monkeypatch.setenv("PYTHONWARNINGS", "default")
    value = lab.quiet_kernels()
    assert lab.quiet_kernels() == value and value.startswith("default,ignore:")
    code = ("import warnings\n"
            "warnings.warn('`is_gradient_checkpointing` is deprecated and will go', FutureWarning)\n"
            "warnings.warn('`gradient_checkpointing` is deprecated and will go', FutureWarning)\n"
            "warnings.warn('another deprecation', FutureWarning)\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    assert "another deprecation" in err and "is deprecated" not in err, err
    assert "quiet_kernels()" in (ROOT / ".jupyter" / "jupyter_server_config.py").read_text()
