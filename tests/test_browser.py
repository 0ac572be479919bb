"""Real-browser tests: JupyterLab started as ``make jupyter`` starts it (serving a git copy of
the repository), Debian's Chromium driven by Playwright.

``make jupyter`` itself: the tracked tour, edited, run and autosaved, leaves git clean and
shows a DiffView; the start page lists the notebooks and each notebook's docs link opens;
notebook 05 interrupted with the toolbar's button stops with one line. The widgets: moving a
RewardTuner slider changes the advantages shown; the TrainingDashboard receives points while
a trainer runs in a thread and its Stop button stops it; selecting an anchor in AnchorView
outlines its spans in every member; a dashboard replays the shipped model's training; the
lab's report.html opens from disk on its findings, with its front-page figures and the
widgets' static renderings drawn.

The numbered notebooks (``notebooks/*.ipynb``) are opened when they exist and use the
widget, with ``smoke = True`` set in a copy of their ``parameters`` cell; otherwise (and
for the dashboard's stop interaction, which needs training in a thread) a small notebook
written here with nbformat drives the real widgets on a tiny random model and toy tasks.

Screenshots go to each test's output folder and, when ``LABKIT_SCREENSHOTS=DIR`` is set,
to DIR too (``docs/screenshots`` is made that way). Needs ``/usr/bin/chromium``:
``.ci/run`` installs it; a missing browser fails, it is never skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from browser_support import (CHROMIUM, CHROMIUM_ARGS, NO_CHROMIUM, ROOT, LabServer, NotebookPage,
                             real_notebook, repo_copy, shot_folders, smoke_copy, write_notebook)
from conftest import toy_tasks

pytestmark = pytest.mark.browser

DASH_STEPS = 400  # far more than the test waits for: only Stop ends the run


# ----------------------------------------------------------------------------- data


def _tuner_batch() -> list[dict]:
    """One stored step: a group where copying the buggy code beats the fix unless precision
    is gated (the RewardTuner's copying trap), and a second group."""
    buggy = "def inc(x):\n    return x - 1\n"
    base = {"r_test": 0.8, "r_pass": 0.0, "r_compile": 1.0, "r_precision": 1.0,
            "r_style": 1.0, "r_progress": 0.0, "hack": 0.0, "noop": 1.0}
    comps = [base, dict(base, r_test=1.0, r_pass=1.0, r_precision=0.4, noop=0.0),
             dict(base, r_test=0.5, r_precision=0.9, noop=0.0),
             dict(base, r_test=0.0, r_compile=0.0, r_precision=0.2, noop=0.0)]
    codes = [buggy, "def inc(x):\n    return x + 1\n", "def inc(x):\n    return x\n",
             "def inc(x):\n    return x +\n"]
    out = []
    for task in ("toy/inc/bug0", "toy/dbl/bug0"):
        for i, (c, code) in enumerate(zip(comps, codes)):
            offsets = [[m.start(), m.end()] for m in re.finditer(r"\S+\s*", code)]
            out.append({"step": 1, "task_id": task, "sample": i, "buggy_code": buggy,
                        "completion": code, "code": code, "code_start": 0, "offsets": offsets,
                        "completion_ids": list(range(len(offsets))),
                        "logprobs": [-0.5] * len(offsets), "components": c,
                        "reward": c["r_test"], "advantages": [0.0] * len(offsets),
                        "status": "passed" if c["r_pass"] else "failed", "flags": []})
    return out


def _train_config(run_dir: str, model: Path, tasks: Path, steps: int, group: int,
                  tokens: int) -> str:
    return (f'cfg = from_dict(TrainConfig, {{"run_dir": {run_dir!r}, "seed": 0, '
            f'"steps": {steps}, "tasks_per_step": 1, '
            f'"policy": {{"spec": {str(model)!r}, "reference": "none"}}, '
            f'"sampling": {{"group_size": {group}, "max_new_tokens": {tokens}}}, '
            f'"tasks": {{"source": "records", "path": {str(tasks)!r}, "eval_tasks": 0}}, '
            f'"loss": {{"kl_coef": 0.0}}, "eval_every": 0, "checkpoint_every": 100000, '
            f'"log_rollouts": -1}})')


IMPORTS = ("from labkit.config import from_dict\n"
           "from labkit.loops.trainer import Trainer, TrainConfig")


def _write_generated(root: Path, model: Path, tasks: Path) -> None:
    """The notebooks written here (used when the numbered ones are missing or do not cover
    an interaction)."""
    run = root / "run_tuner"
    run.mkdir(exist_ok=True)
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _tuner_batch()))
    (run / "config.json").write_text(json.dumps({"reshape": {
        "w_test": 1.0, "w_precision": 0.5, "w_style": 0.0, "w_progress": 0.0, "w_hack": 0.0,
        "gate_precision": "none", "adv_clip": 0.0}}))
    write_notebook(root / "gen_tuner.ipynb", [
        "from widgets import RewardTuner\ntuner = RewardTuner.from_run('run_tuner')\ntuner",
    ])
    # As notebooks/05_training does: show the dashboard, then build and train the trainer
    # in a thread (the cell returns, so the kernel reads the Stop click).
    write_notebook(root / "gen_dashboard.ipynb", [
        IMPORTS + "\nimport threading\nimport ipywidgets as W\nfrom IPython.display import "
        "display\nfrom widgets import TrainingDashboard",
        _train_config("run_dash", model, tasks, steps=DASH_STEPS, group=2, tokens=12),
        "dash = TrainingDashboard(height=600)\n"
        "done = W.HTML('training...')\n"
        "done.add_class('labkit-test-done')\n"
        "display(dash, done)\n"
        "def run():\n"
        "    trainer = Trainer(cfg)\n"
        "    dash.attach(trainer, 'grpo')\n"
        "    rows = trainer.train(progress=False)\n"
        "    done.value = (f'training stopped: {len(rows)} steps, at step {trainer.step}, '\n"
        "                  f'stop requested {dash.stop_requested}')\n"
        "    trainer.close()\n"
        "threading.Thread(target=run, daemon=True).start()",
    ])
    write_notebook(root / "gen_inspector.ipynb", [
        "from widgets import AdvantageInspector\nAdvantageInspector.from_run('run_tuner')",
    ])
    write_notebook(root / "gen_anchors.ipynb", [
        "from labkit.credit.anchors import synthetic_group, task_anchors\n"
        "from widgets import AnchorView",
        "buggy, rollouts, rewards = synthetic_group(G=8, seed=0)\n"
        "anchors = task_anchors(rollouts, rewards, buggy)\n"
        "AnchorView.from_task(anchors, rollouts, rewards, buggy, "
        "caption='a synthetic group of 8 repairs')",
    ])


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def lab(tmp_path_factory, random_model_dir):
    """JupyterLab started as ``make jupyter`` starts it, serving a git copy of the repository;
    the test notebooks are written to its ``runs/browser`` (session-wide)."""
    if not CHROMIUM.exists():
        pytest.fail(NO_CHROMIUM, pytrace=False)
    base = tmp_path_factory.mktemp("lab")
    server = LabServer(repo_copy(base / "repo"), base / "state")
    tasks = server.work / "toy_tasks.jsonl"
    tasks.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in toy_tasks()))
    _write_generated(server.work, Path(random_model_dir), tasks)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@contextmanager
def _notebook_page(browser, lab: LabServer, tmp_path: Path, width: int = 1500, height: int = 1800):
    """A page of the lab in a ``width`` x ``height`` viewport; afterwards every kernel is shut
    down and uncaught page errors fail the test."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(60_000)
    nb = NotebookPage(page, lab, shot_folders(tmp_path))
    try:
        yield nb
    finally:
        context.close()
        _shutdown_kernels(lab)
    assert not nb.errors, f"uncaught page errors: {nb.errors}"


@pytest.fixture
def notebook(browser, lab, tmp_path):
    """A page of the lab (:func:`_notebook_page`, a tall viewport)."""
    with _notebook_page(browser, lab, tmp_path) as nb:
        yield nb


def _shutdown_kernels(lab: LabServer) -> None:
    with urllib.request.urlopen(f"{lab.url}/api/kernels", timeout=10) as r:
        kernels = json.load(r)
    for k in kernels:
        req = urllib.request.Request(f"{lab.url}/api/kernels/{k['id']}", method="DELETE")
        urllib.request.urlopen(req, timeout=30).close()


def _open(nb: NotebookPage, name: str, uses: str, generated: str, whole: bool = False) -> str:
    """Open ``notebooks/<name>`` (a smoke copy; unless ``whole``, cut after the first cell
    that uses the widget ``uses``) when it exists and uses that widget, else the generated
    notebook; returns the file opened."""
    real = real_notebook(name, uses)
    target = generated
    if real is not None:
        target = f"{name}.ipynb"
        smoke_copy(real, nb.server.work / target, until=None if whole else uses)
    nb.open(target)
    print(f"browser test opened {target}")
    return target


POINTS_JS = """() => {
    const p = document.querySelector('.labkit-dashboard .js-plotly-plot');
    return p && p.data && p.data[0] && p.data[0].x ? p.data[0].x.length : -1; }"""
"""Points of the dashboard's first curve (``reward/mean``): one per step received."""


def _plot_points(page) -> int:
    return page.evaluate(POINTS_JS)


def _column(page, table: str, name: str) -> list[str]:
    """The cells of column ``name`` of the first HTML table matching ``table``."""
    return page.evaluate("""([sel, name]) => {
        const t = document.querySelector(sel);
        const heads = [...t.querySelectorAll('thead th')].map(h => h.textContent.trim());
        const k = heads.indexOf(name);
        return [...t.querySelectorAll('tbody tr')].map(r => r.children[k].textContent.trim());
    }""", [table, name])


# ----------------------------------------------------------------------------- tests


def test_reward_tuner_slider_changes_advantages(notebook):
    _open(notebook, "02_reward_reshaping", "RewardTuner", "gen_tuner.ipynb")
    notebook.run_all()
    page = notebook.page
    table = ".labkit-tuner .labkit-tuner-table"
    page.locator(table).first.wait_for()
    before = _column(page, table, "A")
    slider = page.locator(".labkit-tuner .widget-hslider").filter(has_text="w_precision").first
    readout = slider.locator(".widget-readout")
    start = readout.text_content()
    handle = slider.locator(".noUi-handle")
    handle.focus()
    for _ in range(6):
        handle.press("ArrowRight")
    page.wait_for_function(
        """([sel, before]) => {
            const t = document.querySelector(sel);
            const heads = [...t.querySelectorAll('thead th')].map(h => h.textContent.trim());
            const k = heads.indexOf('A');
            const now = [...t.querySelectorAll('tbody tr')]
                .map(r => r.children[k].textContent.trim());
            return JSON.stringify(now) !== JSON.stringify(before); }""",
        arg=[table, before], timeout=60_000)
    after = _column(page, table, "A")
    assert readout.text_content() != start, "the w_precision slider did not move"
    assert after != before and len(after) == len(before)
    assert page.locator(".labkit-tuner .jp-OutputArea-output").filter(
        has_text="Traceback").count() == 0
    notebook.screenshot(".labkit-tuner", "reward_tuner.png")


def test_dashboard_follows_training_and_stop_stops_it(notebook):
    notebook.open("gen_dashboard.ipynb")  # training in a thread: no numbered notebook does it
    notebook.run_all()
    page = notebook.page
    page.wait_for_function(f"() => ({POINTS_JS})() >= 2", timeout=120_000)
    seen = _plot_points(page)
    assert seen >= 2
    status = page.locator(".labkit-dashboard .labkit-status").text_content()
    assert status.startswith("grpo: "), f"the status line does not name the run: {status!r}"
    page.locator(".labkit-dashboard .labkit-stop").click()
    done = page.locator(".labkit-test-done")
    page.wait_for_function(
        "() => document.querySelector('.labkit-test-done').textContent.includes('stopped')",
        timeout=120_000)
    text = done.text_content()
    m = re.search(r"at step (\d+), stop requested True", text)
    assert m, f"the trainer did not report a requested stop: {text!r}"
    stopped_at = int(m.group(1))
    assert seen <= stopped_at < DASH_STEPS
    page.wait_for_function(f"() => ({POINTS_JS})() === {stopped_at}", timeout=30_000)
    time.sleep(3)  # no step after the stop
    assert _plot_points(page) == stopped_at
    notebook.screenshot(".labkit-dashboard", "training_dashboard_stopped.png")


def test_inspector_columns_can_be_seen_at_1280x800(browser, lab, tmp_path):
    """On a 1280x800 screen the AdvantageInspector's advantage columns sit in view or in a
    box that scrolls them into view, never cut off by the page."""
    with _notebook_page(browser, lab, tmp_path, 1280, 800) as nb:
        page = nb.page
        nb.open("gen_inspector.ipynb")
        nb.run_all()
        page.locator(".labkit-inspector-table table").first.wait_for()
        cols = page.evaluate("""() => {
            const box = document.querySelector('.labkit-inspector-table');
            const t = box.querySelector('table');
            const out = [];
            for (const th of t.querySelectorAll('thead th')) {
                th.scrollIntoView({block: 'nearest', inline: 'nearest'});
                const r = th.getBoundingClientRect(), b = box.getBoundingClientRect();
                out.push({name: th.textContent.trim(), left: r.left, right: r.right,
                          box_left: b.left, box_right: b.right, page: window.innerWidth});
            }
            box.scrollLeft = 0;
            return out; }""")
        names = [c["name"] for c in cols]
        assert "advantage" in names and any(n.startswith("A ") for n in names), names
        hidden = [c for c in cols if c["right"] > min(c["box_right"], c["page"]) + 1
                  or c["left"] < max(c["box_left"], 0) - 1]
        assert not hidden, f"columns that cannot be brought into view: {hidden}"
        nb.screenshot(".labkit-inspector", "advantage_inspector.png")


def test_anchorview_selecting_an_anchor_outlines_its_spans(notebook):
    from labkit.credit.anchors import synthetic_group, task_anchors

    opened = _open(notebook, "04_anchor_grouping", "AnchorView", "gen_anchors.ipynb")
    notebook.run_all()
    page = notebook.page
    view = page.locator(".labkit-anchorview").first
    view.wait_for()
    options = view.locator(".labkit-anchor-picker select option")
    assert options.count() >= 2, "need two anchors to switch between"
    if opened == "gen_anchors.ipynb":
        buggy, rollouts, rewards = synthetic_group(G=8, seed=0)  # what the notebook shows
        expected = task_anchors(rollouts, rewards, buggy)
    else:
        expected = None

    def outlined() -> list[str]:
        return view.locator(".labkit-anchor-member").evaluate_all(
            "views => views.map(v => [...v.querySelectorAll('.labkit-outline')]"
            ".map(e => e.textContent).join(''))")

    first = outlined()
    assert first and all(first), "anchor 0's members show no outlined span"
    view.locator(".labkit-anchor-picker select").select_option(index=1)
    # The members' views update one by one (each is its own widget model, and a view's
    # tokens and outlines arrive as separate trait updates), so a read can fall between
    # them. Wait until every member's outlines carry anchor 1's label (anchor 0's do not)
    # and the members' text has stayed the same for five polls in a row.
    page.wait_for_function(
        """() => { const v = document.querySelector('.labkit-anchorview');
            const members = [...v.querySelectorAll('.labkit-anchor-member')];
            const now = JSON.stringify(members.map(m =>
                [...m.querySelectorAll('.labkit-outline')].map(e => e.textContent).join('')));
            const ready = members.length > 0 && members.every(m => {
                const boxes = [...m.querySelectorAll('.labkit-outline')];
                return boxes.length > 0 && boxes.every(e => e.textContent &&
                    (e.getAttribute('title') || '').includes('anchor 1 \u00b7')); });
            const w = window.__labkitAnchorWait = window.__labkitAnchorWait || {last: '', n: 0};
            if (ready && now === w.last) { w.n += 1; } else { w.last = now; w.n = ready ? 1 : 0; }
            return w.n >= 5; }""", polling=100, timeout=30_000)
    second = outlined()
    assert second and all(second) and second != first
    titles = view.locator(".labkit-anchor-member .labkit-outline").first.get_attribute("title")
    assert "anchor 1" in titles
    if expected is not None:
        a = expected[1]
        assert second == ["".join(rollouts[m.rollout].completion[s:e] for s, e in m.spans)
                          for m in a.members]
    notebook.screenshot(".labkit-anchorview", "anchor_view.png")


def test_report_opens_from_disk_with_front_page_figures_and_static_widgets(browser, smoke_lab,
                                                                         tmp_path):
    """``make lab``'s report.html (the smoke lab of this session) in Chromium, from disk, no
    server: its first screen (1280x800) shows "What this lab found" with the findings in plain
    words, the contents are folded below; the front page's figures are drawn, every widget
    shows its static rendering (plotly divs with data, no widget text repr left), and nothing
    is fetched from a network. Saves the first screen as ``report_first_screen.png``."""
    report = Path(smoke_lab["report"])
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(report.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length > 0")
    counts = page.evaluate("""() => {
        const drawn = sel => [...document.querySelectorAll(sel)]
            .filter(p => p.data && p.data.length > 0 && p.querySelector('.main-svg')).length;
        const seen = e => e && e.getBoundingClientRect().bottom <= window.innerHeight;
        const heading = [...document.querySelectorAll('h2')]
            .find(h => h.textContent === 'What this lab found');
        const plain = [...document.querySelectorAll('.front dd .plain')];
        return {front: drawn('.front-figure .js-plotly-plot'),
                widgets: drawn('.labkit-static .js-plotly-plot'),
                statics: document.querySelectorAll('.labkit-static').length,
                findings: document.querySelectorAll('.front dd').length,
                plain: plain.length,
                first_screen: seen(heading) && plain.slice(0, 3).every(seen),
                folded: document.querySelectorAll('details.toc:not([open])').length,
                toc: document.querySelectorAll('nav.toc a').length,
                text: document.body.innerText}; }""")
    text = counts.pop("text")
    print(f"report: {report.stat().st_size / 1e6:.1f} MB, {counts}")
    assert counts["first_screen"], "the first screen does not show the findings"
    assert counts["findings"] == counts["plain"] == len(smoke_lab["notebooks"])
    assert counts["folded"] == 1 and counts["toc"] > 2 * len(smoke_lab["notebooks"])
    assert counts["front"] >= 5  # 01, 02, 04, 05 (two), 06 tag their story's figures
    assert counts["statics"] >= 5 and counts["widgets"] >= 3  # dashboard, inspector, tuner ...
    for repr_text in ("TrainingDashboard(children", "DiffView(children", "RewardTuner(children",
                      "AdvantageInspector(children", "AnchorView(children"):
        assert repr_text not in text
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests
    assert not errors, errors
    for folder in shot_folders(tmp_path):
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / "report_first_screen.png"))
    context.close()


def test_dashboard_replays_the_shipped_model_training(notebook):
    """The README's dashboard picture: the shipped tiny model trained for a few steps on
    synthetic tasks (KL to its reference, evaluations, the per-token strip), replayed."""
    notebook.server.work.joinpath("gen_replay.ipynb").unlink(missing_ok=True)
    write_notebook(notebook.server.work / "gen_replay.ipynb", [
        IMPORTS + "\nfrom widgets import TrainingDashboard",
        'cfg = from_dict(TrainConfig, {"run_dir": "run_replay", "seed": 0, "steps": 6, '
        '"tasks_per_step": 4, "policy": {"spec": "tiny", "reference": "auto"}, '
        '"sampling": {"group_size": 4, "max_new_tokens": 160}, '
        '"tasks": {"train_split": "val", "train_problems": 24, "eval_split": "test", '
        '"eval_tasks": 8, "seed": 0}, "optim": {"lr": 5e-5}, "loss": {"kl_coef": 0.01}, '
        '"eval_every": 3, "checkpoint_every": 100, "log_rollouts": -1})\n'
        "trainer = Trainer(cfg, overwrite=True)\nrows = trainer.train(progress=False)\n"
        "trainer.close()",
        "dash = TrainingDashboard.replay('run_replay', height=700)\ndash",
    ])
    notebook.open("gen_replay.ipynb")
    notebook.run_all()
    page = notebook.page
    page.wait_for_function(f"() => ({POINTS_JS})() === 6", timeout=300_000)
    kl = page.evaluate("""() => {
        const p = document.querySelector('.labkit-dashboard .js-plotly-plot');
        const t = p.data.find(d => d.name === 'kl/k3');
        return t ? t.y.filter(v => v !== null).length : -1; }""")
    assert kl == 6  # the KL panel is filled
    strip = page.evaluate("""() => {
        const p = document.querySelectorAll('.labkit-dashboard .js-plotly-plot')[1];
        return p && p.data[0].z ? p.data[0].z.length : -1; }""")
    assert strip == 16  # one row per rollout of the last step
    notebook.screenshot(".labkit-dashboard", "training_dashboard.png")


# ----------------------------------------------------------------------------- make jupyter


def _lab_setting(lab: LabServer, plugin: str, values: dict) -> None:
    """Set a JupyterLab user setting through the server's settings API (a page opened
    afterwards reads it)."""
    req = urllib.request.Request(f"{lab.url}/lab/api/settings/{plugin}", method="PUT",
                                 data=json.dumps({"raw": json.dumps(values)}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).close()


def _outputs(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                         ".map(o => o.textContent)")


def _retype_line(page, cell, old: str, new: str) -> None:
    """In code cell ``cell`` (a locator), replace the line ``old`` by ``new`` with the
    keyboard, as a learner edits."""
    source = cell.locator(".cm-content").inner_text().splitlines()
    row = source.index(old)
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+Home")
    for _ in range(row):
        page.keyboard.press("ArrowDown")
    page.keyboard.press("Home")
    page.keyboard.press("Shift+End")
    page.keyboard.type(new)
    page.keyboard.press("Escape")
    assert new in cell.locator(".cm-content").inner_text()


def test_tour_runs_and_make_jupyter_saves_it_without_dirtying_git(notebook):
    """The tracked ``notebooks/00_tour.ipynb`` on ``make jupyter``'s server (started as it
    starts it, as root too where the suite runs as root: no ``--allow-root``): edited to
    ``smoke = True`` and run whole, it shows a DiffView of coloured tokens; edited back and
    autosaved, ``git status`` stays clean (the pre-save hook strips outputs and what
    JupyterLab adds) while the tab keeps its outputs. No news pop-up shows."""
    lab, page = notebook.server, notebook.page
    path = lab.root / "notebooks" / "00_tour.ipynb"
    before = path.stat().st_mtime_ns
    _lab_setting(lab, "@jupyterlab/docmanager-extension:plugin", {"autosaveInterval": 2})
    try:
        notebook.open(path)
        params = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").first
        _retype_line(page, params, "smoke = False", "smoke = True")
        notebook.run_all()
        view = page.locator(".labkit-diffview").first
        view.wait_for()
        assert view.locator(".labkit-tokens .labkit-tok").count() > 0, "no coloured tokens"
        assert view.locator(".labkit-legend").count() == 1
        assert view.locator(".labkit-code .labkit-line").count() > 0  # the buggy code
        notebook.screenshot(".labkit-diffview", "diffview.png")
        _retype_line(page, params, "smoke = True", "smoke = False")
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline:  # until an autosave after the edit back
            status = subprocess.run(["git", "status", "--porcelain"], cwd=lab.root,
                                    capture_output=True, text=True, check=True).stdout
            if not status and path.stat().st_mtime_ns != before:
                break
            time.sleep(1)
    finally:
        _lab_setting(lab, "@jupyterlab/docmanager-extension:plugin", {})
    diff = subprocess.run(["git", "diff"], cwd=lab.root, capture_output=True, text=True).stdout
    assert path.stat().st_mtime_ns != before, "JupyterLab never saved the notebook"
    assert status == "", f"saving from make jupyter changed git's files:\n{status}{diff[:3000]}"
    assert view.locator(".labkit-tokens .labkit-tok").count() > 0  # the tab keeps its outputs
    assert page.locator(".jp-toast-message", has_text="news").count() == 0


def test_make_jupyter_opens_a_docs_link_of_every_notebook(notebook):
    """``make jupyter`` opens on the notebooks (its start page lists notebooks/), and each
    notebook's "At scale" link, in its takeaways, opens the page in JupyterLab, rendered: the
    repository is served, so the notebooks' relative links work."""
    from labkit.lab import notebooks

    lab, page = notebook.server, notebook.page
    page.goto(f"{lab.url}/?reset")  # where make jupyter's browser tab starts
    listing = page.locator(".jp-DirListing-item")
    listing.first.wait_for(timeout=60_000)
    assert "/lab/tree/notebooks" in page.url
    panel = ".jp-NotebookPanel:not(.lm-mod-hidden)"
    opened = {}
    for nb in notebooks():
        listing.filter(has_text=nb.name).first.dblclick()
        # the takeaways' relative link, resolved by JupyterLab against the served root
        links = page.locator(f"{panel} .jp-MarkdownCell", has_text="At scale:").locator(
            "a[href*='/files/docs/']")
        links.first.wait_for(timeout=60_000)
        lab.remember_children()
        hrefs = links.evaluate_all("as => as.map(a => a.getAttribute('href'))")
        target = re.search(r"/files/(docs/[^?#]+\.md)", hrefs[-1]).group(1)
        heading = next(line[2:].strip() for line in (ROOT / target).read_text().splitlines()
                       if line.startswith("# "))
        links.last.click()
        page.wait_for_function(  # the page opened in a tab of its own, and shows
            """(name) => [...document.querySelectorAll(
                   '.lm-DockPanel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel')]
                   .some(e => e.textContent === name)""",
            arg=target.rsplit("/", 1)[-1], timeout=30_000)
        page.locator(".lm-DockPanel .jp-RenderedMarkdown:visible h1",
                     has_text=heading).first.wait_for(timeout=30_000)
        opened[nb.stem] = target
    print(f"opened: {opened}")


def test_interrupting_05_stops_training_with_one_line(notebook):
    """Notebook 05 (smoke budget, many steps) under Run All: once the dashboard has a point,
    the toolbar's interrupt button stops the trainer after its step; the waiting cell prints
    one line, "stopped at step N", the dashboard keeps N points, no output holds a traceback
    (none from the dashboard's thread either), and the cells below read the stopped run (the
    copy ends at the first of them that shows it, its DiffView)."""
    lab, page = notebook.server, notebook.page
    smoke_copy(ROOT / "notebooks" / "05_training.ipynb", lab.work / "05_training.ipynb",
               until="DiffView.from_record(rec)",
               then="steps = 400  # far more than the test waits for: only the interrupt ends it\n"
                    "max_new_tokens = 64  # quicker steps")
    notebook.open("05_training.ipynb")
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.wait_for_function(f"() => ({POINTS_JS})() >= 1", timeout=240_000)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                 "[data-command='notebook:interrupt-kernel']").first.click()
    notebook._wait_all_ran(240_000)
    lab.remember_children()
    texts = _outputs(page)
    stopped = [t for t in texts if "stopped at step" in t]
    assert len(stopped) == 1, stopped
    m = re.fullmatch(r"stopped at step (\d+) \(grpo\)\n?", stopped[0])
    assert m, f"not one line: {stopped[0]!r}"
    noise = [t[-2000:] for t in texts if any(w in t for w in (
        "Traceback", "Exception in thread", "ZMQError", "KeyboardInterrupt"))]
    assert not noise, noise[0]
    n = int(m.group(1))
    time.sleep(3)  # no step after the stop
    assert _plot_points(page) == n
    assert any(t.startswith("grpo: ") and " sample " in t for t in texts)  # read the stopped run
    assert page.locator(".labkit-diffview").count() >= 1
