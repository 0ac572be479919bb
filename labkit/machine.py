"""The facts a measured time depends on, stored with every record that holds one (benchmark
lines, the lab's notebook times, the test suite's durations): cores, the 1-minute load
average when the measurement ended, torch's threads and versions. A figure read without them
cannot be compared with another."""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


def facts() -> dict:
    """Cores, load average (1 min), torch threads, Python, torch and CPU names."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cores": os.cpu_count(), "load_1min": round(load, 2) if load is not None else None,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}


def thread_budget(requested: int) -> int:
    """The torch threads to use for ``requested``: at most ``OMP_NUM_THREADS`` where the
    environment sets it. A process that shares the cores with others (a test worker per core,
    two notebooks at once) is given one thread that way; more threads than its share of the
    cores make OpenMP's workers spin against each other (a smoke run of notebook 05 beside one
    busy process: 31 s at one thread, 107 s at two)."""
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(requested, int(cap))) if cap.isdigit() and int(cap) > 0 else max(1, requested)


def run_own_session(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, start_new_session=True, **kwargs)``: a helper child (ruff, git)
    in its own session, so a terminal's Ctrl-C meant for the trainer (which finishes the step
    under way) spares it. A Ctrl-C that lands between the fork and the child's ``setsid()``
    is still the old group's: held pending while the child starts, it kills the child once its
    handlers are reset (exit ``-SIGINT``); that child is run once more, now in its own session."""
    for _ in range(2):
        proc = subprocess.run(cmd, start_new_session=True, **kwargs)
        if proc.returncode != -signal.SIGINT:
            break
    return proc


def cpu_seconds(own: bool = False) -> float:
    """User + system CPU seconds of the children that have exited (notebook kernels, sandbox
    workers, browsers, torchrun), plus this process's own with ``own``; the difference of two
    readings is the CPU a piece of work cost, and over the cores a floor on its wall time."""
    who = (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF) if own else (resource.RUSAGE_CHILDREN,)
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who))


def append_record(path: str | Path, record: Mapping) -> dict:
    """Append ``record`` with the UTC time and :func:`facts` as one JSON line to ``path``
    (created with its folder); returns the line's object."""
    rec = {**record, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": facts()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def read_records(path: str | Path) -> list[dict]:
    """Every JSON line of ``path`` (none when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
