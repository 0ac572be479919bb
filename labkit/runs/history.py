"""A run folder's record of the changes made to its config when it was resumed.

A resume that changes something (``python -m labkit train --resume RUN --set k=v``,
:mod:`labkit.loops.resume` decides what may change) rewrites the run's ``config.json`` and
appends the change to :data:`HISTORY` (:func:`record_changes`); the runs table
(:mod:`labkit.runs.table`) shows it (:func:`history_text`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.config import to_dict
from labkit.runs.events import RunFolder

HISTORY = "config_history.jsonl"
"""The run folder's record of the changes made on resume: one JSON line per resume that
changed something, ``{"step", "time", "changes": {field: [old, new]}}``."""


def flat(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"a.b": value}`` (values as they are; an empty section leaves
    no key)."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if isinstance(v, Mapping):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list]:
    """``{key: [old, new]}`` for each flattened key whose value differs between two config
    dicts (``None`` where one lacks the key), ``run_dir`` left out; sorted by key."""
    a, b = flat(old), flat(new)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
            if k != "run_dir" and json.dumps(a.get(k)) != json.dumps(b.get(k))}


def record_changes(run: RunFolder, cfg, changes: Mapping[str, list],
                   step: int) -> Callable[[], None]:
    """Write ``cfg`` to the run's ``config.json`` and append ``changes`` at ``step`` to
    :data:`HISTORY`; returns the undo (both files as they were), for a resume that fails
    before its first step."""
    before = {name: run.file(name).read_text() if run.file(name).exists() else None
              for name in ("config.json", HISTORY)}
    run.write_json("config.json", to_dict(cfg))
    run.append(HISTORY, {"step": step, "time": time.time(), "changes": dict(changes)})

    def undo() -> None:
        for name, text in before.items():
            if text is None:
                run.file(name).unlink(missing_ok=True)
            else:
                run.file(name).write_text(text)
    return undo


def read_history(run_dir: str | Path) -> list[dict]:
    """The run's :data:`HISTORY` records (none for a run never resumed with changes)."""
    return RunFolder(run_dir).read(HISTORY)


def history_text(history: Sequence[Mapping[str, Any]]) -> str:
    """The changes as one cell: ``steps 8->10 @8; report_to ["none"]->["tensorboard"] @10``."""
    return "; ".join(f"{k} {value_text(old)}->{value_text(new)} @{h['step']}"
                     for h in history for k, (old, new) in h["changes"].items())


def value_text(value: Any) -> str:
    """A config value as a history cell shows it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)
