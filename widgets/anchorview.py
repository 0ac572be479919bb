"""``AnchorView``: the DiDPO anchors of one task, and where each one sits in its members.

A list and a table of the task's anchors (groupability ``GS``, group size ``n``, mean size
``L`` in lines, the group's rewards and each member's ``A_D``); selecting an anchor shows
every member rollout in a :class:`~widgets.diffview.DiffView` with the anchor's character
spans outlined, all on one colour scale. See :mod:`labkit.credit.anchors` for the maths:
``A_D(i) = R_i - mean_{j in group} R_j`` and, per token,
``A(i, t) = A_E(i) + lambda * A_D(i, a*(t))`` with ``a*(t)`` the highest-GS anchor
covering token ``t``.

Works on the records of a run folder (``anchors.jsonl`` + ``rollouts.jsonl``, see
:meth:`AnchorView.from_run`) and on the output of
:func:`labkit.credit.anchors.task_anchors` in memory (:meth:`AnchorView.from_task`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import is_dataclass
from pathlib import Path

import ipywidgets as ipw
import pandas as pd
from traitlets import Int, List, TraitError, Unicode, validate

from labkit.credit.anchors import Anchor, anchor_records
from widgets.colors import escape, symmetric_scale
from widgets.diffview import DiffView
from widgets.errors import shown_in
from widgets.records import describe, open_run, read_rollouts
from widgets.tables import frame_html
from widgets.static import StaticView

COLOR_BY = ("advantages", "a_d")
"""What colours the member tokens: the advantages the trainer trained with (from the
rollout records) or the anchors' own ``A_D`` per token (:func:`anchor_token_values`)."""


# ----------------------------------------------------------------------------- pure helpers


def anchor_dicts(anchors: Sequence[Anchor | Mapping]) -> list[dict]:
    """Anchors as plain JSON-shaped dicts, the shape of an ``anchors.jsonl`` line
    (``id``, ``text``, ``source``, ``L``, ``n``, ``gs``, ``members`` with ``rollout``,
    ``size``, ``reward``, ``a_d``, ``lines``, ``spans``, ``tokens``); :class:`Anchor`
    objects go through :func:`~labkit.credit.anchors.anchor_records`."""
    out = []
    for a in anchors:
        rec = anchor_records([a])[0] if isinstance(a, Anchor) else dict(a)
        out.append(json.loads(json.dumps(rec)))  # tuples -> lists, as read back from JSONL
    return out


def rollout_dicts(rollouts: Sequence, buggy_code: str = "",
                  rewards: Sequence[float] | None = None) -> list[dict | None]:
    """Rollouts as record dicts (``completion``, ``code``, ``offsets``, ``logprobs``, ...):
    a :class:`~labkit.policy.rollout.Rollout` through ``to_dict`` plus ``buggy_code`` and its
    ``reward``; a mapping is copied; ``None`` (a rollout that was not logged) stays ``None``."""
    out: list[dict | None] = []
    for i, r in enumerate(rollouts):
        if r is None:
            out.append(None)
            continue
        rec = r.to_dict() if is_dataclass(r) else dict(r)
        if is_dataclass(r):
            rec.setdefault("buggy_code", buggy_code)
            if rewards is not None:
                rec["reward"] = float(rewards[i])
        out.append(rec)
    return out


def records_by_rollout(records: Sequence[Mapping], anchors: Sequence[Mapping]) -> list[dict | None]:
    """The records of one task's group, placed so that ``out[m["rollout"]]`` is member m's
    rollout; ``None`` where a member's rollout was not logged.

    The trainer samples a task's group in order, so a member's ``rollout`` (its index in the
    group) equals the record's ``sample``.
    """
    wanted = [m["rollout"] for a in anchors for m in a["members"]]
    size = max([*wanted, *(r["sample"] for r in records)], default=-1) + 1
    out: list[dict | None] = [None] * size
    for r in records:
        out[r["sample"]] = dict(r)
    return out


def anchors_table(anchors: Sequence[Mapping]) -> pd.DataFrame:
    """One row per anchor: ``anchor`` (id), ``GS``, ``n``, ``L``, ``source``, ``mean R``
    (the group's mean reward, the baseline of ``A_D``), ``members`` (rollout indices),
    ``A_D`` (of each member, in the same order) and ``sub-diff`` (its first line, and how
    many more)."""
    rows = []
    for a in anchors:
        ms = a["members"]
        text = list(a["text"])
        more = f"  (+{len(text) - 1} lines)" if len(text) > 1 else ""
        rows.append({"anchor": a["id"], "GS": a["gs"], "n": a["n"], "L": a["L"],
                     "source": a["source"],
                     "mean R": sum(m["reward"] for m in ms) / len(ms) if ms else float("nan"),
                     "members": " ".join(str(m["rollout"]) for m in ms),
                     "A_D": " ".join(f"{m['a_d']:+.2f}" for m in ms),
                     "sub-diff": (text[0] if text else "") + more})
    return pd.DataFrame(rows, columns=["anchor", "GS", "n", "L", "source", "mean R", "members",
                                       "A_D", "sub-diff"])


def members_table(anchor: Mapping) -> pd.DataFrame:
    """One row per member of ``anchor``: ``rollout``, ``reward`` ``R_i``, ``A_D``
    (``R_i - mean R`` unless the run divided by the group std), ``size`` (lines of its
    variant), ``lines`` (code lines credited, 1-based) and ``tokens`` (how many tokens
    receive ``A_D``)."""
    return pd.DataFrame([{"rollout": m["rollout"], "reward": m["reward"], "A_D": m["a_d"],
                          "size": m["size"], "lines": " ".join(str(i + 1) for i in m["lines"]),
                          "tokens": len(m["tokens"])} for m in anchor["members"]],
                        columns=["rollout", "reward", "A_D", "size", "lines", "tokens"])


def member_outlines(anchor: Mapping) -> dict[int, list[tuple[int, int, str]]]:
    """``{rollout: [(start, end, label), ...]}``: the completion character spans of each
    member that the anchor credits, labelled ``anchor <id> · A_D <value>``, ready for
    :class:`DiffView`'s ``outlines``."""
    out: dict[int, list[tuple[int, int, str]]] = {}
    for m in anchor["members"]:
        label = f"anchor {anchor['id']} · A_D {m['a_d']:+.3f}"
        out[m["rollout"]] = [(int(s), int(e), label) for s, e in m["spans"]]
    return out


def anchor_token_values(anchors: Sequence[Mapping], rollout: int, n_tokens: int) -> list[float]:
    """Per-token ``A_D(i, a*(t))`` of rollout ``i = rollout``: the ``a_d`` of the first anchor
    (anchors are in GS order) whose member ``i`` lists token ``t``; 0.0 for tokens no anchor
    covers. This is the diff term DiDPO adds to the episode advantage, before ``lambda``."""
    values = [0.0] * n_tokens
    seen = [False] * n_tokens
    for a in sorted(anchors, key=lambda a: a["id"]):
        for m in a["members"]:
            if m["rollout"] != rollout:
                continue
            for t in m["tokens"]:
                if 0 <= t < n_tokens and not seen[t]:
                    values[t], seen[t] = m["a_d"], True
    return values


def member_caption(record: Mapping) -> str:
    """:func:`~widgets.records.describe` of a run-folder record; for an in-memory rollout
    (no ``step``), its sample and reward only."""
    if "step" in record:
        return describe(record)
    reward = f" · reward {record['reward']:.3f}" if record.get("reward") is not None else ""
    return f"sample {record.get('sample', '?')}{reward}"


def anchor_label(anchor: Mapping) -> str:
    """One line for the picker: ``#0  GS 0.412  n 5  L 2.0  return x + 1``."""
    first = anchor["text"][0] if anchor["text"] else ""
    return (f"#{anchor['id']}  GS {anchor['gs']:.3f}  n {anchor['n']}  L {anchor['L']:.1f}  "
            f"{first.strip()[:48]}")


def pick_task(rows: Sequence[Mapping], step: int | None = None,
              task_id: str | None = None) -> tuple[int, str, list[dict]]:
    """``(step, task_id, anchors)`` of one task in ``anchors.jsonl`` rows (defaults: the latest
    step with anchors, the first task logged at it), anchors ordered by ``id``."""
    if not rows:
        raise LookupError("no anchors logged (anchors.jsonl is empty or missing: train with a "
                          "didpo estimator)")
    step = max(r["step"] for r in rows) if step is None else step
    at = [r for r in rows if r["step"] == step]
    if not at:
        raise LookupError(f"no anchors at step {step}; steps with anchors: "
                          f"{sorted({r['step'] for r in rows})}")
    task_id = at[0]["task_id"] if task_id is None else task_id
    out = sorted((dict(r) for r in at if r["task_id"] == task_id), key=lambda r: r["id"])
    if not out:
        raise LookupError(f"task {task_id!r} has no anchors at step {step}; tasks there: "
                          f"{sorted({r['task_id'] for r in at})}")
    return step, task_id, out


# ----------------------------------------------------------------------------- widget


class AnchorView(StaticView, ipw.VBox):
    """The anchors of one task; selecting one outlines its spans in every member's DiffView.

    ``anchors``: anchor dicts (:func:`anchor_dicts`) in GS order; ``records``: the group's
    rollout records indexed by ``Member.rollout`` (``None`` for one not logged);
    ``selected``: index into ``anchors`` of the anchor shown; ``color_by``: one of
    :data:`COLOR_BY`.
    """

    anchors = List(help="Anchor dicts of one task (anchors.jsonl lines), in GS order.")
    records = List(help="Rollout records; records[m['rollout']] is member m's (or None).")
    selected = Int(0, help="Index into anchors of the anchor whose members are shown.")
    color_by = Unicode("advantages", help="'advantages' (records) or 'a_d' (the anchors).")
    caption = Unicode("", help="A line above the view (task and step).")

    def __init__(self, anchors: Sequence[Anchor | Mapping], records: Sequence,
                 caption: str = "", color_by: str = "advantages"):
        self._title = ipw.HTML()
        self._picker = ipw.Select(description="anchor", rows=6,
                                      layout=ipw.Layout(width="420px"))
        self._picker.add_class("labkit-anchor-picker")
        self._color = ipw.ToggleButtons(options=COLOR_BY, description="colour by",
                                            style={"button_width": "90px"})
        self._table = ipw.HTML()
        self._members_table = ipw.HTML()
        self._members = ipw.VBox()
        self._members.add_class("labkit-anchor-members")
        self._views: list[DiffView] = []  # reused across selections, shown as needed
        self.out = ipw.Output()
        super().__init__(children=[self._title, ipw.HBox([self._picker, self._table]),
                                   self._color, self._members_table, self._members, self.out])
        self.add_class("labkit-anchorview")
        self.observe(self._on_data, names=["anchors", "records"])
        self.observe(self._render, names=["selected", "color_by"])
        self.observe(self._show_title, names="caption")
        self._picker.observe(self._on_pick, names="value")
        self.observe(self._show_selected, names="selected")
        ipw.link((self._color, "value"), (self, "color_by"))
        self.caption, self.color_by = caption, color_by
        self.records = rollout_dicts(records)
        self.anchors = anchor_dicts(anchors)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_run(cls, run_dir: str | Path, step: int | None = None,
                 task_id: str | None = None, **kwargs) -> AnchorView:
        """The anchors of ``task_id`` at ``step`` in ``run_dir/anchors.jsonl`` (defaults: the
        latest step with anchors, its first task) with that group's ``rollouts.jsonl``
        records."""
        run = open_run(run_dir)
        step, task_id, anchors = pick_task(run.read("anchors.jsonl"), step, task_id)
        recs = [r for r in read_rollouts(run)
                if r["step"] == step and r["task_id"] == task_id]
        caption = f"{task_id} at step {step}"
        return cls(anchors, records_by_rollout(recs, anchors), caption=caption, **kwargs)

    @classmethod
    def from_task(cls, anchors: Sequence[Anchor], rollouts: Sequence, rewards: Sequence[float],
                  buggy_code: str, caption: str = "", **kwargs) -> AnchorView:
        """In memory: ``anchors = task_anchors(rollouts, rewards, buggy_code)``. Members index
        ``rollouts`` by position; with no trained advantages, tokens are coloured by A_D."""
        kwargs.setdefault("color_by", "a_d")
        return cls(anchors, rollout_dicts(rollouts, buggy_code, rewards), caption=caption,
                   **kwargs)

    # ------------------------------------------------------------------ validation
    @validate("selected")
    def _check_selected(self, proposal: Mapping) -> int:
        i = proposal["value"]
        if self.anchors and not 0 <= i < len(self.anchors):
            raise TraitError(f"selected must be in [0, {len(self.anchors)}); got {i}")
        return i

    @validate("color_by")
    def _check_color_by(self, proposal: Mapping) -> str:
        if proposal["value"] not in COLOR_BY:
            raise TraitError(f"color_by must be one of {COLOR_BY}; got {proposal['value']!r}")
        return proposal["value"]

    # ------------------------------------------------------------------ drawing
    def _show_title(self, _change: Mapping | None = None) -> None:
        head = f"<b>{escape(self.caption)}</b>: " if self.caption else ""
        self._title.value = (f"{head}{len(self.anchors)} anchors "
                             "(GS = (1 - exp(-L/s0)) (1 - exp(-(n-1)/g0)); "
                             "A_D = R_i - mean R of the anchor's group)")

    def _on_pick(self, change: Mapping) -> None:
        if change["new"] is not None:  # None: the options were just emptied
            self.selected = change["new"]

    def _show_selected(self, _change: Mapping | None = None) -> None:
        if self.anchors:
            self._picker.value = self.selected

    def _on_data(self, _change: Mapping | None = None) -> None:
        with shown_in(self.out):
            self._show_title()
            self._picker.unobserve(self._on_pick, names="value")  # options reset its value
            try:
                self._picker.options = [(anchor_label(a), i) for i, a in enumerate(self.anchors)]
            finally:
                self._picker.observe(self._on_pick, names="value")
            if not self.anchors:
                self._table.value = "<i>no anchors for this task</i>"
            if self.selected != 0:
                self.selected = 0  # re-renders
            else:
                self._show_selected()
                self._render()

    def _view(self, k: int) -> DiffView:
        while len(self._views) <= k:
            view = DiffView()
            view.add_class("labkit-anchor-member")
            self._views.append(view)
        return self._views[k]

    def _render(self, _change: Mapping | None = None) -> None:
        with shown_in(self.out):
            self.out.outputs = ()
            if not self.anchors:
                self._members_table.value, self._members.children = "", ()
                return
            bold = [i == self.selected for i in range(len(self.anchors))]
            self._table.value = frame_html(anchors_table(self.anchors), signed=["GS"],
                                           bold_rows=bold,
                                           css_class="labkit-table labkit-anchor-table")
            anchor = self.anchors[self.selected]
            rewards = " ".join(f"{m['reward']:.3f}" for m in anchor["members"])
            self._members_table.value = (
                f"<div>anchor #{anchor['id']} ({escape(anchor['source'])}), "
                f"group rewards: {rewards}</div>"
                + frame_html(members_table(anchor), signed=["A_D"],
                             css_class="labkit-table labkit-anchor-members-table"))
            boxes = member_outlines(anchor)
            shown, values = [], {}
            for m in anchor["members"]:
                rec = self.records[m["rollout"]] if m["rollout"] < len(self.records) else None
                if rec is None:
                    shown.append(ipw.HTML(f"<i>rollout {m['rollout']}: not in the records "
                                              "(log_rollouts limits what is logged)</i>"))
                    continue
                values[m["rollout"]] = self._values(rec, m["rollout"])
            scale = symmetric_scale(v for vs, _ in values.values() for v in vs)
            k = 0
            for m in anchor["members"]:
                if m["rollout"] not in values:
                    continue
                rec = self.records[m["rollout"]]
                view = self._view(k)
                vals, label = values[m["rollout"]]
                view.show_record(rec, outlines=boxes[m["rollout"]], values=vals, scale=scale,
                                 value_label=label,
                                 caption=f"rollout {m['rollout']} · A_D {m['a_d']:+.3f} · "
                                         + member_caption(rec))
                shown.append(view)
                k += 1
            self._members.children = shown

    def _values(self, rec: Mapping, rollout: int) -> tuple[list[float], str]:
        """What colours a member's tokens, and the legend's label (a record without trained
        advantages falls back to the anchors' A_D)."""
        if self.color_by == "advantages" and rec.get("advantages"):
            return list(rec["advantages"]), "advantage (trained)"
        return anchor_token_values(self.anchors, rollout, len(rec["offsets"])), "A_D (anchors)"
