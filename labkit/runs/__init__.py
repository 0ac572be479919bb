"""Floor 4, runs: what a training run leaves behind and who watches it.

A loop emits events on an :class:`~labkit.runs.events.EventBus` and writes a
:class:`~labkit.runs.events.RunFolder` (:mod:`.events`): its config, one metrics row per step
(the pure metric functions of :mod:`.metrics`), its rollout records (:mod:`.records`), the
config changes of its resumes (:mod:`.history`) and its trackers' runs (TensorBoard, W&B,
MLflow, trackio: :mod:`.trackers`). The runs table (:mod:`.table`) reads folders side by side;
:mod:`.background` runs a notebook's training in a thread its dashboard follows. Nothing here
trains or draws; the loops above write, the widgets read.
"""
