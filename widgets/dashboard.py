"""``TrainingDashboard``: live training curves from the trainer's events, or a finished run.

Panels (one plotly ``FigureWidget``): reward mean and components, train and held-out
pass@1, KL to the reference (k1, k3), clip fraction, entropy, zero-std groups, completion
length, seconds per phase. A second figure shows a per-token strip (advantages, or any
per-token field of the records) of the latest batch. A Stop button asks the trainer to
stop between steps.

Live: ``dash.attach(trainer)`` subscribes bound methods to ``trainer.events``
(``on_train_start``, ``on_rollout``, ``on_step_end``, ``on_eval``, ``on_train_end``); the
status line says what runs and how long each step took; ``EventBus.on`` ignores a function it
already holds, so attaching again adds nothing; ``detach()`` / ``close()`` unsubscribe.
Replay: ``TrainingDashboard.replay(run_dir)`` fills the same figures from
``metrics.jsonl``, ``eval.jsonl`` and the last step of ``rollouts.jsonl``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Real
from pathlib import Path
from typing import Any

import ipywidgets as ipw
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from traitlets import Any as AnyTrait
from traitlets import Bool, List, Unicode

from widgets.colors import escape, plotly_colorscale
from widgets.errors import shown_in
from widgets.records import COMPONENTS, at_step, open_run, read_rollouts
from widgets.static import StaticView

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",
                *(f"reward/{c}" for c in COMPONENTS if c not in ("r_feedback", "noop")))),
    ("pass@1", ("train/pass_at_1", "eval/pass_at_1")),
    ("KL to reference", ("kl/k1", "kl/k3")),
    ("clip fraction", ("clip/frac",)),
    ("entropy", ("entropy",)),
    ("zero-std groups", ("adv/zero_std_frac",)),
    ("completion tokens", ("len/mean",)),
    ("seconds per phase", ("time/generate", "time/execute", "time/reward", "time/update")),
)
"""``(title, keys)`` of each panel; ``eval/*`` keys come from ``eval.jsonl`` / ``on_eval``,
the others from ``metrics.jsonl`` / ``on_step_end``."""
COLS = 2
KEPT = ("reward/r_test", "train/pass_at_1", "eval/pass_at_1", "kl/k3")
"""Curves :meth:`TrainingDashboard.keep` freezes by default: the readings that compare
across methods (each method's reward is its own)."""


# ----------------------------------------------------------------------------- pure helpers


def metrics_to_series(rows: Iterable[Mapping], keys: Sequence[str],
                      ) -> dict[str, tuple[list, list[float]]]:
    """``{key: (steps, values)}`` over ``rows`` (metrics or eval rows), skipping rows where
    the key is missing, ``None`` or not finite; a row without ``step`` uses its index."""
    out: dict[str, tuple[list, list[float]]] = {k: ([], []) for k in keys}
    for i, row in enumerate(rows):
        for k in keys:
            v = row.get(k)
            if isinstance(v, Real) and math.isfinite(v):
                out[k][0].append(row.get("step", i))
                out[k][1].append(float(v))
    return out


def strip_matrix(records: Sequence[Mapping], field: str = "advantages",
                 ) -> tuple[list[list[float | None]], list[list[str]], list[str]]:
    """A ``[B, T_max]`` heatmap of a per-token ``field``: values (``None``-padded), the
    token texts (from ``offsets``) for hover, and one row label per record."""
    width = max((len(r.get(field) or []) for r in records), default=0)
    z, text, labels = [], [], []
    for r in records:
        vals = list(r.get(field) or [])
        toks = [r["completion"][a:b] for a, b in r.get("offsets", [])][:width]
        z.append(vals + [None] * (width - len(vals)))
        text.append([repr(t) for t in toks] + [""] * (width - len(toks)))
        labels.append(f"{r['task_id']} #{r['sample']}")
    return z, text, labels


def _replace_from(rows: Sequence[Mapping], row: Mapping) -> list[Mapping]:
    """``rows`` without those at or after ``row``'s step, then ``row`` (a resumed run
    repeats steps; the newest value wins)."""
    return [r for r in rows if r.get("step", -1) < row.get("step", math.inf)] + [row]


# ----------------------------------------------------------------------------- widget


class TrainingDashboard(StaticView, ipw.VBox):
    """Training curves, a per-token strip of the latest batch and a Stop button.

    State: ``rows`` (metrics rows), ``eval_rows``, ``batch`` (latest records); each
    redraws its figure through ``FigureWidget.batch_update``.
    """

    rows = List(help="metrics.jsonl rows / on_step_end metrics, in step order.")
    eval_rows = List(help="eval.jsonl rows / on_eval metrics.")
    batch = List(help="Records of the latest step (the strip).")
    strip_field = Unicode("advantages", help="Per-token record field shown in the strip.")
    status = Unicode("", help="One line under the figures.")
    label = Unicode("", help="Which run the dashboard follows (its run folder's name), shown in the status line.")
    stop_requested = Bool(False, help="The Stop button was clicked.")
    trainer = AnyTrait(None, allow_none=True, help="The attached trainer (None: a replay).")

    def __init__(self, height: int = 900):
        titles = [t for t, _ in PANELS]
        rows = math.ceil(len(PANELS) / COLS)
        # Each figure is built whole before it becomes a widget: edits made to a new
        # FigureWidget (add_scatter, update_layout) are messages, and a page still loading
        # plotly's widget code (the first figure it shows) could lose them.
        curves = make_subplots(rows=rows, cols=COLS, subplot_titles=titles,
                               vertical_spacing=0.08)
        self._trace_of: dict[str, int] = {}
        for p, (_, keys) in enumerate(PANELS):
            for key in keys:
                self._trace_of[key] = len(curves.data)
                # one legend group per panel, titled like the panel: 20 traces read as 8 lists
                curves.add_scatter(x=[], y=[], name=key, mode="lines+markers",
                                   marker_size=4, row=p // COLS + 1, col=p % COLS + 1,
                                   legendgroup=PANELS[p][0], legendgrouptitle_text=PANELS[p][0])
        curves.update_layout(height=height, margin={"t": 40, "b": 20, "l": 40, "r": 20},
                             legend={"tracegroupgap": 6, "groupclick": "toggleitem"})
        self.curves = go.FigureWidget(curves)
        self.strip = go.FigureWidget(go.Heatmap(z=[], zmid=0, colorscale=plotly_colorscale(),
                                                hovertemplate="%{y}<br>token %{x} %{text}"
                                                              "<br>%{z:.3f}<extra></extra>"),
                                     layout={"height": 160, "plot_bgcolor": "white",  # padding stays blank
                                             "margin": {"t": 30, "b": 20, "l": 120, "r": 20}})
        self._stop = ipw.Button(description="Stop", icon="stop", button_style="danger",
                                    disabled=True, tooltip="Stop the trainer after this step")
        self._status = ipw.HTML()
        self.out = ipw.Output()
        super().__init__(children=[self.curves, self.strip,
                                   ipw.HBox([self._stop, self._status]), self.out])
        self.add_class("labkit-dashboard")
        self.curves.add_class("labkit-curves")
        self.strip.add_class("labkit-strip")
        self._stop.add_class("labkit-stop")
        self._stop.on_click(self._on_stop)
        self.observe(self._draw_curves, names=["rows", "eval_rows"])
        self.observe(self._draw_strip, names=["batch", "strip_field"])
        self.observe(self._show_status, names="status")

    # ------------------------------------------------------------------ live
    def attach(self, trainer: Any, label: str | None = None) -> TrainingDashboard:
        """Follow ``trainer``'s events (detaching from any other trainer first); ``label``
        names it in the status line (default: its run folder's name)."""
        if self.trainer is not None and self.trainer is not trainer:
            self.detach()
        for event, fn in self._handlers():
            trainer.events.on(event, fn)
        self.trainer = trainer
        run_dir = getattr(getattr(trainer, "cfg", None), "run_dir", "") or ""
        self.label = label or Path(run_dir).name
        self.stop_requested = False
        self._stop.disabled = False
        self._stop.layout.display = None  # a replay hid it
        return self

    def detach(self) -> None:
        """Stop following the trainer (the figures keep what they show)."""
        if self.trainer is not None:
            for event, fn in self._handlers():
                self.trainer.events.off(event, fn)
        self.trainer = None
        self._stop.disabled = True

    def close(self) -> None:
        """Detach, then close this widget and its figures."""
        self.detach()
        for child in (self.curves, self.strip):
            child.close()
        super().close()

    def _handlers(self) -> tuple[tuple[str, Any], ...]:
        return (("on_train_start", self._on_train_start), ("on_rollout", self._on_rollout),
                ("on_step_end", self._on_step_end), ("on_eval", self._on_eval),
                ("on_train_end", self._on_train_end))

    def _on_train_start(self, trainer: Any, **_: Any) -> None:
        with shown_in(self.out):
            cfg = getattr(trainer, "cfg", None)
            first = ("held-out evaluation, then step 1" if getattr(cfg, "eval_every", 0)
                     else "step 1")
            self.status = self._with_stop(f"started: {first} (the first point comes after "
                                          "the first step, the slowest)...")

    def _on_rollout(self, trainer: Any, step: int, rollouts: Sequence) -> None:
        with shown_in(self.out):
            self.status = self._with_stop(f"step {step + 1}: {len(rollouts)} completions sampled, scoring...")

    def _on_step_end(self, trainer: Any, step: int, metrics: Mapping,
                     records: Sequence[Mapping]) -> None:
        with shown_in(self.out):
            self.rows = _replace_from(self.rows, metrics)
            self.batch = list(records)
            seconds = metrics.get("time/step")
            took = f" in {seconds:.0f} s" if isinstance(seconds, Real) else ""
            self.status = self._with_stop(
                f"step {step}{took}: reward {metrics.get('reward/mean', math.nan):.3f}")

    def _on_eval(self, trainer: Any, step: int, metrics: Mapping) -> None:
        with shown_in(self.out):
            self.eval_rows = _replace_from(self.eval_rows, metrics)

    def _on_train_end(self, trainer: Any, **_: Any) -> None:
        with shown_in(self.out):
            self.publish_static()  # a headless run's notebook keeps the trained curves

    def _with_stop(self, line: str) -> str:
        """A progress line naming the run, that keeps saying a stop was requested (the step
        in flight still reports)."""
        line = f"{self.label}: {line}" if self.label else line
        return f"{line} (stop requested)" if self.stop_requested else line

    def _on_stop(self, _button: ipw.Button) -> None:
        with shown_in(self.out):
            self.stop_requested = True
            if self.trainer is not None:
                self.trainer.request_stop()
                self.status = "stop requested: the trainer stops after the current step"

    def keep(self, label: str, keys: Sequence[str] = KEPT) -> None:
        """Freeze the current curves of ``keys`` as a dotted overlay named ``label``, so the
        next run (after ``rows`` and ``eval_rows`` are cleared) is drawn against it: a live
        side-by-side comparison of methods trained one after the other."""
        panel_of = {k: p for p, (_, ks) in enumerate(PANELS) for k in ks}
        with self.curves.batch_update():
            for key in keys:
                src = self.curves.data[self._trace_of[key]]
                if not src.x:
                    continue
                p = panel_of[key]
                self.curves.add_scatter(x=list(src.x), y=list(src.y), name=f"{key} ({label})",
                                        mode="lines", line={"dash": "dot", "width": 1.5},
                                        opacity=0.6, legendgroup=PANELS[p][0],
                                        row=p // COLS + 1, col=p % COLS + 1)

    # ------------------------------------------------------------------ replay
    @classmethod
    def replay(cls, run_dir: str | Path, **kwargs) -> TrainingDashboard:
        """A dashboard filled from a run folder (``attach`` it later to go on live)."""
        run = open_run(run_dir)
        dash = cls(**kwargs)
        dash.eval_rows = run.read("eval.jsonl")
        dash.rows = run.read("metrics.jsonl")
        rollouts = read_rollouts(run)
        dash.batch = at_step(rollouts) if rollouts else []
        dash.label = Path(run.path).name
        dash.status = f"replay of {run.path}: {len(dash.rows)} steps"
        dash._stop.layout.display = "none"  # nothing to stop; attach() shows it again
        return dash

    # ------------------------------------------------------------------ drawing
    def _draw_curves(self, _change: Mapping | None = None) -> None:
        keys = list(self._trace_of)
        series = {**metrics_to_series(self.rows, [k for k in keys if not k.startswith("eval/")]),
                  **metrics_to_series(self.eval_rows, [k for k in keys if k.startswith("eval/")])}
        with self.curves.batch_update():
            for key, (xs, ys) in series.items():
                trace = self.curves.data[self._trace_of[key]]
                trace.x, trace.y = xs, ys

    def _draw_strip(self, _change: Mapping | None = None) -> None:
        z, text, labels = strip_matrix(self.batch, self.strip_field)
        step = self.batch[0]["step"] if self.batch else "-"
        with self.strip.batch_update():
            heat = self.strip.data[0]
            heat.z, heat.text, heat.y = z, text, labels
            flat = bool(z) and all(v in (None, 0, 0.0) for row in z for v in row)
            note = " (all 0: every group's rewards tied, no signal this step)" if flat else ""
            self.strip.layout.title.text = f"{self.strip_field} per token, step {step}{note}"
            self.strip.layout.height = 80 + 16 * max(1, len(labels))

    def _show_status(self, _change: Mapping | None = None) -> None:
        self._status.value = f"<span class='labkit-status'>{escape(self.status)}</span>"
