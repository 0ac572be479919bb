"""The README's findings table is generated from the committed results records."""

import json
import statistics
from pathlib import Path

import pytest

from labkit.experiments import findings

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
    change = learning["methods"]["grpo"]["paired_change"]
    naive = statistics.fmean(statistics.fmean(v) for v in change["per_task"].values())  # recomputed
    assert f"held-out templates by {naive:+.3f}" in text


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
    from labkit.experiments.findings import write_all

    assert write_all(check=True) == []


def test_the_reference_lists_every_estimator_and_every_training_field():
    import dataclasses

    import labkit.credit  # noqa: F401 - registers every estimator
    from labkit.credit.advantages import ADVANTAGE_ESTIMATORS
    from labkit.loops.config import TrainConfig
    from labkit.reference import computed_defaults, markdown

    page = markdown()
    for name in ADVANTAGE_ESTIMATORS:
        meta = ADVANTAGE_ESTIMATORS.meta(name)
        assert f"### `{name}`" in page and f"*credit*: {meta['credit']}" in page, name
    assert "*needs*: hunks; *credit*: token" in page  # oracle_hunk
    train = page[page.index("### `TrainConfig`"):]
    for f in dataclasses.fields(TrainConfig):
        assert f"| `{f.name}` |" in train, f.name
    from labkit.env.sandbox import SandboxConfig

    assert computed_defaults(SandboxConfig)["workers"] == "os.cpu_count() or 1"  # not this machine's count
