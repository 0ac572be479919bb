"""``python -m labkit experiment credit``: which per-token credit agrees with the true effect
of each edit?

Ground truth: edit-level counterfactuals (:func:`labkit.credit.ground_truth.hunk_effects`). For
every hunk ``h`` of a rollout's program against the buggy code,
``effect_h = R(program) - R(program with h reverted)``, ``R`` the fraction of hidden tests
passed. Each estimator assigns per-token advantages ``A [B, T]`` to the same rollouts (same
rewards, same groups); a hunk's credit is the mean advantage over its tokens,
``c_h = mean_{u in tokens(h)} A[i, u]``. Agreement, pooled over all hunks of a data set:

* Spearman's rank correlation ``rho(c, effect)`` (average ranks for ties), with a 95%
  percentile bootstrap interval that resamples tasks (a task's hunks share its rollouts and
  groups, so they are resampled together);
* sign agreement: over hunks with ``effect != 0``, the fraction with
  ``sign(c_h) = sign(effect_h)`` (a credit of exactly 0 disagrees).

Estimators: ``grpo`` (uniform per token: every hunk of a rollout gets ``A_E``), ``didpo``
(anchors: ``A_E + lambda A_D``) and its local term ``didpo_no_ae``, ``didpo_fork``
(``A_E + lambda A_fork``, forks inside the edit, spread over the hunk) and its local term
``didpo_fork_no_ae``. The policy is the tiny model as shipped, its EMA baseline equal to it.

HumanEval: the tiny model has 768 positions, so only bug-injected HumanEval tasks whose
prompt plus reference program (plus a margin) fit are used; the report says how many.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit.config import to_record
from labkit.credit.advantages import AdvantageInput, compute_advantages
from labkit.credit.ground_truth import hunk_effects, pass_fraction
from labkit.env.records import Candidate
from labkit.env.sandbox import Sandbox
from labkit.env.tasks import load_tasks
from labkit.experiments.config import RESULTS
from labkit.experiments.pages import write_figure_html
from labkit.loops.forks import measure_forks
from labkit.loops.metrics import average_ranks
from labkit.policy import forking as fk
from labkit.policy.loading import load_policy
from labkit.policy.prompts import build_prompt
from labkit.policy.rollout import SamplingConfig, collate, sample_with_cache
from labkit.seeding import derive_seed


@dataclass
class Config:
    """Budget of the credit experiment (``--set key=value``)."""

    synthetic_tasks: int = 48
    """Synthetic tasks of ``split`` (each gives ``group_size`` rollouts)."""
    humaneval_tasks: int = 24
    """At most this many bug-injected HumanEval tasks, among those that fit the context."""
    n_bugs: int = 2
    """Bugs per synthetic task; with ``multi_hunk`` each bug is its own, separately tested hunk,
    so a rollout's hunks can be told apart (the premise of diff-level credit)."""
    multi_hunk: bool = True
    """Only separable multi-hunk tasks (``labkit.env.tasks.multi_hunk_catches``)."""
    split: str = "test"
    """Split of the synthetic tasks: ``test`` (templates training never sees), ``val``,
    ``train`` or ``in_template``. The first ``synthetic_tasks`` of a 200-task list (the size the
    lab evaluates on, so usually cached) are used."""
    group_size: int = 8
    """G: rollouts sampled per task. GRPO's episode advantage ``A_E`` is normalised within each
    task's group, so G decides how finely it ranks rollouts; cost grows linearly (G rollouts,
    their forks and sandbox runs per task)."""
    tasks_per_batch: int = 8
    """Tasks per estimator batch (a trainer step's ``tasks_per_step``): groups and the fork
    normalisation are per batch."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; the forks propose and continue at the same T
    (:meth:`~labkit.policy.forking.ForkConfig.from_sampling`). 1.0 samples the policy itself, as
    RL training does."""
    max_new_tokens: int = 320
    """Completion budget per rollout, shared with its forks. On HumanEval a batch gets at most
    ``max positions - its longest prompt``, so every sequence fits the model."""
    context_margin: int = 16
    """A HumanEval task fits when ``|prompt| + |reference| + margin <= max positions``."""
    fork_strategy: str = "diff"
    """Where ``didpo_fork`` forks (:data:`labkit.policy.forking.POSITION_STRATEGIES`): ``diff``
    draws only tokens on lines that differ from the buggy code, i.e. inside the hunks whose
    credit is measured; ``uniform`` spreads forks over the whole completion (most then land
    outside any hunk). ``entropy`` is not available here: no per-token entropies are passed."""
    fork_fraction: float = 0.5
    """Forks per rollout as a share of its completion tokens,
    ``k = min(fork_budget, ceil(fork_fraction * n_tokens))`` (fewer when ``diff`` finds fewer
    changed tokens). More forks give denser, less noisy per-hunk credit at one extra generation
    and sandbox run each."""
    fork_budget: int = 4
    """At most this many forks per rollout: bounds the fork cost of long completions, at the
    price of sparser credit on them."""
    spread: str = "hunk"
    """Placement of ``didpo_fork``'s credit: ``hunk`` gives every token of a hunk the mean of
    its forks' normalised ``dR`` (a hunk's credit then does not depend on which of its tokens
    were forked); ``token`` keeps each fork's credit on its own token (0 at unforked ones, which
    dilutes the hunk's mean)."""
    lam: float = 1.0
    """lambda in ``A = A_E + lambda A_fork`` of the two ``didpo_fork`` estimators (``didpo``
    keeps its own default): the weight of the local term against the sequence-level one. The
    ``A_fork only`` rows' rank and sign agreement do not depend on it (for lambda > 0)."""
    bootstrap: int = 1000
    """Resamples (of the tasks, each with all its hunks) for each 95% percentile interval; the
    more, the steadier the interval's ends, at linear cost (0 = no intervals, reported n/a)."""
    seed: int = 0
    """Seeds the task lists (synthetic generation, HumanEval bug injection), the sampling, fork
    positions and forks (derived per data set and batch), torch and the bootstrap: the report is
    reproducible from it."""
    policy: str = "tiny"
    """The policy that samples and forks: ``tiny`` or a local Hugging Face causal-LM folder. Its
    ``max_position_embeddings`` decides which HumanEval tasks fit; its EMA baseline equals it,
    so the forks' alternatives come from the policy itself."""
    threads: int = 1
    """``torch.set_num_threads``: 1 keeps a 2M-parameter model from fighting other jobs for
    the cores (oversubscribed OpenMP threads spin)."""
    out: str = str(RESULTS)
    """Folder of ``credit.md``, ``credit.json``, ``credit.html`` and ``credit.png`` (default:
    the repository's ``docs/results``)."""


ESTIMATORS = {  # label -> (registered estimator, uses the fork options)
    "grpo": ("grpo", False),
    "didpo": ("didpo", False),
    "didpo (A_D only)": ("didpo_no_ae", False),
    "didpo_group_mean (non-paper)": ("didpo_group_mean", False),
    "didpo_fork": ("didpo_fork", True),
    "didpo_fork (A_fork only)": ("didpo_fork_no_ae", True),
}


# ============================================================================= metrics


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


def sign_agreement(credit, effect) -> float:
    """Over pairs with ``effect != 0``: the fraction with ``sign(credit) == sign(effect)``
    (credit 0 disagrees); NaN when no effect is non-zero."""
    pairs = [(c, e) for c, e in zip(credit, effect) if e != 0]
    if not pairs:
        return math.nan
    return sum((c > 0) == (e > 0) and c != 0 for c, e in pairs) / len(pairs)


def bootstrap_ci(x, y, stat, n: int = 1000, seed: int = 0,
                 clusters=None) -> tuple[float, float]:
    """95% percentile interval of ``stat(x*, y*)`` over ``n`` resamples (resamples where the
    statistic is undefined are dropped). With ``clusters`` (one id per pair, e.g. the task),
    whole clusters are resampled: hunks of one task share its rollouts, so resampling them
    one by one would make the interval too narrow."""
    if len(x) < 2 or n < 1:
        return math.nan, math.nan
    rng = random.Random(seed)
    groups: dict = {}
    for i, c in enumerate(clusters if clusters is not None else range(len(x))):
        groups.setdefault(c, []).append(i)
    members = list(groups.values())
    vals = []
    for _ in range(n):
        idx = [i for _ in members for i in members[rng.randrange(len(members))]]
        v = stat([x[i] for i in idx], [y[i] for i in idx])
        if not math.isnan(v):
            vals.append(v)
    if not vals:
        return math.nan, math.nan
    vals.sort()
    return vals[int(0.025 * (len(vals) - 1))], vals[int(math.ceil(0.975 * (len(vals) - 1)))]


def hunk_credit(adv: torch.Tensor, row: int, tokens) -> float:
    """``c_h = mean_{u in tokens} adv[row, u]`` (the hunk's tokens), rounded to 9 decimals so
    that equal credits averaged over different token counts compare equal."""
    return round(adv[row, list(tokens)].double().mean().item(), 9)


def within_rollout(records: list[dict], label: str, with_tasks: bool = False):
    """Credit and effect centred on their rollout's mean, over rollouts with at least two
    hunks: what is left once differences between rollouts are removed (``with_tasks``: also
    each value's task, the bootstrap's cluster)."""
    by: dict = {}
    for r in records:
        by.setdefault((r["dataset"], r["task_id"], r["sample"]), []).append(r)
    c, e, t = [], [], []
    for key, rs in by.items():
        if len(rs) < 2:
            continue
        mc = statistics.fmean(r["credit"][label] for r in rs)
        me = statistics.fmean(r["effect"] for r in rs)
        c += [round(r["credit"][label] - mc, 9) for r in rs]  # float noise is no signal
        e += [round(r["effect"] - me, 9) for r in rs]
        t += [key[:2]] * len(rs)
    return (c, e, t) if with_tasks else (c, e)


def agreement(records: list[dict], label: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """Spearman (with bootstrap interval) and sign agreement of ``record["credit"][label]``
    with ``record["effect"]`` over ``records``, and Spearman within rollouts
    (:func:`within_rollout`)."""
    c = [r["credit"][label] for r in records]
    e = [r["effect"] for r in records]
    tasks = [(r["dataset"], r["task_id"]) for r in records]
    lo, hi = bootstrap_ci(c, e, spearman, n_boot, seed, clusters=tasks)
    wc, we, wt = within_rollout(records, label, with_tasks=True)
    return {"spearman": spearman(c, e), "spearman_ci95": [lo, hi],
            "sign_agreement": sign_agreement(c, e),
            "sign_ci95": list(bootstrap_ci(c, e, sign_agreement, n_boot, seed, clusters=tasks)),
            "credit_nonzero_frac": sum(v != 0 for v in c) / len(c) if c else math.nan,
            "within_spearman": spearman(wc, we), "within_hunks": len(wc),
            "within_ci95": list(bootstrap_ci(wc, we, spearman, n_boot, seed, clusters=wt)),
            "intervals": "95% bootstrap over tasks (clusters)"}


def agreement_table(records: list[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """Per data set (and ``all``): hunk counts and :func:`agreement` of every estimator."""
    table: dict = {}
    for ds in ("synthetic", "humaneval", "all"):
        recs = [r for r in records if ds == "all" or r["dataset"] == ds]
        effects = [r["effect"] for r in recs]
        table[ds] = {"hunks": len(recs), "nonzero_effect": sum(e != 0 for e in effects),
                     "positive_effect": sum(e > 0 for e in effects),
                     "rollouts_with_hunks": len({(r["dataset"], r["task_id"], r["sample"])
                                                 for r in recs}),
                     "estimators": {lab: agreement(recs, lab, n_boot, seed) if recs else {}
                                    for lab in ESTIMATORS}}
    return table


# ============================================================================= data


def fitting_tasks(tasks, tokenizer, max_positions: int, margin: int) -> list[tuple]:
    """``(task, prompt_len)`` for the tasks whose prompt plus reference program plus
    ``margin`` tokens fit in ``max_positions``."""
    out = []
    for t in tasks:
        p = len(tokenizer(build_prompt(t, tokenizer), add_special_tokens=False).input_ids)
        r = len(tokenizer(t.reference_code, add_special_tokens=False).input_ids)
        if p + r + margin <= max_positions:
            out.append((t, p))
    return out


class MemoRunner:
    """Runs each distinct (task, program) once in the sandbox."""

    def __init__(self, sandbox):
        self.sandbox, self.memo, self.runs = sandbox, {}, 0

    def __call__(self, cands):
        todo = {}
        for c in cands:
            key = (c.entry_point, repr(c.tests), c.code)
            if key not in self.memo:
                todo[key] = c
        if todo:
            self.runs += len(todo)
            for key, res in zip(todo, self.sandbox.run_many(list(todo.values()))):
                self.memo[key] = res
        return [self.memo[(c.entry_point, repr(c.tests), c.code)] for c in cands]


def credit_batch(policy, tasks, cfg: Config, dataset: str, index: int, max_new: int, runner) -> tuple[list, dict]:
    """One batch: rollouts, rewards, ground-truth hunk effects, forks, and every estimator's
    credit for every hunk. Returns the hunk records and the batch's costs."""
    scfg = SamplingConfig(group_size=cfg.group_size, temperature=cfg.temperature,
                          max_new_tokens=max_new, seed=derive_seed(cfg.seed, "credit", dataset, index))
    t0 = time.time()
    rollouts, kv = sample_with_cache(policy, tasks, scfg)
    sample_s = time.time() - t0
    by_id = {t.task_id: t for t in tasks}
    task_of = [by_id[r.task_id] for r in rollouts]

    def reward(codes, ts):
        res = runner([Candidate(code=c, tests=t.tests, entry_point=t.entry_point, id=t.task_id)
                      for c, t in zip(codes, ts)])
        return [pass_fraction(r) for r in res]

    t0 = time.time()
    R = reward([r.code for r in rollouts], task_of)
    effects = hunk_effects(rollouts, by_id, run=runner)
    truth_s = time.time() - t0

    t0 = time.time()
    measured = measure_forks(
        policy, rollouts, task_of, R, lambda ts, rs: reward([r.code for r in rs], ts),
        fk.PositionConfig(cfg.fork_strategy, cfg.fork_fraction, cfg.fork_budget,
                          seed=derive_seed(cfg.seed, "credit-pos", dataset, index)),
        fk.ForkConfig.from_sampling(scfg, seed=derive_seed(cfg.seed, "credit-fork", dataset, index)),
        kv=kv, baseline=policy.baseline())
    del kv
    forks, sites = measured.batch, measured.sites
    fork_gen_s, fork_exec_s = measured.gen_s, measured.exec_s
    row_of = {(r.task_id, r.sample): b for b, r in enumerate(rollouts)}

    mask = collate(rollouts, policy.tokenizer.pad_token_id)["completion_mask"].double()  # [B, T]
    rewards = torch.tensor(R, dtype=torch.float64)
    advs = {}
    inp = AdvantageInput(rewards, [r.task_id for r in rollouts], mask, rollouts=rollouts,
                         tasks=task_of, forks=sites)
    for label, (name, forky) in ESTIMATORS.items():
        opts = {"lam": cfg.lam, "spread": cfg.spread} if forky else {}
        advs[label] = compute_advantages(name, inp, **opts).advantages
    records = []
    for e in effects:
        if not e.tokens:
            continue
        b = row_of[(e.task_id, e.sample)]
        records.append({"dataset": dataset, "task_id": e.task_id, "sample": e.sample, "k": e.k,
                        "effect": e.effect, "reward": e.reward, "n_tokens": len(e.tokens),
                        "credit": {lab: hunk_credit(a, b, e.tokens) for lab, a in advs.items()}})
    cost = {"rollouts": len(rollouts), "hunks": len(effects),
            "hunks_without_tokens": sum(not e.tokens for e in effects),
            "rollout_tokens": sum(r.n_tokens for r in rollouts), "pass_mean": statistics.fmean(R),
            "forks": len(forks.forks), "fork_tokens": forks.stats.generated_tokens,
            "fork_dr_nonzero": int((sites.dr != 0).sum()),
            "sample_s": sample_s, "truth_s": truth_s, "fork_gen_s": fork_gen_s,
            "fork_exec_s": fork_exec_s}
    return records, cost


def _dataset(policy, tasks, cfg: Config, name: str, max_new_of, runner) -> tuple[list, dict]:
    records, costs = [], []
    for index, c0 in enumerate(range(0, len(tasks), cfg.tasks_per_batch)):
        chunk = tasks[c0:c0 + cfg.tasks_per_batch]
        recs, cost = credit_batch(policy, chunk, cfg, name, index, max_new_of(chunk), runner)
        records += recs
        costs.append(cost)
        print(f"{name} batch {index}: {cost['rollouts']} rollouts, {cost['hunks']} hunks, "
              f"{cost['forks']} forks, sample {cost['sample_s']:.0f}s fork "
              f"{cost['fork_gen_s'] + cost['fork_exec_s']:.0f}s", flush=True)
    total = {k: sum(c[k] for c in costs) for k in costs[0]} if costs else {}
    if costs:
        total["pass_mean"] = statistics.fmean(c["pass_mean"] for c in costs)
    return records, total


# ============================================================================= run


def run(cfg: Config) -> Path:
    t_start = time.time()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.policy)
    max_pos = int(policy.model.config.max_position_embeddings)
    datasets: dict = {}
    with Sandbox() as sandbox:
        runner = MemoRunner(sandbox)
        # the first tasks of a 200-task list (the size the lab evaluates on, so usually cached)
        n_problems = max(200, cfg.synthetic_tasks) * (4 if cfg.multi_hunk else 1)
        synth = load_tasks("synthetic", split=cfg.split, n=n_problems, seed=cfg.seed,
                           n_bugs=cfg.n_bugs, multi_hunk=cfg.multi_hunk)[:cfg.synthetic_tasks]
        datasets["synthetic"] = {"tasks": len(synth)}
        recs_s, cost_s = _dataset(policy, synth, cfg, "synthetic",
                                  lambda chunk: cfg.max_new_tokens, runner)
        he_all = load_tasks("humaneval", split=None, seed=cfg.seed)
        fit = fitting_tasks(he_all, policy.tokenizer, max_pos, cfg.context_margin)
        prompt_len = {t.task_id: p for t, p in fit}
        he = [t for t, _ in sorted(fit, key=lambda tp: tp[1])][:cfg.humaneval_tasks]
        datasets["humaneval"] = {"tasks": len(he), "available": len(he_all), "fit": len(fit)}
        recs_h, cost_h = _dataset(
            policy, he, cfg, "humaneval",
            lambda chunk: min(cfg.max_new_tokens, max_pos - max(prompt_len[t.task_id] for t in chunk)),
            runner)
    datasets["synthetic"] |= {"cost": cost_s, "records": len(recs_s)}
    datasets["humaneval"] |= {"cost": cost_h, "records": len(recs_h)}
    results = {"experiment": "credit", "config": to_record(cfg), "datasets": datasets,
               "wall_s": round(time.time() - t_start, 1), "hunks": recs_s + recs_h}
    return write_report(results, cfg)


def _fmt(x: float, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def write_report(results: dict, cfg: Config) -> Path:
    """``credit.json`` (the agreement table recomputed from ``results["hunks"]``, so a report
    can be rebuilt from a saved run), ``credit.md`` and the figure."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results["agreement"] = agreement_table(results["hunks"], cfg.bootstrap, cfg.seed)
    # what every results file says first (no training here: the policy as given, one seed)
    results["setting"] = {"split": cfg.split, "feedback": "dense (fraction of hidden tests)",
                          "model": cfg.policy, "steps": 0,
                          "batch": f"{cfg.tasks_per_batch} tasks x {cfg.group_size} samples",
                          "seeds": [cfg.seed], "n_bugs": cfg.n_bugs, "multi_hunk": cfg.multi_hunk,
                          "intervals": "95% bootstrap over tasks (clusters)"}
    results["seeds"] = [cfg.seed]
    (out / "credit.json").write_text(json.dumps(results, indent=1, default=float))
    ds, tab = results["datasets"], results["agreement"]
    lines = ["# Which credit is right? Per-hunk credit vs edit-level counterfactuals", "",
             "Generated by `python -m labkit experiment credit` "
             f"(config in `credit.json`; wall time {results['wall_s']:.0f} s).", "",
             "Ground truth per hunk h of a rollout's program: `effect_h = R(program) - "
             "R(program with h reverted)`, R = fraction of hidden tests passed "
             "(`labkit.credit.ground_truth.hunk_effects`). Credit of an estimator for h: the mean of "
             "its per-token advantage over h's tokens. Spearman: pooled over hunks, average "
             "ranks, 95% percentile bootstrap interval resampling tasks (clusters: a task's hunks "
             "share its rollouts and groups). Sign agreement: over hunks "
             "with a non-zero effect, the share whose credit has the same sign (credit 0 "
             "counts as disagreement).", "",
             f"Tiny model as shipped (its EMA baseline equals it), T = {cfg.temperature}, "
             f"G = {cfg.group_size}, {cfg.tasks_per_batch} tasks per estimator batch, rewards = "
             f"pass fraction. didpo_fork: forks at `{cfg.fork_strategy}` positions "
             f"(fraction {cfg.fork_fraction}, at most {cfg.fork_budget} per rollout), "
             f"dR normalised by the batch RMS, spread = `{cfg.spread}`, lambda = {cfg.lam}.", ""]
    he = ds["humaneval"]
    kind = (f"{cfg.n_bugs} bugs per task, each in its own separately tested hunk"
            if cfg.multi_hunk else f"{cfg.n_bugs} bug(s) per task")
    lines += [f"Data: {ds['synthetic']['tasks']} synthetic `{cfg.split}`-split tasks ({kind}); "
              f"{he['tasks']} bug-injected HumanEval tasks, the shortest of the {he['fit']} of "
              f"{he['available']} whose prompt + reference + {cfg.context_margin} tokens fit the "
              "tiny model's 768 positions (the others cannot be attempted at all).", ""]
    lines += ["Within-rollout rho: credit and effect centred on their rollout's mean, over "
              "rollouts with two or more hunks (`grpo` is then constant: n/a).", "",
              "| data | estimator | hunks | non-zero effects | Spearman rho (95% CI) | sign agreement | credit != 0 | within-rollout rho (95% CI; hunks) |",
              "|---|---|---|---|---|---|---|---|"]
    for name in ("synthetic", "humaneval", "all"):
        t = tab[name]
        for lab, a in t["estimators"].items():
            if not a:
                lines.append(f"| {name} | {lab} | 0 | 0 | n/a | n/a | n/a | n/a |")
                continue
            lo, hi = a["spearman_ci95"]
            lines.append(f"| {name} | {lab} | {t['hunks']} | {t['nonzero_effect']} | "
                         f"{_fmt(a['spearman'])} ({_fmt(lo, 2)}, {_fmt(hi, 2)}) | "
                         f"{_fmt(a['sign_agreement'])} | {_fmt(a['credit_nonzero_frac'], 2)} | "
                         f"{_fmt(a['within_spearman'])} ({_fmt(a['within_ci95'][0], 2)}, "
                         f"{_fmt(a['within_ci95'][1], 2)}; {a['within_hunks']}) |")
    lines += ["", "Cost (forks are the extra work of didpo_fork):", "",
              "| data | rollouts | mean pass | hunks | forks | fork tokens | sample s | fork generate s | fork execute s | forks with dR != 0 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name in ("synthetic", "humaneval"):
        c = ds[name].get("cost") or {}
        if c:
            lines.append(f"| {name} | {c['rollouts']} | {c['pass_mean']:.3f} | {c['hunks']} | "
                         f"{c['forks']} | {c['fork_tokens']} | {c['sample_s']:.0f} | "
                         f"{c['fork_gen_s']:.0f} | {c['fork_exec_s']:.0f} | {c['fork_dr_nonzero']} |")
    lines += ["", "## Reading", "", *_reading(results), ""]
    html, png, err = _figure(tab, out)
    lines += ["", f"Figure: [credit.html]({html.name})" +
              (f", ![agreement by estimator]({png.name})" if png else
               f" (PNG export failed: {err})"), ""]
    md = out / "credit.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def _reading(results: dict) -> list[str]:
    """What the table says, computed from it, plus the caveats that hold for any run."""
    out = []
    for name in ("synthetic", "humaneval"):
        t = results["agreement"][name]
        est = {lab: a for lab, a in t["estimators"].items() if a and not math.isnan(a["spearman"])}
        if not est:
            cost = results["datasets"][name].get("cost") or {}
            out.append(f"- **{name}**: no estimator's credit varies over its {t['hunks']} hunks "
                       f"(mean pass rate {cost.get('pass_mean', float('nan')):.3f}), so Spearman is "
                       "undefined: with every reward equal, GRPO and DiDPO advantages are 0 and every "
                       "fork has dR = 0. Nothing is learned about credit there.")
            continue
        best = max(est, key=lambda lab: est[lab]["spearman"])
        lo = est[best]["spearman_ci95"][0]
        beaten = [lab for lab in est if lab != best and est[lab]["spearman_ci95"][1] < lo]
        out.append(f"- **{name}** ({t['hunks']} hunks, {t['nonzero_effect']} with a non-zero effect): "
                   f"highest pooled rho {best} ({est[best]['spearman']:.3f}); its interval lies "
                   f"above the intervals of {', '.join(beaten) if beaten else 'none of the others'}.")
        within = {lab: a for lab, a in t["estimators"].items()
                  if a and not math.isnan(a["within_spearman"])}
        if within:
            out.append("  Within rollouts (between-rollout differences removed): " + "; ".join(
                f"{lab} {a['within_spearman']:+.3f} ({a['within_ci95'][0]:+.2f}, "
                f"{a['within_ci95'][1]:+.2f})" for lab, a in within.items()) +
                ". A negative value means the hunks a method credits more than the rest of "
                "their rollout are the ones that matter less.")
    out += [
        "- `grpo` gives every hunk of a rollout the same credit, so its agreement comes only "
        "from differences between rollouts: a hunk of a passing program tends to have a "
        "positive effect (`effect = R - R_without` and `R` is high), one of a failing program "
        "cannot be positive. The local terms (`A_D only`, `A_fork only`) show what each method "
        "adds beyond that.",
        "- didpo_fork spends extra generation and sandbox runs (cost table) to see each "
        "token's counterfactual directly; anchors use only the group's own rollouts. A fork "
        "flips one token inside a hunk and lets the policy continue, which is close to, but "
        "not the same as, reverting the whole hunk: the two counterfactuals are related by "
        "construction, which favours didpo_fork in this comparison.",
        "- One seed, one model; intervals resample tasks (a task's hunks together), not "
        "training seeds: no training happens in this experiment.",
    ]
    return out


def _figure(tab: dict, out: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Spearman rho (95% CI)", "sign agreement"))
    for name in ("synthetic", "humaneval"):
        est = tab[name]["estimators"]
        labs = [lab for lab, a in est.items() if a]
        rho = [est[lab]["spearman"] for lab in labs]
        err_hi = [est[lab]["spearman_ci95"][1] - r for lab, r in zip(labs, rho)]
        err_lo = [r - est[lab]["spearman_ci95"][0] for lab, r in zip(labs, rho)]
        fig.add_trace(go.Bar(x=labs, y=rho, name=f"{name} rho", legendgroup=name,
                             error_y={"type": "data", "array": err_hi, "arrayminus": err_lo}), 1, 1)
        fig.add_trace(go.Bar(x=labs, y=[est[lab]["sign_agreement"] for lab in labs],
                             name=f"{name} sign", legendgroup=name), 1, 2)
    fig.update_layout(title="Per-hunk credit vs edit-level counterfactual effect",
                      template="plotly_white", barmode="group")
    html = write_figure_html(fig, out / "credit.html")
    png = out / "credit.png"
    try:
        fig.write_image(str(png), width=1100, height=500)
        return html, png, None
    except Exception as e:  # noqa: BLE001 - kaleido needs a Chrome; report and keep the HTML
        return html, None, f"{type(e).__name__}: {str(e)[:120]}"
