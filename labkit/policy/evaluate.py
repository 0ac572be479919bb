"""Held-out evaluation of a policy: sample, execute, report pass@k.

``evaluate(policy, tasks)`` samples ``k`` completions per task at temperature ``T`` (plus
one greedy completion), runs every extracted program in the sandbox, and reports

* ``pass_at_1``: the unbiased pass@1 of the sampled completions (the mean pass rate),
* ``pass_at_k`` for k in {1, 2, 4, 8, ...} up to ``k`` (Chen et al. 2021 estimator),
* ``greedy_pass_at_1``, the copy rate (the completion is the buggy code unchanged),
* ``name_kept_rate``: the share of samples that define the entry point under its own name
  (a garbled name fails every test, whatever the body),
* ``token_entropy``: the mean per-token entropy of the sampling distribution in nats,
  estimated without a second forward as the mean of ``-log pi(y_t)`` over the sampled tokens
  (an unbiased estimate: ``E_y[-log pi(y)] = H(pi)``, at the sampling temperature),
* ``zero_var_groups_frac``: the share of tasks whose ``k`` samples all pass the same fraction
  of the tests (a GRPO group of them would have no signal at all),
* per-bug-kind and per-family pass@1, and a per-task table (pandas-ready records).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from labkit.env.feedback import defines_entry_point, is_noop
from labkit.sandbox.records import Candidate
from labkit.env.records import RepairTask
from labkit.sandbox.pool import default_sandbox, run_distinct
from labkit.policy.rollout import SamplingConfig, pass_at_k, sample


@dataclass
class EvalConfig:
    """Held-out evaluation settings."""

    k: int = 8
    """Samples per task: pass@1 is their mean pass rate, and pass@k is reported for k in {1, 2,
    4, 8, 16, 32} up to this. More samples make pass@1 less noisy at k times the cost."""
    temperature: float = 0.7
    """Sampling temperature of the k samples (``token_entropy`` is measured at it). Below 1
    reads the policy's likelier behaviour: less noise, but more optimistic than the T = 1 that
    RL samples at."""
    max_new_tokens: int = 320
    """Longest completion in tokens; a fix cut off at this length usually fails its tests."""
    greedy: bool = True
    """Also decode one near-greedy completion per task (T = 1e-4) for ``greedy_pass_at_1``: one
    more sampling and sandbox pass."""
    batch_size: int = 64
    """Sequences per sampling batch (tasks x k are chunked to fit)."""
    parallel_chunks: int = 1
    """Sampling batches decoded at once on CPU threads, each from its own random stream
    (:attr:`~labkit.policy.rollout.SamplingConfig.parallel_chunks`; ``1``: one after another
    from one stream, as the journal's earlier evaluations)."""
    seed: int = 1234
    """Sampling seed: fix it to evaluate different checkpoints on the same random numbers (a
    paired comparison)."""

    def validate(self) -> None:
        if self.k < 1 or self.max_new_tokens < 1 or self.batch_size < 1 or self.parallel_chunks < 1:
            raise ValueError(f"k, max_new_tokens, batch_size and parallel_chunks must be >= 1, "
                             f"got {self.k}, {self.max_new_tokens}, {self.batch_size} and "
                             f"{self.parallel_chunks}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (a tiny value for near-greedy), got "
                             f"{self.temperature}")


def _run(policy, tasks, cfg: SamplingConfig, sandbox, progress):
    rollouts = sample(policy, tasks, cfg, progress=progress)
    by_id = {t.task_id: t for t in tasks}
    cands = [Candidate(code=r.code, tests=by_id[r.task_id].tests,
                       entry_point=by_id[r.task_id].entry_point, id=r.task_id) for r in rollouts]
    results = run_distinct(sandbox, cands)  # the k samples often repeat a program
    return rollouts, results


def evaluate(policy, tasks: Sequence[RepairTask], config: EvalConfig | None = None, *,
             sandbox=None, progress: bool = False) -> dict:
    cfg = config or EvalConfig()
    if not tasks:
        raise ValueError("evaluate: no tasks to evaluate (the task list is empty); "
                         "ask for more problems or another split")
    if sandbox is None:
        sandbox = default_sandbox()
    scfg = SamplingConfig(group_size=cfg.k, temperature=cfg.temperature,
                          max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                          seed=cfg.seed, parallel_chunks=cfg.parallel_chunks)
    rollouts, results = _run(policy, tasks, scfg, sandbox, progress)
    greedy_ok: dict[str, bool] = {}
    if cfg.greedy:
        gcfg = dataclasses.replace(scfg, group_size=1, temperature=1e-4)
        g_roll, g_res = _run(policy, tasks, gcfg, sandbox, progress)
        greedy_ok = {r.task_id: res.ok for r, res in zip(g_roll, g_res)}

    per_task = []
    for i, t in enumerate(tasks):
        rs = results[i * cfg.k:(i + 1) * cfg.k]
        ro = rollouts[i * cfg.k:(i + 1) * cfg.k]
        c = sum(r.ok for r in rs)
        fractions = [r.fraction for r in rs]
        per_task.append({
            "task_id": t.task_id, "bug_kinds": ",".join(t.bug_kinds),
            "family": t.meta.get("family", t.source), "n": cfg.k, "correct": c,
            "pass_at_1": c / cfg.k, "copies": sum(is_noop(t.buggy_code, r.code) for r in ro),
            "names_kept": sum(defines_entry_point(r.code, t.entry_point) for r in ro),
            "mean_tests": sum(r.fraction for r in rs) / cfg.k,
            "greedy_ok": greedy_ok.get(t.task_id),
            "all_equal": len(set(fractions)) == 1,
            "nll_sum": -sum(sum(r.logprobs) for r in ro), "tokens": sum(r.n_tokens for r in ro),
        })
    n = len(per_task)
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= cfg.k]
    report = {
        "tasks": n, "samples_per_task": cfg.k, "temperature": cfg.temperature,
        "pass_at_1": sum(p["pass_at_1"] for p in per_task) / n,
        **{f"pass_at_{k}": sum(pass_at_k(cfg.k, p["correct"], k) for p in per_task) / n for k in ks},
        "copy_rate": sum(p["copies"] for p in per_task) / (n * cfg.k),
        "name_kept_rate": sum(p["names_kept"] for p in per_task) / (n * cfg.k),
        "mean_tests_passed": sum(p["mean_tests"] for p in per_task) / n,
        "token_entropy": sum(p["nll_sum"] for p in per_task) / max(1, sum(p["tokens"] for p in per_task)),
        "zero_var_groups_frac": sum(p["all_equal"] for p in per_task) / n,
    }
    if cfg.greedy:
        report["greedy_pass_at_1"] = sum(bool(v) for v in greedy_ok.values()) / n
    for key in ("bug_kinds", "family"):
        groups: dict[str, list[float]] = defaultdict(list)
        for p in per_task:
            groups[p[key]].append(p["pass_at_1"])
        report[f"by_{key}"] = {g: round(sum(v) / len(v), 4) for g, v in sorted(groups.items())}
    report["per_task"] = per_task
    return report
