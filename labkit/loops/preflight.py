"""What a training run checks before anything loads: the mistakes a config's own validation
cannot see, because they need an installed package, a file, the model's size, the run folder
or the tasks.

``python -m labkit train`` calls :func:`check_run` before it builds the trainer, so a tracker
not installed, a missing policy folder, a completion longer than the model's positions, a
folder holding another run or an empty task list fails in one line, before the model loads
and before the run folder is written. The tasks it loads are the ones the trainer then trains
on (loaded once).
"""

from __future__ import annotations

import os
from pathlib import Path

from labkit.env.records import RepairTask
from labkit.env.task_sampling import check_train_tasks, run_tasks
from labkit.loops.checkpoints import held_run_error
from labkit.loops.config import TrainConfig
from labkit.runs.events import RunFolder
from labkit.runs.trackers import check_installed, report_to_names
from labkit.policy.loading import check_completion_length, resolve_spec


def check_run(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False,
              ) -> tuple[list[RepairTask], list[RepairTask]]:
    """The run's training and held-out tasks, once the run is known to be able to start,
    checked cheapest first: the trackers are installed
    (:class:`~labkit.runs.trackers.TrackerError`), then ``ValueError`` (a
    :class:`~labkit.policy.loading.PolicyLoadError` for the policy) saying what to change, or
    :class:`~labkit.loops.checkpoints.RunFolderError` for a new run whose folder holds another
    (neither ``resume`` nor ``overwrite``)."""
    check_installed(report_to_names(cfg.report_to))
    resolve_spec(cfg.policy.spec)
    check_completion_length(cfg.policy.spec, cfg.sampling.max_new_tokens, "sampling.max_new_tokens")
    if cfg.tasks.source in ("humanevalpack", "records") and not cfg.tasks.path:
        raise ValueError(f"tasks.source {cfg.tasks.source!r} reads a file: set tasks.path to it")
    if cfg.tasks.path and not Path(cfg.tasks.path).is_file():
        raise ValueError(f"tasks.path {cfg.tasks.path!r}: no such file; give the task file "
                         f"tasks.source {cfg.tasks.source!r} reads")
    run = RunFolder(cfg.run_dir)
    if not resume and not overwrite and first_process() and run.holds_run():
        raise held_run_error(run)
    try:
        train = run_tasks(cfg.tasks, cfg.seed, "train")
        held_out = run_tasks(cfg.tasks, cfg.seed, "eval")
    except FileNotFoundError as e:
        raise ValueError(f"tasks: {e}") from None
    check_train_tasks(train, cfg.tasks)
    return train, held_out


def first_process() -> bool:
    """Whether this is process 0 of its launch (``torchrun`` and ``accelerate launch`` set
    ``RANK``; one process is process 0): the one that writes the run folder."""
    return os.environ.get("RANK", "0") == "0"
