"""``RewardTuner``: move the reshaping knobs, see a stored batch's rewards and advantages move.

The batch is the records of one step (their feedback ``components``); every change of a
slider or toggle rebuilds the :class:`~labkit.credit.reshaping.ReshapeConfig` and
recomputes through the one credit pipeline the trainer uses
(:class:`labkit.credit.pipeline.Credit`: composite reward -> normalisation -> estimator ->
advantage transforms). The table compares each rollout with the starting
config: reward, advantage and rank inside its group; Kendall's tau per group says how
much the ranking changed (1 = same order).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import ipywidgets as ipw
import pandas as pd
import torch
from traitlets import Instance, List, Unicode

from labkit.config import from_dict
from labkit.credit.advantages import ADVANTAGE_ESTIMATORS
from labkit.credit.pipeline import Credit, CreditInput
from labkit.env.feedback import FEEDBACK_MODES, FeedbackConfig, r_feedback_of_record
from labkit.credit.reshaping import COMPONENT_OFF, RECIPES, ReshapeConfig, components_on, recipe
from labkit.loops.trainer import TrainConfig
from labkit.docs.reference import field_docs
from widgets.errors import shown_in
from widgets.records import at_step, open_run, read_rollouts
from widgets.tables import frame_html
from widgets.static import StaticView

SLIDERS: tuple[tuple[str, float, float, float], ...] = (
    ("w_test", 0.0, 2.0, 0.05), ("w_precision", 0.0, 1.0, 0.05), ("w_style", 0.0, 1.0, 0.05),
    ("w_progress", 0.0, 1.0, 0.05), ("w_hack", 0.0, 2.0, 0.05), ("adv_clip", 0.0, 10.0, 0.5),
    ("amplify_power", 0.1, 2.0, 0.05), ("focus_threshold", 0.0, 2.0, 0.05),
)
"""``(field, min, max, step)`` of each slider (a max widens to fit the starting value)."""
TOGGLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gate_precision", ("none", "edit", "improved")), ("normalise", ("none", "batch", "running")),
    ("amplify", ("none", "signed_power", "piecewise")),
)
"""``(field, choices)`` of each toggle."""


# ----------------------------------------------------------------------------- pure helpers


def recompute(records: Sequence[Mapping], cfg: ReshapeConfig, estimator: str = "grpo",
              feedback: FeedbackConfig | None = None) -> pd.DataFrame:
    """Rewards and advantages of one step's records under ``cfg``, as the trainer computes
    them (a fresh :class:`labkit.credit.pipeline.Credit`, so no running statistics).

    Columns: ``task_id``, ``sample``, ``term/<name>`` (weighted terms), ``reward``
    (composite), ``reward_norm`` (after ``cfg.normalise``; a stored batch has no running
    statistics, so ``running`` starts from mean 0, std 1), ``advantage`` (estimator, then
    ``transform_advantages``) and ``rank`` (1 = best reward in its group, ties share).
    The precision gate ``improved`` compares with ``record["buggy_r_test"]`` when a record
    has it, else with 0. ``feedback`` re-reads every record's ``r_feedback`` under another
    regime (:func:`labkit.env.feedback.r_feedback_of_record`); ``None`` keeps the run's own.
    """
    steps = {r["step"] for r in records}
    if len(steps) != 1:
        raise ValueError(f"recompute needs the records of one step; got steps {sorted(steps)}")
    credit = Credit(cfg, estimator)
    credit.step = max(0, steps.pop() - 1)  # records carry step + 1 (logged after the step)
    comps = [r["components"] for r in records]
    if feedback is not None:
        comps = [{**c, "r_feedback": r_feedback_of_record(r, feedback)} for c, r in zip(comps, records)]
    groups = [r["task_id"] for r in records]
    # one token per sequence, in the dtype the trainer's completion mask has (float32)
    out = credit(CreditInput(comps, groups, torch.ones(len(records), 1, dtype=torch.float32),
                             [r.get("buggy_r_test") for r in records]))
    rewards, terms, normed, adv = out.rewards, out.terms, out.normalised, out.advantages[:, 0]
    frame = pd.DataFrame({"task_id": groups, "sample": [r["sample"] for r in records],
                          **{f"term/{k}": [t[k] for t in terms] for k in terms[0]},
                          "reward": rewards.tolist(), "reward_norm": normed.tolist(),
                          "advantage": adv.tolist()})
    frame["rank"] = (frame["reward"].round(9).groupby(frame["task_id"])
                     .rank(ascending=False, method="min").astype(int))
    return frame


def component_effects(records: Sequence[Mapping], cfg: ReshapeConfig, estimator: str = "grpo",
                      tol: float = 1e-4) -> pd.DataFrame:
    """For every reshaping component ``cfg`` switches on: the largest change of any advantage
    of this batch when that component alone is switched off
    (:data:`labkit.credit.reshaping.COMPONENT_OFF`), and whether it *acts* (``> tol``).

    Batch normalisation and an EMA baseline are affine in the rewards, so they cannot act
    under an estimator that standardises (``grpo``, ``batch_norm``); a clip acts only above
    :func:`labkit.credit.reshaping.max_standardised_advantage` of the group size. Measuring
    on the batch says the same for any estimator, including the ones no rule covers."""
    base = recompute(records, cfg, estimator)["advantage"]
    rows = []
    for name in components_on(cfg):
        off = recompute(records, dataclasses.replace(cfg, **COMPONENT_OFF[name]), estimator)
        delta = float((base - off["advantage"]).abs().max())
        rows.append({"component": name, "max_change": delta, "acts": delta > tol})
    return pd.DataFrame(rows, columns=["component", "max_change", "acts"])


def kendall_tau(a: Sequence[float], b: Sequence[float], tol: float = 1e-9) -> float:
    """Kendall's tau-b of two rankings (ties allowed; NaN when one side is all ties):
    ``sum s_a s_b / sqrt(sum s_a^2 sum s_b^2)`` over pairs, ``s = sign(x_i - x_j)``."""
    def sign(x: float) -> int:
        return 0 if abs(x) <= tol else (1 if x > 0 else -1)

    num = den_a = den_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            sa, sb = sign(a[i] - a[j]), sign(b[i] - b[j])
            num, den_a, den_b = num + sa * sb, den_a + sa * sa, den_b + sb * sb
    return num / math.sqrt(den_a * den_b) if den_a and den_b else math.nan


def compare(start: pd.DataFrame, now: pd.DataFrame) -> pd.DataFrame:
    """Side by side, one row per rollout: ``reward@start``, ``reward``, ``A@start``, ``A``,
    ``rank@start``, ``rank`` and ``moved`` (``rank@start - rank``: > 0 moved up)."""
    keys = ["task_id", "sample"]
    out = start[keys + ["reward", "advantage", "rank"]].merge(
        now[keys + ["reward", "advantage", "rank"]], on=keys, suffixes=("@start", ""))
    out = out.rename(columns={"advantage@start": "A@start", "advantage": "A"})
    out["moved"] = out["rank@start"] - out["rank"]
    return out[keys + ["reward@start", "reward", "A@start", "A", "rank@start", "rank", "moved"]]


def group_taus(compared: pd.DataFrame) -> pd.Series:
    """Kendall's tau between the start and current rewards of each group (by ``task_id``)."""
    return pd.Series({task: kendall_tau(g["reward@start"].tolist(), g["reward"].tolist())
                      for task, g in compared.groupby("task_id", sort=False)}, dtype=float)


def summary_html(compared: pd.DataFrame) -> str:
    """One line: mean Kendall tau over groups with a defined tau, and how many rollouts moved."""
    taus = group_taus(compared).dropna()
    tau = f"{taus.mean():.3f} over {len(taus)} groups" if len(taus) else "undefined (all ties)"
    moved = int((compared["moved"] != 0).sum())
    return (f"ranking vs start: mean Kendall tau {tau}; "
            f"<b>{moved}</b> of {len(compared)} rollouts changed rank")


def effects_html(effects: pd.DataFrame, estimator: str) -> str:
    """One line: which switched-on components change this batch's advantages under
    ``estimator``, and which cannot (inert)."""
    if effects.empty:
        return ""
    acts = [r.component for r in effects.itertuples() if r.acts]
    inert = [r.component for r in effects.itertuples() if not r.acts]
    return (f"<br>under <code>{estimator}</code>: acting {', '.join(acts) or 'none'}; "
            f"<b>inert</b> (no advantage moves) {', '.join(inert) or 'none'}")


def run_reshape_config(run_dir: str | Path) -> ReshapeConfig:
    """The ``reshape`` section of a run's ``config.json``, read as the trainer reads it (a
    missing section or key takes ``TrainConfig``'s default, the raw recipe)."""
    path = Path(run_dir) / "config.json"
    section = open_run(run_dir).read_json("config.json").get("reshape", {}) if path.exists() else {}
    return from_dict(TrainConfig, {"reshape": section}).reshape


# ----------------------------------------------------------------------------- widget


class RewardTuner(StaticView, ipw.VBox):
    """Sliders and toggles over a :class:`ReshapeConfig`, recomputing a stored batch at once.

    ``config`` is the live config (the controls write it; setting it moves the controls);
    ``start`` is the reference the table compares with; ``frame`` is the table shown.
    """

    records = List(help="One step's rollout records.")
    config = Instance(ReshapeConfig, help="The config the controls edit.")
    start = Instance(ReshapeConfig, help="The config the table compares with.")
    estimator = Unicode("grpo", help="Advantage estimator (labkit.credit.advantages).")
    feedback = Unicode("as run", help="Feedback regime the batch is re-read under ('as run' or "
                                      "one of labkit.env.feedback.FEEDBACK_MODES).")
    frame = Instance(pd.DataFrame, allow_none=True, help="compare(start, config) of the batch.")

    def __init__(self, records: Sequence[Mapping], start: ReshapeConfig | None = None,
                 estimator: str = "grpo"):
        start = start or recipe("raw")
        docs = field_docs(ReshapeConfig)  # each control's tooltip: the field's docstring
        label = {"description_width": "120px"}  # the longest name (focus_threshold) in full
        self.controls: dict[str, ipw.ValueWidget] = {
            **{name: ipw.FloatSlider(description=name, min=lo, max=hi, step=step,
                                     continuous_update=False, style=label,
                                     tooltip=docs.get(name, name), layout=ipw.Layout(width="98%"))
               for name, lo, hi, step in SLIDERS},
            **{name: ipw.ToggleButtons(description=name, options=choices, tooltip=docs.get(name, name),
                                       style={"button_width": "90px", **label})
               for name, choices in TOGGLES},
        }
        # only estimators a stored batch is enough for (no rollouts, tasks or forks needed)
        self._estimator = ipw.Dropdown(options=ADVANTAGE_ESTIMATORS.names(needs=()), value=estimator,
                                           description="estimator")
        self._recipe = ipw.Dropdown(options=["(custom)", *RECIPES], value="(custom)",
                                        description="recipe")
        self._feedback = ipw.Dropdown(options=["as run", *FEEDBACK_MODES], value="as run",
                                          description="feedback")
        self._reset = ipw.Button(description="reset to start", icon="undo")
        self._summary = ipw.HTML()
        self._table = ipw.HTML()
        self.out = ipw.Output()
        grid = ipw.GridBox(list(self.controls.values()),
                               layout=ipw.Layout(grid_template_columns="repeat(2, 50%)"))
        # the table scrolls in its own box, so the controls and the ranks fit one screen
        table_box = ipw.Box([self._table], layout=ipw.Layout(max_height="340px", overflow="auto"))
        super().__init__(children=[grid, ipw.HBox([self._recipe, self._estimator, self._feedback, self._reset]),
                                   self._summary, table_box, self.out],
                         records=[dict(r) for r in records], start=start,
                         config=dataclasses.replace(start), estimator=estimator)
        self.add_class("labkit-tuner")
        for name, control in self.controls.items():
            control.observe(functools.partial(self._on_control, name), names="value")
        ipw.link((self._estimator, "value"), (self, "estimator"))
        ipw.link((self._feedback, "value"), (self, "feedback"))
        self._reset.on_click(self._on_reset)
        self._recipe.observe(self._on_recipe, names="value")
        self.observe(self._show_config, names="config")
        self.observe(self._recompute, names=["records", "start", "estimator", "feedback"])
        self._show_config()

    @classmethod
    def from_run(cls, run_dir: str | Path, step: int | None = None,
                 start: ReshapeConfig | None = None, estimator: str = "grpo") -> RewardTuner:
        """The batch of ``step`` (default: the latest) from ``run_dir/rollouts.jsonl``,
        starting from ``start`` (default: the run's own reshaping config)."""
        records = at_step(read_rollouts(open_run(run_dir)), step)
        return cls(records, start or run_reshape_config(run_dir), estimator)

    def _on_control(self, name: str, change: Mapping) -> None:
        with shown_in(self.out):
            self.config = dataclasses.replace(self.config, **{name: change["new"]})

    def _on_recipe(self, change: Mapping) -> None:
        """Load a named recipe (:data:`labkit.credit.reshaping.RECIPES`) into the controls."""
        if change["new"] in RECIPES:
            with shown_in(self.out):
                self.config = recipe(change["new"])

    def _on_reset(self, _button: ipw.Button) -> None:
        self.config = dataclasses.replace(self.start)

    def _show_config(self, _change: Mapping | None = None) -> None:
        for name, control in self.controls.items():  # a no-op for the control that moved
            value = getattr(self.config, name)
            if isinstance(control, ipw.FloatSlider):  # a slider clamps: widen it instead
                control.min, control.max = min(control.min, value), max(control.max, value)
            control.value = value
        self.controls["amplify_power"].disabled = self.config.amplify != "signed_power"
        self._recompute()

    def _recompute(self, _change: Mapping | None = None) -> None:
        with shown_in(self.out):
            self.out.outputs = ()
            regime = None if self.feedback == "as run" else FeedbackConfig(mode=self.feedback)
            self.frame = compare(recompute(self.records, self.start, self.estimator),
                                 recompute(self.records, self.config, self.estimator, regime))
            effects = component_effects(self.records, self.config, self.estimator)
            self._summary.value = summary_html(self.frame) + effects_html(effects, self.estimator)
            self._table.value = frame_html(self.frame, signed=["A@start", "A"],
                                           bold_rows=(self.frame["moved"] != 0).tolist(),
                                           css_class="labkit-table labkit-tuner-table")
