"""ipywidgets views over labkit's trainer events, run folders and rollout records.

=====================  ==========================================================
``DiffView``           buggy code | completion coloured by per-token advantage
``AdvantageInspector`` one group: components -> reward -> advantage per estimator
``TrainingDashboard``  live curves from trainer events, or a replay of a run folder
``RewardTuner``        reshaping sliders recomputing a stored batch's advantages
``AnchorView``         a task's DiDPO anchors; selecting one outlines it in every member
``RunsTable``          run folders side by side; clicking one replays it in a dashboard
=====================  ==========================================================

Each widget lives in its own module next to the pure functions it draws with; see
``docs/widgets.md``.
"""

from widgets.anchorview import AnchorView
from widgets.dashboard import TrainingDashboard, metrics_to_series
from widgets.diffview import DiffView, render_tokens_html
from widgets.inspector import AdvantageInspector
from widgets.runs import RunsTable
from widgets.tuner import RewardTuner, recompute

__all__ = ["AdvantageInspector", "AnchorView", "DiffView", "RewardTuner", "RunsTable",
           "TrainingDashboard",
           "metrics_to_series", "recompute", "render_tokens_html"]
