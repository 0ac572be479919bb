"""The house's floors: each room (a package of labkit) imports only rooms on the floors below
it; the sandbox and env floors have no torch."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = [("sandbox",), ("env",), ("policy",), ("credit",), ("runs", "integrations"),
          ("loops", "mucode"), ("experiments",), ("bench", "docs")]
"""labkit's rooms, floor by floor from the bottom (``widgets`` and the notebooks above them all).
A room imports rooms of lower floors only: none of its own floor, none above. The top-level
modules beside them (``config``, ``registry``, ``seeding``, ``provenance``, ``machine``) serve
every floor."""
FLOOR_OF = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
    return mods


def test_every_package_of_labkit_is_a_room_on_a_floor():
    packages = {p.parent.name for p in (ROOT / "labkit").glob("*/__init__.py")}
    assert packages == set(FLOOR_OF), f"place {sorted(packages - set(FLOOR_OF))} on a floor"


def test_rooms_import_only_rooms_on_the_floors_below():
    bad = []
    for room, floor in FLOOR_OF.items():
        for py in (ROOT / "labkit" / room).rglob("*.py"):
            for m in _imports(py):
                parts = m.split(".")
                other = parts[1] if parts[0] == "labkit" and len(parts) > 1 else None
                if other in FLOOR_OF and other != room and FLOOR_OF[other] >= floor:
                    bad.append(f"{py.relative_to(ROOT)} imports {m} (floor {FLOOR_OF[other]}, "
                               f"{room} is on floor {floor})")
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
