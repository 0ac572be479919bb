"""Rollout records and run folders as the widgets read them.

A record is one line of ``rollouts.jsonl`` (or one item of ``records`` in the trainer's
``on_step_end`` event), a :class:`labkit.runs.records.RolloutRecord` as a dict: ``step``,
``task_id``, ``sample``, ``completion``, ``offsets``, ``logprobs``, ``components``,
``reward``, ``advantages`` and more; :func:`read_rollouts` reads and checks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from labkit.env.records import COMPONENT_NAMES
from labkit.runs.events import RunFolder
from labkit.runs.records import read_rollouts

COMPONENTS = COMPONENT_NAMES
"""The feedback components a record carries, in display order
(:class:`labkit.env.records.Components`)."""

__all__ = ["COMPONENTS", "at_step", "describe", "group", "open_run", "read_rollouts",
           "sequence_advantage"]


def open_run(run_dir: str | Path) -> RunFolder:
    """The :class:`RunFolder` of an existing run (a missing folder is an error, not created)."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    return RunFolder(run_dir)


def sequence_advantage(record: Mapping) -> float:
    """One number per rollout: the mean of its per-token advantages (for sequence-level
    estimators every token holds the same value); 0.0 for an empty completion."""
    adv = record.get("advantages") or []
    return sum(adv) / len(adv) if adv else 0.0


def at_step(records: Sequence[Mapping], step: int | None = None) -> list[dict]:
    """The records of ``step`` (default: the latest step present)."""
    if not records:
        raise LookupError("no rollout records")
    step = max(r["step"] for r in records) if step is None else step
    out = [dict(r) for r in records if r["step"] == step]
    if not out:
        steps = sorted({r["step"] for r in records})
        raise LookupError(f"no records at step {step}; steps: {steps}")
    return out


def group(records: Sequence[Mapping], step: int | None = None,
          task_id: str | None = None) -> list[dict]:
    """One task's group at one step, ordered by sample (defaults: the latest step, and of its
    tasks the one whose rewards spread widest, the first logged among equals: a group whose
    rollouts all scored alike has every advantage 0 and nothing to show)."""
    batch = at_step(records, step)
    if task_id is None:
        rewards: dict[str, list[float]] = {}
        for r in batch:
            rewards.setdefault(r["task_id"], []).append(float(r.get("reward") or 0.0))
        task_id = max(rewards, key=lambda t: max(rewards[t]) - min(rewards[t]))  # first among ties
    out = sorted((r for r in batch if r["task_id"] == task_id), key=lambda r: r["sample"])
    if not out:
        tasks = sorted({r["task_id"] for r in batch})
        raise LookupError(f"task {task_id!r} has no records at step {batch[0]['step']}; "
                          f"tasks there: {tasks}")
    return out


def describe(record: Mapping) -> str:
    """A one-line label: ``step 3 · toy/inc/bug0 · sample 1 · reward 1.000 · passed``."""
    parts = [f"step {record.get('step', '?')}", str(record.get("task_id", "?")),
             f"sample {record.get('sample', '?')}"]
    if record.get("reward") is not None:
        parts.append(f"reward {record['reward']:.3f}")
    if record.get("status"):
        parts.append(str(record["status"]))
    if record.get("flags"):
        parts.append("flags: " + ", ".join(record["flags"]))
    return " · ".join(parts)
