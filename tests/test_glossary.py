"""docs/glossary.md: it defines every term the README's findings use and the terms a learner
meets in the notebooks, and each notebook links a term to it where the term first appears."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# term's anchor in docs/glossary.md -> how the term is written in running text
TERMS: dict[str, str] = {
    "pass-at-k": r"pass@(?:1|k|\d+)\b",
    "grpo": r"(?<!Dr\. )\bGRPO\b",
    "dr-grpo": r"\bDr\. GRPO\b",
    "advantage": r"\badvantages?\b",
    "rollout": r"\brollouts?\b",
    "kl": r"\bKL\b",
    "ppo-clip": r"\bPPO-clip\b",
    "hunk": r"\bhunks?\b",
    "anchor": r"\banchors?\b",
    "shapley-value": r"\bShapley\b",
    "leave-one-out-effect": r"\bleave-one-out effect\b",
    "fork": r"\bforks?\b",
    "didpo": r"\bDiDPO\b",
    "reward-hack": r"\breward hacks?\b",
    "copying-trap": r"\bcopying trap\b",
    "template": r"\btemplates?\b",
    "seed": r"\bseeds?\b",
    "sharpening": r"\bsharpen(?:s|ing)?\b",
    "the-blog": r"\bblog\b",
    "reward-reshaping": r"\b(?:reward reshaping|reshaped GRPO)\b",
    "curriculum": r"\bcurriculum\b",
    "lora": r"\bLoRA\b",
    "verifier": r"\bverifiers?\b",
    "episode": r"\bepisodes?\b",
    "expert-iteration": r"\bexpert iteration\b",
    "best-of-n": r"\bBest-of-N\b",
    "oracle": r"\boracle\b",
    "rank-agreement": r"\brank agreement\b",
    "paired-change": r"\bpaired\b",
    "interval": r"\b(?:95% interval|interval(?= over)|significant over seeds|not shown)\b|\[[+-]\d",
    "verdict": r"\b(?:supported|refuted at this scale|undecided)\b",
    "mde": r"\b(?:minimum detectable effect|detectable|MDE)\b",
    "controls": r"\b(?:positive|negative) control\b|\bthe control (?:failed|passed)\b",
    "probability-of-improvement": r"\bprobability of improvement\b",
    "primary-contrast": r"\b(?:primary contrast|exploratory|Holm)\b",
    "testbed": r"\btestbed\b",
}
"""Every term the glossary must define, by its anchor, and how it reads in running text."""


def glossary_anchors() -> set[str]:
    return set(re.findall(r'<a id="([a-z0-9-]+)"></a>\n### ', GLOSSARY.read_text()))


def findings_section() -> str:
    """The README's "What the lab found" section: its words and its generated table."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## What the lab found")
    return text[start:text.index("\n## ", start + 1)]


def test_the_glossary_defines_every_term_with_an_anchor():
    missing = sorted(set(TERMS) - glossary_anchors())
    assert not missing, f"docs/glossary.md lacks an entry (<a id=...> + ###) for {missing}"


def test_the_glossary_defines_every_term_the_readme_findings_use():
    """Each term of :data:`TERMS` the findings section uses has its entry, and so does every
    phrase the section sets in bold (its verdict words)."""
    section = findings_section()
    used = [a for a, pattern in TERMS.items() if re.search(pattern, section)]
    assert len(used) >= 6, f"the findings section reads as expected? terms found: {used}"
    assert set(used) <= glossary_anchors()
    text = GLOSSARY.read_text().lower()
    text = re.sub(r"\s+", " ", text)
    bold = [re.sub(r"\s+", " ", b).lower() for b in re.findall(r"\*\*([^*]+)\*\*", section)]
    undefined = [b for b in bold
                 if not re.search(rf"\*\*{re.escape(b)}\*\*|### [^#]*{re.escape(b)}", text)]
    assert not undefined, f"bold in the README's findings, not in docs/glossary.md: {undefined}"


def test_links_to_the_glossary_name_its_entries():
    anchors = glossary_anchors()
    links = [(p.name, a) for p in NOTEBOOKS
             for a in re.findall(r"glossary\.md#([\w-]+)", p.read_text())]
    links += [(p.name, a) for p in (ROOT / "docs").rglob("*.md")
              for a in re.findall(r"glossary\.md#([\w-]+)", p.read_text())]
    links += [("README.md", a) for a in re.findall(r"glossary\.md#([\w-]+)",
                                                   (ROOT / "README.md").read_text())]
    bad = [(f, a) for f, a in links if a not in anchors]
    assert not bad, f"links to glossary entries that do not exist: {bad}"


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _running_text(nb) -> tuple[str, list[tuple[int, int, str]]]:
    """The notebook's markdown as a learner reads it, for finding where a term first appears:
    headings, inline code, maths, link targets and the generated "Try this" cells blanked
    (positions kept); and the spans of glossary links' texts with their anchors."""
    parts, links, offset = [], [], 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        src = cell.source + "\n\n"
        if src.startswith("**Try this.**"):
            src = " " * len(src)
        for m in _LINK.finditer(src):
            target = m.group(2)
            if "glossary.md#" in target:
                links.append((offset + m.start(1), offset + m.end(1), target.split("#", 1)[1]))
        blank = lambda m: " " * len(m.group(0))  # noqa: E731
        src = re.sub(r"(?m)^#.*$", blank, src)
        src = re.sub(r"`[^`]*`|\$\$.*?\$\$|\$[^$]*\$", blank, src, flags=re.S)
        src = re.sub(r"\]\([^)\s]+\)", blank, src)
        src = re.sub(r"<[^>]+>", blank, src)
        parts.append(src)
        offset += len(src)
    return "".join(parts), links


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_links_a_term_to_the_glossary_where_it_first_appears(path):
    text, links = _running_text(nbformat.read(path, as_version=4))
    assert links, f"{path.name} never links docs/glossary.md"
    unlinked = []
    for anchor, pattern in TERMS.items():
        m = re.search(pattern, text)
        if m and not any(a == anchor and s <= m.start() < e for s, e, a in links):
            context = text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ")
            unlinked.append(f"{anchor}: ...{context}...")
    assert not unlinked, (f"{path.name}: link these first appearances to "
                          "../docs/glossary.md#<anchor>:\n" + "\n".join(unlinked))
