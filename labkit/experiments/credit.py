"""``python -m labkit experiment credit``: which per-token credit agrees with each edit's true
effect, measured where there is a signal to agree with?

Data: two-bug, multi-hunk tasks (each bug its own, separately tested hunk) of the training
templates (``val``) and of the held-out list (``test``); the shipped model samples groups of
``G`` rollouts at the training temperature. Only **informative groups** count: groups whose
rewards (the fraction of hidden tests passed) are not all equal, since every group estimator
gives an all-equal group zero credit. Tasks are drawn until ``groups`` informative groups from
at least ``min_tasks`` distinct tasks are in.

Ground truth, independent of how any estimator builds its credit: each hunk's **exact Shapley
value** over the rollout's hunks (:mod:`labkit.loops.hunks`: every subset of the hunks applied
to the buggy code and run). An estimator's credit for a hunk is the mean of its per-token
advantages over the hunk's tokens. Agreement: Spearman's rank correlation pooled over hunks
and within rollouts (each rollout's credits and values centred), and sign agreement; 95%
intervals resample tasks (a task's hunks share its rollouts and groups).

Estimators: ``grpo``, ``didpo``, ``didpo`` A_D only, ``didpo_group_mean`` (non-paper),
``didpo_fork``, and three references: **oracle** (the Shapley values themselves on each hunk's
tokens, scaled per group as GRPO scales: ``oracle_hunk`` without ``A_E``; it agrees with the
truth by construction, so it is a ceiling, not a control), **revert_one** (each hunk's effect
when it alone is reverted, ``R(c) - R(c without h)``, scaled the same way: measured credit
that differs from the Shapley value where hunks interact, the signed positive control) and
**shuffled** (the Shapley values permuted among each group's hunks, the negative control).

The claim, named before the run (:data:`PRIMARY`): DiDPO's credit ranks the hunks *within a
rollout* as their Shapley values do (GRPO gives every hunk of a rollout the same credit, so the
pooled agreement mostly measures which rollouts did well, not which hunk did).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit.config import to_record
from labkit.machine import thread_budget
from labkit.credit.advantages import AdvantageInput, compute_advantages
from labkit.sandbox.records import Candidate
from labkit.sandbox.pool import Sandbox
from labkit.env.tasks import load_tasks
from labkit import provenance
from labkit.credit.advantages import HunkValues
from labkit.env.edits import rollout_hunks
from labkit.experiments import claims, pages, stats
from labkit.experiments.claims import Contrast
from labkit.experiments.config import DEFAULT_OUT, command
from labkit.experiments.methods import METHODS
from labkit.loops.forks import measure_forks
from labkit.loops.hunks import hunk_values, subset_program
from labkit.runs.metrics import average_ranks
from labkit.policy import forking as fk
from labkit.policy.loading import load_policy, weights_fingerprint
from labkit.policy.rollout import SamplingConfig, collate, sample
from labkit.seeding import derive_seed

TITLE = "Which credit is right? Per-hunk credit against each hunk's Shapley value"


@dataclass
class Config:
    """Budget of the credit experiment (``--set key=value``)."""

    splits: tuple[str, ...] = ("val", "test")
    """Splits the tasks come from: ``val`` (the templates the experiments train on) and
    ``test`` (the held-out templates), drawn in turn."""
    groups: int = 200
    """Informative groups to collect (rewards not all equal)."""
    min_tasks: int = 60
    """...from at least this many distinct tasks."""
    max_rounds: int = 3
    """Sampling rounds over the task pool (another sampling seed each) before giving up."""
    pool: int = 240
    """Tasks per split in the pool."""
    n_bugs: int = 2
    """Bugs per task, each in its own, separately tested hunk (``multi_hunk``)."""
    group_size: int = 8
    """G: rollouts sampled per task (one group)."""
    tasks_per_batch: int = 8
    """Tasks per sampling batch."""
    temperature: float = 1.6
    """The training temperature of the experiments: the groups training sees."""
    max_new_tokens: int = 320
    """Completion budget per rollout, shared with its forks."""
    max_hunks: int = 4
    """Rollouts with more hunks are left out (``2^K - 2`` programs each for the ground truth)."""
    fork_strategy: str = "diff"
    """Where ``didpo_fork`` forks: ``diff`` draws tokens on changed lines, inside the hunks."""
    fork_fraction: float = 0.5
    """Forks per rollout as a share of its completion tokens (at most ``fork_budget``)."""
    fork_budget: int = 4
    """At most this many forks per rollout."""
    bootstrap: int = 1000
    """Resamples of the tasks for each 95% interval."""
    seed: int = 0
    """Seeds the task lists, the sampling, the forks and the bootstrap."""
    policy: str = "tiny"
    """The policy that samples and forks (its EMA baseline equals it)."""
    threads: int = 2
    """torch threads (at most ``OMP_NUM_THREADS`` where the environment sets it:
    :func:`labkit.machine.thread_budget`)."""
    out: str = DEFAULT_OUT
    """Folder of ``credit.md``, ``.json``, ``.html``, ``.png``; publishing is explicit:
    ``out=docs/results``."""
    smoke: bool = False
    """A smoke run (``experiment credit --smoke``, the :data:`SMOKE` budget): its page says its
    numbers decide nothing."""


ESTIMATORS = {  # the records' label -> the method (labkit.experiments.methods.METHODS)
    "grpo": "grpo",
    "didpo": "didpo",
    "didpo (A_D only)": "didpo_no_ae",
    "didpo_group_mean (non-paper)": "didpo_group_mean",
    "didpo_fork": "didpo_fork_hunk",
    "oracle": "oracle",
    "revert_one": "revert_one",
    "shuffled": "shuffled",
}
"""The methods whose credit is compared, under the labels the records keep: ``oracle`` the
ceiling, ``revert_one`` the positive control (``oracle_hunk`` on revert-one effects instead of
Shapley values) and ``shuffled`` the floor. Each method's estimator and options are the ones
it trains with."""

PRIMARY = (
    Contrast("DiDPO within-rollout agreement", "claim", "didpo", None, +1,
             source="DiDPO (arXiv 2608.07147) credits each code diff by its anchor group; no size "
                    "of agreement is stated, so only the direction is claimed"),
    Contrast("revert-one within-rollout agreement", "positive", "revert_one", None, +1),
    Contrast("shuffled within-rollout agreement", "negative", "shuffled", None, +1),
)
"""The claim and its signed controls: within-rollout Spearman rho of each estimator's hunk
credit with the Shapley values (above 0: it ranks a rollout's hunks right)."""

SMOKE = {"groups": 4, "min_tasks": 2, "max_rounds": 1, "pool": 8, "fork_budget": 1,
         "bootstrap": 50}
"""``--smoke``: a few informative groups, the whole pipeline."""


# ============================================================================= agreement


def spearman(x, y) -> float:
    """Spearman's rho: the Pearson correlation of average ranks; NaN when fewer than two
    points or either side is constant (undefined)."""
    if len(x) != len(y):
        raise ValueError("spearman: x and y differ in length")
    if len(x) < 2:
        return math.nan
    rx, ry = average_ranks(list(x)), average_ranks(list(y))
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


def sign_agreement(credit, value) -> float:
    """Over pairs with ``value != 0``: the fraction with ``sign(credit) == sign(value)`` (a
    credit of 0 disagrees); NaN when no value is non-zero."""
    pairs = [(c, e) for c, e in zip(credit, value) if e != 0]
    if not pairs:
        return math.nan
    return sum((c > 0) == (e > 0) and c != 0 for c, e in pairs) / len(pairs)


def cluster_draws(records: list[dict], stat, n_boot: int, seed: int) -> list[float]:
    """``stat(records*)`` on ``n_boot`` resamples of whole tasks (a task's hunks together);
    undefined draws left out, none for fewer than two tasks."""
    by: dict = {}
    for r in records:
        by.setdefault((r["split"], r["task_id"]), []).append(r)
    clusters = list(by.values())
    if len(clusters) < 2 or n_boot < 1:
        return []
    return stats.bootstrap_draws(lambda rng: stat([r for c in stats.resample(clusters, rng) for r in c]),
                                 n_boot, seed)


def cluster_interval(records: list[dict], stat, n_boot: int, seed: int) -> list[float]:
    """95% percentile interval of :func:`cluster_draws` (NaN when there are none)."""
    draws = cluster_draws(records, stat, n_boot, seed)
    return stats.percentile_interval(draws) if draws else [math.nan, math.nan]


def centred(records: list[dict], label: str) -> list[dict]:
    """Each hunk's credit and value minus its rollout's means, over rollouts with at least
    two hunks: what is left once differences between rollouts are removed."""
    by: dict = {}
    for r in records:
        by.setdefault((r["split"], r["task_id"], r["round"], r["sample"]), []).append(r)
    out = []
    for rs in by.values():
        if len(rs) < 2:
            continue
        mc = statistics.fmean(r["credit"][label] for r in rs)
        mv = statistics.fmean(r["value"] for r in rs)
        out += [{**r, "c": round(r["credit"][label] - mc, 9), "v": round(r["value"] - mv, 9)} for r in rs]
    return out


def agreement(records: list[dict], label: str, n_boot: int, seed: int) -> dict:
    """Spearman (pooled and within rollouts) and sign agreement of ``credit[label]`` with the
    hunk's Shapley ``value``, each with its interval resampling tasks."""
    def rho(rs):
        return spearman([r["credit"][label] for r in rs], [r["value"] for r in rs])

    def sign(rs):
        return sign_agreement([r["credit"][label] for r in rs], [r["value"] for r in rs])

    def within(rs):
        w = centred(rs, label)
        return spearman([r["c"] for r in w], [r["v"] for r in w])

    within_draws = cluster_draws(records, within, n_boot, seed)
    return {"spearman": rho(records), "spearman_ci95": cluster_interval(records, rho, n_boot, seed),
            "within": within(records),
            "within_ci95": stats.percentile_interval(within_draws) if within_draws else [math.nan] * 2,
            "within_se": statistics.stdev(within_draws) if len(within_draws) > 1 else math.nan,
            "within_hunks": len(centred(records, label)),
            "sign": sign(records), "sign_ci95": cluster_interval(records, sign, n_boot, seed),
            "credit_nonzero_frac": statistics.fmean(r["credit"][label] != 0 for r in records)
            if records else math.nan}


_Z975, _Z80 = 1.959964, 0.841621
"""Standard normal quantiles 0.975 and 0.80."""


# ============================================================================= data


def hunk_mean(adv: torch.Tensor, row: int, tokens) -> float:
    """``c_h = mean_{u in tokens} adv[row, u]`` rounded to 9 decimals (equal credits averaged
    over different token counts compare equal)."""
    return round(adv[row, list(tokens)].double().mean().item(), 9)


class MemoRunner:
    """Runs each distinct (task, program) once in the sandbox; rewards are the fraction of
    hidden tests passed."""

    def __init__(self, sandbox):
        self.sandbox, self.memo, self.runs = sandbox, {}, 0

    def __call__(self, tasks, codes) -> list[float]:
        keys = [(t.task_id, c) for t, c in zip(tasks, codes)]
        todo = {k: Candidate(code=c, tests=t.tests, entry_point=t.entry_point, id=t.task_id)
                for k, t, c in zip(keys, tasks, codes) if k not in self.memo}
        if todo:
            self.runs += len(todo)
            for k, res in zip(todo, self.sandbox.run_many(list(todo.values()))):
                self.memo[k] = res.fraction
        return [self.memo[k] for k in keys]


def credit_batch(policy, tasks, cfg: Config, split: str, rnd: int, index: int, runner) -> tuple[list, dict]:
    """One batch: sample, keep the informative groups, measure the hunks' Shapley values and
    the forks, and every estimator's credit for every hunk. Returns hunk records and costs."""
    scfg = SamplingConfig(group_size=cfg.group_size, temperature=cfg.temperature,
                          max_new_tokens=cfg.max_new_tokens,
                          seed=derive_seed(cfg.seed, "credit", split, rnd, index))
    t0 = time.time()
    rollouts = sample(policy, tasks, scfg)
    by_id = {t.task_id: t for t in tasks}
    rewards = runner([by_id[r.task_id] for r in rollouts], [r.code for r in rollouts])
    groups: dict = {}
    for r, x in zip(rollouts, rewards):
        groups.setdefault(r.task_id, []).append(x)
    keep = [b for b, r in enumerate(rollouts) if max(groups[r.task_id]) > min(groups[r.task_id])]
    cost = {"groups": len(groups), "informative": sum(max(v) > min(v) for v in groups.values()),
            "sample_s": time.time() - t0}
    if not keep:
        return [], cost
    rolls = [rollouts[b] for b in keep]
    task_of = [by_id[r.task_id] for r in rolls]
    own = [rewards[b] for b in keep]
    t0 = time.time()
    buggy = runner(task_of, [t.buggy_code for t in task_of])
    hunks, hm = hunk_values(rolls, task_of, runner, own, buggy, cfg.max_hunks)
    cost["truth_s"], cost["subset_programs"] = time.time() - t0, hm["hunks/programs"]
    t0 = time.time()
    forks = measure_forks(
        policy, rolls, task_of, own, runner,
        fk.PositionConfig(cfg.fork_strategy, cfg.fork_fraction, cfg.fork_budget,
                          seed=derive_seed(cfg.seed, "credit-pos", split, rnd, index)),
        fk.ForkConfig.from_sampling(scfg, seed=derive_seed(cfg.seed, "credit-fork", split, rnd, index)),
        baseline=policy.baseline())
    cost["fork_s"], cost["forks"] = time.time() - t0, len(forks.batch.forks)
    mask = collate(rolls, policy.tokenizer.pad_token_id)["completion_mask"].double()  # [B, T]
    inp = AdvantageInput(torch.tensor(own, dtype=torch.float64), [r.task_id for r in rolls], mask,
                         rollouts=rolls, tasks=task_of, forks=forks.sites, hunks=hunks)
    loo = revert_one_values(rolls, task_of, runner, own, hunks)
    advs = {lab: compute_advantages(METHODS[m].estimator,
                                    dataclasses.replace(inp, hunks=loo) if m == "revert_one" else inp,
                                    **METHODS[m].estimator_options).advantages
            for lab, m in ESTIMATORS.items()}
    records = []
    for b, (r, row) in enumerate(zip(rolls, hunks.rows)):
        for k, (tokens, value) in enumerate(row):
            if tokens:
                records.append({"split": split, "task_id": r.task_id, "round": rnd, "sample": r.sample,
                                "k": k, "value": value, "reward": own[b], "n_tokens": len(tokens),
                                "credit": {lab: hunk_mean(a, b, tokens) for lab, a in advs.items()}})
    return records, cost


def revert_one_values(rolls, tasks, runner, own, hunks: HunkValues) -> HunkValues:
    """Each hunk's revert-one effect ``R(c) - R(c without h)`` in place of its Shapley value (the
    same hunks and tokens; the programs were run for the Shapley values, so ``runner``'s memo
    answers)."""
    rows = []
    for r, t, reward, row in zip(rolls, tasks, own, hunks.rows):
        if not row:
            rows.append([])
            continue
        located = [h.hunk for h in rollout_hunks(r, t.buggy_code)]
        k = len(located)
        codes = [subset_program(r.code, located, [j for j in range(k) if j != i]) for i in range(k)]
        without = runner([t] * k, codes)
        rows.append([(tokens, reward - w) for (tokens, _), w in zip(row, without)])
    return HunkValues(rows)


def _pool(cfg: Config) -> list[tuple[str, object]]:
    """The task pool: ``cfg.pool`` two-bug multi-hunk tasks of each split, interleaved."""
    lists = [[(s, t) for t in load_tasks("synthetic", split=s, n=cfg.pool * 4, seed=cfg.seed,
                                          n_bugs=cfg.n_bugs, multi_hunk=True)[:cfg.pool]]
             for s in cfg.splits]
    return [x for row in zip(*lists) for x in row] + [x for lst in lists for x in lst[min(map(len, lists)):]]


# ============================================================================= run


def run(cfg: Config) -> Path:
    t_start = time.time()
    torch.set_num_threads(thread_budget(cfg.threads))
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.policy)
    pool = _pool(cfg)
    records, costs, informative = [], [], set()
    n_groups = 0
    with Sandbox() as sandbox:
        runner = MemoRunner(sandbox)
        for rnd in range(cfg.max_rounds):
            for index, c0 in enumerate(range(0, len(pool), cfg.tasks_per_batch)):
                if n_groups >= cfg.groups and len({t for t, _ in informative}) >= cfg.min_tasks:
                    break
                chunk = pool[c0:c0 + cfg.tasks_per_batch]
                for split in dict.fromkeys(s for s, _ in chunk):
                    tasks = [t for s, t in chunk if s == split]
                    recs, cost = credit_batch(policy, tasks, cfg, split, rnd, index, runner)
                    records += recs
                    costs.append({"split": split, **cost})
                    n_groups += cost["informative"]
                    informative |= {(r["task_id"], rnd) for r in recs}
                print(f"round {rnd} batch {index}: {n_groups} informative groups, "
                      f"{len({t for t, _ in informative})} tasks, {len(records)} hunks", flush=True)
            else:
                continue
            break
    exp_cfg = to_record(cfg)
    results = {"experiment": "credit", "config": exp_cfg, "command": _command(cfg),
               "setting": {"model": cfg.policy, "model_sha256": weights_fingerprint(cfg.policy),
                           "seeds": [cfg.seed], "temperature": cfg.temperature,
                           "splits": list(cfg.splits), "n_bugs": cfg.n_bugs},
               "informative_groups": n_groups,
               "informative_tasks": len({t for t, _ in informative}),
               "groups_sampled": sum(c["groups"] for c in costs),
               "sandbox_runs": runner.runs, "wall_s": round(time.time() - t_start, 1),
               "cost": {k: sum(c.get(k, 0) for c in costs) for k in
                        ("sample_s", "truth_s", "fork_s", "forks", "subset_programs")},
               "hunks": records}
    results["agreement"] = agreement_table(records, cfg.bootstrap, cfg.seed)
    now = provenance.label(provenance.code_identity())
    results["provenance"] = {"code": now, "runs": [now], "allow_code_drift": False,
                             "clean_single_commit": now != "unknown" and "+dirty" not in now}
    results["primary"] = claims.read(results, PRIMARY, PRIMARY_KEY, getter=_within)
    return pages.write_page(results, cfg.out, render, figure)


PRIMARY_KEY = "all"
"""The claim is read on the hunks of both splits together."""


def _within(results, c: Contrast, key: str):
    """:data:`PRIMARY`'s getter: an estimator's within-rollout rho with its interval over
    tasks and its smallest detectable value (``(z_0.975 + z_0.80) se``, ``se`` the bootstrap
    draws' SD: the tasks are the sample)."""
    a = results["agreement"].get(key, {}).get("estimators", {}).get(c.variant)
    if not a or a.get("within") != a.get("within"):
        return None, None
    se = a.get("within_se")
    return {"mean": a["within"], "ci95": a["within_ci95"], "se": se,
            "mde": (_Z975 + _Z80) * se if se == se and se is not None else None,
            "tasks": results["agreement"][key].get("tasks")}, None


def restat(results: dict) -> dict:
    """The agreement computed again from the stored hunk records, and the claim read again."""
    cfg = results["config"]
    done = all("within_se" in a for t in results.get("agreement", {}).values()
               for a in t["estimators"].values() if a)
    if not done:  # a record from before the interval kept its spread
        results["agreement"] = agreement_table(results["hunks"], cfg["bootstrap"], cfg["seed"])
    results.pop("controls", None)
    results["primary"] = claims.read(results, PRIMARY, PRIMARY_KEY, getter=_within)
    return results


def _command(cfg: Config) -> str:
    return command("credit", cfg)


def agreement_table(records: list[dict], n_boot: int, seed: int) -> dict:
    """Per split and ``all``: hunk counts and every estimator's :func:`agreement` (the ones
    every record carries: a record of an older run may lack a newer estimator)."""
    table = {}
    splits = sorted({r["split"] for r in records})
    for name in [*splits, "all"]:
        recs = [r for r in records if name == "all" or r["split"] == name]
        table[name] = {"hunks": len(recs), "nonzero_value": sum(r["value"] != 0 for r in recs),
                       "tasks": len({r["task_id"] for r in recs}),
                       "estimators": {lab: agreement(recs, lab, n_boot, seed) if recs else {}
                                      for lab in ESTIMATORS
                                      if all(lab in r["credit"] for r in recs)}}
    return table


def _fmt(x, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def render(results: dict) -> str:
    """The page of a credit results JSON."""
    c, tab = results["config"], results["agreement"]
    what = (f"The shipped policy samples groups of {c['group_size']} at T = {c['temperature']} on "
            f"{c['n_bugs']}-bug, multi-hunk tasks of the `{'`, `'.join(c['splits'])}` templates; only "
            f"groups whose rewards differ count. **{results['informative_groups']} informative groups "
            f"from {results['informative_tasks']} tasks** ({results['groups_sampled']} groups sampled). "
            "Ground truth per hunk: its exact Shapley value over the rollout's hunks (every subset "
            "applied to the buggy code and run). Credit of an estimator for a hunk: the mean of its "
            "per-token advantages over the hunk's tokens. Intervals: 95% bootstrap over tasks.")
    rule = ("Intervals are 95% percentile intervals resampling tasks (a task's hunks together; one "
            "sampling seed: the tasks are the sample). The claim and its controls were named "
            "before the run (primary); the rest of the page is exploratory.")
    lines = pages.header(results, TITLE, what, rule) + pages.primary_lines(results)
    lines += ["The pooled agreement (below, a secondary column) mostly measures which rollouts did "
              "well: GRPO's credit is one number per rollout and still reaches a high pooled rho. "
              "The within-rollout rho asks the credit question itself: which hunk of a rollout did "
              "the work. `oracle` agrees by construction (its credit is the Shapley value).", "",
              "## Agreement of each estimator's credit with the Shapley values (exploratory)", "",
              "Within-rollout rho: credit and value centred on their rollout's mean, over rollouts "
              "with two or more hunks (`grpo` gives every hunk of a rollout the same credit).", "",
              "| tasks | estimator | hunks | within-rollout rho (hunks) | pooled Spearman rho | sign agreement | credit != 0 |",
              "|---|---|---|---|---|---|---|"]
    for name, t in tab.items():
        for lab, a in t["estimators"].items():
            if not a:
                continue
            lines.append(f"| {name} ({t['tasks']} tasks) | {lab} | {t['hunks']} | {_fmt(a['within'])} "
                         f"{stats.interval_text(a['within_ci95'], 2)} ({a['within_hunks']}) | "
                         f"{_fmt(a['spearman'])} {stats.interval_text(a['spearman_ci95'], 2)} | "
                         f"{_fmt(a['sign'])} | {_fmt(a['credit_nonzero_frac'], 2)} |")
    cost = results["cost"]
    lines += ["", f"Cost: {results['sandbox_runs']} sandbox runs ({cost['subset_programs']:.0f} subset "
              f"programs for the ground truth), {cost['forks']:.0f} forks; sampling "
              f"{cost['sample_s']:.0f} s, ground truth {cost['truth_s']:.0f} s, forks {cost['fork_s']:.0f} s; "
              f"{results['wall_s']:.0f} s in all.", ""] + pages.figure_line("credit")
    return "\n".join(lines)


def figure(results: dict, out: Path):
    """Pooled and within-rollout rho of every estimator, with their intervals."""
    import plotly.graph_objects as go

    est = results["agreement"]["all"]["estimators"]
    labels = [lab for lab in est if est[lab]]
    fig = go.Figure()
    for key, name in (("spearman", "pooled over hunks"), ("within", "within rollouts")):
        ys = [est[lab][key] for lab in labels]
        lo = [y - est[lab][f"{key}_ci95"][0] for y, lab in zip(ys, labels)]
        hi = [est[lab][f"{key}_ci95"][1] - y for y, lab in zip(ys, labels)]
        fig.add_trace(go.Bar(x=labels, y=ys, name=name,
                             error_y={"type": "data", "array": hi, "arrayminus": lo}))
    fig.update_layout(title="credit: Spearman rho with the hunks' Shapley values (95% over tasks)",
                      xaxis_title="estimator", yaxis_title="Spearman rho", barmode="group",
                      template="plotly_white")
    return pages.save_figure(fig, out, "credit")
