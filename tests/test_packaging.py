"""environment.yml mirrors pyproject.toml's pins (the dependencies and the dev and trackers
extras, what `make test` installs), and nothing admits a CUDA torch."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_mirrors_pyproject():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = proj["optional-dependencies"]
    pins = set(proj["dependencies"]) | set(extras["dev"]) | set(extras["trackers"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    mirrored = {p for p in pip if not p.startswith("-")}
    assert mirrored == pins, (sorted(pins - mirrored), sorted(mirrored - pins))


def test_torch_is_pinned_to_the_cpu_build():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in proj["dependencies"]


def test_the_repository_refers_only_to_itself():
    """Docs, docstrings, tests, notebooks and results name no file outside the repository:
    no development notes beside the checkout, no absolute path of a development machine."""
    import re
    import subprocess

    outside = re.compile("|".join(["shared/" + "notes", r"\.\./" + "shared/", "/" + "work/",
                                   "/" + "farm/"]))
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".ipynb", ".json", ".yml", ".yaml", ".toml", ".txt",
                               ""} or not path.is_file():
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:20])
