"""The runs table: run folders side by side, with the config fields that differ between them.

``python -m labkit runs [DIR]`` prints it (``--json`` for scripts) and ``widgets.runs.RunsTable``
shows it in a notebook. Everything is read from the folders (``config.json``,
``metrics.jsonl``, ``eval.jsonl``, ``running.json``); nothing is written.

Per run: its folder (relative to ``DIR``), estimator, reshaping recipe (the name in
``labkit.credit.reshaping.RECIPES`` whose config it equals, else ``custom``), feedback regime,
seed, steps done and planned, the last step's reward, held-out pass@1 at the first and the
last evaluation, wall time (logged step and evaluation seconds), the changes made when it was
resumed (``config_history.jsonl``, :mod:`labkit.runs.history`) and status:

- ``running``: a process's running mark is there and the process lives (on another host,
  whose processes cannot be looked at: the logs changed within :data:`STALE_S`);
- ``finished``: every planned step is logged;
- ``stopped``: neither (stopped between steps, killed, or crashed; ``--resume`` goes on).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.config import to_dict
from labkit.credit.reshaping import RECIPES
from labkit.runs.events import RunFolder
from labkit.runs.history import history_text, read_history
from labkit.runs.trackers import WATCH_FIELDS, flat_config

STALE_S = 3600.0
"""A running mark written on another host counts while the run's logs changed this recently."""
SHOWN = ("run_dir", "estimator", "seed", "steps", "feedback.mode")
"""Config fields the table shows in its own columns (never listed as differing); nor are the
watch-only ones (``WATCH_FIELDS``: where a run is watched is not what it trains)."""
COLUMNS = ("run", "estimator", "recipe", "feedback", "seed", "steps", "reward", "pass@1",
           "wall", "status")
"""The fixed columns of the printed table, before the differing config fields."""


def is_run_config(cfg: Any) -> bool:
    """Whether a ``config.json`` holds a training run's config (not, say, a model's)."""
    return isinstance(cfg, dict) and {"estimator", "steps", "reshape"} <= set(cfg)


def find_runs(root: str | Path) -> list[Path]:
    """Run folders at or under ``root`` (sorted), those whose ``config.json`` is a training
    config; tracker and checkpoint folders are not searched."""
    root = Path(root)
    found = []
    for cfg in sorted(root.rglob("config.json")):
        parts = cfg.relative_to(root).parts[:-1]
        if "trackers" in parts or "checkpoints" in parts:
            continue
        try:
            if is_run_config(json.loads(cfg.read_text())):
                found.append(cfg.parent)
        except (OSError, ValueError):
            continue
    return found


def recipe_name(reshape: Mapping[str, Any]) -> str:
    """The name of the recipe in ``RECIPES`` whose config equals ``reshape`` (as JSON, so
    tuples and lists compare equal), else ``custom``."""
    mine = json.loads(json.dumps(reshape))
    for name, make in RECIPES.items():
        if json.loads(json.dumps(to_dict(make()))) == mine:
            return name
    return "custom"


def run_status(steps_done: int, steps: int, mark: Mapping | None, alive: bool | None,
               idle_s: float) -> str:
    """``running``, ``finished`` or ``stopped`` (see the module docstring). ``mark``: the
    running mark or ``None``; ``alive``: whether its process lives (``None``: on another
    host, not known); ``idle_s``: seconds since the run's logs last changed."""
    if mark is not None and (alive if alive is not None else idle_s < STALE_S):
        return "running"
    return "finished" if steps_done >= steps else "stopped"


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def run_row(path: str | Path, root: str | Path | None = None) -> dict[str, Any]:
    """One run folder's row of the table (``config``: its config as a dict)."""
    run = RunFolder(path)
    cfg = run.read_json("config.json")
    rows, evals = run.read("metrics.jsonl"), run.read("eval.jsonl")
    mark = run.running_mark()
    alive = None
    if mark is not None and mark.get("host") == socket.gethostname():
        alive = pid_alive(int(mark.get("pid", -1)))
    logs = [run.file(n) for n in ("metrics.jsonl", "eval.jsonl", RunFolder.RUNNING)]
    changed = max((p.stat().st_mtime for p in logs if p.exists()), default=0.0)
    done = rows[-1]["step"] if rows else 0
    name = Path(path).relative_to(root).as_posix() if root is not None else str(path)
    return {
        "run": Path(path).name if name == "." else name, "path": str(path),
        "estimator": cfg.get("estimator"), "recipe": recipe_name(cfg.get("reshape", {})),
        "feedback": (cfg.get("feedback") or {}).get("mode"), "seed": cfg.get("seed"),
        "steps_done": done, "steps": cfg.get("steps"),
        "reward_last": rows[-1].get("reward/mean") if rows else None,
        "pass_at_1_start": evals[0].get("eval/pass_at_1") if evals else None,
        "pass_at_1_end": evals[-1].get("eval/pass_at_1") if evals else None,
        "wall_s": (sum(r.get("time/step") or 0.0 for r in rows)
                   + sum(e.get("time/eval") or 0.0 for e in evals)),
        "status": run_status(done, cfg.get("steps", 0), mark, alive, time.time() - changed),
        "changes": read_history(path),
        "config": cfg,
    }


_MISSING = "(absent)"


def differing_fields(configs: Sequence[Mapping[str, Any]], recipes_named: bool = True,
                     ) -> list[str]:
    """Flattened config keys (``loss.kl_coef``) whose values are not the same in every
    config (a key some configs lack differs), sorted, without the :data:`SHOWN` and the
    watch-only ones (``report_to``, ``trackers.*``); the ``reshape.*`` keys only when
    ``recipes_named`` is false (the recipe column says it)."""
    flats = [flat_config(c) for c in configs]
    keys = sorted(set().union(*flats)) if flats else []
    out = []
    for k in keys:
        if (k in SHOWN or k.split(".")[0] in WATCH_FIELDS
                or (recipes_named and k.startswith("reshape."))):
            continue
        if len({json.dumps(f.get(k, _MISSING)) for f in flats}) > 1:
            out.append(k)
    return out


def runs_table(root: str | Path) -> dict[str, Any]:
    """The table of every run under ``root``: ``{"dir", "runs", "differing"}``, each run's
    row carrying ``differs``, its values of the ``differing`` fields (``config`` dropped)."""
    root = Path(root)
    rows = [run_row(p, root) for p in find_runs(root)]
    configs = [r.pop("config") for r in rows]
    keys = differing_fields(configs, recipes_named=all(r["recipe"] != "custom" for r in rows))
    for row, cfg in zip(rows, configs):
        flat = flat_config(cfg)
        row["differs"] = {k: flat.get(k) for k in keys}
    return {"dir": str(root), "runs": rows, "differing": keys}


def format_wall(seconds: float | None) -> str:
    """``1h02m``, ``12m05s`` or ``45s``; ``-`` for nothing logged."""
    if not seconds:
        return "-"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _num(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "-"


def columns(table: Mapping[str, Any]) -> list[str]:
    """The printed table's columns: the :data:`COLUMNS`, ``changed on resume`` when a run
    was resumed with changes, then each differing field."""
    changed = ["changed on resume"] if any(r.get("changes") for r in table["runs"]) else []
    return [*COLUMNS, *changed, *table["differing"]]


def display_rows(table: Mapping[str, Any]) -> list[dict[str, str]]:
    """The table's runs as text cells, one per :func:`columns` entry."""
    out = []
    for r in table["runs"]:
        cells = {"run": r["run"], "estimator": str(r["estimator"]), "recipe": r["recipe"],
                 "feedback": str(r["feedback"]), "seed": str(r["seed"]),
                 "steps": f"{r['steps_done']}/{r['steps']}", "reward": _num(r["reward_last"]),
                 "pass@1": (f"{_num(r['pass_at_1_start'])} -> {_num(r['pass_at_1_end'])}"
                            if r["pass_at_1_start"] is not None else "-"),
                 "wall": format_wall(r["wall_s"]), "status": r["status"],
                 "changed on resume": history_text(r.get("changes") or []) or "-"}
        for k in table["differing"]:
            v = r["differs"].get(k)
            cells[k] = "-" if v is None else v if isinstance(v, str) else json.dumps(v)
        out.append(cells)
    return out


def format_table(table: Mapping[str, Any]) -> str:
    """The runs table as aligned text (a header line, then one line per run)."""
    rows = display_rows(table)
    if not rows:
        return f"no run folders under {table['dir']}"
    cols = columns(table)
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols)]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
