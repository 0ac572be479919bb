"""The lab report's front page: what this lab found, in a minute's reading.

:func:`front_page` turns the lab's status rows (each with the numbers its notebook recorded,
:func:`labkit.lab.record`) and the executed notebooks into HTML. The report opens on it:

* **What this lab found**: per notebook, one plain sentence a newcomer can take away
  (:data:`PLAIN`) above the one or two sentences with its numbers (:data:`FINDINGS`), both
  written from the numbers this run recorded (a notebook without a function, or whose
  numbers lack a key, gets a plain pointer to its JSON instead of a wrong sentence);
* **Figures**: the plotly outputs of the cells tagged ``front-page`` in the notebooks
  (the training curves, the credit agreement, the reward components, the Best-of-N
  selectors), drawn statically;
* **Key numbers**: a short table with readable names, units and rounding
  (:data:`KEY_NUMBERS`); every number stays in ``<notebook>.json`` next to the report;
* **What the experiments found**: the multi-seed results committed in ``docs/results``, the
  same sentences as the README's findings table (:func:`labkit.docs.findings.rows`):
  a notebook shows one short run, these pages answer its question at scale;
* **Contents**, folded: each notebook's status, wall time and section headings, linked.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from labkit.docs.findings import plain_rows
from labkit.docs.findings import rows as findings_rows
from labkit.docs.figcheck import PLOTLY_MIME
from labkit.registry import Registry

FRONT_TAG = "front-page"
"""Cell tag: the cell's plotly outputs are copied onto the front page."""

FINDINGS: Registry = Registry("report finding")
"""``notebook name -> fn(numbers) -> list of sentences``: what it found, with its numbers."""

PLAIN: Registry = Registry("plain finding")
"""``notebook name -> fn(numbers) -> sentence``: the same finding in plain words, for a
newcomer, still written from the numbers (terms: docs/glossary.md)."""



def _f(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


@FINDINGS.register("00_tour")
def _tour(n: Mapping) -> list[str]:
    moved = "moved the parameters" if n["param_delta"] > 0 else "left the parameters where they were"
    return [f"The tiny model repaired {n['tasks']} tasks x {n['rollouts'] // n['tasks']} samples: "
            f"mean reward {_f(n['reward_mean'])}, pass rate {_f(n['pass_rate'])}; "
            f"{n['nonzero_std_groups']} of {n['tasks']} groups had a reward spread (GRPO signal).",
            f"One trainer step ({_pct(n['step_zero_std_frac'])} of its groups without signal) "
            f"{moved} (L2 change {n['param_delta']:.2e})."]


@FINDINGS.register("01_tasks_and_sandbox")
def _tasks(n: Mapping) -> list[str]:
    return [f"{n['mutants_caught']} of {n['mutants']} injected bugs were caught by the hidden tests "
            f"({n['operators_with_site']} of {n['operators']} bug operators found a site).",
            f"{n['hacks_flagged']} of {n['hacks']} reward hacks were flagged by the sandbox's scan; "
            f"{n['hacks_rewarded']} would have been paid by the pass/fail reward alone. Copying the "
            f"buggy code scores precision {_f(n['copy_r_precision'])} (which is why precision is "
            f"gated), unparsable code compiles to {_f(n['unparsable_r_compile'], 0)}."]


@FINDINGS.register("02_reward_reshaping")
def _reshaping(n: Mapping) -> list[str]:
    out = [f"On {n['records']} stored rollouts, the raw reward equals the test fraction "
           f"({'yes' if n['raw_equals_r_test'] else 'no'}); without the precision gate, copies of "
           f"the buggy code gain {_f(n['trap_minus_default_on_copies'])} reward over the default."]
    regimes = n.get("regime_no_signal_groups") or {}
    if regimes:
        out.append("Groups without signal per feedback regime: "
                   + ", ".join(f"{k} {v}" for k, v in regimes.items()) + ".")
    last = n.get("short_pass_at_1_last") or {}
    if last:
        out.append("Short runs, training pass@1 at the last step: "
                   + ", ".join(f"{k} {_f(v)}" for k, v in last.items()) + ".")
    return out


@FINDINGS.register("03_counterfactual_forking")
def _forking(n: Mapping) -> list[str]:
    return [f"{n['forks']} forks; {_pct(n['forks_differ_frac'])} changed the program and "
            f"{_pct(n['dr_nonzero_frac'])} changed the reward. Reusing the prefix cache "
            f"recomputed {_pct(n['recomputed_fraction'])} of the prefix positions a naive fork "
            f"re-encodes.",
            f"{n['hunks']} edit hunks, effects from {_f(n['effect_min'])} to "
            f"{_f(n['effect_max'])} (reward with minus reward without the hunk)."]


@FINDINGS.register("04_anchor_grouping")
def _anchors(n: Mapping) -> list[str]:
    rho = {k: v for k, v in (n.get("spearman") or {}).items() if v is not None}
    out = [f"{n['anchors']} anchors in a group of {n['group_size']}; DiDPO gives diff-level "
           f"credit to {_pct(n['didpo_token_coverage'])} of the tokens and GRPO's elsewhere."]
    if rho:
        out.append(f"Agreement with the measured effect of {n['agreement_hunks']} hunks "
                   "(Spearman): " + ", ".join(f"{k} {v:+.2f}" for k, v in rho.items()) + ".")
    return out


@FINDINGS.register("05_training")
def _training(n: Mapping) -> list[str]:
    out = []
    for m in n["methods"]:
        ev = n.get("eval_pass_at_1", {}).get(m) or []
        held = f"; held-out pass@1 {_f(ev[0])} -> {_f(ev[-1])}" if len(ev) >= 2 else ""
        out.append(f"{m}: training test reward {_f(n['r_test_first'][m])} -> "
                   f"{_f(n['r_test_last'][m])} in {n['steps'][m]} steps{held}.")
    return out


@FINDINGS.register("06_mucode")
def _mucode(n: Mapping) -> list[str]:
    bon = n.get("bon_pass_final") or {}
    out = [f"{n['iterations']} expert-iteration rounds on {n['examples']} labelled attempts; the "
           f"local expert passed in {', '.join(_pct(x) for x in n['expert_pass_frac'])} of tasks."]
    if bon:
        out.append("Multi-turn Best-of-N, final pass rate by selector: "
                   + ", ".join(f"{k} {_f(v)}" for k, v in bon.items())
                   + f" (one sample, one turn: {_f(n.get('bon_single_turn_n1'))}).")
    return out


@FINDINGS.register("07_bring_your_own_model")
def _byom(n: Mapping) -> list[str]:
    base = "stayed frozen" if n["base_weight_max_change"] == 0 else "moved (they should not)"
    return [f"A Hugging Face model of {n['parameters']:,} parameters trained with LoRA "
            f"({_pct(n['trainable_fraction'])} trainable) on {n['device']}: the base weights "
            f"{base}, the adapters moved by up to {n['lora_weight_max_change']:.2e}; "
            f"{n['steps_with_signal']} of {n['steps']} steps had signal."]


@FINDINGS.register("08_scale_out")
def _scale_out(n: Mapping) -> list[str]:
    return [f"TRL's GRPOTrainer ran {n['steps']} steps with labkit's sandbox reward "
            f"({n['grpo_reward_calls']} reward calls; rewards equal labkit's: "
            f"{'yes' if n['rewards_equal'] else 'no'}); DiDPO credit through TRL equals "
            f"labkit's: {'yes' if n['credit_equal'] else 'no'}."]


# ----------------------------------------------------------------------------- in plain words


def _share(k: Any, n: Any) -> str:
    return f"{k} of {n}"


@PLAIN.register("00_tour")
def _tour_plain(n: Mapping) -> str:
    signal = n["nonzero_std_groups"]
    return (f"The model's attempts are scored by running tests; only a task whose attempts score "
            f"differently teaches anything, and {_share(signal, n['tasks'])} did here.")


@PLAIN.register("01_tasks_and_sandbox")
def _tasks_plain(n: Mapping) -> str:
    paid = n["hacks_rewarded"]
    return (f"A bug is a task only if the tests catch it ({_share(n['mutants_caught'], n['mutants'])} "
            f"were caught), and {'no' if paid == 0 else paid} reward hack"
            f"{'' if paid == 1 else 's'} got paid.")


@PLAIN.register("02_reward_reshaping")
def _reshaping_plain(n: Mapping) -> str:
    gain = n.get("trap_minus_default_on_copies")
    copy = ("" if gain is None else
            f"; without a gate, returning the buggy code unchanged earns {gain:+.2f} more reward")
    return ("Changing a reward only changes training if it changes which attempt of a group "
            f"ranks higher{copy}.")


@PLAIN.register("03_counterfactual_forking")
def _forking_plain(n: Mapping) -> str:
    same = n.get("dr_nonzero_frac")
    part = "" if same is None else f": {_pct(1 - same)} of the swapped tokens changed nothing"
    return f"Swapping one token of an answer and finishing it again shows which tokens mattered{part}."


@PLAIN.register("04_anchor_grouping")
def _anchors_plain(n: Mapping) -> str:
    rho = {k: v for k, v in (n.get("spearman") or {}).items()
           if v is not None and k in ("grpo", "didpo", "didpo_fork")}
    if not rho:
        return ("DiDPO compares only the attempts that made the same edit; this run had no "
                "hunks to check its credit against.")
    best = max(rho, key=rho.get)
    return (f"Whose credit follows each edit's real worth on this batch? {best} most "
            f"({', '.join(f'{k} {v:+.2f}' for k, v in rho.items())}, 1 is a perfect ranking); "
            "one batch, so docs/results/credit.md is the measured answer.")


@PLAIN.register("05_training")
def _training_plain(n: Mapping) -> str:
    moves = []
    for m in n["methods"]:
        a, b = n["r_test_first"][m], n["r_test_last"][m]
        moves.append(f"{m} {'up' if b > a + 1e-9 else 'down' if b < a - 1e-9 else 'flat'}")
    return ("Three ways to train on the same few tasks, one after the other; the share of tests "
            f"passed went {', '.join(moves)}. One seed: differences here are luck, not a ranking.")


@PLAIN.register("06_mucode")
def _mucode_plain(n: Mapping) -> str:
    bon = {k: v for k, v in (n.get("bon_pass_final") or {}).items() if k != "oracle"}
    if not bon:
        return "Several tries with test feedback, and a learned judge to pick among attempts."
    best = max(bon.values())
    top = [k for k, v in bon.items() if v == best]
    if len(top) == len(bon):
        return (f"Trying several attempts per turn and picking one: every way of picking solved "
                f"the same share ({_pct(best)}) here, too few tasks to tell them apart.")
    return (f"Trying several attempts per turn and picking one: {', '.join(top)} solved the most "
            f"({_pct(best)} of the tasks).")


@PLAIN.register("07_bring_your_own_model")
def _byom_plain(n: Mapping) -> str:
    return (f"LoRA trains a small add-on ({_pct(n['trainable_fraction'])} of the weights) and "
            f"{'leaves the model itself untouched' if n['base_weight_max_change'] == 0 else 'moved the model itself (it should not)'}.")


@PLAIN.register("08_scale_out")
def _scale_out_plain(n: Mapping) -> str:
    same = n["rewards_equal"] and n["credit_equal"]
    return ("The same rewards and credit run inside TRL, a trainer built for many GPUs: "
            + ("it saw exactly labkit's numbers." if same else "its numbers differ from labkit's."))


KEY_NUMBERS: dict[str, list[tuple[str, str, str]]] = {
    "00_tour": [("reward_mean", "mean reward of the first batch", "{:.3f}"),
                ("pass_rate", "pass rate of the first batch", "{:.3f}")],
    "01_tasks_and_sandbox": [("humaneval_tasks", "bug-injected HumanEval tasks", "{:d}"),
                             ("mutants_caught", "injected bugs caught by the tests", "{:d}"),
                             ("hacks_flagged", "reward hacks flagged", "{:d}")],
    "03_counterfactual_forking": [("recomputed_fraction", "prefix positions recomputed by forks",
                                   "{:.1%}")],
    "04_anchor_grouping": [("anchors", "DiDPO anchors in the group", "{:d}"),
                           ("didpo_token_coverage", "tokens with diff-level credit", "{:.1%}")],
    "06_mucode": [("bon_single_turn_n1", "single sample, single turn pass rate", "{:.3f}"),
                  ("bon_turn1_pass_at_n", "pass@N of the first turn", "{:.3f}")],
    "07_bring_your_own_model": [("trainable_fraction", "trainable share of the LoRA model",
                                 "{:.2%}")],
}
"""``notebook -> [(key, readable name, format)]`` of the front page's table."""


def findings(name: str, numbers: Mapping | None) -> list[str]:
    """The sentences for notebook ``name`` (a pointer to its JSON when none can be written)."""
    if not numbers:
        return ["It recorded no numbers."]
    if name not in FINDINGS:
        return [f"See {name}.json for its numbers."]
    try:
        return FINDINGS.get(name)(numbers)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as e:
        return [f"Its numbers lack what the summary reads ({type(e).__name__}: {e}); see "
                f"{name}.json."]


def plain(name: str, numbers: Mapping | None) -> str | None:
    """The plain sentence for notebook ``name``, or None when it has none or its numbers lack
    what it reads."""
    if not numbers or name not in PLAIN:
        return None
    try:
        return PLAIN.get(name)(numbers)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError):
        return None


def key_numbers_html(rows: Sequence[Mapping]) -> str:
    lines = ["<table class='key-numbers'><tr><th>notebook</th><th>number</th><th>value</th></tr>"]
    for r in rows:
        nums = r.get("numbers") or {}
        for key, label, fmt in KEY_NUMBERS.get(r["notebook"], []):
            value = nums.get(key)
            if value is None:
                continue
            try:
                text = fmt.format(value)
            except (ValueError, TypeError):
                text = str(value)
            lines.append(f"<tr><td>{html.escape(r['notebook'])}</td><td>{html.escape(label)}</td>"
                         f"<td>{html.escape(text)}</td></tr>")
    lines.append("</table>")
    return "\n".join(lines)


def front_figures(notebook: Path) -> list[str]:
    """The plotly outputs of ``notebook``'s ``front-page`` cells as static divs."""
    import nbformat
    import plotly.io as pio

    if not notebook.is_file():
        return []
    nb = nbformat.read(str(notebook), as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code" or FRONT_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if PLOTLY_MIME in data:
                fig = pio.from_json(json.dumps(data[PLOTLY_MIME]))
                out.append(pio.to_html(fig, include_plotlyjs=False, full_html=False,
                                       config={"displaylogo": False}))
    return out


_HEADING = re.compile(r"<h([12])[^>]*\bid=\"([^\"]+)\"[^>]*>(.*?)</h\1>", re.S)


def headings(body: str) -> list[tuple[int, str, str]]:
    """``(level, id, text)`` of a notebook fragment's ``h1``/``h2`` headings."""
    out = []
    for level, anchor, inner in _HEADING.findall(body):
        text = re.sub(r"<[^>]+>", "", inner).replace("¶", "").strip()
        out.append((int(level), anchor, text))
    return out


def contents_html(rows: Sequence[Mapping], bodies: Mapping[str, str]) -> str:
    """The contents, folded: each notebook's status, wall time, JSON and ``##`` sections."""
    parts = ["<details class='toc'><summary>Contents: the notebooks and their sections"
             "</summary><nav class='toc'><ol>"]
    for r in rows:
        name = r["notebook"]
        status = r["status"]
        cls = "" if status == "ok" else " class='failed'"
        subs = [f"<li><a href='#{html.escape(a)}'>{html.escape(t)}</a></li>"
                for level, a, t in headings(bodies.get(name, "")) if level == 2]
        parts.append(f"<li><a href='#{name}'>{name}</a> <span{cls}>{html.escape(status)}</span>, "
                     f"{r['seconds']:.0f} s, <a href='{name}.json'>{name}.json</a>"
                     + (f"<ol>{''.join(subs)}</ol>" if subs else "") + "</li>")
    parts.append("</ol></nav></details>")
    return "\n".join(parts)


def front_page(out: Path, rows: Sequence[Mapping], bodies: Mapping[str, str],
               figures: Callable[[Path], list[str]] = front_figures,
               results: Sequence[tuple[str, str, str]] | None = None,
               results_plain: Sequence[str] | None = None) -> str:
    """The front page's HTML (see the module docstring): what this lab found first, the
    contents folded at the end; ``results`` and ``results_plain`` default to
    :func:`labkit.docs.findings.rows` and ``plain_rows`` of the repository's records."""
    if results is None:
        results, results_plain = findings_rows(), plain_rows()
    found = ["<section class='front'><h2>What this lab found</h2>"
             "<p class='lede'>One short run per notebook on the tiny model: in plain words first, "
             "then its numbers. Terms are explained in the repository's "
             "<code>docs/glossary.md</code>.</p><dl>"]
    for r in rows:
        name = r["notebook"]
        if r["status"] != "ok":
            said, simple = [f"It failed: {r.get('error', '')}."], None
        else:
            said, simple = findings(name, r.get("numbers")), plain(name, r.get("numbers"))
        words = f"<p class='plain'>{html.escape(simple)}</p>" if simple else ""
        found.append(f"<dt><a href='#{name}'>{name}</a></dt><dd>{words}<p class='numbers'>"
                     + " ".join(html.escape(s) for s in said) + "</p></dd>")
    found.append("</dl>")
    found.append(experiments_html(results, results_plain))
    figs = [(r["notebook"], f) for r in rows for f in figures(out / f"{r['notebook']}.ipynb")]
    if figs:
        found.append("<h2>Figures</h2>")
        found += [f"<figure class='front-figure'>{f}<figcaption>from <a href='#{n}'>{n}</a>"
                  "</figcaption></figure>" for n, f in figs]
    found.append("<h2>Key numbers</h2>" + key_numbers_html(rows)
                 + "<p>Every number a notebook recorded is in its JSON file next to this report "
                   "(<a href='lab.json'>lab.json</a> lists them).</p>")
    found.append(contents_html(rows, bodies) + "</section>")
    return "\n".join(found)


def experiments_html(results: Sequence[tuple[str, str, str]],
                     plain_words: Sequence[str] | None = None) -> str:
    """The committed multi-seed findings (``(sentence, could this testbed see it, page)``
    rows, each after its plain-words sentence when ``plain_words`` has them), as the README
    lists them."""
    if not results:
        return "<h2>What the experiments found</h2><p>No results are recorded in docs/results.</p>"
    words = list(plain_words or [])
    words += [""] * (len(results) - len(words))
    items = "".join((f"<li><p class='plain'>{html.escape(w)}</p>" if w else "<li>")
                    + f"{html.escape(said)} <em>Could this testbed see it? {html.escape(seen)}.</em> "
                    f"<code>docs/results/{html.escape(page)}</code></li>"
                    for w, (said, seen, page) in zip(words, results))
    return ("<h2>What the experiments found</h2><p>Several training seeds per method, paired "
            "on held-out tasks; the repository's <code>docs/results</code> pages (the same "
            f"rows as its README):</p><ul class='experiments'>{items}</ul>")
