"""Bug injection (labkit.env.bugs): golden examples per operator, properties over generated
functions, multi-bug spans, deduplication, and validation by running tests."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.env import bugs
from labkit.sandbox.records import AssertTest, Candidate, SandboxResult, Status, TestSuite
from labkit.env.records import BugKind, BugSpan

# ------------------------------------------------------------ test helper: a runner
# Runs *trusted* code (the test's own references and their mutants) in a plain subprocess,
# one per candidate. It is not a sandbox; the lab's sandbox is labkit.sandbox.pool.

_CHILD = r"""
import json, sys
job = json.load(sys.stdin)
ns = {"__name__": "candidate"}
try:
    exec(compile(job["code"], "<candidate>", "exec"), ns)
    exec(job["setup"], ns)
    candidate = ns[job["entry_point"]]
except BaseException as err:
    print(json.dumps({"loaded": False, "error": repr(err)}))
    sys.exit()
oks = []
for source in job["asserts"]:
    try:
        exec(source, {**ns, "candidate": candidate})
        oks.append(True)
    except BaseException:
        oks.append(False)
print(json.dumps({"loaded": True, "oks": oks}))
"""


def subprocess_runner(candidates: Sequence[Candidate]) -> list[SandboxResult]:
    """A stand-in for labkit.sandbox.pool.run_many that runs AssertTests of trusted code."""
    results = []
    for c in candidates:
        assert not c.tests.cases, "this helper runs AssertTests only"
        job = {"code": c.code, "setup": c.tests.setup, "entry_point": c.entry_point,
               "asserts": [a.source for a in c.tests.asserts]}
        total = len(job["asserts"])
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(job),
                                  capture_output=True, text=True, check=False,
                                  timeout=c.timeout_s or 5)
        except subprocess.TimeoutExpired:
            results.append(SandboxResult(Status.TIMEOUT, 0, total, error="timeout"))
            continue
        reply = json.loads(proc.stdout.strip().splitlines()[-1])
        if not reply["loaded"]:
            results.append(SandboxResult(Status.ERROR, 0, total, error=reply["error"]))
            continue
        passed = sum(reply["oks"])
        status = Status.PASSED if passed == total else Status.FAILED
        results.append(SandboxResult(status, passed, total))
    return results


# ------------------------------------------------------------ helpers


def unchanged_outside(old: str, new: str, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether ``new`` is ``old`` with only the lines inside ``spans`` (lines of ``new``)
    rewritten: the lines between spans appear in ``old`` in order, the first block as a
    prefix and the last as a suffix."""
    o, n = old.split("\n"), new.split("\n")
    blocks, line = [], 1
    for start, end in sorted(spans):
        blocks.append(n[line - 1 : start - 1])
        line = end + 1
    blocks.append(n[line - 1 :])
    head, *middle, tail = blocks
    if o[: len(head)] != head or (tail and o[len(o) - len(tail) :] != tail):
        return False
    at = len(head)
    for block in middle:
        at = next((j + len(block) for j in range(at, len(o) - len(block) + 1)
                   if o[j : j + len(block)] == block), -1)
        if at < 0:
            return False
    return at <= len(o) - len(tail)


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def span(m: bugs.Mutation) -> tuple[int, int]:
    return m.bug.start_line, m.bug.end_line


# ------------------------------------------------------------ golden examples
# (operator, source of f, site index, buggy code, span in the buggy code, description)

GOLDEN = [
    ("arithmetic_operator", """
        def f(a, b):
            a += 1
            return a + b * 2  # sum
        """, 2, """
        def f(a, b):
            a += 1
            return a + b / 2  # sum
        """, (3, 3), "`*` -> `/`"),
    ("arithmetic_operator", """
        def f(a, b):
            a += 1
            return a
        """, 0, """
        def f(a, b):
            a -= 1
            return a
        """, (2, 2), "`+=` -> `-=`"),
    ("comparison_operator", """
        def f(x, xs):
            if x == 0 or x not in xs:
                return True
            return x is None
        """, 1, """
        def f(x, xs):
            if x == 0 or x in xs:
                return True
            return x is None
        """, (2, 2), "`not in` -> `in`"),
    ("boolean_operator", """
        def f(a, b):
            return a and b
        """, 0, """
        def f(a, b):
            return a or b
        """, (2, 2), "`and` -> `or`"),
    ("comparison_boundary", """
        def f(i, n):
            while i < n:
                i += 1
            return i >= n
        """, 1, """
        def f(i, n):
            while i < n:
                i += 1
            return i > n
        """, (4, 4), "`>=` -> `>`"),
    ("range_bound", """
        def f(n):
            for i in range(1, n - 1):
                print(i)
        """, 2, """
        def f(n):
            for i in range(1, n):
                print(i)
        """, (2, 2), "`n - 1` -> `n` (range)"),
    ("slice_bound", """
        def f(s, k):
            return s[1:k] + s[::-1]
        """, 2, """
        def f(s, k):
            return s[1:k + 1] + s[::-1]
        """, (2, 2), "`k` -> `k + 1` (slice)"),
    ("index_offset", """
        def f(xs, i, d):
            return xs[-1] + xs[i] + d['key']
        """, 1, """
        def f(xs, i, d):
            return xs[-2] + xs[i] + d['key']
        """, (2, 2), "`-1` -> `-2` (index)"),
    ("number_constant", """
        def f(xs, x):
            return x * 2 + 0.5 + xs[0]
        """, 2, """
        def f(xs, x):
            return x * 2 + 1.5 + xs[0]
        """, (2, 2), "`0.5` -> `1.5`"),
    ("bool_constant", """
        def f(xs):
            found = False
            return found
        """, 0, """
        def f(xs):
            found = True
            return found
        """, (2, 2), "`False` -> `True`"),
    ("string_constant", """
        def f(words):
            return ', '.join(words) + ""
        """, 0, """
        def f(words):
            return ','.join(words) + ""
        """, (2, 2), "`', '` -> `','`"),
    ("variable_swap", """
        def f(a, b):
            c = a + b
            return c * a
        """, 5, """
        def f(a, b):
            c = a + b
            return c * c
        """, (3, 3), "`a` -> `c`"),
    ("delete_statement", """
        def f(xs):
            out = []
            # keep the even ones
            for x in xs:
                if x % 2 == 0:
                    out.append(x)
            return out
        """, 1, """
        def f(xs):
            out = []
            return out
        """, (2, 3), "deleted `for x in xs: ...`"),
    ("remove_if_guard", """
        def f(x):
            # only positive
            if x > 0:
                x = x - 1
            return x
        """, 0, """
        def f(x):
            # only positive
            x = x - 1
            return x
        """, (2, 3), "removed the guard `if x > 0:`"),
    ("remove_else_branch", """
        def f(x):
            if x > 0:
                s = 1
            elif x < 0:
                s = -1
            else:
                s = 0
            return s
        """, 0, """
        def f(x):
            if x > 0:
                s = 1
            else:
                s = 0
            return s
        """, (3, 4), "deleted the `elif x < 0:` branch"),
    ("drop_condition_clause", """
        def f(a, b):
            if(a > 0) and b > 0:
                return 1
            return 0
        """, 1, """
        def f(a, b):
            if(b > 0):
                return 1
            return 0
        """, (2, 2), "`(a > 0) and b > 0` -> `(b > 0)`"),
    ("delete_return", """
        def f(x):
            if x > 0:
                return 1
            return 0
        """, 2, """
        def f(x):
            if x > 0:
                return 1
        """, (3, 3), "deleted `return 0`"),
    ("add_term", """
        def f(a, b, c):
            return a * b - c
        """, 0, """
        def f(a, b, c):
            return a * b - c + 1
        """, (2, 2), "`a * b - c` -> `a * b - c + 1`"),
    ("duplicate_statement", """
        def f(xs):
            count = 0
            for x in xs:
                count += x
            return count
        """, 0, """
        def f(xs):
            count = 0
            for x in xs:
                count += x
                count += x
            return count
        """, (4, 5), "duplicated `count += x`"),
    ("function_swap", """
        def f(xs, s):
            return max(xs) + len(s.lower())
        """, 2, """
        def f(xs, s):
            return max(xs) + len(s.upper())
        """, (2, 2), "`.lower` -> `.upper`"),
    ("argument_swap", """
        def f(a, b, m):
            return pow(a, b, m)
        """, 1, """
        def f(a, b, m):
            return pow(a, m, b)
        """, (2, 2), "swapped `b` and `m` in `pow(...)`"),
    ("return_other", """
        def f(a, b):
            c = a - b
            return c + a
        """, 2, """
        def f(a, b):
            c = a - b
            return b
        """, (3, 3), "`return c + a` -> `return b`"),
    ("missing_colon", """
        def f(xs):
            for x in xs:  # loop: each
                print(x)
        """, 0, """
        def f(xs):
            for x in xs  # loop: each
                print(x)
        """, (2, 2), "missing `:` after `for x in xs`"),
    ("bad_indentation", """
        def f(x):
            y = x
            return y
        """, 0, """
        def f(x):
            y = x
              return y
        """, (3, 3), "`return y` indented too deep"),
]


@pytest.mark.parametrize(("name", "source", "index", "expected", "lines", "description"), GOLDEN,
                         ids=[f"{g[0]}-{g[2]}" for g in GOLDEN])
def test_golden_mutation(name, source, index, expected, lines, description):
    source, expected = textwrap.dedent(source).lstrip(), textwrap.dedent(expected).lstrip()
    mutation = bugs.OPERATORS[name].apply(source, "f", index)
    assert mutation.code == expected
    kind = bugs.OPERATORS[name].kind.value
    assert mutation.bug == BugSpan(kind, name, *lines, description)


def test_golden_examples_cover_every_operator():
    assert {g[0] for g in GOLDEN} == set(bugs.OPERATORS)


def test_site_lists_in_source_order():
    source = "def f(n):\n    for i in range(1, n - 1):\n        print(i)\n"
    sites = bugs.OPERATORS["range_bound"].sites(source, "f")
    assert [s.description for s in sites] == [
        "`1` -> `2` (range)", "`1` -> `0` (range)", "`n - 1` -> `n` (range)",
        "`n - 1` -> `n - 2` (range)"]


def test_variable_swap_uses_only_names_bound_earlier():
    source = "def f(a, b):\n    c = a + b\n    return c * a\n"
    sites = bugs.OPERATORS["variable_swap"].sites(source, "f")
    # `c` is not yet bound while `a + b` runs, so it never replaces `a` or `b` there
    assert [(s.lines[0], s.description) for s in sites] == [
        (2, "`a` -> `b`"), (2, "`b` -> `a`"), (3, "`c` -> `a`"), (3, "`c` -> `b`"),
        (3, "`a` -> `b`"), (3, "`a` -> `c`")]


def test_shadowed_builtins_are_not_swapped():
    source = "def f(xs, max):\n    return max(xs) + min(xs)\n"
    sites = bugs.OPERATORS["function_swap"].sites(source, "f")
    assert [s.description for s in sites] == ["`min` -> `max`"]


def test_helpers_imports_and_docstrings_are_never_sites():
    source = textwrap.dedent('''\
        import math


        def helper(x):
            """1 < 2 and True."""
            return x + 1 if x > 0 else max(x, 0)


        def f(x):
            """Return x < 3 or 'abc'."""
            return x


        def after(y):
            return y - 1
        ''')
    sites = [site for op in bugs.OPERATORS.values() for site in op.sites(source, "f")]
    assert {site.lines for site in sites} == {(11, 11)}  # only `return x` is the solution


def test_mutation_keeps_comments_and_layout():
    source = "def f(a,b):\n    # why\n    x = a+b   # sum\n\n    return x  # done\n"
    mutation = bugs.OPERATORS["arithmetic_operator"].apply(source, "f", 0)
    assert mutation.code == source.replace("a+b", "a-b")


def test_words_do_not_run_together():
    source = "def f(a, b):\n    return(a) or b\n"
    codes = [m.code for m in bugs.enumerate_mutations(source, "f", ["drop_condition_clause"])]
    assert codes == ["def f(a, b):\n    return(a)\n", "def f(a, b):\n    return(b)\n"]


def test_apply_rejects_a_missing_site_and_a_missing_function():
    with pytest.raises(IndexError):
        bugs.OPERATORS["boolean_operator"].apply("def f(a):\n    return a\n", "f", 0)
    with pytest.raises(ValueError, match="no top-level function 'g'"):
        bugs.mutation_sites("def f(a):\n    return a\n", "g")


# ------------------------------------------------------------ registry


def test_registry_covers_every_bug_kind():
    assert len(bugs.OPERATORS) >= 10
    assert {op.kind for op in bugs.OPERATORS.values()} == set(BugKind)
    assert {op.name for op in bugs.OPERATORS.values() if op.syntax} == {
        "missing_colon", "bad_indentation"}
    assert all(op.kind == BugKind.SYNTAX for op in bugs.OPERATORS.values() if op.syntax)
    assert all(op.summary for op in bugs.OPERATORS.values())


def test_registering_a_taken_name_is_an_error():
    existing = bugs.OPERATORS["boolean_operator"]
    again = bugs.register("boolean_operator", BugKind.OPERATOR_MISUSE)(existing.find)
    assert again is existing.find  # re-registering the same finder is harmless
    with pytest.raises(ValueError, match="already registered"):
        bugs.register("boolean_operator", BugKind.OPERATOR_MISUSE)(lambda solution: [])
    assert bugs.OPERATORS["boolean_operator"] == existing


def test_selecting_operators():
    names = [op.name for op in bugs.select_operators({"index_offset", "arithmetic_operator"})]
    assert names == ["arithmetic_operator", "index_offset"]  # registry order, not set order
    assert not any(op.syntax for op in bugs.select_operators())
    assert any(op.syntax for op in bugs.select_operators(include_syntax=True))
    with pytest.raises(ValueError, match="unknown operator"):
        bugs.select_operators(["no_such_operator"])
    with pytest.raises(ValueError, match="include_syntax"):
        bugs.select_operators(["missing_colon"])


# ------------------------------------------------------------ generated functions

NAMES = ("a", "b", "total")


@st.composite
def expressions(draw, depth: int = 2) -> str:
    atoms = st.one_of(
        st.sampled_from(NAMES + ("len(xs)", "xs[0]", "xs[-1]", "True", "'ab'")),
        st.integers(0, 3).map(str), st.sampled_from(["0.5", "1.0"]))
    if depth == 0:
        return draw(atoms)
    sub = expressions(depth - 1)
    form = draw(st.sampled_from(["atom", "binary", "call", "slice"]))
    if form == "atom":
        return draw(atoms)
    if form == "binary":
        op = draw(st.sampled_from(["+", "-", "*", "//", "%"]))
        return f"{draw(sub)} {op} {draw(sub)}"
    if form == "call":
        callee = draw(st.sampled_from(["max", "min", "abs", "helper", "sorted"]))
        arity = 2 if callee in ("max", "min") else 1
        args = ", ".join(draw(st.lists(sub, min_size=1, max_size=arity)))
        return f"{callee}({args})"
    return f"xs[{draw(sub)}:{draw(sub)}]"


@st.composite
def conditions(draw) -> str:
    left, right = draw(expressions(1)), draw(expressions(1))
    test = f"{left} {draw(st.sampled_from(['<', '<=', '==', '!=', '>', 'in']))} {right}"
    if draw(st.booleans()):
        test += f" {draw(st.sampled_from(['and', 'or']))} {draw(st.sampled_from(NAMES))} > 0"
    return test


@st.composite
def statements(draw, depth: int = 1) -> list[str]:
    """One statement as lines (indented relative to its block)."""
    simple = st.one_of(
        st.builds(lambda v, e: [f"{v} = {e}"], st.sampled_from(NAMES), expressions()),
        st.builds(lambda v, o, e: [f"{v} {o}= {e}"], st.sampled_from(NAMES),
                  st.sampled_from(["+", "-", "*"]), expressions()),
        st.builds(lambda e: [f"out.append({e})"], expressions(1)),
        st.builds(lambda e: [f"return {e}"], expressions()))
    if depth == 0:
        return draw(simple)
    inner = st.lists(statements(depth - 1), min_size=1, max_size=2).map(
        lambda stmts: ["    " + line for s in stmts for line in s])
    kind = draw(st.sampled_from(["simple", "if", "for", "comment"]))
    if kind == "if":
        lines = [f"if {draw(conditions())}:", *draw(inner)]
        if draw(st.booleans()):
            lines += ["else:", *draw(inner)]
        return lines
    if kind == "for":
        return [f"for i in range({draw(expressions(1))}):  # loop", *draw(inner)]
    if kind == "comment":
        return ["", "# a comment", *draw(simple)]
    return draw(simple)


HEAD = '''\
import math


def helper(v):
    """Helper: 1 < 2, True, 'ab'."""
    return v + 1 if v > 0 else max(v, 0)


def target(a, b, xs):
    """Docstring: a < b and True, 'ab', 3."""
    total = 0
    out = []
'''
TAIL = '''

def after(v):
    return v - 1 or min(v, 2)
'''


@st.composite
def programs(draw) -> str:
    body = draw(st.lists(statements(), min_size=1, max_size=3))
    lines = [line for stmt in body for line in stmt] + ["return total + len(out)"]
    return HEAD + "".join(f"    {line}\n".replace("    \n", "\n") for line in lines) + TAIL


def _untouched_parts(code: str) -> list[str]:
    """The module outside the solution: helpers, imports, the entry's header and docstring."""
    module = ast.parse(code)
    others = [ast.dump(s) for s in module.body if getattr(s, "name", "") != "target"]
    entry = next(s for s in module.body if getattr(s, "name", "") == "target")
    return others + [ast.dump(entry.args), ast.get_docstring(entry)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_every_mutation_is_well_formed(code):
    ast.parse(code)
    mutations = list(bugs.enumerate_mutations(code, "target", include_syntax=True))
    assert mutations, "every generated program has sites"
    assert len(mutations) == len(bugs.mutation_sites(code, "target", include_syntax=True))
    head = code[: code.index("    total = 0")]
    parts, key = _untouched_parts(code), bugs.normal_form(code)
    for m in mutations:
        syntax = bugs.OPERATORS[m.bug.operator].syntax
        assert parses(m.code) != syntax, m.bug  # (a) parses unless a syntax bug
        assert m.code != code  # (b) differs
        assert unchanged_outside(code, m.code, [span(m)]), m.bug  # (c) only inside the span
        assert m.code.startswith(head) and m.code.endswith(TAIL)  # (e) helpers untouched
        if not syntax:
            assert _untouched_parts(m.code) == parts
            assert bugs.normal_form(m.code) != key
        assert m.bug.kind == bugs.OPERATORS[m.bug.operator].kind.value


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1), st.integers(1, 3), st.booleans())
def test_injection_is_deterministic_and_its_spans_are_right(code, seed, n_bugs, syntax):
    try:
        first = bugs.inject(code, "target", random.Random(seed), n_bugs, include_syntax=syntax)
    except bugs.NoSiteError:
        return  # a tiny program can run out of free sites for three bugs
    again = bugs.inject(code, "target", random.Random(seed), n_bugs, include_syntax=syntax)
    assert first == again  # (d) deterministic for a seed
    spans = [(b.start_line, b.end_line) for b in first.bugs]
    assert len(spans) == n_bugs and spans == sorted(spans)
    assert all(a_end < b_start for (_, a_end), (b_start, _) in pairwise(spans))
    assert unchanged_outside(code, first.code, spans)
    assert first.code.startswith(code[: code.index("    total = 0")]) and first.code.endswith(TAIL)
    syntax_bugs = [b for b in first.bugs if b.kind == BugKind.SYNTAX.value]
    assert len(syntax_bugs) <= 1 and parses(first.code) == (not syntax_bugs)


def test_enumeration_is_deterministic():
    code = HEAD + "    for i in range(len(xs) - 1):\n        total += xs[i] * 2\n    return total\n"
    first = list(bugs.enumerate_mutations(code, "target", include_syntax=True))
    assert first == list(bugs.enumerate_mutations(code, "target", include_syntax=True))
    sites = bugs.mutation_sites(code, "target", include_syntax=True)
    assert [m.bug.operator for m in first] == [name for name, _ in sites]
    assert sites[:2] == [("arithmetic_operator", 0), ("arithmetic_operator", 1)]


# ------------------------------------------------------------ several bugs

MULTI = textwrap.dedent('''\
    def f(xs, k):
        """Count the items below k, then scale."""
        count = 0
        for x in xs:
            if x < k:
                count += 1
        scale = 2
        total = count * scale
        if total > 10:
            total = 10
        return total
    ''')


def test_three_bugs_have_disjoint_spans_in_the_final_code():
    injection = bugs.inject(MULTI, "f", random.Random(7), n_bugs=3)
    assert len(injection.bugs) == 3
    spans = [(b.start_line, b.end_line) for b in injection.bugs]
    assert all(a_end < b_start for (_, a_end), (b_start, _) in pairwise(spans))
    assert unchanged_outside(MULTI, injection.code, spans)


@pytest.mark.parametrize("seed", range(40))
def test_spans_point_at_their_bugs_in_the_final_code(seed):
    # bugs that change the line count (a deletion, a duplicate) move the spans below them
    ops = ["comparison_boundary", "number_constant", "duplicate_statement", "delete_statement"]
    injection = bugs.inject(MULTI, "f", random.Random(seed), 2, ops)
    lines = injection.code.split("\n")
    for bug in injection.bugs:
        text = "\n".join(lines[bug.start_line - 1 : bug.end_line])
        if bug.operator == "duplicate_statement":
            statement = bug.description.split("`")[1]
            assert text.count(statement) == 2, bug
        elif bug.operator != "delete_statement":
            assert bug.description.split("`")[3] in text, bug
    spans = [(b.start_line, b.end_line) for b in injection.bugs]
    assert unchanged_outside(MULTI, injection.code, spans)


def test_too_many_bugs_for_the_sites_raise():
    with pytest.raises(bugs.NoSiteError):
        bugs.inject("def f(a, b):\n    return a and b\n", "f", random.Random(0), 2,
                    ["boolean_operator"])


# ------------------------------------------------------------ dedup and validation

REFERENCE = textwrap.dedent('''\
    def helper(v):
        return v * 2


    def solve(xs, k):
        """Sum of helper(x) over the items of xs below k."""
        total = 0
        for x in xs:
            if x < k:
                total += helper(x)
        return total
    ''')
SUITE = TestSuite(asserts=(
    AssertTest("assert candidate([1, 2, 3], 3) == 6", "small"),
    AssertTest("assert candidate([], 1) == 0", "empty"),
    AssertTest("assert candidate([5, 0, 7], 6) == 10", "mixed"),
))


def test_normal_form_ignores_layout_and_comments():
    assert bugs.normal_form("x = (1+2)  # c\n") == bugs.normal_form("x = 1 + 2\n")
    assert bugs.normal_form("x = 1 + 2\n") != bugs.normal_form("x = 2 + 1\n")
    assert bugs.normal_form("if x\n  y = 1  \n") == bugs.normal_form("if x\n  y = 1\n")


def test_validated_mutants_are_distinct_and_fail_a_test():
    ran: list[Candidate] = []

    def recording(candidates):
        ran.extend(candidates)
        return subprocess_runner(candidates)

    found = bugs.inject_validated(REFERENCE, SUITE, "solve", seed=3, n=6, runner=recording,
                                  batch_size=4)
    assert len(found) == 6
    keys = [bugs.normal_form(c.code) for c in ran]
    assert len(keys) == len(set(keys))  # dedup happens before running
    assert bugs.normal_form(REFERENCE) not in keys[1:]  # the first run is the reference
    for injection, result in zip(found, subprocess_runner(
            [Candidate(i.code, SUITE, "solve") for i in found])):
        assert result.status != Status.PASSED and injection.passed == result.passed < 3
        assert injection.total == 3 and injection.status == result.status.value
        assert injection.code.startswith(REFERENCE.split("def solve")[0])  # helper untouched


def test_validation_is_deterministic_per_seed_and_independent_of_batching():
    def run(seed, batch_size):
        return bugs.inject_validated(REFERENCE, SUITE, "solve", seed=seed, n=3,
                                     runner=subprocess_runner, batch_size=batch_size)

    assert run(0, 1) == run(0, 5)
    assert run(0, 5) != run(1, 5)


def test_validation_with_several_bugs_and_syntax():
    found = bugs.inject_validated(REFERENCE, SUITE, "solve", seed=0, n=3, n_bugs=2,
                                  include_syntax=True, runner=subprocess_runner)
    assert len(found) == 3 and all(len(i.bugs) == 2 for i in found)
    assert all(i.status != Status.PASSED.value for i in found)


def test_a_failing_reference_is_refused():
    broken = REFERENCE.replace("v * 2", "v * 3")
    with pytest.raises(ValueError, match="does not pass its tests"):
        bugs.inject_validated(broken, SUITE, "solve", seed=0, n=1, runner=subprocess_runner)


def test_timeouts_are_dropped_unless_allowed():
    def verdicts(candidates):
        return [SandboxResult(Status.PASSED if c.id == "reference" else Status.TIMEOUT, 0, 3)
                for c in candidates]

    assert bugs.inject_validated(REFERENCE, SUITE, "solve", seed=0, n=2, runner=verdicts) == []
    kept = bugs.inject_validated(REFERENCE, SUITE, "solve", seed=0, n=2, runner=verdicts,
                                 allow_timeout=True)
    assert [i.status for i in kept] == ["timeout", "timeout"]


def test_yield_report_counts_per_operator():
    refs = [bugs.Reference("solve", REFERENCE, "solve", SUITE)]
    ops = ["comparison_boundary", "delete_statement", "return_other"]
    report = bugs.yield_report(refs, operators=ops, runner=subprocess_runner)
    rows = report["operators"]
    assert list(rows) == ops and report["references_failing"] == []
    # `x < k` -> `x <= k` is caught by ([1, 2, 3], 3); two deletions; three other returns
    assert rows["comparison_boundary"] == {"kind": "boundary", "sites": 1, "tried": 1,
                                           "validated": 1, "timeouts": 0, "yield": 1.0}
    assert rows["delete_statement"]["sites"] == 2
    assert rows["return_other"]["tried"] == 3
    assert report["total"]["tried"] == sum(r["tried"] for r in rows.values())
    table = bugs.format_yield_table(report)
    assert table.splitlines()[2].startswith("| comparison_boundary | boundary | 1 | 1 | 1 | 0 |")


def test_cli_prints_a_table_then_a_json_line(monkeypatch, capsys):
    refs = [bugs.Reference("solve", REFERENCE, "solve", SUITE)]
    monkeypatch.setattr(bugs, "humaneval_references", lambda: refs)
    monkeypatch.setattr(bugs, "default_runner", lambda: subprocess_runner)
    assert bugs.main(["yield", "--operators", "boolean_operator,comparison_boundary"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("| operator | kind |")
    assert json.loads(out[-1])["operators"]["comparison_boundary"]["validated"] == 1
    assert bugs.main(["operators"]) == 0
    assert "bad_indentation" in capsys.readouterr().out


# ------------------------------------------------------------ the lab's sandbox


def test_validation_through_the_sandbox():
    sandbox = pytest.importorskip("labkit.sandbox.pool")
    found = bugs.inject_validated(REFERENCE, SUITE, "solve", seed=3, n=4, timeout_s=5)
    assert len(found) == 4
    again = sandbox.run_many([Candidate(i.code, SUITE, "solve", 5) for i in found])
    assert all(r.status != Status.PASSED for r in again)
    assert [i.code for i in found] == [
        i.code for i in bugs.inject_validated(REFERENCE, SUITE, "solve", seed=3, n=4,
                                              runner=subprocess_runner, timeout_s=5)]
