"""Paired held-out evaluation: the starting policy and each run's final checkpoint on the
same tasks, with the same sampling seed, so that a change in pass@1 is measured task by
task instead of as the difference of two noisy means.

``python -m labkit paired RUN_DIR [RUN_DIR ...] --tasks 400 --k 4`` prints, per run, the
mean per-task change ``d = mean_i (c_i^end - c_i^start) / k`` with a 95% bootstrap interval
over tasks, and writes the per-task counts as JSON (``--out``).
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
from pathlib import Path
from typing import Sequence
from labkit.config import from_dict
from labkit.env.balanced import balanced_synthetic
from labkit.env.sandbox import Sandbox
from labkit.env.tasks import load_tasks
from labkit.loops.trainer import TrainConfig, latest_checkpoint
from labkit.policy.evaluate import EvalConfig, evaluate
from labkit.policy.loading import load_policy


def paired_difference(start: Sequence[float], end: Sequence[float], n_boot: int = 2000,
                      seed: int = 0) -> dict:
    """Mean of ``end_i - start_i`` over tasks and its 95% percentile-bootstrap interval
    (tasks resampled with replacement, ``n_boot`` times, a fixed RNG)."""
    if len(start) != len(end) or not start:
        raise ValueError("start and end need the same, non-zero number of tasks")
    d = [e - s for s, e in zip(start, end)]
    rng = random.Random(seed)
    n = len(d)
    boots = sorted(statistics.fmean(d[rng.randrange(n)] for _ in range(n)) for _ in range(n_boot))
    lo, hi = boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]
    return {"mean": statistics.fmean(d), "ci95": [lo, hi], "tasks": n,
            "improved": sum(x > 0 for x in d), "worsened": sum(x < 0 for x in d)}


def policy_at(run_dir: str | Path, step: int | None = None):
    """The run's policy at its newest complete checkpoint (or ``step``; 0 = the start)."""
    import torch

    run = Path(run_dir)
    cfg = from_dict(TrainConfig, json.loads((run / "config.json").read_text()))
    policy = load_policy(cfg.policy)
    if step == 0:
        return policy
    ckpt = run / "checkpoints" / f"step_{step:06d}" if step else latest_checkpoint(run)
    if ckpt is None or not (ckpt / "COMPLETE").exists():
        raise FileNotFoundError(f"{run}: no complete checkpoint{'' if step is None else f' at step {step}'}")
    params = dict(policy.model.named_parameters())
    with torch.no_grad():
        for name, value in torch.load(ckpt / "trainable.pt", weights_only=True).items():
            params[name].copy_(value)
    return policy


def held_out_tasks(n_tasks: int, split: str = "test", seed: int = 0, n_bugs: int = 1,
                   multi_hunk: bool = False, per_template: int | None = None) -> list:
    """The first ``n_tasks`` synthetic tasks of ``split`` (one buggy variant per problem), the
    same list for every run compared on them. ``per_template``: at most that many tasks of
    any one template, drawing further into the stream to fill the list
    (:func:`labkit.env.balanced.balanced_tasks`)."""
    per = 4 if multi_hunk else 1  # multi-hunk: about 40% of problems give one
    kinds = {"n_bugs": n_bugs, "multi_hunk": multi_hunk}
    if per_template:
        return balanced_synthetic(split, n_tasks, per_template, seed=seed,
                                  problems=2 * n_tasks * per, **kinds)
    return load_tasks("synthetic", split=split, n=n_tasks * per, seed=seed, **kinds)[:n_tasks]


def cache_name(task_ids: Sequence[str]) -> str:
    """File name of a run's cached paired evaluation on the tasks ``task_ids``."""
    return "paired-" + hashlib.sha256("\n".join(task_ids).encode()).hexdigest()[:10] + ".json"


def paired_eval(run_dirs: Sequence[str | Path], tasks: Sequence | int = 400, k: int = 4,
                seed: int = 0, eval_seed: int = 4321, start_k: int | None = None,
                temperature: float = 0.7) -> dict:
    """Evaluate the start policy (of the first run) and every run's final checkpoint on the
    same ``tasks`` (a list, or a number of synthetic test tasks of ``seed``), ``k`` samples
    each at ``temperature``, one sampling seed.

    ``start_k`` (default ``k``): samples per task for the start policy. Every run is compared
    with the same start measurement, so when several runs are pooled the start's sampling
    noise dominates the interval; a larger ``start_k`` shrinks it (the per-task difference
    of means stays unbiased).

    Results are kept in ``<run>/paired-<h>.json``, ``h`` a hash of the task ids (the run's
    per-task results, and the start's per ``start_k``), and reused when the tasks, ``k``,
    temperature and seed match, so a report can be rebuilt without evaluating again and one
    run can be compared on several task sets."""
    start_k = start_k or k
    if isinstance(tasks, int):
        tasks = held_out_tasks(tasks, seed=seed)
    key = {"tasks": len(tasks), "k": k, "eval_seed": eval_seed, "temperature": temperature,
           "task_ids": [t.task_id for t in tasks]}
    skey = "start_per_task" if start_k == k else f"start_per_task_k{start_k}"
    name = cache_name(key["task_ids"])
    cached = {}
    for d in run_dirs:
        try:
            c = json.loads((Path(d) / name).read_text())
        except (OSError, ValueError):
            continue
        if all(c.get(x, 0.7 if x == "temperature" else None) == v for x, v in key.items()):
            cached[str(d)] = c
    per = lambda rep: [p["pass_at_1"] for p in rep["per_task"]]  # noqa: E731
    out = {**key, "start_k": start_k, "runs": {}}
    with Sandbox() as sandbox:
        start = next((c[skey] for c in cached.values() if skey in c), None)
        if start is None:
            start = per(evaluate(policy_at(run_dirs[0], 0), tasks,
                                 EvalConfig(k=start_k, temperature=temperature, greedy=False,
                                            seed=eval_seed), sandbox=sandbox))
        out["start_per_task"] = start
        out["start_pass_at_1"] = statistics.fmean(start)
        ecfg = EvalConfig(k=k, temperature=temperature, greedy=False, seed=eval_seed)
        for d in run_dirs:
            c = cached.get(str(d), {**key})
            if "end_per_task" not in c:
                c["end_per_task"] = per(evaluate(policy_at(d), tasks, ecfg, sandbox=sandbox))
            c[skey] = start
            (Path(d) / name).write_text(json.dumps(c))
            end = c["end_per_task"]
            out["runs"][str(d)] = {"end_pass_at_1": statistics.fmean(end), "end_per_task": end,
                                   **paired_difference(start, end)}
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m labkit paired", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (each with config.json and checkpoints)")
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--start-k", type=int, default=None, help="samples per task for the start (default --k)")
    p.add_argument("--out", default=None, help="JSON file for the per-task counts")
    a = p.parse_args(argv)
    res = paired_eval(a.runs, a.tasks, a.k, start_k=a.start_k)
    for d, r in res["runs"].items():
        print(f"{d}: {res['start_pass_at_1']:.4f} -> {r['end_pass_at_1']:.4f}, paired change "
              f"{r['mean']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}] over {r['tasks']} tasks "
              f"({r['improved']} up, {r['worsened']} down)", flush=True)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({d: {k: r[k] for k in ("mean", "ci95", "end_pass_at_1")} for d, r in res["runs"].items()}
                     | {"start_pass_at_1": res["start_pass_at_1"]}))
    return 0
