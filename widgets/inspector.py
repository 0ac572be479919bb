"""``AdvantageInspector``: one task's group at one step, from components to advantages.

A table with one row per rollout: the feedback components, the reshaped reward the
trainer computed, the advantage it trained with (mean over tokens), and the advantage
that each of ``grpo``, ``dr_grpo`` and ``rloo`` gives the group's rewards. Picking a
rollout opens it in an embedded :class:`~widgets.diffview.DiffView`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import ipywidgets as ipw
import pandas as pd
import torch
from traitlets import Instance, Int, List, TraitError, validate

from labkit.credit.advantages import ADVANTAGE_ESTIMATORS, AdvantageInput, compute_advantages
from widgets.colors import escape
from widgets.diffview import DiffView
from widgets.records import COMPONENTS, describe, group, open_run, read_rollouts, sequence_advantage
from widgets.tables import frame_html
from widgets.static import StaticView

ESTIMATORS = tuple(ADVANTAGE_ESTIMATORS.names(needs=()))
"""The estimators a stored group's rewards are enough for: those needing no rollouts, tasks
or forks (their registry metadata)."""


def estimator_advantages(rewards: Sequence[float], estimators: Sequence[str] = ESTIMATORS,
                         ) -> dict[str, list[float]]:
    """Each estimator's sequence advantage for one group's ``rewards``
    (``labkit.credit.advantages``; one token per sequence is enough for these)."""
    r = torch.tensor(list(rewards), dtype=torch.float64)  # [B]
    inp = AdvantageInput(r, [0] * len(r), torch.ones(len(r), 1, dtype=torch.float64))
    return {name: compute_advantages(name, inp).advantages[:, 0].tolist() for name in estimators}


def group_frame(records: Sequence[Mapping], estimators: Sequence[str] = ESTIMATORS,
                ) -> pd.DataFrame:
    """One row per rollout: ``sample``, ``status``, ``reward`` (the logged reshaped reward),
    ``advantage`` (logged, mean over tokens), ``A <estimator>`` recomputed from ``reward``
    (before the trainer's optional batch normalisation and advantage transforms), then the
    components."""
    rows = [{"sample": r["sample"], "status": r.get("status", ""),
             "reward": r["reward"], "advantage": sequence_advantage(r)} for r in records]
    frame = pd.DataFrame(rows)
    for name, adv in estimator_advantages([r["reward"] for r in records], estimators).items():
        frame[f"A {name}"] = adv
    # the components last: the advantages stay in view in a narrow notebook, the rest scrolls
    for c in COMPONENTS:
        frame[c] = [r["components"].get(c) for r in records]
    return frame


class AdvantageInspector(StaticView, ipw.VBox):
    """Reward components -> reshaped reward -> advantage for one group, plus a DiffView.

    ``records`` must share one ``step`` and ``task_id``; ``selected`` is the index of the
    rollout shown below the table.
    """

    records = List(help="One group's records (same step and task_id).")
    selected = Int(0, help="Index into records of the rollout shown in the DiffView.")
    frame = Instance(pd.DataFrame, allow_none=True, help="The table shown (group_frame).")

    def __init__(self, records: Sequence[Mapping], estimators: Sequence[str] = ESTIMATORS):
        self.estimators = tuple(estimators)
        self._title = ipw.HTML()
        self._table = ipw.HTML()
        self._picker = ipw.Dropdown(description="rollout", layout=ipw.Layout(width="auto"))
        self.diff = DiffView()
        table_box = ipw.Box([self._table], layout=ipw.Layout(overflow="auto", max_width="100%"))
        table_box.add_class("labkit-inspector-table")
        super().__init__(children=[self._title, table_box, self._picker, self.diff])
        self.add_class("labkit-inspector")
        self.observe(self._on_records, names="records")
        self.observe(self._on_selected, names="selected")
        self.records = [dict(r) for r in records]
        ipw.link((self._picker, "value"), (self, "selected"))

    @classmethod
    def from_run(cls, run_dir: str | Path, step: int | None = None, task_id: str | None = None,
                 **kwargs) -> AdvantageInspector:
        """The group of ``task_id`` at ``step`` in ``run_dir/rollouts.jsonl`` (defaults: the
        latest step, its task whose rewards spread widest: :func:`widgets.records.group`)."""
        return cls(group(read_rollouts(open_run(run_dir)), step, task_id), **kwargs)

    @validate("records")
    def _check_group(self, proposal: Mapping) -> list:
        recs = proposal["value"]
        if not recs:
            raise TraitError("AdvantageInspector needs at least one record")
        keys = {(r["step"], r["task_id"]) for r in recs}
        if len(keys) > 1:
            raise TraitError(f"records must share one step and task_id; got {sorted(keys)}")
        return recs

    @validate("selected")
    def _check_selected(self, proposal: Mapping) -> int:
        i = proposal["value"]
        if not 0 <= i < len(self.records):
            raise TraitError(f"selected must be in [0, {len(self.records)}); got {i}")
        return i

    def _on_records(self, _change: Mapping) -> None:
        first = self.records[0]
        self.frame = group_frame(self.records, self.estimators)
        self._title.value = (f"<b>{escape(str(first['task_id']))}</b> at step {first['step']}: "
                             f"{len(self.records)} rollouts")
        moved = self.selected != 0
        self._picker.options = [(describe(r), i) for i, r in enumerate(self.records)]
        self._picker.value = 0  # and, through the link, `selected`
        if not moved:  # no change of `selected`: nothing re-rendered yet
            self._on_selected()

    def _on_selected(self, _change: Mapping | None = None) -> None:
        signed = ["advantage", *(f"A {e}" for e in self.estimators)]
        bold = [i == self.selected for i in range(len(self.frame))]
        self._table.value = frame_html(self.frame, signed, bold_rows=bold)
        self.diff.show_record(self.records[self.selected])
