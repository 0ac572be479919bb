"""The headless lab: run the notebook sequence with papermill and write a static report.

``python -m labkit lab`` (``make lab``) executes ``notebooks/NN_*.ipynb`` in order, each
with ``--cwd notebooks``, the ``python3`` kernel and the parameters ``smoke`` and
``out_dir``, into ``runs/lab-<UTC timestamp>/``::

    runs/lab-20261130-014500/
        00_tour.ipynb ...        the executed notebooks (outputs kept)
        00_tour.json ...         the key numbers each notebook records (see :func:`record`)
        report.html              the front page (what each notebook found, the figures of
                                 its front-page cells, key numbers, contents), then every
                                 notebook; static plotly figures, plotly.js inline once
        lab.json                 per-notebook status and wall time, the report's size

The report needs no network and no server: plotly's JavaScript is embedded once, figures
are the notebooks' own plotly outputs redrawn statically, and widgets (which need a live
kernel) show their static rendering (``widgets.static``: figures, tables, control values)
with a note to open the notebook in JupyterLab to use them. The front page is
:mod:`labkit.docs.report`.

Notebooks call :func:`record` to write their numbers; the tests read those files.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Mapping, Sequence

from labkit.docs.figcheck import PLOTLY_MIME
from labkit.machine import append_record, cpu_seconds, thread_budget
from labkit.docs.report import front_page

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
KERNEL = "python3"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


KNOWN_WARNINGS: tuple[tuple[str, str], ...] = (
    ("FutureWarning", "`is_gradient_checkpointing` is deprecated"),  # peft asks transformers (07)
    ("FutureWarning", "`gradient_checkpointing` is deprecated"),  # TRL's GRPOConfig sets it (08)
)
"""Third-party warnings the lab's kernels do not show, ``(category, start of the message)``:
deprecations inside transformers, peft and TRL that a learner can do nothing about."""


def quiet_kernels() -> str:
    """Add :data:`KNOWN_WARNINGS` to ``PYTHONWARNINGS`` in this process's environment, which
    the kernels it starts inherit (``make jupyter``'s server, ``make lab``'s papermill); returns
    the new value. Idempotent; other warnings still show."""
    import os

    have = [w for w in os.environ.get("PYTHONWARNINGS", "").split(",") if w]
    for category, message in KNOWN_WARNINGS:
        entry = f"ignore:{message}:{category}"
        if entry not in have:
            have.append(entry)
    os.environ["PYTHONWARNINGS"] = ",".join(have)
    return os.environ["PYTHONWARNINGS"]


class LabError(RuntimeError):
    """A notebook is missing or failed; the message names it and the file to open."""


# ----------------------------------------------------------------------------- numbers


def _json_safe(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, int):
        return value
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"record: non-finite number {value}; record None for 'not measured'")
    return round(value, 6)


RECORD_TAG = "record"
"""Tag of each notebook's :func:`record` cell: its output collapsed in JupyterLab, the cell
left out of the report."""


def record(out_dir: str | Path, name: str, numbers: Mapping) -> dict:
    """Write ``numbers`` to ``<out_dir>/<name>.json`` (floats rounded to 6 digits) and
    return them. Non-finite floats are refused: a NaN in a notebook's summary is a bug."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = _json_safe(dict(numbers))
    (out / f"{name}.json").write_text(json.dumps(clean, indent=2) + "\n")
    return clean


# ----------------------------------------------------------------------------- running


def notebooks(only: Sequence[str] | None = None, directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The numbered notebooks in order; ``only`` keeps those whose number or name matches
    (``["00", "02"]`` or ``["00_tour"]``)."""
    found = sorted(p for p in directory.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise LabError(f"no notebooks in {directory}")
    if not only:
        return found
    wanted = [w.strip() for w in only if w.strip()]
    def matches(p: Path, w: str) -> bool:
        return p.stem == w or p.stem.split("_")[0] == w

    picked = [p for p in found if any(matches(p, w) for w in wanted)]
    unknown = [w for w in wanted if not any(matches(p, w) for p in found)]
    if unknown:
        raise LabError(f"--only: no notebook {unknown}; have {[p.stem for p in found]}")
    return picked


def run_notebook(path: Path, out_dir: Path, smoke: bool = False, parameters: Mapping | None = None,
                 log_output: bool = False, threads: int | None = None) -> dict:
    """Execute one notebook with papermill into ``out_dir``; returns its status row.

    ``threads``: the notebook's ``threads`` parameter (torch threads) unless ``parameters``
    sets it; by default ``OMP_NUM_THREADS`` where the environment sets it (a test worker per
    core sets 1), else the notebook's own.

    Widget state is not stored in the executed notebook (a live dashboard's state runs to
    tens of megabytes); open the notebook in JupyterLab to use the widgets."""
    import papermill as pm

    quiet_kernels()
    if threads is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
    params = {"smoke": bool(smoke), "out_dir": str(out_dir.resolve()), **(parameters or {})}
    if "threads" not in params and threads is not None:
        params["threads"] = threads
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cpu0 = cpu_seconds()
    row = {"notebook": path.stem, "smoke": bool(smoke)}
    try:
        pm.execute_notebook(str(path), str(out_dir / path.name), parameters=params,
                            kernel_name=KERNEL, cwd=str(path.parent), progress_bar=False,
                            log_output=log_output, store_widget_state=False)
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - papermill raises PapermillExecutionError and more
        row["status"] = "failed"
        last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        row["error"] = f"{type(e).__name__}: {last}"
    row["seconds"] = round(time.time() - started, 1)
    # CPU seconds of the kernel and everything it started (sandbox workers, ruff, torchrun),
    # once they have exited: on a busy machine, a better guide to the cost than wall time.
    row["cpu_seconds"] = round(cpu_seconds() - cpu0, 1)
    numbers = out_dir / f"{path.stem}.json"
    row["numbers"] = json.loads(numbers.read_text()) if numbers.is_file() else None
    return row


def run_lab(out: str | Path | None = None, smoke: bool = False, only: Sequence[str] | None = None,
            report: bool = True, log_output: bool = False, record_to: str | Path | None = None,
            jobs: int = 1) -> dict:
    """Run the sequence (or ``only`` some notebooks) into ``out`` (default
    ``runs/lab-<UTC timestamp>``), write ``lab.json`` and ``report.html``; returns the summary.
    ``record_to``: also append the notebooks' times, with the machine's facts, as one JSON line
    to that file (``docs/benchmarks/lab.jsonl``: the README's minutes come from it).
    ``jobs``: notebooks executed at once (each in its own kernel; they share nothing but the
    task cache). With more than one, a notebook's CPU seconds cannot be told apart (``None``;
    the summary keeps the total) and its wall time is not its own, so nothing is recorded;
    each notebook's torch then gets its share of the cores (``threads``: cores // jobs)."""
    if jobs < 1:
        raise LabError(f"jobs must be >= 1, got {jobs}")
    if jobs > 1 and record_to:
        raise LabError("--record needs notebooks run one at a time (--jobs 1): run at once, "
                       "their times are not their own")
    paths = notebooks(only)
    if out is None:
        out = REPO_ROOT / "runs" / time.strftime("lab-%Y%m%d-%H%M%S", time.gmtime())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started, cpu0 = time.time(), cpu_seconds()

    def one(p: Path) -> dict:
        if jobs == 1:  # one at a time: the name now, the outcome on the same line
            print(f"  {p.stem} ...", end="", flush=True)
        row = run_notebook(p, out, smoke=smoke, log_output=log_output,
                           threads=None if jobs == 1 else thread_budget(max(1, (os.cpu_count() or 1) // jobs)))
        if jobs > 1:  # this process's CPU time is every running notebook's, not this one's
            row["cpu_seconds"] = None
        name = "" if jobs == 1 else f"  {p.stem}"
        cpu = f" ({row['cpu_seconds']:.0f} CPU s)" if row["cpu_seconds"] is not None else ""
        error = f"  ({row['error']})" if row["status"] != "ok" else ""
        print(f"{name} {row['status']} in {row['seconds']:.0f} s{cpu}{error}", flush=True)
        return row

    if jobs == 1:  # in this thread, so Ctrl-C stops the notebook running
        rows = [one(p) for p in paths]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=jobs) as pool:  # papermill's kernels are processes
            rows = list(pool.map(one, paths))
    summary = {"out": str(out), "smoke": smoke, "seconds": round(time.time() - started, 1),
               "cpu_seconds": round(cpu_seconds() - cpu0, 1),
               "jobs": jobs,
               "notebooks": rows, "failed": [r["notebook"] for r in rows if r["status"] != "ok"]}
    (out / "lab.json").write_text(json.dumps(summary, indent=2) + "\n")
    if report:
        page = write_report(out, rows)
        summary["report"] = str(page)
        summary["report_bytes"] = page.stat().st_size
        (out / "lab.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"  report: {page} ({page.stat().st_size / 1e6:.1f} MB)", flush=True)
    if record_to:
        append_record(record_to, {
            "kind": "lab", "command": "python -m labkit lab" + (" --smoke" if smoke else ""),
            "smoke": smoke, "seconds": summary["seconds"], "cpu_seconds": summary["cpu_seconds"],
            "failed": summary["failed"],
            "notebooks": {r["notebook"]: {"status": r["status"], "seconds": r["seconds"],
                                          "cpu_seconds": r["cpu_seconds"]} for r in rows}})
    return summary


# ----------------------------------------------------------------------------- report

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
pre, code { background: #f6f6f6; font-size: 0.88em; }
pre { padding: 0.6em; overflow-x: auto; border-radius: 4px; }
.cell-input pre { border-left: 3px solid #9ab; }
.widget-note { color: #666; border: 1px dashed #bbb; padding: 0.4em 0.6em; margin: 0.4em 0;
               font-size: 0.88em; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; }
.nb { border-top: 2px solid #444; margin-top: 3em; padding-top: 1em; }
.failed { color: #b00; font-weight: bold; }
nav.toc ol { margin: 0.2em 0; } nav.toc > ol > li { margin: 0.3em 0; }
.front dt { font-weight: bold; margin-top: 0.6em; } .front dd { margin-left: 1.2em; }
.front dd p { margin: 0.1em 0; } .front .plain { font-size: 1.05em; }
.front .numbers { color: #555; font-size: 0.9em; } .front .lede { color: #555; }
details.toc { margin: 1.5em 0; } details.toc summary { cursor: pointer; font-weight: bold; }
.front-figure { margin: 1em 0; border: 1px solid #eee; padding: 0.4em; }
.front-figure figcaption { font-size: 0.85em; color: #666; }
"""


def _static_outputs(nb) -> None:
    """Rewrite outputs in place so that a plain HTML export shows them without a kernel or
    CDN: plotly figures become divs (plotly.js is added once by the page), widgets their
    text form, and plotly's own library-loading outputs are dropped."""
    import plotly.io as pio

    nb.metadata.pop("widgets", None)  # saved widget state: needs the widget manager's JS
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if PLOTLY_MIME in data:
                fig = pio.from_json(json.dumps(data[PLOTLY_MIME]))
                o["data"] = {"text/html": pio.to_html(fig, include_plotlyjs=False, full_html=False)}
            elif WIDGET_MIME in data and "text/html" in data:
                # the widget's static rendering (widgets.static): its figures and tables
                o["data"] = {"text/html": "".join(data["text/html"])
                             + "<div class='widget-note'>a static copy of an interactive widget: "
                               "open the notebook in JupyterLab to use it</div>"}
            elif WIDGET_MIME in data:
                text = data.get("text/plain", "")
                o["data"] = {"text/html": "<div class='widget-note'>interactive widget "
                             f"({html.escape(text)}): open the notebook in JupyterLab to use it"
                             "</div>"}
            elif "text/html" in data and "<script" in "".join(data["text/html"]) \
                    and "plotly" in "".join(data["text/html"]).lower():
                continue  # a renderer's copy of plotly.js or a script-only figure
            elif "application/javascript" in data:
                continue
            kept.append(o)
        cell["outputs"] = kept


def notebook_html(path: Path) -> str:
    """One executed notebook as an HTML fragment (no scripts, no external links)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(path), as_version=4)
    # the record cell is plumbing (the numbers are on the front page and in <notebook>.json)
    nb.cells = [c for c in nb.cells if RECORD_TAG not in c.get("metadata", {}).get("tags", [])]
    _static_outputs(nb)
    exporter = HTMLExporter(template_name="basic")
    body, _ = exporter.from_notebook_node(nb)
    return body


def numbers_table(rows: Sequence[Mapping]) -> str:
    """Each notebook's status, wall and CPU time, and a link to its recorded numbers."""
    parts = ["<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>CPU seconds</th>"
             "<th>numbers</th></tr>"]
    for r in rows:
        cls = "" if r["status"] == "ok" else " class='failed'"
        link = (f"<a href='{r['notebook']}.json'>{r['notebook']}.json</a>" if r.get("numbers")
                else "none recorded")
        parts.append(f"<tr><td><a href='#{r['notebook']}'>{r['notebook']}</a></td>"
                     f"<td{cls}>{html.escape(r['status'])}</td><td>{r['seconds']}</td>"
                     f"<td>{'' if r.get('cpu_seconds') is None else r['cpu_seconds']}</td><td>{link}</td></tr>")
    parts.append("</table>")
    return "\n".join(parts)


def write_report(out: Path, rows: Sequence[Mapping]) -> Path:
    """``out/report.html``: the front page (:func:`labkit.docs.report.front_page`: what this lab
    found, the figures that carry the story, key numbers, the contents folded), the status
    table, then every executed notebook, with plotly.js embedded inline once (no CDN)."""
    from plotly.offline import get_plotlyjs
    from pygments.formatters import HtmlFormatter

    css = _CSS + HtmlFormatter(style="default").get_style_defs(".highlight")
    sections, bodies = [], {}
    for r in rows:
        nb = out / f"{r['notebook']}.ipynb"
        body = notebook_html(nb) if nb.is_file() else "<p>not executed</p>"
        bodies[r["notebook"]] = body
        err = ("" if r["status"] == "ok"
               else f"<p class='failed'>{html.escape(r.get('error', ''))}</p>")
        sections.append(f"<section class='nb' id='{r['notebook']}'><h1>{r['notebook']}</h1>"
                        f"{err}{body}</section>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>labkit lab report</title>"
            f"<style>{css}</style><script type='text/javascript'>{get_plotlyjs()}</script>"
            "</head><body><h1>labkit lab report</h1>"
            f"<p>{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the executed notebooks "
            "and their JSON numbers are next to this file.</p>"
            f"{front_page(out, rows, bodies)}<h2>Status</h2>{numbers_table(rows)}"
            f"{''.join(sections)}</body></html>")
    path = out / "report.html"
    path.write_text(page)
    return path


# ----------------------------------------------------------------------------- notebooks in git


KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": KERNEL}
"""The kernel metadata a tracked notebook holds. JupyterLab rewrites it from the running
kernel (its display name, and ``language_info`` with the Python version) on every save."""


def strip(nb) -> None:
    """Remove outputs, execution counts, run metadata and what JupyterLab writes of its own
    (the running kernel's ``language_info`` and display name, view state: ``collapsed``,
    ``scrolled``, ``jupyter.outputs_hidden``, which running a cell resets) from a notebook (a
    dict or ``NotebookNode``) in place: what git holds. The ``record`` cell's output stays
    collapsed."""
    for cell in nb["cells"]:
        meta = cell.setdefault("metadata", {})
        for key in ("execution", "papermill", "collapsed", "scrolled", "jupyter"):
            meta.pop(key, None)
        if RECORD_TAG in meta.get("tags", []):
            meta["jupyter"] = {"outputs_hidden": True}
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    meta = nb.get("metadata", {})
    meta.pop("papermill", None)
    meta.pop("widgets", None)
    if meta.get("kernelspec", {}).get("name") == KERNEL:
        meta["kernelspec"] = dict(KERNELSPEC)
    if "language_info" in meta:
        meta["language_info"] = {"name": meta["language_info"].get("name", "python")}


TRACKED = re.compile(r"(^|/)notebooks/\d\d_[^/]*\.ipynb$")
"""The lab's tracked notebooks, by path: ``notebooks/NN_<name>.ipynb``."""


def pre_save_hook(model: dict, path: str = "", contents_manager=None, **_) -> None:
    """Jupyter's ``FileContentsManager.pre_save_hook`` for the lab's tracked notebooks: saves
    a numbered notebook of a ``notebooks/`` folder stripped (:func:`strip`), so working in
    ``make jupyter`` never writes outputs into git's files; the open tab keeps them. Other
    files are saved as they are.

    ``path`` is relative to the folder the server serves, so the file is found from the
    contents manager's ``root_dir``: the hook strips the same files whether the server serves
    the repository, ``notebooks/`` itself or a folder above the repository."""
    if model.get("type") != "notebook":
        return
    where = "/" + path.lstrip("/")
    root = getattr(contents_manager, "root_dir", None)
    if root:
        where = (Path(root) / path.lstrip("/")).resolve().as_posix()
    if TRACKED.search(where):
        strip(model["content"])


def lab_contents_manager() -> type:
    """Jupyter Server's default contents manager with :func:`pre_save_hook` registered (what
    ``make jupyter``'s config serves with). Registered, not set through the
    ``pre_save_hook`` option: JupyterLab applies the server's config twice, and a second
    setting of that option warns "Overriding existing pre_save_hook"."""
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

    class LabContentsManager(AsyncLargeFileManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.register_pre_save_hook(pre_save_hook)

    return LabContentsManager


def clear_outputs(paths: Sequence[Path] | None = None) -> list[Path]:
    """Strip outputs, execution counts and run metadata from notebooks (what git holds);
    returns the files that changed."""
    import nbformat

    changed = []
    for p in paths or sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        before = Path(p).read_text()
        nb = nbformat.reads(before, as_version=4)
        strip(nb)
        after = nbformat.writes(nb) + "\n"
        if after != before:
            Path(p).write_text(after)
            changed.append(Path(p))
    return changed
