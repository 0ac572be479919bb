"""Resuming a run with changes: which config fields may change.

``python -m labkit train --resume RUN --set k=v`` continues the run in ``RUN`` from its last
checkpoint. The checkpoint holds the optimiser, the schedule and the running statistics of
the config the run was trained under, so most fields cannot change without the run folder no
longer saying what was trained (an estimator switched mid-run, a learning rate the
optimiser's restored state overrides). :data:`RESUMABLE` lists what may change: how long the
run goes on, how it is checkpointed and logged, and where it is watched.
:func:`resume_config` refuses the rest in one line naming each field;
:func:`labkit.runs.history.record_changes` rewrites ``config.json`` and appends the change to
``config_history.jsonl``, which ``python -m labkit runs`` shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from labkit.config import apply_overrides, from_dict, parse_override, to_dict
from labkit.loops.checkpoints import latest_checkpoint
from labkit.loops.config import TrainConfig
from labkit.runs.history import config_changes, value_text
from labkit.runs.trackers import WATCH_FIELDS

RESUMABLE = ("steps", "checkpoint_every", "keep_checkpoints", "log_rollouts", *WATCH_FIELDS)
"""``TrainConfig`` fields (a section: every field in it) a resume may change. ``steps`` only
upwards of the checkpoint and under a constant learning rate after warm-up (a decaying
schedule ends at ``steps``: moving it changes the rate of the steps already planned)."""


class ResumeError(ValueError):
    """A resume asks for a change it cannot make; the message names the fields."""


def refused(changes: Mapping[str, list], schedule: str, done: int) -> list[str]:
    """The changes a resume from step ``done`` of a run with learning-rate schedule
    ``schedule`` may not make, each as ``field (old -> new)``."""
    out = []
    for key, (old, new) in changes.items():
        top = key.split(".")[0]
        bad = top not in RESUMABLE
        if key == "steps":
            bad = new < done or (schedule != "constant" and new != old)
        if bad:
            out.append(f"{key} ({value_text(old)} -> {value_text(new)})")
    return out


def checkpoint_step(run_dir: str | Path) -> int:
    """The step of the run's newest complete checkpoint (0: none)."""
    ckpt = latest_checkpoint(run_dir)
    return int(ckpt.name.split("_")[-1]) if ckpt is not None else 0


def resume_config(run_dir: str | Path, overrides: Sequence[str]) -> tuple[TrainConfig, dict]:
    """The config a resume of the run in ``run_dir`` trains (its ``config.json`` with
    ``overrides``) and what they change (:func:`config_changes`). Raises :class:`ResumeError`
    for a change not in :data:`RESUMABLE`, a ``steps`` below the checkpoint's or moved under a
    decaying schedule, and an override of ``run_dir`` (the folder resumed is the run's)."""
    run_dir = str(run_dir)
    if any(parse_override(item)[0][0] == "run_dir" for item in overrides):
        raise ResumeError(f"--resume {run_dir}: --set run_dir cannot go with --resume (the run "
                          "stays in its folder); drop it, or train a new run_dir without --resume")
    old = from_dict(TrainConfig, json.loads(Path(run_dir, "config.json").read_text()))
    old.run_dir = run_dir
    new = apply_overrides(old, list(overrides))
    new.run_dir = run_dir
    changes = config_changes(to_dict(old), to_dict(new))
    done = checkpoint_step(run_dir)
    bad = refused(changes, old.optim.schedule, done)
    if bad:
        may = ", ".join(f"{f}.*" if f == "trackers" else f for f in RESUMABLE)
        why = (f"; steps must stay >= {done} (the checkpoint's step) and cannot move under the "
               f"{old.optim.schedule} schedule" if any(b.startswith("steps ") for b in bad) else "")
        raise ResumeError(f"--resume {run_dir}: {', '.join(bad)} cannot change on resume (the "
                          f"checkpoint at step {done} was trained with them){why}; a resume may "
                          f"change {may}: train a new run_dir for the others")
    return new, changes


