"""Figures that do not mislead: checks run on the plotly figures of executed notebooks.

:func:`problems` reads one figure (plotly's JSON, as a notebook output stores it) and names
what would mislead a reader:

* **an axis without a title**, or with a placeholder one (``value``, ``variable``,
  ``index``: what plotly writes when a wide table is plotted without labels); facets share
  one title per direction, so at least one x and one y axis must say what they show;
* **a categorical variable on a continuous colour scale**: bars coloured through a colour
  axis that share x positions stack (plotly puts them in one trace), and a colour bar
  titled with a step, seed or count reads as a measurement; colour by a string column;
* **identical traces drawn alike**: two traces of one subplot with the same points and the
  same line dash and marker symbol hide each other (only the last one shows) while the
  legend lists both; draw them apart (dash, facet) or name them as identical. Bars hide
  each other only when overlaid (``barmode="overlay"``).

:func:`notebook_problems` runs :func:`problems` over every plotly output of a notebook.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLACEHOLDER_TITLES = {"", "value", "variable", "index", "0", "x", "y"}
"""Axis titles that say nothing about what the axis shows."""
CATEGORICAL_WORDS = ("step", "seed", "method", "estimator", "mode", "count", "iteration")
"""Colour-bar titles that name a category or an ordinal, not a measured quantity."""
_BAR_LIKE = {"bar", "box", "histogram", "violin"}


def _title(axis: Mapping | None) -> str:
    t = (axis or {}).get("title")
    if isinstance(t, Mapping):
        t = t.get("text")
    return (t or "").strip()


def _cartesian(trace: Mapping) -> bool:
    return trace.get("type", "scatter") in {"scatter", "scattergl", "bar", "box", "histogram",
                                             "violin", "heatmap"}


def _points(trace: Mapping) -> tuple:
    def seq(v):
        if isinstance(v, Mapping):  # plotly's typed-array form
            return json.dumps(v, sort_keys=True)
        return tuple(round(x, 9) if isinstance(x, float) else x for x in (v or ()))
    return seq(trace.get("x")), seq(trace.get("y"))


def _style(trace: Mapping) -> tuple:
    line, marker = trace.get("line") or {}, trace.get("marker") or {}
    return (trace.get("type", "scatter"), trace.get("mode"), line.get("dash"),
            marker.get("symbol"), trace.get("xaxis", "x"), trace.get("yaxis", "y"))


def problems(fig: Mapping) -> list[str]:
    """What in ``fig`` (``{"data": [...], "layout": {...}}``) would mislead; empty when nothing."""
    data, layout = list(fig.get("data") or []), fig.get("layout") or {}
    found = []
    cart = [t for t in data if _cartesian(t)]
    if cart:
        for axis in ("x", "y"):
            titles = [_title(v) for k, v in layout.items()
                      if k.startswith(f"{axis}axis") and isinstance(v, Mapping)]
            if not any(t.lower() not in PLACEHOLDER_TITLES for t in titles):
                found.append(f"no {axis} axis says what it shows (titles: {titles or 'none'})")
    coloraxes = {k: v for k, v in layout.items() if k.startswith("coloraxis") and isinstance(v, Mapping)}
    for t in data:
        ref = (t.get("marker") or {}).get("coloraxis") or t.get("coloraxis")
        xs = _points(t)[0]
        if ref and t.get("type") in _BAR_LIKE and isinstance(xs, tuple) and len(set(xs)) < len(xs):
            found.append(f"{t.get('type')} trace {t.get('name')!r} is coloured on a continuous scale "
                         "and its bars share x positions (they stack): colour by a string column")
    for name, axis in coloraxes.items():
        title = _title(axis.get("colorbar")).lower()
        if any(w in title for w in CATEGORICAL_WORDS):
            found.append(f"{name}: a continuous colour scale for {title!r}, a category or an "
                         "ordinal: colour by a string column")
    seen: dict[tuple, str] = {}
    overlaid = layout.get("barmode") == "overlay"  # grouped or stacked bars never hide each other
    for t in data:
        if not _cartesian(t) or t.get("type") == "heatmap" or (t.get("type") in _BAR_LIKE and not overlaid):
            continue
        key = (_style(t), _points(t))
        name = str(t.get("name") or "")
        if key in seen and "identical" not in (name + seen[key]).lower():
            found.append(f"traces {seen[key]!r} and {name!r} have the same points and style: one "
                         "hides the other (dash one, facet them, or name them identical)")
        seen.setdefault(key, name)
    return found


def notebook_problems(path: str | Path) -> list[tuple[int, str]]:
    """``(cell index, problem)`` for every plotly output of the executed notebook ``path``."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            fig = (o.get("data") or {}).get(PLOTLY_MIME)
            if fig:
                out += [(i, p) for p in problems(fig)]
    return out
