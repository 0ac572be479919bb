"""The README's findings table is generated from the committed results records."""

import json
import statistics
from pathlib import Path

import pytest

from labkit.experiments import claims
from labkit.docs import findings

ROOT = Path(__file__).resolve().parents[1]


def test_readme_findings_block_is_what_the_records_give():
    for page in ("README.md", "docs/tiny_model.md", "docs/benchmarks.md"):
        assert findings.main(["--check", str(ROOT / page)]) == 0, page


def test_every_committed_record_has_a_row_with_its_own_numbers():
    recs = findings.records()
    assert recs, "no results record"
    text = findings.table()
    for path, _ in recs:
        assert f"[{path.with_suffix('.md').name}]" in text
    learning = json.loads((ROOT / "docs" / "results" / "learning.json").read_text())
    key = learning["primary"]["key"]
    change = learning["methods"]["grpo"][f"{key}_change"]
    naive = statistics.fmean(statistics.fmean(v) for v in change["per_task"].values())  # recomputed
    assert f"GRPO - start: {naive:+.3f}" in text


def test_a_stale_block_fails_the_check_and_write_repairs_it(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{findings.START}\n| old | table |\n{findings.END}\n\nafter\n")
    assert findings.main(["--check", str(readme)]) == 1
    assert findings.main(["--write", str(readme)]) == 0
    assert findings.main(["--check", str(readme)]) == 0
    assert readme.read_text().endswith("\n\nafter\n") and "| old |" not in readme.read_text()


def test_a_file_without_the_markers_is_named():
    with pytest.raises(ValueError, match="no findings block: add a line <!-- findings:start -->"):
        findings.replace_block("# no markers\n", "| t |")


def test_the_manual_is_in_the_present_tense():
    """Outside the journal and the results records, the README and docs/ hold no dates in prose,
    no work-period labels and no names of model variants tried before the shipped one."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    patterns = {"a date": r"\b20\d\d-\d\d-\d\d\b", "a work-period label": r"\b[Ss]essions? \d",
                "a variant letter": r"\b(?:[Vv]ariants?|model) (?:[A-K]|K2)\b"}
    found = []
    for page in pages:
        prose = re.sub(r"\]\([^)]*\)", "]()", page.read_text())  # link targets are addresses
        for what, pat in patterns.items():
            found += [f"{page.name}: {what}: {m.group(0)!r}" for m in re.finditer(pat, prose)]
    assert not found, "\n".join(found)


def test_every_generated_page_is_current():
    """README, benchmarks, the tiny model's quality and the reference: what `python -m labkit
    docs` writes from the records and the code."""
    from labkit.docs.findings import write_all

    assert write_all(check=True) == []


def test_the_reference_lists_every_estimator_and_every_training_field():
    import dataclasses

    import labkit.credit  # noqa: F401 - registers every estimator
    from labkit.credit.advantages import ADVANTAGE_ESTIMATORS
    from labkit.loops.config import TrainConfig
    from labkit.docs.reference import computed_defaults, markdown

    page = markdown()
    for name in ADVANTAGE_ESTIMATORS:
        meta = ADVANTAGE_ESTIMATORS.meta(name)
        assert f"### `{name}`" in page and f"*credit*: {meta['credit']}" in page, name
    assert "*needs*: hunks; *credit*: token" in page  # oracle_hunk
    train = page[page.index("### `TrainConfig`"):]
    for f in dataclasses.fields(TrainConfig):
        assert f"| `{f.name}` |" in train, f.name
    from labkit.sandbox.config import SandboxConfig

    assert computed_defaults(SandboxConfig)["workers"] == "os.cpu_count() or 1"  # not this machine's count


def test_the_reference_prints_a_sections_default_as_the_value_its_factory_makes():
    """A config section's default is what its default factory makes, not its class's
    defaults: ``Type()`` only when they are the same, else the fields that differ."""
    from dataclasses import dataclass, field, fields

    from labkit.docs.reference import _default

    @dataclass
    class Inner:
        a: int = 1
        b: str = "x"

    @dataclass
    class Outer:
        same: Inner = field(default_factory=Inner)
        made: Inner = field(default_factory=lambda: Inner(a=2))

    same, made = fields(Outer)
    assert (_default(same, {}), _default(made, {})) == ("`Inner()`", "`Inner(a=2)`")


def test_the_seen_column_reads_each_experiments_signed_positive_control():
    """"Could this testbed see it?": yes when the claim's positive controls passed, no with the
    failed control's reason, "not known" when none was run; every row carries its plain-words
    sentence and its claim's verdict."""
    table = findings.table()
    assert f"| in plain words | what the records say | {findings.SEEN_HEADER} | page |" in table
    for path, data in findings.records():
        seen = findings.SEEN[data["experiment"]](data)
        prim = data.get("primary") or {}
        positives = claims.controls_of(prim, "positive")
        if positives and all(p.get("change") for p in positives):
            assert seen.startswith("yes: " if prim["testbed_sees"] else "no: "), (path.name, seen)
        assert f"| {seen} | [{path.with_suffix('.md').name}]" in table
        assert findings.plain(data) in table
        claim = claims.claim_of(prim)
        if claim and data["experiment"] != "credit":
            assert f"**{claim['verdict']}**" in findings.ROWS[data["experiment"]](data)

    def record(passed, verdict="undecided"):
        change = {"mean": 0.05, "ci95": [0.01, 0.09], "seeds": 3, "tasks": 200}
        rows = [{"role": "claim", "label": "a - b", "direction": 1, "size_abs": 0.056,
                 "verdict": verdict, "why": "", "change": change}]
        if passed is not None:
            rows.append({"role": "positive", "label": "oracle - b", "of": "a - b", "passed": passed,
                         "why": "the control failed: it moved the wrong way", "change": change})
        return {"experiment": "didpo", "primary": {"contrasts": rows, "mde": 0.02,
                                                   "testbed_sees": passed}}

    assert findings.SEEN["didpo"](record(True)).startswith("yes: oracle - b +0.050, passed")
    assert findings.SEEN["didpo"](record(False)) == ("no: oracle - b +0.050 (it moved the wrong way), "
                                                     "detectable 0.020")
    assert findings.SEEN["didpo"](record(None)) == "not known: no positive control was run"
    assert findings.SEEN["learning"](record(None, "supported")).startswith("yes")
    assert findings.plain(record(False)).endswith(findings.CONTROL_FAILED)
    assert findings.plain(record(True, "supported")) == findings.PLAIN["didpo"]["supported"]
    # a page with two claims gives two rows, each read against its own controls
    two = record(True)
    second = {"role": "claim", "label": "learned verifier - random pick, multi-turn BoN",
              "direction": 1, "size_abs": 0.058, "verdict": "refuted at this scale", "why": "",
              "change": two["primary"]["contrasts"][0]["change"], "mde": 0.03, "testbed_sees": False}
    two["primary"]["contrasts"] += [second, {
        "role": "positive", "label": "oracle - random", "of": second["label"], "passed": False,
        "why": "the control failed: its interval includes 0", "change": second["change"]}]
    assert findings._claims(two) == [two["primary"]["contrasts"][0], second]
    assert findings.SEEN["didpo"](two, second) == ("no: oracle - random +0.050 (its interval "
                                                   "includes 0), detectable 0.030")
    assert findings.plain(two, second) == (findings.PLAIN_CLAIMS[second["label"]]["refuted at this scale"]
                                           + findings.CONTROL_FAILED)
    assert findings.SEEN["didpo"](two).startswith("yes: oracle - b")  # the first claim's, as before


def test_every_finding_is_one_short_sentence():
    """Each row of the README's table: at most ``MAX_WORDS`` words, for every committed record,
    and every plain-words sentence."""
    said = [s for s, _, _ in findings.rows()] + [p for v in findings.PLAIN.values() for p in v.values()]
    for s in said:
        assert len(s.split()) <= findings.MAX_WORDS, (len(s.split()), s)


def test_notebook_minutes_and_suite_durations_come_from_the_latest_clean_records(tmp_path):
    """The README's learner's path reads the last full-budget lab record that ran every
    notebook (smoke runs and failed runs are not read); the suite's table the last passing
    fresh and warm runs."""
    from labkit.machine import append_record

    lab_file, tests_file = tmp_path / "lab.jsonl", tmp_path / "tests.jsonl"
    every = {name: {"status": "ok", "seconds": 30.0, "cpu_seconds": 50.0} for name in findings.GUIDE}
    append_record(lab_file, {"kind": "lab", "smoke": False, "failed": [], "seconds": 999.0,
                             "notebooks": {**every, "05_training": {"status": "ok", "seconds": 600.0}}})
    append_record(lab_file, {"kind": "lab", "smoke": True, "failed": [], "seconds": 5.0, "notebooks": every})
    append_record(lab_file, {"kind": "lab", "smoke": False, "failed": ["06_mucode"], "seconds": 7.0,
                             "notebooks": every})
    append_record(tests_file, {"kind": "tests", "command": "pytest", "seconds": 540.0,
                               "fresh_task_cache": True, "install_seconds": 120.0, "exit_status": 0,
                               "cpu_seconds": 800.0, "machine": {"cores": 2},
                               "outcomes": {"passed": 3}, "slowest": [{"test": "t::a", "seconds": 90.0}]})
    text = findings.notebooks(lab_file, tests_file)
    assert "| `05_training` | 10 |" in text and "| `00_tour` | <1 |" in text
    assert "`make lab` took 17 minutes" in text
    assert "`make test` 11 minutes on a fresh machine, 2 of them installing" in text
    assert "warm" not in text.split("Measured:")[1]  # no warm record: nothing said about it
    table = findings.test_durations(tests_file)
    assert "**warm task cache**: not recorded." in table and "| `t::a` | 90 |" in table
    assert "540 s + 120 s installing (3 passed;" in table
    assert "800 CPU s, so at least 400 s on 2 cores" in table
    assert "**fast tier** (`make test-fast`): not recorded." in table
    # a fast-tier run is its own line, never read as the full suite's warm run
    append_record(tests_file, {"kind": "tests", "command": "pytest -q -m x", "suite": "fast",
                               "seconds": 80.0, "fresh_task_cache": False, "exit_status": 0,
                               "outcomes": {"passed": 2}, "slowest": []})
    # a failed run of the whole suite is not its table's run either
    append_record(tests_file, {"kind": "tests", "command": "pytest", "seconds": 70.0,
                               "fresh_task_cache": True, "exit_status": 1,
                               "outcomes": {"passed": 2, "failed": 1}, "slowest": []})
    table = findings.test_durations(tests_file)
    assert "**warm task cache**: not recorded." in table and "540 s + 120 s installing" in table
    assert "**fast tier** (`make test-fast`): 80 s (2 passed; warm task cache;" in table
    assert "warm" not in findings.notebooks(lab_file, tests_file).split("Measured:")[1]


def test_readme_is_a_front_door():
    """At most 1,200 words (code blocks and the generated tables' markup included) and no
    table cell over 60 words: the README points to docs/ for everything longer."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 1200, len(text.split())
    cells = [c for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    longest = max(cells, key=lambda c: len(c.split()))
    assert len(longest.split()) <= 60, longest
