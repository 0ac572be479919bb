"""Events and run folders: how loops talk to the world without drawing anything.

A loop owns an :class:`EventBus` and calls ``bus.emit("on_step_end", ...)``; widgets and
notebooks subscribe with ``bus.on("on_step_end", fn)``; with no subscriber the loop runs
headless. A :class:`RunFolder` holds everything a run writes (config, ``metrics.jsonl``,
``rollouts.jsonl``, ``anchors.jsonl``, ``checkpoints/``, the trackers' ``trackers.json`` and
``trackers/``) so any view can reopen a run later; ``running.json`` says a process is
training it now.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

EVENTS = ("on_train_start", "on_rollout", "on_step_end", "on_eval", "on_checkpoint", "on_train_end")


class EventBus:
    def __init__(self):
        self._subs: dict[str, list[Callable]] = defaultdict(list)

    def on(self, event: str, fn: Callable) -> Callable:
        """Subscribe ``fn`` (once: subscribing the same function again is a no-op)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; events: {EVENTS}")
        if fn not in self._subs[event]:
            self._subs[event].append(fn)
        return fn

    def off(self, event: str, fn: Callable) -> None:
        if fn in self._subs[event]:
            self._subs[event].remove(fn)

    def emit(self, event: str, **payload: Any) -> None:
        for fn in list(self._subs[event]):
            fn(**payload)


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


class RunFolder:
    """Files of one run. JSONL files are appended one line per record and flushed with
    ``fsync`` so a killed run loses at most the line being written."""

    RUN_FILES = ("config.json", "metrics.jsonl", "eval.jsonl", "rollouts.jsonl", "anchors.jsonl",
                 "trackers.json", "config_history.jsonl")
    """What a run writes besides ``checkpoints/`` and ``trackers/``."""
    RUNNING = "running.json"
    """Written while a process trains the run: its pid, host and start time."""

    def __init__(self, path: str | Path):
        self.path = Path(path)  # nothing is created until something is written

    def file(self, name: str) -> Path:
        return self.path / name

    def holds_run(self) -> bool:
        """Whether the folder already holds (part of) a run: its config, a log or a checkpoint."""
        return (any(self.file(n).exists() for n in self.RUN_FILES)
                or any((self.path / "checkpoints").glob("step_*")))

    def clear(self) -> None:
        """Remove a previous run's files, checkpoints and tracker folders (other files are
        left alone)."""
        import shutil

        for n in self.RUN_FILES:
            self.file(n).unlink(missing_ok=True)
        for record in [*self.path.glob("provenance*.diff"), self.file("provenance.json")]:
            record.unlink(missing_ok=True)
        shutil.rmtree(self.path / "checkpoints", ignore_errors=True)
        shutil.rmtree(self.path / "trackers", ignore_errors=True)

    def mark_running(self) -> None:
        """Say this process trains the run now (:attr:`RUNNING`)."""
        self.write_json(self.RUNNING, {"pid": os.getpid(), "host": socket.gethostname(),
                                       "since": time.time()})

    def mark_stopped(self) -> None:
        """Remove this process's running mark (another process's is left alone)."""
        mark = self.running_mark()
        if mark is not None and mark.get("pid") == os.getpid() \
                and mark.get("host") == socket.gethostname():
            self.file(self.RUNNING).unlink(missing_ok=True)

    def held_elsewhere(self) -> dict | None:
        """The running mark of another process on this host that is still alive: it trains
        this run now (``None``: no other process does, or its mark is stale or from another
        host, whose processes this one cannot see)."""
        mark = self.running_mark()
        if not mark or mark.get("host") != socket.gethostname() or mark.get("pid") == os.getpid():
            return None
        try:
            os.kill(int(mark["pid"]), 0)
        except PermissionError:  # alive, another user's
            return mark
        except (OSError, KeyError, TypeError, ValueError):
            return None
        return mark

    def running_mark(self) -> dict | None:
        """The running mark (``None`` when there is none or it is unreadable)."""
        try:
            return json.loads(self.file(self.RUNNING).read_text())
        except (OSError, ValueError):
            return None

    def append(self, name: str, record: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.file(name), "a") as f:
            f.write(json.dumps(_clean(record)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self, name: str) -> list[dict]:
        """Records of a JSONL file; a torn last line (a kill mid-write) is ignored."""
        p = self.file(name)
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return out

    def iter(self, name: str) -> Iterator[dict]:
        yield from self.read(name)

    def truncate_after(self, name: str, step: int) -> int:
        """Keep only records with ``step <= step`` (resume: no row lost or duplicated).
        Returns how many were dropped."""
        rows = self.read(name)
        if not rows and not self.file(name).exists():
            return 0
        keep = [r for r in rows if r.get("step", -1) <= step]
        tmp = self.file(name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, self.file(name))
        return len(rows) - len(keep)

    def write_json(self, name: str, obj: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.file(name + ".tmp")
        tmp.write_text(json.dumps(_clean(obj), indent=2))
        os.replace(tmp, self.file(name))

    def read_json(self, name: str) -> dict:
        return json.loads(self.file(name).read_text())
