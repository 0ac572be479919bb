"""Every field of every config dataclass in ``labkit/`` carries a docstring.

A field's docstring is a string literal on the line(s) right after its annotated assignment
(the style of :class:`labkit.env.task_sampling.TaskConfig`). The check covers every
``@dataclass`` whose class name ends in ``Config``, plus ``TaskSpec`` and ``MucodeTasks``.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "labkit"
EXTRA = {"TaskSpec", "MucodeTasks"}


def _is_dataclass(node: ast.ClassDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "dataclass":
            return True
    return False


def _is_docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _config_classes(tree: ast.AST):
    for node in ast.walk(tree):
        if (isinstance(node, ast.ClassDef) and _is_dataclass(node)
                and (node.name.endswith("Config") or node.name in EXTRA)):
            yield node


def missing_field_docs(root: Path = PACKAGE) -> list[str]:
    """``file:Class.field`` for every annotated field of a config dataclass without a docstring
    (``file`` relative to the folder above ``root``)."""
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for cls in _config_classes(tree):
            body = cls.body
            for i, stmt in enumerate(body):
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                nxt = body[i + 1] if i + 1 < len(body) else None
                if nxt is None or not _is_docstring(nxt):
                    missing.append(f"{rel}:{cls.name}.{stmt.target.id}")
    return missing


def test_checker_finds_classes():
    names = {cls.name for path in PACKAGE.rglob("*.py")
             for cls in _config_classes(ast.parse(path.read_text(encoding="utf-8")))}
    assert {"TaskConfig", "FeedbackConfig", "TaskSpec", "MucodeTasks"} <= names


def test_checker_flags_undocumented_field(tmp_path):
    pkg = tmp_path / "labkit"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from dataclasses import dataclass\n\n"
        "@dataclass\nclass FooConfig:\n"
        "    a: int = 1\n    '''documented'''\n"
        "    b: int = 2\n"
        "    c: int = 3\n\n"
        "@dataclass(frozen=True)\nclass TaskSpec:\n    d: str\n\n"
        "class NotADataclassConfig:\n    e: int = 4\n")
    assert missing_field_docs(pkg) == ["labkit/m.py:FooConfig.b", "labkit/m.py:FooConfig.c",
                                       "labkit/m.py:TaskSpec.d"]


def test_every_config_field_has_a_docstring():
    missing = missing_field_docs()
    assert not missing, ("config dataclass fields without a docstring (add a string literal "
                         "on the line after each):\n" + "\n".join(missing))
