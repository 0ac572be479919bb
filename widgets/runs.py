"""``RunsTable``: the run folders under a folder side by side; a click replays one.

The table is :func:`labkit.runs.table.runs_table`'s (what ``python -m labkit runs DIR``
prints): per run its estimator, recipe, feedback regime, seed, steps done / planned, last
reward, held-out pass@1 first -> last, wall time and status, then the config fields that
differ between the runs. Clicking a run in the list under the table replays its folder in a
:class:`widgets.dashboard.TrainingDashboard` below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ipywidgets as ipw
import pandas as pd
from traitlets import Any as AnyTrait
from traitlets import List, Unicode

from labkit.runs.table import COLUMNS, display_rows, runs_table
from widgets.dashboard import TrainingDashboard
from widgets.errors import shown_in
from widgets.static import StaticView
from widgets.tables import frame_html

# ----------------------------------------------------------------------------- pure helpers


def table_frame(runs: list[Mapping[str, Any]], differing: list[str]) -> pd.DataFrame:
    """The runs as a text DataFrame: the table's fixed columns, then the differing fields."""
    cells = display_rows({"runs": runs, "differing": differing})
    return pd.DataFrame(cells, columns=[*COLUMNS, *differing])


# ----------------------------------------------------------------------------- widget


class RunsTable(StaticView, ipw.VBox):
    """The runs under ``root``; selecting one in the list replays it in a dashboard.

    State: ``runs`` (rows of the table), ``differing`` (config fields that differ),
    ``selected`` (the replayed run's folder, ``""`` for none), ``dashboard`` (its replay).
    """

    root = Unicode(help="Folder holding the run folders.")
    runs = List(help="Rows of labkit.runs.table.runs_table, one per run folder.")
    differing = List(help="Config fields whose values differ between the runs.")
    selected = Unicode("", help="Folder of the run replayed below ('' = none).")
    dashboard = AnyTrait(None, allow_none=True, help="The TrainingDashboard replaying it.")

    def __init__(self, root: str | Path, dashboard_height: int = 700):
        self._height = dashboard_height
        self._table = ipw.HTML()
        self._pick = ipw.Select(options=[], value=None, rows=4, description="replay",
                                layout={"width": "60%"})
        self._view = ipw.VBox()
        self.out = ipw.Output()
        super().__init__(children=[self._table, self._pick, self._view, self.out])
        self.add_class("labkit-runs")
        self._table.add_class("labkit-runs-table")
        self._pick.add_class("labkit-runs-pick")
        self.observe(self._draw, names=["runs", "differing"])
        self.observe(self._replay, names="selected")
        self._pick.observe(self._on_pick, names="value")
        self.root = str(root)
        self.refresh()

    def refresh(self) -> None:
        """Read the run folders again (a running run moves on)."""
        with shown_in(self.out):
            table = runs_table(self.root)
            self.differing = table["differing"]
            self.runs = table["runs"]

    def select(self, run: str) -> None:
        """Replay the run named ``run`` (its name in the table's ``run`` column)."""
        names = [r["run"] for r in self.runs]
        if run not in names:
            raise KeyError(f"no run {run!r} under {self.root}; runs: {names}")
        self._pick.value = run

    # ------------------------------------------------------------------ callbacks
    def _draw(self, _change: Mapping | None = None) -> None:
        frame = table_frame(self.runs, self.differing)
        self._table.value = (frame_html(frame, css_class="labkit-runs-table") if len(frame)
                             else f"<i>no run folders under {self.root}</i>")
        keep, names = self._pick.value, [r["run"] for r in self.runs]
        self._pick.options = names
        self._pick.rows = max(2, min(8, len(names)))
        self._pick.value = keep if keep in names else None

    def _on_pick(self, change: Mapping) -> None:
        paths = {r["run"]: r["path"] for r in self.runs}
        self.selected = paths.get(change["new"], "")

    def _replay(self, change: Mapping) -> None:
        with shown_in(self.out):
            if self.dashboard is not None:
                self.dashboard.close()
                self.dashboard = None
            if change["new"]:
                self.dashboard = TrainingDashboard.replay(change["new"], height=self._height)
            self._view.children = [self.dashboard] if self.dashboard is not None else []
