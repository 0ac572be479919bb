"""Static renderings of the widgets, for places without a kernel (a headless run's report,
an exported notebook).

A widget needs a live kernel and JupyterLab's widget manager; a notebook executed by
papermill keeps only a reference to a model that no longer exists. :class:`StaticView`
adds a ``text/html`` rendering to every widget's display data: figures as plotly ``div``s
(plotly.js is supplied by the page, :mod:`labkit.lab` embeds it once), tables and text as
HTML, controls as their current value. JupyterLab still shows the live widget: its widget
renderer outranks HTML.

The rendering is taken when the widget is displayed; a widget whose state changes after
that (a dashboard following training) calls :meth:`StaticView.publish_static`, which
updates every place it was displayed with its current rendering.
"""

from __future__ import annotations

import html

import ipywidgets as ipw
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display

CONTROLS = (ipw.ValueWidget,)
"""Widgets shown as ``description: value`` (sliders, dropdowns, check boxes...)."""


def static_html(widget: ipw.Widget) -> str:
    """HTML of ``widget`` and its children as they are now (no scripts but plotly's
    ``newPlot`` calls, no widget model needed)."""
    if isinstance(widget, go.FigureWidget):
        return pio.to_html(go.Figure(widget), include_plotlyjs=False, full_html=False,
                           config={"displaylogo": False})
    if isinstance(widget, ipw.Output):
        return "".join(_output_html(o) for o in widget.outputs)
    if isinstance(widget, (ipw.HTML, ipw.HTMLMath)):
        return f"<div class='labkit-static-html'>{widget.value}</div>"
    if isinstance(widget, ipw.Label):
        return f"<span>{html.escape(str(widget.value))}</span>"
    if isinstance(widget, ipw.Button):
        return ""  # an action, nothing to show once the kernel is gone
    if isinstance(widget, (ipw.Tab, ipw.Accordion)):
        titles = [widget.get_title(i) if hasattr(widget, "get_title") else None
                  for i in range(len(widget.children))]
        return "".join(f"<h4>{html.escape(t or f'panel {i + 1}')}</h4>{static_html(c)}"
                       for i, (t, c) in enumerate(zip(titles, widget.children)))
    if isinstance(widget, ipw.Box):
        style = "display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start" \
            if isinstance(widget, ipw.HBox) else ""
        classes = " ".join(getattr(widget, "_dom_classes", ()))
        inner = "".join(static_html(c) for c in widget.children)
        return f"<div class='{html.escape(classes)}' style='{style}'>{inner}</div>"
    if isinstance(widget, CONTROLS):
        label = getattr(widget, "description", "") or type(widget).__name__
        return (f"<span class='labkit-static-control'>{html.escape(label)}: "
                f"<b>{html.escape(_value_text(widget))}</b></span>")
    return ""


def _value_text(widget: ipw.ValueWidget) -> str:
    value = widget.value
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (tuple, list)):
        return ", ".join(map(str, value))
    return str(value)


def _output_html(output: dict) -> str:
    """One output of an ``Output`` widget (``stream``, ``display_data``, ``error``)."""
    kind = output.get("output_type")
    if kind == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if kind == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    data = output.get("data", {})
    if "text/html" in data:
        return "".join(data["text/html"])
    if "text/plain" in data:
        return f"<pre>{html.escape(''.join(data['text/plain']))}</pre>"
    return ""


class StaticView:
    """Mixin for a widget class: its display data also carries :func:`static_html`.

    Put it first among the bases (``class DiffView(StaticView, ipw.VBox)``)."""

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None:
            data["text/html"] = ("<div class='labkit-static'>" + static_html(self) + "</div>")
        return data

    def _ipython_display_(self) -> None:
        handle = display(self._repr_mimebundle_(), raw=True, display_id=True)
        self.__dict__.setdefault("_static_handles", []).append(handle)

    def publish_static(self) -> None:
        """Update every displayed copy of this widget with its current static rendering
        (live views are redrawn from the same model)."""
        for handle in self.__dict__.get("_static_handles", []):
            if handle is not None:
                handle.update(self._repr_mimebundle_(), raw=True)
