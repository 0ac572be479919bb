"""Every number in the manual comes from a record.

A number in README.md or docs/*.md outside generated blocks (``<!-- NAME:start -->`` ...
``<!-- NAME:end -->``, written by ``python -m labkit docs``), fenced code, comments, link
targets and three-part version numbers must be one of:

* a value of a committed record: a JSON or JSONL file under docs/results, docs/benchmarks or
  data/ (the figures of the papers, the seed blog and the software the lab builds on are in
  docs/results/sources.json);
* a number of docs/reference.md's generated block (every config default and command flag);
* on :data:`DERIVED` (worked out from other numbers; the test recomputes it) or :data:`CODE`
  (a constant of the code, a test's input or tolerance, a pinned version, that no config
  exposes; the test finds it in the file named).

A measured figure that no record holds belongs in the journal (docs/journal/, not read
here). A number matches a record's value at the precision it is printed with (``0.052``
matches 0.0523, ``2.0M`` 1,967,808), a signed one only a value of its sign, and ``35%`` also
matches 0.35. Values inside a list or mapping of more than :data:`MAX_ENTRIES` entries
(per-task lists, per-hunk records) are not read: a page quotes summaries, and among thousands
of per-task values a typed figure would too often meet a coincidence. Small integers (counts,
steps, G = 8) are in some record almost always; the test bites on decimals, percentages and
large counts, which is where hand-typed measurements hide. A change printed with its interval,
``+0.052 [+0.022, +0.082]``, must be one record's mean and interval together.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORD_DIRS = [ROOT / "docs" / "results", ROOT / "docs" / "benchmarks", ROOT / "data"]
NOT_RECORDS = {"tokenizer.json"}
"""Files under data/ that are not records (a tokenizer's vocabulary numbers every token)."""
REFERENCE = ROOT / "docs" / "reference.md"
SOURCES = ROOT / "docs" / "results" / "sources.json"
MAX_ENTRIES = 32
MAX_STRING = 300
"""Numbers inside a record's strings count (a command's options, a source's table) up to this
length; longer strings are code or prose."""

DERIVED = {  # printed -> (expression, why); the test evaluates the expression
    "2.47": ("7 / math.sqrt(8)", "GRPO's largest standardised advantage (G - 1) / sqrt(G) at G = 8"),
    "0.975": ("1 - 0.05 / 2", "the t quantile of a two-sided 95% interval"),
    "0.01381": ("(1 - math.exp(-1 / 8)) ** 2", "DiDPO's groupability GS(L=1, n=2) with s0 = g0 = 8"),
    "1e-7": ("2 ** -23", "float32's relative rounding step: how far two float32 sums in another order differ"),
    "27,000": ("9 * 3000", "the template census: nine families, 3,000 drafts each"),
    "6,000": ("3 * 2000", "the leak pool: 2,000 training problems of three generator streams (LEAK_POOL)"),
    "525,312": ("128 * (8 + 4 * 1024)", "bytes a DiDPO step gathers for 8 GPUs x 16 rows of 1,024 tokens"),
    "-2": ("-1 - 1", "docs/bugs.md's example of index_offset: xs[-1] moved down by one"),
}
"""Numbers worked out from others, each with the expression that gives it."""

CODE = {  # printed -> (file that holds it, why it is not in a record)
    "-20": ("labkit/credit/losses.py", "the log-ratio clamp of PPO-clip and the KL estimators"),
    "-10": ("labkit/credit/losses.py", "the clamp of the k3 KL estimate"),
    "1e-6": ("labkit/credit/advantages.py", "EPS added to a group's std"),
    "1e-5": ("tests/test_tail.py", "the tolerance of the lean loss engine against the model's forward"),
    "1e-4": ("tests/test_forking.py", "the tolerance of forks against a naive generate"),
    "1e-3": ("tests/test_integrations_trl.py", "two processes against one: weights within 1e-3 of the move"),
    "3,000": ("labkit/env/synthetic.py", "family_templates' census size (3_000 drafts)"),
    "10,000": ("labkit/env/synthetic.py", "_MAX_MISSES: draws without a new behaviour before the stream stops"),
    "4,300": ("labkit/sandbox/plain.py", "MAX_INT_DIGITS of a grader reply"),
    "200,000": ("labkit/sandbox/plain.py", "MAX_ITEMS of a grader reply"),
    "100,000": ("tests/test_sandbox_adversarial.py", "the nested brackets of a hostile reply"),
    "20,000": ("tests/test_sandbox_adversarial.py", "the colliding ints of a hostile reply"),
    "1,200": ("tests/test_sandbox_adversarial.py", "DEPTH of the nested directories a check leaves"),
    "64000": ("labkit/sandbox/config.py", "SandboxConfig.uid_base"),
    "3.11": ("pyproject.toml", "requires-python"),
    "9.2": ("pyproject.toml", "pytest is held below 9.2"),
    "1386": ("pyproject.toml", "the pytest-xdist issue the pin names"),
    "5.11": ("requirements-verl.txt", "verl 0.9.1's transformers requirement"),
}
"""Constants of the code and pins of the project, each found in the file it names."""

BLOCK = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.S)
FENCE = re.compile(r"^ *(`{3,}|~{3,}).*?^ *\1[ \t]*$", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)|<https?://[^>]*>|https?://\S+")
VERSION = re.compile(r"(?<![\w.])v?\d+(?:\.\d+){2,}\b")
NUMBER = re.compile(r"(?:(?<![\w.,/@#])[+\-\u2212])?(?<![\w.,/@#])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?"
                    r"(?:e([+\-]?\d+))?([kMB](?!\w)|x(?!\w)|%)?(?![\w.]\d|\w)")
MULTIPLIER = {"k": 3, "M": 6, "B": 9}


def prose(text: str) -> str:
    """``text`` with what is not prose blanked (line numbers kept): generated blocks, fenced
    code, comments, link targets and three-part version numbers."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    for pattern in (BLOCK, FENCE, COMMENT, LINK_TARGET, VERSION):
        text = pattern.sub(blank, text)
    return text


def numbers(text: str):
    """``(line, as printed, value, half its last printed digit, signed, percent)`` per number."""
    for i, line in enumerate(text.splitlines(), 1):
        for m in NUMBER.finditer(line):
            digits, frac, exp, suffix = m.groups()
            shift = int(exp or 0) + MULTIPLIER.get(suffix or "", 0)
            decimals = len(frac) - 1 if frac else 0
            signed = m.group(0)[0] in "+-\u2212"
            mantissa = float(digits.replace(",", "") + (frac or ""))
            if m.group(0)[0] in "-\u2212":
                mantissa = -mantissa
            yield (i, m.group(0), mantissa * 10 ** shift, 0.5 * 10 ** (shift - decimals), signed,
                   suffix == "%")


def _walk(x, out: list[float]) -> None:
    if isinstance(x, bool) or x is None:
        return
    if isinstance(x, (int, float)):
        if math.isfinite(x):
            out.append(float(x))
    elif isinstance(x, str):
        if len(x) <= MAX_STRING:
            out += [v for _, _, v, *_ in numbers(x)]
    elif len(x) <= MAX_ENTRIES:
        for v in (x.values() if isinstance(x, dict) else x):
            _walk(v, out)


def record_files(dirs=RECORD_DIRS) -> list[Path]:
    return sorted(p for d in dirs for p in Path(d).rglob("*")
                  if p.suffix in (".json", ".jsonl") and p.name not in NOT_RECORDS)


def record_values(files) -> list[float]:
    """Every number of the records, sorted (a record's top level is read whatever its size)."""
    out: list[float] = []
    for f in files:
        text = Path(f).read_text()
        docs = ([json.loads(x) for x in text.splitlines() if x.strip()] if str(f).endswith(".jsonl")
                else [json.loads(text)])
        for doc in docs:
            for v in (doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else [doc]):
                _walk(v, out)
    return sorted(out)


def _plain(printed: str) -> str:
    return printed.replace(",", "").replace("\u2212", "-").lstrip("+").rstrip("%x")


def reference_numbers(path: Path = REFERENCE) -> set[str]:
    """The numbers of docs/reference.md's generated block, as printed."""
    block = BLOCK.search(path.read_text())
    assert block and block.group(1) == "reference", f"{path.name}: no reference block"
    return {_plain(printed) for _, printed, *_ in numbers(block.group(0))}


def _near(values: list[float], x: float, half: float) -> bool:
    half *= 1 + 1e-9
    i = bisect.bisect_left(values, x - half)
    return i < len(values) and values[i] <= x + half


def found(values, known: set[str], printed, value, half, signed, percent) -> bool:
    if _plain(printed) in known:
        return True
    for v in ([value] if signed else [value, -value]):
        if _near(values, v, half) or (percent and _near(values, v / 100, half / 100)):
            return True
    return False


INTERVAL = re.compile(r"([+\-\u2212]?\d+\.\d+) \[([+\-\u2212]?\d+\.\d+), ([+\-\u2212]?\d+\.\d+)\]")


def record_intervals(files) -> list[tuple[float, float, float]]:
    """Every ``(mean, low, high)`` of the records: a mapping's ``mean`` (or ``X``) with its
    ``ci95`` (or ``X_ci95``), in containers of any size."""
    out = []

    def walk(x):
        if isinstance(x, dict):
            for k, ci in x.items():
                base = "mean" if k.startswith("ci95") else k[:-len("_ci95")] if k.endswith("_ci95") else None
                mean = x.get(base) if base else None
                if (isinstance(mean, (int, float)) and isinstance(ci, list) and len(ci) == 2
                        and all(isinstance(v, (int, float)) for v in ci)):
                    out.append((float(mean), float(ci[0]), float(ci[1])))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for f in files:
        text = Path(f).read_text()
        for doc in ([json.loads(x) for x in text.splitlines() if x.strip()] if str(f).endswith(".jsonl")
                    else [json.loads(text)]):
            walk(doc)
    return out


def _interval_held(triple: tuple[str, str, str], intervals) -> bool:
    want = [next(numbers(s))[2:4] for s in triple]  # (value, half) each
    return any(all(abs(v - x) <= h * (1 + 1e-9) for (x, h), v in zip(want, rec)) for rec in intervals)


def unsourced(pages, files, known: set[str]) -> list[str]:
    """``page:line: number`` for each number of ``pages`` that no record holds and ``known``
    (the reference's numbers and the allowlists, as printed without sign or commas) lacks, and
    for each change printed with its interval that no record's mean and interval give."""
    values, intervals = record_values(files), record_intervals(files)
    out = []
    for page in pages:
        text = prose(Path(page).read_text())
        out += [f"{Path(page).name}:{line}: {printed}" for line, printed, *rest in numbers(text)
                if not found(values, known, printed, *rest)]
        for i, line in enumerate(text.splitlines(), 1):
            out += [f"{Path(page).name}:{i}: {m.group(0)} (no record has this change with this interval)"
                    for m in INTERVAL.finditer(line) if not _interval_held(m.groups(), intervals)]
    return out


def allowed() -> set[str]:
    return {_plain(k) for k in (*DERIVED, *CODE)}


def test_every_number_of_the_manual_is_in_a_record_the_reference_or_the_allowlist():
    t0 = time.perf_counter()
    missing = unsourced(PAGES, record_files(), reference_numbers() | allowed())
    assert not missing, ("numbers typed by hand: make them a generated block (labkit/docs/"
                         "findings.py BLOCKS), put the source's figure in docs/results/sources.json, or "
                         "move the sentence to docs/journal/:\n" + "\n".join(missing))
    assert time.perf_counter() - t0 < 2


def test_a_typed_number_is_named_with_its_page_and_line(tmp_path):
    """The check can fail: the issue's example, a probe's interval quoted where the record
    says otherwise, is named, and its interval still is where each of its numbers is known on
    its own; the record's own numbers, at the page's precision, pass."""
    (tmp_path / "learning.json").write_text(json.dumps(
        {"claim": {"mean": 0.0523, "ci95": [0.0221, 0.0824], "seeds": 3}, "per_task": list(range(40))}))
    page = tmp_path / "training.md"
    page.write_text("# Training\n\nGRPO moves it by +0.052 [+0.022, +0.082].\n\n"
                    "<!-- findings:start -->\n+0.9999 is generated\n<!-- findings:end -->\n\n"
                    "```\n+0.777 in code\n```\n\nA probe said +0.056 [+0.028, +0.084] over 3 seeds, "
                    "-0.052 once and 39 tasks.\n")
    files = [tmp_path / "learning.json"]
    assert unsourced([page], files, set()) == ["training.md:13: +0.056", "training.md:13: +0.028",
                                                "training.md:13: +0.084", "training.md:13: -0.052",
                                                "training.md:13: 39",  # only in a long per-task list
                                                "training.md:13: +0.056 [+0.028, +0.084] (no record has "
                                                "this change with this interval)"]
    assert unsourced([page], files, {"0.056", "0.028", "0.084", "-0.052", "39"}) == [
        "training.md:13: +0.056 [+0.028, +0.084] (no record has this change with this interval)"]


def test_the_number_reader_reads_what_a_page_prints():
    got = [(p, v) for _, p, v, *_ in numbers("2.0M parameters, 35%, 2.3x, 1e-6, 1,024 tokens, "
                                              "0.80-0.85, pass@8, HumanEval/31, k3, x86, -0.5")]
    assert got == [("2.0M", 2.0e6), ("35%", 35.0), ("2.3x", 2.3), ("1e-6", 1e-6), ("1,024", 1024.0),
                   ("0.80", 0.8), ("0.85", 0.85), ("-0.5", -0.5)]
    assert prose("verl 0.9.1 and 0.9").strip() == "verl       and 0.9"


def test_the_allowlists_hold_what_they_say():
    for printed, (expr, why) in DERIVED.items():
        (_, _, value, half, *_), = numbers(printed)
        assert abs(eval(expr, {"math": math}) - value) <= half, f"{printed} is not {expr} ({why})"
    for printed, (file, why) in CODE.items():
        text = (ROOT / file).read_text()
        plain = _plain(printed)
        forms = {printed, plain, f"{int(plain):_}" if plain.lstrip("-").isdigit() else plain}
        assert any(f in text for f in forms), f"{printed} is not in {file} ({why})"


def test_each_claimed_size_is_its_sources_figure():
    """A claim's size in a results record (named in code before the run) is the one
    sources.json gives for it, and each source the records cite is in sources.json."""
    sources = json.loads(SOURCES.read_text())["sources"]
    claimed = {(c["experiment"], c["contrast"]): c for s in sources for c in s.get("claims", [])}
    arxiv = {s["arxiv"] for s in sources if s.get("arxiv")}
    checked = 0
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        for c in (data.get("primary") or {}).get("contrasts", []):
            cited = set(re.findall(r"arXiv (\d{4}\.\d{4,5})", c.get("source", "")))
            assert cited <= arxiv, f"{path.name}: {c['label']} cites {cited - arxiv}, not in sources.json"
            if c.get("role") != "claim" or not (cited or "seed blog" in c.get("source", "")):
                continue
            if c.get("size") is None and c.get("relative") is None:
                continue
            src = claimed.get((data["experiment"], c["label"]))
            assert src, f"{path.name}: the claim {c['label']!r} has no entry in sources.json"
            for key in ("size", "relative"):
                assert src.get(key) == c.get(key), f"{path.name}: {c['label']} {key} {c.get(key)} != {src.get(key)}"
            checked += 1
    assert checked >= 3


if __name__ == "__main__":
    print("\n".join(unsourced(PAGES, record_files(), reference_numbers() | allowed())))
