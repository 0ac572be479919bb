"""Results pages: one writer, and the blocks every page is rendered from.

A page is a pure function of its JSON. :func:`write_page` is the one writer: it adds the
code commit to the results, writes ``<name>.json``, reads it back, and writes ``<name>.md``
as ``render(json)`` (and the figure, drawn from the same JSON). So every number and every
verdict sentence of a page comes from its JSON, and ``python -m labkit results render``
(:func:`rerender`) rebuilds the pages from the committed JSON without running anything; a
test checks that the committed pages are what that gives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from labkit.experiments import claims, load, stats
from labkit.experiments.config import RESULTS, code_commit


class PublishError(ValueError):
    """A page was about to be published (written to the repository's ``docs/results``) from
    runs that do not stand for one clean commit; the message says what to do."""

READINGS = {"paired": "pass@1", "paired_pass_k": "pass@k"}


# ----------------------------------------------------------------------------- the writer


def write_page(results: dict, out: str | Path, render: Callable[[dict], str],
               figure: Callable[[dict, Path], object] | None = None) -> Path:
    """Write ``<out>/<name>.json`` (``results`` plus ``code_commit``), then ``<name>.md`` =
    ``render`` of the JSON as read back, then ``figure(json, out)``; returns the page's path.

    Publishing, writing into the repository's ``docs/results``, is refused for a smoke run
    and for results whose rows do not all come from one clean commit (``provenance``), unless
    the experiment let other code in on purpose (``allow_code_drift``, which the page says)."""
    out = Path(out)
    name = page_name(results)
    check_publishable(results, out)
    out.mkdir(parents=True, exist_ok=True)
    results.setdefault("code_commit", code_commit())
    other = engine_comparison(results, out)
    if other is not None:
        results["engines"] = other
    path = out / f"{name}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    data = json.loads(path.read_text())
    md = out / f"{name}.md"
    md.write_text(page_text(render, data))
    if figure is not None:
        figure(data, out)
    return md


def page_name(results: Mapping) -> str:
    """The file name (no suffix) of an experiment's page: ``results["page"]`` where one
    experiment writes several pages (``reshaping-public``), else the experiment's name."""
    return results.get("page") or results["experiment"].replace("/", "_")


def restat(json_path: str | Path) -> Path:
    """Compute a committed results JSON's statistics again with this code (its experiment's
    ``restat``: every change from its per-task data, the claim and controls read again) and
    write its JSON, page and figure back; nothing is trained or evaluated, so the record's
    provenance is unchanged. Returns the page's path."""
    path = Path(json_path)
    data = json.loads(path.read_text())
    module = load(data["experiment"].split("/")[0])
    module.restat(data)
    path.write_text(json.dumps(data, indent=1) + "\n")
    data = json.loads(path.read_text())
    md = path.with_suffix(".md")
    md.write_text(page_text(module.render, data))
    figure = getattr(module, "figure", curves_figure)
    figure(data, path.parent)
    return md


def check_publishable(results: Mapping, out: Path) -> None:
    """Raise :class:`PublishError` when ``out`` is the repository's results folder and the
    results are a smoke run or rows of several (or uncommitted) code versions."""
    if out.resolve() != RESULTS.resolve():
        return
    if results.get("config", {}).get("smoke"):
        raise PublishError("a smoke run is not published to docs/results: write it elsewhere (out=...)")
    prov = results.get("provenance") or {}
    if not prov.get("clean_single_commit") and not prov.get("allow_code_drift"):
        raise PublishError(f"the rows come from code {', '.join(prov.get('runs', [])) or 'unrecorded'}, "
                           "not one clean commit: run the experiment from a clean worktree at one "
                           "commit (git worktree add), or pass allow_code_drift=true to publish "
                           "mixed code (the page says so)")


def rerender(json_path: str | Path) -> str:
    """The page of a committed results JSON, rendered again by its experiment's ``render``."""
    data = json.loads(Path(json_path).read_text())
    return page_text(load(data["experiment"].split("/")[0]).render, data)


def page_text(render: Callable[[dict], str], data: Mapping) -> str:
    """A page: its experiment's ``render`` of the JSON, then the engines side by side where
    the JSON holds them (:func:`engine_comparison`)."""
    return "\n".join([render(data).rstrip("\n"), *engine_lines(data)]).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------- both engines

ENGINE_FREE = ("engine", "processes", "out", "run_root", "reuse_finished", "allow_code_drift",
               "reuse_recorded", "report_to")
"""Config fields that may differ between the two engines' pages of one experiment."""


def engine_comparison(results: Mapping, out: str | Path) -> dict | None:
    """The experiment's page of the other engine in ``out`` (``<name>-trl`` beside ``<name>``),
    set beside this one: per method both engines' paired changes and ``trl - labkit``, paired
    by seed and task (:func:`labkit.experiments.stats.difference`: the same held-out tasks and
    evaluation seeds, so only training differs). ``None`` without such a page; a page whose
    settings differ beyond :data:`ENGINE_FREE` gives ``comparable: false`` and the fields."""
    engine = (results.get("config") or {}).get("engine", "labkit")
    name = page_name(results)
    other_name = name[: -len("-trl")] if engine == "trl" else f"{name}-trl"
    path = Path(out) / f"{other_name}.json"
    if not path.exists():
        return None
    other = json.loads(path.read_text())
    mine, theirs = results.get("config") or {}, other.get("config") or {}
    differs = sorted(k for k in set(mine) | set(theirs)
                     if k not in ENGINE_FREE and mine.get(k) != theirs.get(k))
    out_rec = {"page": other_name, "comparable": not differs, "differs": differs, "methods": {}}
    if differs:
        return out_rec
    by = {engine: results, theirs.get("engine", "labkit"): other}
    if set(by) != {"labkit", "trl"}:
        return None
    for m in results.get("methods", {}):
        a = by["labkit"].get("methods", {}).get(m, {}).get("paired_change")
        b = by["trl"].get("methods", {}).get(m, {}).get("paired_change")
        if a and b:
            out_rec["methods"][m] = {"labkit": stats.compact(a), "trl": stats.compact(b),
                                     "trl_minus_labkit": stats.compact(stats.difference(a, b)),
                                     "processes": {"labkit": by["labkit"]["config"].get("processes", 1),
                                                   "trl": by["trl"]["config"].get("processes", 1)}}
    return out_rec


def engine_lines(results: Mapping) -> list[str]:
    """The section of :func:`engine_comparison`'s record."""
    eng = results.get("engines")
    if not eng:
        return []
    lines = ["", "## Both engines", ""]
    if not eng["comparable"]:
        return lines + [f"`{eng['page']}` is this experiment on the other engine, but with other "
                        f"settings ({', '.join(eng['differs'])}): not set side by side.", ""]
    lines += [f"The same experiment trained by labkit's trainer and by TRL (`{eng['page']}` is the "
              "other page): the same methods, seeds, held-out tasks and evaluation seeds, so "
              "`TRL - labkit` is paired by seed and task and only the training differs. An "
              "interval that includes 0 says the engines agree within this design's noise.", "",
              "| method | labkit change | TRL change | TRL - labkit | P(TRL better) |",
              "|---|---|---|---|---|"]
    for m, row in eng["methods"].items():
        d = row["trl_minus_labkit"]
        poi = f"{d['poi']:.2f}" if d and d.get("poi") is not None else "n/a"
        lines.append(f"| {m} | {cell(row['labkit'])} | {cell(row['trl'])} | {cell(d)} | {poi} |")
    return lines + [""]


# ----------------------------------------------------------------------------- blocks


VERDICT_RULE = ("Intervals are 95% with training seeds and held-out tasks both random (a crossed "
                "random-effects analysis of the paired changes, Satterthwaite's degrees of freedom, "
                "the seed spread taken no smaller than the evaluation noise); a change is **shown** "
                "when that interval excludes 0. The claim and its controls were named before the "
                "run (primary); every other row is exploratory, its p Holm-corrected over the page "
                "(docs/training.md, \"Reading a result\").")


def header(results: Mapping, title: str, what: str, rule: str = VERDICT_RULE) -> list[str]:
    """Title, smoke banner, what was run, the command that rebuilds every row, the model's
    weights, the code behind the rows, and the verdict rule (``rule``)."""
    s = results.get("setting", {})
    lines = [f"# {title}", ""]
    if results.get("config", {}).get("smoke"):
        lines += ["**Smoke run**: a tiny budget that exercises the whole pipeline; its numbers "
                  "decide nothing.", ""]
    lines += [what, "", f"Rerun: `{results['command']}`", "",
              f"Model `{s.get('model')}` (weights sha256 `{s.get('model_sha256')}`), training "
              f"seeds {s.get('seeds')}. {code_line(results)}", "",
              *_recorded_lines(results.get("recorded")), rule, ""]
    return lines


def optim_text(results: Mapping, method: str) -> str:
    """``lr 5e-05 (AdamW, betas [0.9, 0.99], grad clip 1.0), KL 0.01 (k3), clip 0.2/0.2,
    token-mean``: what a method's training config (``train_config``) sets for the update; the
    learning rate alone for a record made before results carried the config."""
    tc = results.get("methods", {}).get(method, {}).get("train_config")
    if not tc:
        return (f"lr {results.get('setting', {}).get('lr')} (the KL coefficient, clipping and "
                "optimiser settings are not in this record)")
    o, loss = tc["optim"], tc["loss"]
    return (f"lr {o['lr']} (AdamW, betas {o['betas']}, weight decay {o['weight_decay']}, grad clip "
            f"{o['grad_clip']}, {o['schedule']}), KL {loss['kl_coef']} ({loss['kl_estimator']}), "
            f"clip {loss['eps_low']}/{loss['eps_high']}, {loss['agg']}")


def code_line(results: Mapping) -> str:
    """Which code the rows come from (``provenance``), in one sentence."""
    prov = results.get("provenance")
    if not prov:
        commit = (results.get("code_commit") or "unknown")[:12]
        return (f"Page written by code `{commit}`; its runs recorded no code (made before runs "
                "recorded it), so which code trained them is not known.")
    runs, now = prov.get("runs", []), prov.get("code")
    if prov.get("clean_single_commit"):
        said = f"Every row was trained by one clean commit, `{runs[0]}`"
        if now and runs[0] != now:
            return said + f"; this page was written by `{now}` (`allow_code_drift`: on purpose)."
        return said + "."
    if len(runs) == 1 and runs[0] == now:
        return (f"Every row was trained by `{now}`, an uncommitted tree (each run folder keeps "
                "its patch): a page to look at, not to publish.")
    drift = " (`allow_code_drift`: mixed on purpose)" if prov.get("allow_code_drift") else ""
    return (f"The rows come from several code versions{drift}: "
            + ", ".join(f"`{c}`" for c in runs) + f"; each seed's record names its own; this page "
            f"was written by `{now}`.")


def _recorded_lines(rec: Mapping | None) -> list[str]:
    """Which methods came from an earlier record (``reuse_recorded``), and from what."""
    if not rec:
        return []
    return [f"Taken from an earlier record ({rec['from']}), not trained again: "
            f"{', '.join(f'`{m}`' for m in rec['methods'])} (that record's command: "
            f"`{rec.get('command')}`). Their runs were trained by the code named above; the start "
            "policy was evaluated again and reads as in that record (each seed's mean, to the last "
            "digit), so their per-task changes pair with the new methods' by task id.", ""]


def cell(change: Mapping | None, digits: int = 3) -> str:
    """A change as the pages print it: the mean and its 95% interval."""
    if not change:
        return "n/a"
    if change.get("ci95") is None:
        return f"{change['mean']:+.{digits}f} (one seed)"
    return f"{change['mean']:+.{digits}f} {stats.interval_text(change['ci95'], digits)}"


def verdict_cell(change: Mapping | None) -> str:
    return stats.verdict(change) if change else "n/a"


def _holm_cell(row: Mapping | None) -> str:
    """``p 0.012, Holm 0.048: shown`` for an exploratory row (its family: the page)."""
    if row is PRIMARY_ROW:
        return "primary: read above"
    if not row or row.get("p_holm") is None:
        return "n/a (one seed)"
    return (f"p {row['p']:.3f}, Holm {row['p_holm']:.3f}: "
            + ("shown" if row["shown"] else "not shown"))


PAIRED_KEYS = ("paired", "paired_clean", "paired_trained", "paired_screened")
"""The paired evaluations a page may show, in order."""


PRIMARY_ROW = {"primary": True}
"""A table row that is one of the page's primary contrasts (read above, not in the family)."""


def primary_labels(results: Mapping) -> set[str]:
    """The :func:`row_label` of each primary contrast on its paired evaluation."""
    prim = results.get("primary") or {}
    key = prim.get("key")
    return {row_label(key, c["variant"] if c.get("base") is None else f"{c['variant']} - {c['base']}")
            for c in prim.get("contrasts", [])}


def family(results: Mapping, pairs: list[tuple[str, str]], keys=PAIRED_KEYS) -> dict[str, dict]:
    """Every exploratory contrast of a page, Holm-corrected as one family
    (:func:`labkit.experiments.claims.exploratory`): each method's change from the start and
    each pair's difference, on every paired evaluation, pass@1 and pass@k; keyed by
    :func:`row_label`. The primary contrasts are not in the family (:data:`PRIMARY_ROW`)."""
    rows, primary = [], primary_labels(results)
    for key in keys:
        if not results.get(key):
            continue
        for reading in ("paired", "paired_pass_k"):
            k = key.replace("paired", reading, 1)
            for m, r in results["methods"].items():
                if r.get(f"{k}_change"):
                    rows.append((row_label(k, m), r[f"{k}_change"]))
            for a, b in pairs:
                ra, rb = results["methods"].get(a, {}), results["methods"].get(b, {})
                if ra.get(f"{k}_change") and rb.get(f"{k}_change"):
                    d = stats.difference(ra[f"{k}_change"], rb[f"{k}_change"])
                    if d is not None:
                        rows.append((row_label(k, f"{b} - {a}"), d))
    out = {r["label"]: r for r in claims.exploratory([r for r in rows if r[0] not in primary])}
    return {**out, **{label: PRIMARY_ROW for label in primary}}


def row_label(key: str, what: str) -> str:
    return f"{key}: {what}"


def paired_lines(results: Mapping, key: str = "paired", methods: list[str] | None = None,
                 holm: Mapping[str, Mapping] | None = None) -> list[str]:
    """The table of each method's paired change under ``key`` (``paired``,
    ``paired_clean``, ``paired_trained``): pass@1 at the evaluation temperature and pass@k at
    the training temperature, start -> end, the change with its interval, and, for these
    exploratory rows, p with Holm's correction over the page (``holm``, :func:`family`)."""
    p = results.get(key)
    if not p:
        return []
    holm = holm or {}
    s = results.get("setting", {})
    proto = results.get("paired", {}).get("protocol", {})
    titles = {"paired": f"held-out `{s.get('split')}` tasks",
              "paired_clean": f"held-out `{s.get('split')}` tasks no trained-on reference solves",
              "paired_trained": f"new instances of the trained `{s.get('train_split')}` templates",
              "paired_screened": f"screened held-out `{s.get('split')}` tasks (the start neither "
                                 "always nor never passes; a control variate)"}
    proto = p.get("protocol", proto)
    pk = proto.get("pass_k")
    lines = [f"### {p['tasks']} {titles.get(key, key)}", "",
             f"pass@1: {proto.get('k')} samples per task at T = {proto.get('temperature')}"
             + (f"; pass@{pk}: {pk} samples per task at the training temperature "
                f"T = {proto.get('train_temperature')}" if pk else "")
             + "; each training seed has its own evaluation sampling seed, the same for its start "
             "and its end.", ""]
    head = "| method | pass@1 start -> end | change | exploratory |"
    rule = "|---|---|---|---|"
    if pk:
        head += f" pass@{pk} start -> end | change | exploratory |"
        rule += "---|---|---|"
    lines += [head, rule]
    kk = key.replace("paired", "paired_pass_k", 1)
    for m in methods or list(results["methods"]):
        r = results["methods"][m]
        c = r.get(f"{key}_change")
        if not c:
            continue
        start = _start_of(p, "pass_at_1", c)
        row = (f"| {m} | {start:.3f} -> {start + c['mean']:.3f} | {cell(c)} | "
               f"{_holm_cell(holm.get(row_label(key, m)))} |")
        if pk:
            ck = r.get(f"{kk}_change")
            if ck:
                sk = _start_of(p, "pass_at_k", ck)
                row += (f" {sk:.3f} -> {sk + ck['mean']:.3f} | {cell(ck)} | "
                        f"{_holm_cell(holm.get(row_label(kk, m)))} |")
            else:
                row += " n/a | n/a | n/a |"
        lines.append(row)
    return lines + [""]


def _start_of(p: Mapping, reading: str, change: Mapping) -> float:
    """The start's mean reading over the seeds ``change`` covers."""
    starts = p["start"][reading]
    seeds = [s for s in change["per_seed"] if s in starts]
    return sum(starts[s] for s in seeds) / len(seeds)


def difference_lines(results: Mapping, pairs: list[tuple[str, str]], key: str = "paired",
                     title: str = "Method against method",
                     holm: Mapping[str, Mapping] | None = None) -> list[str]:
    """``b - a`` for each pair, paired by seed and task (:func:`stats.difference` of the two
    methods' changes): the interval, the probability of improvement, and p with Holm's
    correction over the page (exploratory rows)."""
    holm = holm or {}
    rows = []
    for a, b in pairs:
        ra, rb = results["methods"].get(a), results["methods"].get(b)
        if not ra or not rb or not ra.get(f"{key}_change") or not rb.get(f"{key}_change"):
            continue
        d = stats.difference(ra[f"{key}_change"], rb[f"{key}_change"])
        if d is None:
            continue
        poi = f"{d['poi']:.2f}" if d.get("poi") is not None else "n/a"
        rows.append(f"| {b} - {a} | {cell(d)} | {poi} | "
                    f"{_holm_cell(holm.get(row_label(key, f'{b} - {a}')))} |")
    if not rows:
        return []
    return [f"### {title} ({key.replace('_', ' ')}, exploratory)", "",
            "| difference | paired by seed and task | P(improvement) | exploratory |",
            "|---|---|---|---|", *rows, ""]


def screened_lines(results: Mapping, method: str) -> list[str]:
    """The standard and the lower-noise evaluation side by side for ``method``: each one's
    change, interval, smallest detectable effect and cost in samples."""
    sc = results.get("paired_screened")
    r = results["methods"].get(method, {})
    if not sc or not r.get("paired_screened_change"):
        return []
    rows = []
    for key, label in (("paired", "standard: every held-out task"),
                       ("paired_clean", "standard: no trained-on reference solves it"),
                       ("paired_screened", "screened, more samples, control variate")):
        c = r.get(f"{key}_change")
        if not c:
            continue
        samples = sc["samples"] if key == "paired_screened" else sc["samples_pass_at_1_standard"]
        mde = f"{c['mde']:.3f}" if c.get("mde") else "n/a"
        rows.append(f"| {label} | {results[key]['tasks']} | {cell(c)} | {mde} | {samples:,} |")
    lo, hi = sc["range"]
    return ["## A less noisy evaluation", "",
            f"The screen sampled the start policy {sc['screen_k']} times on each of {sc['pool']} "
            f"held-out tasks (a sampling seed of its own) and kept those it passed between "
            f"{lo:.0%} and {hi:.0%} of the time; each kept task is evaluated with "
            f"{sc['protocol']['k']} samples, and the screen's reading is a control variate "
            f"(slope {r.get('paired_screened_beta', 0):+.3f}). Samples count every pass@1 sample "
            "of the evaluation, the screen's included (the CPU it costs).", "",
            "| evaluation | tasks | change [95%] | detectable (MDE) | samples |",
            "|---|---|---|---|---|", *rows, ""]


def primary_lines(results: Mapping, claim_size_text: str = "") -> list[str]:
    """The page's decision: the claim and its controls (named before the run), each change with
    its interval and its reading, the claim's smallest detectable effect, and whether the
    testbed could see an effect of the claim's kind."""
    prim = results.get("primary")
    if not prim:
        return []
    key = prim["key"]
    what = {"paired": "the held-out list", "paired_clean": "the held-out tasks no trained-on "
            "reference solves", "paired_trained": "new instances of the trained templates",
            "paired_screened": "the screened held-out tasks (the start policy neither always nor "
            "never solves them; a population of its own)", "all": "the hunks of every split"}
    lines = ["## The claim and its controls", "",
             f"Named before the run and read on {what.get(key, key)} (`{key}`"
             + (f", {results[key]['tasks']} tasks" if results.get(key) else "") + ").", "",
             "| | contrast | change [95%] | reading |", "|---|---|---|---|"]
    names = {"claim": "claim", "positive": "positive control", "negative": "negative control"}
    for r in prim["contrasts"]:
        if r["role"] == "claim":
            size = "" if r.get("size_abs") is None else f" (claimed {r['direction'] * abs(r['size_abs']):+.3f}{_relative(r)})"
            reading = f"**{r['verdict']}**{size}: {r['why']}"
        else:
            reading = r["why"] if not r["passed"] else f"passed: {r['why']}"
        lines.append(f"| {names[r['role']]} | {r['label']} | {cell(r.get('change'))} | {reading} |")
    for claim in [r for r in prim["contrasts"] if r["role"] == "claim"]:
        lines += [""] + _claim_summary(prim, claim)
    return lines + [""]


def _claim_summary(prim: Mapping, claim: Mapping) -> list[str]:
    """Under the primary table, per claim: its smallest detectable effect, where its size
    comes from, and whether its positive controls passed."""
    mde = claim.get("mde")
    lines = [f"*{claim['label']}*: smallest effect this design detects (80% power, two-sided 5%): "
             + (f"{mde:.3f}." if mde else "n/a (one seed, or no variation).")]
    if claim.get("source"):
        lines.append(f"The claimed size comes from: {claim['source']}.")
    p = claim.get("plan")
    if p:
        lines.append(f"Seeds a design on these tasks needs to detect half the claimed size "
                     f"({p['target']:.3f}), from this record's variance components: "
                     + (f"{p['seeds']}." if p["seeds"] else "more than 64."))
    sees = claim.get("testbed_sees")
    positives = claims.controls_of(prim, "positive", claim["label"])
    if positives and all(r.get("change") is None for r in positives):
        lines.append("**The positive control was not run**: whether this testbed can show an "
                     "effect of the claim's kind is not known.")
    elif sees is True:
        lines.append("**This testbed can see an effect of this kind**: its positive control passed.")
    elif sees is False:
        failed = "; ".join(r["why"] for r in claims.controls_of(prim, "positive", claim["label"])
                           if not r["passed"])
        lines.append(f"**The positive control failed** ({failed}): this testbed cannot show an "
                     "effect of the claim's kind, so the verdict speaks of this testbed, not of "
                     "the method.")
    return lines


def _relative(r: Mapping) -> str:
    return f", {r['relative']:+.0%} of the base's end" if r.get("relative") is not None else ""


def periodic_lines(results: Mapping) -> list[str]:
    """The runs' own periodic held-out readings (start, end, end - start over seeds), the
    seconds per step and the wall time per run."""
    cfg = results.get("config", {})
    lines = ["### Periodic held-out evaluation during training", "",
             f"Each run's own readings ({cfg.get('eval_tasks')} tasks x {cfg.get('eval_k')} samples at "
             "every evaluation, one sampling seed for all runs).", "",
             "| method | start | end | end - start | s/step | wall per run (s) |",
             "|---|---|---|---|---|---|"]
    for m, r in results["methods"].items():
        if "start" not in r:
            continue
        lines.append(f"| {m} | {r['start']['mean']:.3f} | {r['end']['mean']:.3f} | "
                     f"{cell(r['delta'])} | {r['s_per_step']:.2f} | {r['wall_s']:.0f} |")
    return lines + [""]


def figure_line(name: str, png: bool = True) -> list[str]:
    return [f"Figure: [{name}.html]({name}.html)" + (f", ![{name}]({name}.png)" if png else ""), ""]


# ----------------------------------------------------------------------------- figures


def curves_figure(results: Mapping, out: Path, name: str | None = None):
    """Held-out pass@1 against step, one line per run, one colour per method."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    name = name or page_name(results)
    fig = go.Figure()
    colours = qualitative.D3
    for i, (m, r) in enumerate(results["methods"].items()):
        for j, sd in enumerate(r.get("seeds", [])):
            xs, ys = zip(*sd["curve"])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=m, legendgroup=m,
                                     showlegend=j == 0, line={"color": colours[i % len(colours)]},
                                     opacity=0.8))
    fig.update_layout(title=f"{name}: held-out pass@1 against step (one line per seed)",
                      xaxis_title="training step", yaxis_title="held-out pass@1",
                      template="plotly_white")
    return save_figure(fig, out, name)


def save_figure(fig, out: Path, name: str, width: int = 900, height: int = 500):
    """``<out>/<name>.html`` (loading plotly.js as :func:`write_figure_html` says) and, when
    kaleido can render it, ``<name>.png``; returns both paths (``None`` for a skipped PNG)."""
    out.mkdir(parents=True, exist_ok=True)
    html = write_figure_html(fig, out / f"{name}.html")
    png = out / f"{name}.png"
    try:
        fig.write_image(str(png), width=width, height=height)
    except Exception as e:  # noqa: BLE001 - kaleido needs a Chrome; report and keep the HTML
        print(f"PNG export skipped: {type(e).__name__}: {e}")
        png.unlink(missing_ok=True)  # never leave an earlier run's picture beside this page
        png = None
    return html, png


PLOTLY_JS = "plotly.min.js"


def shared_plotly_js(folder: Path) -> str | None:
    """The path, relative to ``folder``, of the nearest ``plotly.min.js`` of the installed
    plotly's version in ``folder`` or a folder above it inside the same project (the walk
    stops at the first folder holding ``.git`` or ``pyproject.toml``; outside a project only
    ``folder`` itself is looked at); ``None`` when there is none. This lets the figures of
    sub-folders of ``docs/results`` load its one committed copy."""
    from plotly.offline import get_plotlyjs_version

    folder = folder.resolve()
    chain = [folder, *folder.parents]
    top = next((i for i, d in enumerate(chain)
                if (d / ".git").exists() or (d / "pyproject.toml").is_file()), 0)
    wanted = f"plotly.js v{get_plotlyjs_version()}"
    for d in chain[:top + 1]:
        js = d / PLOTLY_JS
        if js.is_file():
            with js.open(errors="replace") as f:
                head = f.read(200)
            if wanted in head:
                return Path(os.path.relpath(js, folder)).as_posix()
    return None


def write_figure_html(fig, html: Path) -> Path:
    """Write ``fig`` as a full HTML page at ``html``. The page loads plotly.js from the nearest
    copy of the installed version (:func:`shared_plotly_js`); when there is none, plotly's
    ``include_plotlyjs="directory"`` writes one beside the page, which every later figure of
    that folder shares (that mode keeps a ``plotly.min.js`` already beside the page whatever
    its version, so a stale copy there must be deleted by hand)."""
    shared = shared_plotly_js(html.parent)
    fig.write_html(str(html), include_plotlyjs=shared or "directory", full_html=True)
    return html
