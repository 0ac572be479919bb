"""The house's floors: each imports only the floors below it; the env floor has no torch."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ["sandbox", "env", "policy", "credit", "loops", "integrations"]  # bottom to top; widgets above loops


def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
    return mods


def test_floors_import_only_floors_below():
    bad = []
    for i, floor in enumerate(FLOORS):
        above = {f"labkit.{f}" for f in FLOORS[i + 1:]} | {"widgets"}
        for py in (ROOT / "labkit" / floor).rglob("*.py"):
            for m in _imports(py):
                if any(m == a or m.startswith(a + ".") for a in above):
                    bad.append(f"{py.relative_to(ROOT)} imports {m}")
    for py in (ROOT / "labkit").rglob("*.py"):
        if any(m == "widgets" or m.startswith("widgets.") for m in _imports(py)):
            bad.append(f"{py.relative_to(ROOT)} imports widgets")
    assert not bad, "\n".join(bad)


def test_env_floor_never_imports_torch():
    for py in [*(ROOT / "labkit" / "sandbox").rglob("*.py"), *(ROOT / "labkit" / "env").rglob("*.py")]:
        assert not any(m.split(".")[0] in {"torch", "transformers", "peft"} for m in _imports(py)), py
    code = ("import sys, labkit.env.tasks, labkit.env.bugs, labkit.sandbox.pool, labkit.env.feedback;"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_credit_floor_reads_records_not_the_sampler():
    """Credit is pure functions over records (``labkit.env.records``): it never imports the
    policy floor (sampling, forking, models)."""
    bad = [f"{py.relative_to(ROOT)} imports {m}" for py in (ROOT / "labkit" / "credit").rglob("*.py")
           for m in _imports(py) if m == "labkit.policy" or m.startswith("labkit.policy.")]
    assert not bad, "\n".join(bad)


def test_the_credit_floor_never_runs_the_sandbox():
    """Credit receives effects as data (hunk values, fork rewards): running programs is the
    environment's and the loops' work."""
    bad = [f"{py.relative_to(ROOT)} imports {m}" for py in (ROOT / "labkit" / "credit").rglob("*.py")
           for m in _imports(py) if m in ("labkit.sandbox", "labkit.env.feedback", "labkit.env.tasks")
           or m.startswith("labkit.sandbox.")]
    assert not bad, "\n".join(bad)


def test_trl_and_verl_are_imported_only_by_the_integrations():
    """TRL and verl are optional extras: the rest of labkit never imports them."""
    bad = [f"{py.relative_to(ROOT)} imports {m}" for py in (ROOT / "labkit").rglob("*.py")
           if "integrations" not in py.parts and "bench" not in py.parts
           for m in _imports(py) if m.split(".")[0] in {"trl", "verl"}]
    assert not bad, "\n".join(bad)


def test_labkit_imports_sit_at_module_top():
    """A module's labkit dependencies are read off its top; only the CLI imports a
    subcommand's modules inside the subcommand (so ``--help`` does not load torch)."""
    bad = []
    for py in list((ROOT / "labkit").rglob("*.py")) + list((ROOT / "widgets").rglob("*.py")):
        if py.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if (isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module
                            and sub.module.split(".")[0] in ("labkit", "widgets")):
                        bad.append(f"{py.relative_to(ROOT)}:{sub.lineno} imports {sub.module}")
    assert not bad, "\n".join(bad)
