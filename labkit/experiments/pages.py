"""Results pages: one writer, and the blocks every page is rendered from.

A page is a pure function of its JSON. :func:`write_page` is the one writer: it adds the
code commit to the results, writes ``<name>.json``, reads it back, and writes ``<name>.md``
as ``render(json)`` (and the figure, drawn from the same JSON). So every number and every
verdict sentence of a page comes from its JSON, and ``python -m labkit results render``
(:func:`rerender`) rebuilds the pages from the committed JSON without running anything; a
test checks that the committed pages are what that gives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from labkit.experiments import load, stats
from labkit.experiments.config import code_commit

READINGS = {"paired": "pass@1", "paired_pass_k": "pass@k"}


# ----------------------------------------------------------------------------- the writer


def write_page(results: dict, out: str | Path, render: Callable[[dict], str],
               figure: Callable[[dict, Path], object] | None = None) -> Path:
    """Write ``<out>/<name>.json`` (``results`` plus ``code_commit``), then ``<name>.md`` =
    ``render`` of the JSON as read back, then ``figure(json, out)``; returns the page's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = results["experiment"]
    results.setdefault("code_commit", code_commit())
    path = out / f"{name}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    data = json.loads(path.read_text())
    md = out / f"{name}.md"
    md.write_text(render(data).rstrip("\n") + "\n")
    if figure is not None:
        figure(data, out)
    return md


def rerender(json_path: str | Path) -> str:
    """The page of a committed results JSON, rendered again by its experiment's ``render``."""
    data = json.loads(Path(json_path).read_text())
    return load(data["experiment"].split("/")[0]).render(data).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------- blocks


def header(results: Mapping, title: str, what: str) -> list[str]:
    """Title, what was run, the command that reruns it, the model's weights and the code."""
    s = results.get("setting", {})
    commit = results.get("code_commit") or "unknown"
    return [f"# {title}", "", what, "",
            f"Rerun: `{results['command']}`", "",
            f"Model `{s.get('model')}` (weights sha256 `{s.get('model_sha256')}`), code "
            f"`{commit[:12]}{'+dirty' if commit.endswith('+dirty') else ''}`, training seeds "
            f"{s.get('seeds')}.", "", *_recorded_lines(results.get("recorded")),
            "Intervals are 95% t-intervals over training seeds of paired changes; a change is "
            "**significant over seeds** when that interval excludes 0, and a change that is not "
            "is printed with the smallest change this design detects (80% power, two-sided 5%; "
            "docs/training.md, \"Reading a result\"). The seed-and-task bootstrap is printed beside.",
            ""]


def _recorded_lines(rec: Mapping | None) -> list[str]:
    """Which methods came from an earlier record (``reuse_recorded``), and from what."""
    if not rec:
        return []
    commit = rec.get("code_commit") or "unknown"
    return [f"Taken from an earlier record ({rec['from']}), not trained again: "
            f"{', '.join(f'`{m}`' for m in rec['methods'])} (code `{commit[:12]}"
            f"{'+dirty' if commit.endswith('+dirty') else ''}`, `{rec.get('command')}`). The "
            "start policy was evaluated again and reads as in that record (each seed's mean, to the "
            "last digit), so their per-task changes pair with the new methods'.", ""]


def _cell(change: Mapping | None, digits: int = 3) -> str:
    if not change:
        return "n/a"
    if change.get("ci95") is None:
        return f"{change['mean']:+.{digits}f} (one seed)"
    return f"{change['mean']:+.{digits}f} {stats.interval_text(change['ci95'], digits)}"


def verdict_cell(change: Mapping | None) -> str:
    return stats.verdict(change) if change else "n/a"


def paired_lines(results: Mapping, key: str = "paired", methods: list[str] | None = None) -> list[str]:
    """The table of each method's paired change under ``key`` (``paired``,
    ``paired_clean``, ``paired_trained``): pass@1 at the evaluation temperature and pass@k at
    the training temperature, start -> end, the change and its verdict."""
    p = results.get(key)
    if not p:
        return []
    s = results.get("setting", {})
    proto = results.get("paired", {}).get("protocol", {})
    titles = {"paired": f"held-out `{s.get('split')}` tasks",
              "paired_clean": f"held-out `{s.get('split')}` tasks a trained-on reference does not solve",
              "paired_trained": f"new instances of the trained `{s.get('train_split')}` templates"}
    pk = proto.get("pass_k")
    lines = [f"### {p['tasks']} {titles.get(key, key)}", "",
             f"pass@1: {proto.get('k')} samples per task at T = {proto.get('temperature')}"
             + (f"; pass@{pk}: {pk} samples per task at the training temperature "
                f"T = {proto.get('train_temperature')}" if pk else "")
             + "; each training seed has its own evaluation sampling seed, the same for its start "
             "and its end.", ""]
    head = "| method | pass@1 start -> end | change | seeds and tasks | verdict |"
    rule = "|---|---|---|---|---|"
    if pk:
        head += f" pass@{pk} start -> end | change | verdict |"
        rule += "---|---|---|"
    lines += [head, rule]
    for m in methods or list(results["methods"]):
        r = results["methods"][m]
        c = r.get(f"{key}_change")
        if not c:
            continue
        start = _start_of(p, "pass_at_1", c)
        row = (f"| {m} | {start:.3f} -> {start + c['mean']:.3f} | {_cell(c)} | "
               f"{stats.interval_text(c.get('hierarchical_ci95'))} | {verdict_cell(c)} |")
        if pk:
            ck = r.get(f"{key.replace('paired', 'paired_pass_k', 1)}_change")
            if ck:
                sk = _start_of(p, "pass_at_k", ck)
                row += f" {sk:.3f} -> {sk + ck['mean']:.3f} | {_cell(ck)} | {verdict_cell(ck)} |"
            else:
                row += " n/a | n/a | n/a |"
        lines.append(row)
    return lines + [""]


def _start_of(p: Mapping, reading: str, change: Mapping) -> float:
    """The start's mean reading over the seeds ``change`` covers."""
    starts = p["start"][reading]
    seeds = [s for s in change["per_seed"] if s in starts]
    return sum(starts[s] for s in seeds) / len(seeds)


def difference_lines(results: Mapping, pairs: list[tuple[str, str]], key: str = "paired",
                     title: str = "Method against method") -> list[str]:
    """``b - a`` for each pair, paired by seed and task (:func:`stats.difference` of the two
    methods' changes): the t-interval over seeds, the seed-and-task bootstrap, the verdict."""
    rows = []
    for a, b in pairs:
        ra, rb = results["methods"].get(a), results["methods"].get(b)
        if not ra or not rb or not ra.get(f"{key}_change") or not rb.get(f"{key}_change"):
            continue
        d = stats.difference(ra[f"{key}_change"], rb[f"{key}_change"])
        if d is None:
            continue
        rows.append(f"| {b} - {a} | {_cell(d)} | {stats.interval_text(d.get('hierarchical_ci95'))} | "
                    f"{verdict_cell(d)} |")
    if not rows:
        return []
    return [f"### {title} ({key.replace('_', ' ')})", "",
            "| difference | paired by seed and task | seeds and tasks | verdict |",
            "|---|---|---|---|", *rows, ""]


def periodic_lines(results: Mapping) -> list[str]:
    """The runs' own periodic held-out readings (start, end, end - start over seeds), the
    seconds per step and the wall time per run."""
    cfg = results.get("config", {})
    lines = ["### Periodic held-out evaluation during training", "",
             f"Each run's own readings ({cfg.get('eval_tasks')} tasks x {cfg.get('eval_k')} samples at "
             "every evaluation, one sampling seed for all runs).", "",
             "| method | start | end | end - start | s/step | wall per run (s) |",
             "|---|---|---|---|---|---|"]
    for m, r in results["methods"].items():
        if "start" not in r:
            continue
        lines.append(f"| {m} | {r['start']['mean']:.3f} | {r['end']['mean']:.3f} | "
                     f"{_cell(r['delta'])} | {r['s_per_step']:.2f} | {r['wall_s']:.0f} |")
    return lines + [""]


def figure_line(name: str, png: bool = True) -> list[str]:
    return [f"Figure: [{name}.html]({name}.html)" + (f", ![{name}]({name}.png)" if png else ""), ""]


# ----------------------------------------------------------------------------- figures


def curves_figure(results: Mapping, out: Path, name: str | None = None):
    """Held-out pass@1 against step, one line per run, one colour per method."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    name = name or results["experiment"].replace("/", "_")
    fig = go.Figure()
    colours = qualitative.D3
    for i, (m, r) in enumerate(results["methods"].items()):
        for j, sd in enumerate(r.get("seeds", [])):
            xs, ys = zip(*sd["curve"])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=m, legendgroup=m,
                                     showlegend=j == 0, line={"color": colours[i % len(colours)]},
                                     opacity=0.8))
    fig.update_layout(title=f"{name}: held-out pass@1 against step (one line per seed)",
                      xaxis_title="training step", yaxis_title="held-out pass@1",
                      template="plotly_white")
    return save_figure(fig, out, name)


def save_figure(fig, out: Path, name: str, width: int = 900, height: int = 500):
    """``<out>/<name>.html`` (loading plotly.js as :func:`write_figure_html` says) and, when
    kaleido can render it, ``<name>.png``; returns both paths (``None`` for a skipped PNG)."""
    out.mkdir(parents=True, exist_ok=True)
    html = write_figure_html(fig, out / f"{name}.html")
    png = out / f"{name}.png"
    try:
        fig.write_image(str(png), width=width, height=height)
    except Exception as e:  # noqa: BLE001 - kaleido needs a Chrome; report and keep the HTML
        print(f"PNG export skipped: {type(e).__name__}: {e}")
        png.unlink(missing_ok=True)  # never leave an earlier run's picture beside this page
        png = None
    return html, png


PLOTLY_JS = "plotly.min.js"


def shared_plotly_js(folder: Path) -> str | None:
    """The path, relative to ``folder``, of the nearest ``plotly.min.js`` of the installed
    plotly's version in ``folder`` or a folder above it inside the same project (the walk
    stops at the first folder holding ``.git`` or ``pyproject.toml``; outside a project only
    ``folder`` itself is looked at); ``None`` when there is none. This lets the figures of
    sub-folders of ``docs/results`` load its one committed copy."""
    from plotly.offline import get_plotlyjs_version

    folder = folder.resolve()
    chain = [folder, *folder.parents]
    top = next((i for i, d in enumerate(chain)
                if (d / ".git").exists() or (d / "pyproject.toml").is_file()), 0)
    wanted = f"plotly.js v{get_plotlyjs_version()}"
    for d in chain[:top + 1]:
        js = d / PLOTLY_JS
        if js.is_file():
            with js.open(errors="replace") as f:
                head = f.read(200)
            if wanted in head:
                return Path(os.path.relpath(js, folder)).as_posix()
    return None


def write_figure_html(fig, html: Path) -> Path:
    """Write ``fig`` as a full HTML page at ``html``. The page loads plotly.js from the nearest
    copy of the installed version (:func:`shared_plotly_js`); when there is none, plotly's
    ``include_plotlyjs="directory"`` writes one beside the page, which every later figure of
    that folder shares (that mode keeps a ``plotly.min.js`` already beside the page whatever
    its version, so a stale copy there must be deleted by hand)."""
    shared = shared_plotly_js(html.parent)
    fig.write_html(str(html), include_plotlyjs=shared or "directory", full_html=True)
    return html


def controls_lines(ctl: Mapping, positive: str, negative: str | None, claim: str,
                   unable: str) -> list[str]:
    """The page's reading of a ``controls`` record (:func:`labkit.experiments.stats.controls`):
    each control's change with its verdict, the MDE, and the answer in one sentence."""
    rows = [("positive control", positive, ctl.get("positive")),
            ("negative control", negative, ctl.get("negative")),
            ("the claim", claim, ctl.get("claim"))]
    lines = ["| | difference | paired by seed and task | verdict |", "|---|---|---|---|"]
    for role, label, change in rows:
        if label and change:
            lines.append(f"| {role} | {label} | {_cell(change)} | {stats.verdict(change)} |")
    mde = ctl.get("mde")
    lines += ["", "Smallest difference this design detects (80% power, two-sided 5%): "
              + (f"{mde:.3f}." if mde is not None else "n/a (one seed).")]
    if ctl.get("sensitive"):
        lines.append("**Yes, this testbed can see an effect of this kind**: the positive control "
                     "beats the baseline, significant over seeds, by more than that.")
    else:
        short, pos = ctl.get("shortfall"), ctl.get("positive")
        why = (f"; the positive control falls short of the smallest detectable difference by "
               f"{short:.3f}." if short is not None else
               "; the positive control's interval over seeds includes 0." if pos else ".")
        lines.append(f"**No: {unable}**{why}")
    return lines
