"""A seeded generator of small Python functions to repair, sized for a tiny model.

Each problem is one function of 5-15 lines from one of nine families (loops with accumulators,
classification, strings, lists, index arithmetic, early returns, dict counting, nested loops,
digit loops), with constants drawn from a seed and names from a small vocabulary. The prompt
states the behaviour in words and shows 2-3 input/output examples; the 8 tests are
:class:`IOCase` s whose expected values come from running the reference, code this module wrote
itself, in-process.

Identity. A problem's id is its family plus a hash of its *behaviour*: the code written with
canonical names. Renaming ``nums`` to ``values`` does not make a new problem, so two spellings
of one behaviour can never land on both sides of a train/test split. The names, the test inputs
and the examples are then drawn from a generator seeded by that hash, so a problem is the same
whichever seed produced it.

Templates. A problem's *template* is its behaviour before naming and constants: the canonical
code with the function's name, every literal (numbers, strings) and the direction of every
comparison abstracted away (:func:`template_of`). ``sum_above_3`` and ``sum_at_least_7`` share
a template (``x > c`` and ``x >= c + 1`` are the same behaviour on integers); ``sum_even`` and
``count_even`` do not. Held-out splits hold out whole templates (:mod:`labkit.env.tasks`), so no
held-out problem is a training problem with other constants.

Generation is pure Python and takes well under a millisecond a problem.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import textwrap
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any

from labkit.sandbox.records import IOCase, TestSuite

N_TESTS = 8  # IOCases per problem
N_EXAMPLES = 3  # examples shown in the prompt
_EXAMPLE_CHARS = 24  # preferred length of an example's arguments and output, as text
_POOL = 16  # random inputs drawn per problem before choosing the tests
_MAX_MISSES = 10_000  # consecutive repeated behaviours before the stream gives up

# Roles a family's template may use, each with its spellings; the first is canonical.
VOCAB: dict[str, tuple[str, ...]] = {
    "nums": ("nums", "values", "items"),
    "x": ("x", "v", "num"),
    "acc": ("total", "acc", "result"),
    "count": ("count", "hits", "found"),
    "out": ("result", "out", "res"),
    "s": ("s", "text", "word"),
    "ch": ("ch", "c", "letter"),
    "n": ("n", "value", "k"),
    "counts": ("counts", "freq", "tally"),
    "best": ("best", "top", "winner"),
}


@dataclass(frozen=True)
class SyntheticProblem:
    """One generated function with its tests.

    ``reference_code`` is the function alone (no docstring); ``prompt`` is its signature and a
    docstring with the behaviour in words and ``examples`` (a subset of ``tests.cases``).
    """

    problem_id: str
    family: str
    entry_point: str
    signature: str
    description: str
    reference_code: str
    tests: TestSuite
    examples: tuple[IOCase, ...]
    level: int  # family difficulty, 1 (easiest) to 3
    template: str = ""
    """The behaviour before naming and constants (:func:`template_of`): ``family/<hash>``."""

    @property
    def prompt(self) -> str:
        return self.prompt_with(self.examples)

    def prompt_with(self, examples: Sequence[IOCase]) -> str:
        """The signature and docstring, showing ``examples`` as ``>>>`` lines."""
        lines = textwrap.wrap(self.description, 84)
        if examples:
            lines.append("")
        for case in examples:
            args = ", ".join(repr(a) for a in case.args)
            lines += [f">>> {self.entry_point}({args})", repr(case.expected)]
        doc = "\n".join(f"    {line}" if line else "" for line in lines)
        return f'{self.signature}\n    """{doc.lstrip()}\n    """\n'


def choose_examples(tests: TestSuite, failing: Collection[str] = (),
                    k: int = N_EXAMPLES) -> tuple[IOCase, ...]:
    """Pick ``k`` cases of ``tests`` to show in a prompt, in the suite's order.

    First up to two cases named in ``failing`` (the ones the buggy code gets wrong, so the fix
    can be inferred from the prompt), then passing ones, then anything left. Within each group
    cases with an output not shown yet come first, then non-edge cases (edge cases are named
    ``edge_<i>``), then those whose text is nearest :data:`_EXAMPLE_CHARS` long: long enough to
    show the behaviour, short enough for a small context.
    """
    chosen: list[IOCase] = []
    shown: set[str] = set()

    def take(pool: list[IOCase], limit: int) -> None:
        def rank(case: IOCase) -> tuple:
            size = len(repr(case.args)) + len(repr(case.expected))
            return (repr(case.expected) in shown, case.name.startswith("edge_"),
                    abs(size - _EXAMPLE_CHARS))

        pool = [c for c in pool if c not in chosen]
        while pool and len(chosen) < limit:
            best = min(pool, key=rank)
            pool.remove(best)
            chosen.append(best)
            shown.add(repr(best.expected))

    cases = list(tests.cases)
    take([c for c in cases if c.name in failing], min(2, k))
    take([c for c in cases if c.name not in failing], k)
    take(cases, k)
    return tuple(c for c in cases if c in chosen)


# ----------------------------------------------------------------------------- generation


def generate_problems(n: int, seed: int = 0, *,
                      families: Sequence[str] | None = None) -> list[SyntheticProblem]:
    """The first ``n`` distinct problems of the stream for ``seed`` (see :func:`iter_problems`)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    stream = iter_problems(seed, families=families)
    return [next(stream) for _ in range(n)]


def iter_problems(seed: int = 0, *,
                  families: Sequence[str] | None = None) -> Iterator[SyntheticProblem]:
    """An endless, deterministic stream of distinct problems, families drawn uniformly.

    Behaviours whose tests all give the same output (``sum of the digits less than 1``) are
    skipped: no bug in them could be told apart from the reference.

    Raises ``ValueError`` for an unknown family name, and ``RuntimeError`` if the families'
    space of behaviours runs out (tens of thousands of problems; see ``docs/tasks.md``).
    """
    names = list(FAMILIES) if families is None else list(families)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown or not names:
        raise ValueError(f"unknown synthetic families {unknown}; choose from {sorted(FAMILIES)}")
    rng = random.Random(f"labkit.synthetic:{seed}")
    seen: set[str] = set()
    misses = 0
    while misses < _MAX_MISSES:
        draft = FAMILIES[rng.choice(names)].draft(rng)
        code, roles, digest = _identify(draft)
        if digest in seen:
            misses += 1
            continue
        seen.add(digest)
        problem = _realise(draft, code, roles, digest)
        if len({repr(c.expected) for c in problem.tests.cases}) < 2:
            continue  # one output for every test: no bug could be told from the reference
        misses = 0
        yield problem
    raise RuntimeError(f"no new problem in {_MAX_MISSES} draws after {len(seen)} problems from "
                       f"families {names}: the space is exhausted")


@dataclass(frozen=True)
class _Draft:
    """A behaviour before naming: code and description are :class:`string.Template` s over the
    roles of :data:`VOCAB` (``$nums``, ``$x`` ...); ``sample`` draws one argument tuple;
    ``edges`` are argument tuples always tested (empty list, zero, ...)."""

    family: str
    name: str
    params: str
    returns: str
    doc: str
    body: str
    sample: Callable[[random.Random], tuple]
    edges: tuple[tuple, ...] = ()


def _identify(draft: _Draft) -> tuple[Template, list[str], str]:
    """The draft's code as a template over roles, the roles it uses, and the hash of the code
    written with canonical names."""
    header = f"def {draft.name}({draft.params}) -> {draft.returns}:\n"
    code = Template(header + textwrap.indent(textwrap.dedent(draft.body).strip("\n"), "    ")
                    + "\n")
    used = set(code.get_identifiers())
    roles = [r for r in VOCAB if r in used]
    canonical = code.substitute({r: VOCAB[r][0] for r in roles})
    return code, roles, hashlib.sha256(canonical.encode()).hexdigest()


class _Abstract(ast.NodeTransformer):
    """Abstract a function's code to its template: the name, every literal and the direction
    and strictness of every comparison go; the structure stays."""

    def __init__(self, skeleton: bool = False):
        self.skeleton = skeleton

    _SAME = {ast.Gt: ast.Lt, ast.GtE: ast.Lt, ast.LtE: ast.Lt, ast.NotEq: ast.Eq, ast.IsNot: ast.Is,
             ast.NotIn: ast.In}

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = "f"
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=type(node.value).__name__)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return ast.Constant(value=type(node.operand.value).__name__)  # -5 is a constant
        self.generic_visit(node)
        return node

    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        if self.skeleton:  # the skeleton drops what a branch tests, too
            node.test = ast.Name(id="COND", ctx=ast.Load())
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        node.ops = [self._SAME.get(type(op), type(op))() for op in node.ops]
        return node


def template_of(draft: _Draft, skeleton: bool = False) -> str:
    """``family/<hash>`` of the draft's code with canonical names, then abstracted: the function
    name, literals (``3``, ``-5``, ``"aeiou"`` all become their type) and comparison direction
    (``>``, ``>=``, ``<``, ``<=`` one operator; ``==`` / ``!=`` one; ``in`` / ``not in`` one) are
    dropped. Equal templates mean the same code shape over other constants.

    ``skeleton=True`` also drops what every ``if`` tests: the loop-and-branch shape that
    templates differing only in their conditions share (``product of evens`` and ``product of
    numbers above c`` have one skeleton)."""
    code, roles, _ = _identify(draft)
    tree = _Abstract(skeleton).visit(ast.parse(code.substitute({r: VOCAB[r][0] for r in roles})))
    digest = hashlib.sha256(ast.dump(tree).encode()).hexdigest()
    return f"{draft.family}/{'s' if skeleton else ''}{digest[:10]}"


@functools.lru_cache(maxsize=None)
def family_templates(family: str, draws: int = 3_000) -> tuple[tuple[str, int, str], ...]:
    """The templates of ``family``: ``(template, count, skeleton)`` with how often each came up
    in ``draws`` drafts of a fixed stream (most frequent first, then by id). Drafting is cheap,
    so the census is exact for every template with a non-negligible chance; the split assigns
    templates from it."""
    rng = random.Random(f"labkit.synthetic.templates:{family}")
    counts: dict[str, int] = {}
    skeletons: dict[str, str] = {}
    for _ in range(draws):
        draft = FAMILIES[family].draft(rng)
        t = template_of(draft)
        counts[t] = counts.get(t, 0) + 1
        skeletons.setdefault(t, template_of(draft, skeleton=True))
    return tuple((t, c, skeletons[t]) for t, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _realise(draft: _Draft, template: Template, roles: list[str],
             digest: str) -> SyntheticProblem:
    """Name the draft and run the reference to choose tests and examples, all seeded by the
    behaviour's ``digest``."""
    rng = random.Random(digest)
    names: dict[str, str] = {}
    for role in roles:
        names[role] = rng.choice([v for v in VOCAB[role] if v not in names.values()])
    code = template.substitute(names)
    namespace: dict[str, Any] = {}
    exec(compile(code, f"<synthetic {draft.name}>", "exec"), namespace)  # noqa: S102 (code we wrote)
    fn = namespace[draft.name]

    suite = TestSuite(cases=_select_tests(fn, draft, rng))
    return SyntheticProblem(
        template=template_of(draft),
        problem_id=f"{draft.family}-{digest[:10]}",
        family=draft.family,
        entry_point=draft.name,
        signature=code.splitlines()[0],
        description=Template(draft.doc).substitute(names),
        reference_code=code,
        tests=suite,
        examples=choose_examples(suite),
        level=FAMILIES[draft.family].level,
    )


def _select_tests(fn: Callable, draft: _Draft, rng: random.Random) -> tuple[IOCase, ...]:
    """:data:`N_TESTS` distinct inputs: every edge case first (named ``edge_<i>``), then, from
    a pool of up to :data:`_POOL` distinct sampled inputs, those with outputs not yet seen (so a
    wrong branch shows), then the rest of the pool in order (named ``case_<i>``)."""
    unique: dict[str, tuple[tuple, Any]] = {}

    def add(args: tuple) -> None:
        key = repr(args)
        if key not in unique:  # lists are copied, so the reference cannot alter a test's input
            unique[key] = (args, fn(*[list(a) if type(a) is list else a for a in args]))

    for args in draft.edges:
        add(args)
    n_edges = len(unique)
    for _ in range(4 * _POOL):  # small input spaces repeat themselves: stop after a while
        if len(unique) >= n_edges + _POOL:
            break
        add(draft.sample(rng))
    items = list(unique.values())
    chosen = items[:n_edges]
    outputs = {repr(out) for _, out in chosen}
    for args, out in items[n_edges:]:
        if len(chosen) < N_TESTS and repr(out) not in outputs:
            chosen.append((args, out))
            outputs.add(repr(out))
    for item in items[n_edges:]:
        if len(chosen) < N_TESTS and item not in chosen:
            chosen.append(item)
    return tuple(IOCase(args, out, "eq", name=f"edge_{i}" if i < n_edges else f"case_{i}")
                 for i, (args, out) in enumerate(chosen))


# ----------------------------------------------------------------------------- input helpers


def _int_list(lo: int, hi: int, max_len: int = 6, near: Sequence[int] = (),
              min_len: int = 1) -> Callable[[random.Random], tuple]:
    """A sampler of one list of ints in [lo, hi]; about a third of the values come from ``near``
    (the constants of the code and their neighbours), so boundaries get exercised."""
    values = range(lo, hi + 1)

    def sample(rng: random.Random) -> tuple:
        nums = rng.choices(values, k=rng.randint(min_len, max_len))
        if near:
            nums = [rng.choice(near) if rng.random() < 0.35 else x for x in nums]
        return (nums,)
    return sample


def _text(alphabet: str, max_len: int = 7) -> Callable[[random.Random], tuple]:
    def sample(rng: random.Random) -> tuple:
        return ("".join(rng.choices(alphabet, k=rng.randint(1, max_len))),)
    return sample


def _int_arg(lo: int, hi: int, near: Sequence[int] = ()) -> Callable[[random.Random], tuple]:
    def sample(rng: random.Random) -> tuple:
        return (rng.choice(near) if near and rng.random() < 0.5 else rng.randint(lo, hi),)
    return sample


@dataclass(frozen=True)
class _Cond:
    """A test on one value: the expression over ``$x`` and its negation, how to say "numbers
    that are ..." (``words``) and "a number that is ..." (``singular``), a short tag for function
    names, and values worth testing near it."""

    expr: str
    negated: str
    words: str
    singular: str
    tag: str
    near: tuple[int, ...] = ()

    def on(self, var: str) -> _Cond:
        return _Cond(self.expr.replace("$x", var), self.negated.replace("$x", var),
                     self.words, self.singular, self.tag, self.near)


_COMPARISONS = ("gt", "lt", "ge", "le")
_DIVISIBILITY = ("even", "odd", "mult", "notmult")


def _condition(rng: random.Random, compound: float = 0.3) -> _Cond:
    """A condition on ``$x``: a comparison, parity, divisibility or a range; with probability
    ``compound`` a comparison joined to a divisibility test by ``and`` / ``or``."""
    if rng.random() < compound:
        left = _simple_condition(rng, rng.choice(_COMPARISONS))
        right = _simple_condition(rng, rng.choice(_DIVISIBILITY))
        join, dual = rng.choice([("and", "or"), ("or", "and")])
        return _Cond(f"{left.expr} {join} {right.expr}", f"{left.negated} {dual} {right.negated}",
                     f"{left.words} {join} {right.words}",
                     f"{left.singular} {join} {right.singular}", f"{left.tag}_{join}_{right.tag}",
                     left.near + right.near)
    kind = rng.choice(_COMPARISONS + _DIVISIBILITY + ("between",))
    return _simple_condition(rng, kind)


def _simple_condition(rng: random.Random, kind: str) -> _Cond:
    c = rng.randint(-5, 15)
    m = rng.randint(3, 7)
    lo = rng.randint(-5, 8)
    hi = lo + rng.randint(1, 6)
    around = (c - 1, c, c + 1)
    multiples = (0, m, 2 * m, m + 1, -m)
    between = f"between {lo} and {hi} (inclusive)"
    return {
        "gt": _Cond(f"$x > {c}", f"$x <= {c}", *[f"greater than {c}"] * 2, "above", around),
        "lt": _Cond(f"$x < {c}", f"$x >= {c}", *[f"less than {c}"] * 2, "below", around),
        "ge": _Cond(f"$x >= {c}", f"$x < {c}", *[f"at least {c}"] * 2, "at_least", around),
        "le": _Cond(f"$x <= {c}", f"$x > {c}", *[f"at most {c}"] * 2, "at_most", around),
        "even": _Cond("$x % 2 == 0", "$x % 2 == 1", "even", "even", "even"),
        "odd": _Cond("$x % 2 == 1", "$x % 2 == 0", "odd", "odd", "odd"),
        "mult": _Cond(f"$x % {m} == 0", f"$x % {m} != 0", f"multiples of {m}",
                      f"a multiple of {m}", "multiples", multiples),
        "notmult": _Cond(f"$x % {m} != 0", f"$x % {m} == 0", f"not multiples of {m}",
                         f"not a multiple of {m}", "non_multiples", multiples),
        "between": _Cond(f"{lo} <= $x <= {hi}", f"$x < {lo} or $x > {hi}", between, between,
                         "between", (lo - 1, lo, hi, hi + 1)),
    }[kind]


_LIST_EDGES = (([],), ([0],), ([-3, 4],))


# ----------------------------------------------------------------------------- families


def _accumulate(rng: random.Random) -> _Draft:
    """Loops with an accumulator: sum, count, product, sum of squares of the matching numbers."""
    cond = _condition(rng).on("$x")
    agg = rng.choice(["sum", "count", "product", "squares", "signed"])
    update, start, name, doc = {
        "sum": ("$acc += $x", 0, "sum",
                f"Return the sum of the numbers in $nums that are {cond.words}."),
        "count": ("$acc += 1", 0, "count", f"Return how many numbers in $nums are {cond.words}."),
        "product": ("$acc *= $x", 1, "product",
                    (f"Return the product of the numbers in $nums that are {cond.words} "
                     "(1 if there are none).")),
        "squares": ("$acc += $x * $x", 0, "square_sum",
                    f"Return the sum of the squares of the numbers in $nums that are {cond.words}."),
        "signed": ("$acc += $x", 0, "signed_sum",
                   (f"Add up the numbers in $nums that are {cond.words} and subtract all the "
                    "other numbers; return the result.")),
    }[agg]
    if agg == "signed":
        body = f"""
            $acc = 0
            for $x in $nums:
                if {cond.expr}:
                    $acc += $x
                else:
                    $acc -= $x
            return $acc
        """
    else:
        body = f"""
            $acc = {start}
            for $x in $nums:
                if {cond.expr}:
                    {update}
            return $acc
        """
    small = agg == "product"
    return _Draft("accumulate", f"{name}_{cond.tag}", "$nums: list[int]", "int", doc, body,
                  _int_list(-4 if small else -5, 6 if small else 12, 5 if small else 6, cond.near),
                  _LIST_EDGES)


def _classify(rng: random.Random) -> _Draft:
    """Conditionals: thresholds, comparison with a constant, clamping, fizz-buzz, distance."""
    kind = rng.choice(["level", "side", "clamp", "fizz", "near"])
    if kind == "level":
        labels, name = rng.choice([(("low", "mid", "high"), "level_of"),
                                   (("small", "medium", "large"), "size_of"),
                                   (("cold", "warm", "hot"), "temperature_of")])
        a = rng.randint(-5, 8)
        b = a + rng.randint(1, 8)
        op, words = rng.choice([("<", "less than"), ("<=", "at most")])
        doc = (f'Return "{labels[0]}" if $n is {words} {a}, "{labels[1]}" if it is {words} '
               f'{b}, and "{labels[2]}" otherwise.')
        body = f"""
            if $n {op} {a}:
                return "{labels[0]}"
            if $n {op} {b}:
                return "{labels[1]}"
            return "{labels[2]}"
        """
        return _Draft("classify", name, "$n: int", "str", doc, body,
                      _int_arg(a - 6, b + 6, (a - 1, a, b - 1, b)), ((0,), (-1,)))
    if kind == "side":
        c = rng.randint(-5, 15)
        doc = f'Return "above" if $n is greater than {c}, "below" if it is less, else "equal".'
        body = f"""
            if $n > {c}:
                return "above"
            if $n < {c}:
                return "below"
            return "equal"
        """
        return _Draft("classify", "side_of", "$n: int", "str", doc, body,
                      _int_arg(c - 8, c + 8, (c - 1, c, c + 1)), ((c,), (0,)))
    if kind == "clamp":
        lo = rng.randint(-5, 6)
        hi = lo + rng.randint(1, 10)
        doc = f"Return $n limited to the range from {lo} to {hi}: smaller values become {lo}, " \
              f"larger values become {hi}."
        body = f"""
            if $n < {lo}:
                return {lo}
            if $n > {hi}:
                return {hi}
            return $n
        """
        return _Draft("classify", "clamp", "$n: int", "int", doc, body,
                      _int_arg(lo - 6, hi + 6, (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1)),
                      ((0,), (lo,), (hi,)))
    if kind == "fizz":
        a, b = rng.sample(range(2, 10), 2)
        doc = (f'Return "fizzbuzz" if $n is a multiple of both {a} and {b}, "fizz" if only of '
               f'{a}, "buzz" if only of {b}, and otherwise $n as a string.')
        body = f"""
            if $n % {a} == 0 and $n % {b} == 0:
                return "fizzbuzz"
            if $n % {a} == 0:
                return "fizz"
            if $n % {b} == 0:
                return "buzz"
            return str($n)
        """
        return _Draft("classify", "fizz_buzz", "$n: int", "str", doc, body,
                      _int_arg(1, 4 * a * b, (a, b, a * b, a + 1, b + 1)), ((0,), (a * b,)))
    c = rng.randint(-5, 15)
    d = rng.randint(1, 5)
    doc = (f'Return "same" if $n equals {c}, "near" if it is at most {d} away from {c}, and '
           f'"far" otherwise.')
    body = f"""
        if $n == {c}:
            return "same"
        if abs($n - {c}) <= {d}:
            return "near"
        return "far"
    """
    return _Draft("classify", "distance_label", "$n: int", "str", doc, body,
                  _int_arg(c - 3 * d - 3, c + 3 * d + 3, (c - d - 1, c - d, c + d, c + d + 1)),
                  ((c,), (0,)))


@dataclass(frozen=True)
class _CharTest:
    """A test on one character ``$ch``: the expression and its negation, how to say "characters
    that are ..." (``plural``) and "a character that is ..." (``singular``), a name tag, and an
    alphabet to draw test strings from."""

    expr: str
    negated: str
    plural: str
    singular: str
    tag: str
    alphabet: str


_LETTERS = "abcdexyz"


def _char_test(rng: random.Random) -> _CharTest:
    letter = rng.choice(_LETTERS)
    group = "".join(sorted(rng.sample(_LETTERS, rng.randint(2, 3))))
    return rng.choice([
        _CharTest('$ch in "aeiou"', '$ch not in "aeiou"', "vowels", "a vowel", "vowels",
                  "abeiouxyz"),
        _CharTest(f'$ch == "{letter}"', f'$ch != "{letter}"', f'equal to "{letter}"',
                  f'equal to "{letter}"', letter, _LETTERS),
        _CharTest("$ch.isdigit()", "not $ch.isdigit()", "digits", "a digit", "digits",
                  "ab12c3x90"),
        _CharTest("$ch.isupper()", "not $ch.isupper()", "uppercase letters",
                  "an uppercase letter", "upper", "abcABCxY"),
        _CharTest(f'$ch in "{group}"', f'$ch not in "{group}"', f'in "{group}"',
                  f'in "{group}"', group, _LETTERS),
    ])


def _strings(rng: random.Random) -> _Draft:
    """String processing: count, find positions, remove, reverse, repeat, mask, uppercase."""
    test = _char_test(rng)
    kind = rng.choice(["count", "at_least", "positions", "remove", "reverse", "repeat", "mask",
                       "upper"])
    sample = _text(test.alphabet)
    edges = (("",),)
    if kind == "count":
        doc = f"Return how many characters of $s are {test.plural}."
        body = f"""
            $count = 0
            for $ch in $s:
                if {test.expr}:
                    $count += 1
            return $count
        """
        return _Draft("strings", f"count_{test.tag}", "$s: str", "int", doc, body, sample, edges)
    if kind == "at_least":
        k = rng.randint(1, 3)
        doc = f"Return True if at least {k} characters of $s are {test.plural}, else False."
        body = f"""
            $count = 0
            for $ch in $s:
                if {test.expr}:
                    $count += 1
            return $count >= {k}
        """
        return _Draft("strings", f"has_{test.tag}", "$s: str", "bool", doc, body, sample, edges)
    if kind == "positions":
        at = test.expr.replace("$ch", "$s[i]")
        doc = f"Return the list of positions i in $s where the character is {test.singular}."
        body = f"""
            $out = []
            for i in range(len($s)):
                if {at}:
                    $out.append(i)
            return $out
        """
        return _Draft("strings", f"positions_{test.tag}", "$s: str", "list[int]", doc, body,
                      sample, edges)
    if kind in ("remove", "reverse"):
        update = "$ch + $out" if kind == "reverse" else "$out + $ch"
        doc = (f"Return $s without the characters that are {test.plural}"
               + (", in reverse order." if kind == "reverse" else "."))
        body = f"""
            $out = ""
            for $ch in $s:
                if {test.negated}:
                    $out = {update}
            return $out
        """
        name = f"reverse_without_{test.tag}" if kind == "reverse" else f"remove_{test.tag}"
        return _Draft("strings", name, "$s: str", "str", doc, body, sample, edges)
    if kind in ("repeat", "mask"):
        k = rng.randint(2, 4)
        mark = rng.choice("*-_#")
        if kind == "repeat":
            change, name = f"$ch * {k}", f"repeat_{test.tag}"
            doc = f"Return $s with every character that is {test.singular} repeated {k} times."
        else:
            change, name = f'"{mark}"', f"mask_{test.tag}"
            doc = f'Return $s with every character that is {test.singular} replaced by "{mark}".'
        body = f"""
            $out = ""
            for $ch in $s:
                if {test.expr}:
                    $out += {change}
                else:
                    $out += $ch
            return $out
        """
        return _Draft("strings", name, "$s: str", "str", doc, body, sample, edges)
    k = rng.randint(2, 3)
    start = rng.randint(0, k - 1)
    doc = (f"Return $s with the character at every position i where i % {k} == {start} made "
           "uppercase.")
    body = f"""
        $out = ""
        for i in range(len($s)):
            if i % {k} == {start}:
                $out += $s[i].upper()
            else:
                $out += $s[i]
        return $out
    """
    return _Draft("strings", "upper_positions", "$s: str", "str", doc, body,
                  _text("abcdexyz", 8), edges)


def _lists(rng: random.Random) -> _Draft:
    """List processing: filter, map, conditional map, running max/min, prefix sums, neighbours."""
    kind = rng.choice(["filter", "map", "map_if", "running", "prefix", "neighbours"])
    sample = _int_list(-5, 12)
    if kind in ("filter", "map_if"):
        cond = _condition(rng).on("$x")
        sample = _int_list(-5, 12, near=cond.near)
        if kind == "filter":
            doc = f"Return the numbers in $nums that are {cond.words}, in their original order."
            body = f"""
                $out = []
                for $x in $nums:
                    if {cond.expr}:
                        $out.append($x)
                return $out
            """
            return _Draft("lists", f"keep_{cond.tag}", "$nums: list[int]", "list[int]", doc,
                          body, sample, _LIST_EDGES)
        a = rng.choice([2, 3, 4, 10, -1, -2])
        doc = (f"Return a copy of $nums where every number that is {cond.words} is multiplied "
               f"by {a}; the other numbers stay as they are.")
        body = f"""
            $out = []
            for $x in $nums:
                if {cond.expr}:
                    $out.append($x * {a})
                else:
                    $out.append($x)
            return $out
        """
        return _Draft("lists", f"scale_{cond.tag}", "$nums: list[int]", "list[int]", doc, body,
                      sample, _LIST_EDGES)
    if kind == "map":
        a = rng.choice([2, 3, 4, 5, -1, -2, -3])
        b = rng.randint(-5, 9)
        doc = f"Return a list with each number x of $nums replaced by x * {a} + {b}."
        body = f"""
            $out = []
            for $x in $nums:
                $out.append($x * {a} + {b})
            return $out
        """
        return _Draft("lists", "transform", "$nums: list[int]", "list[int]", doc, body, sample,
                      _LIST_EDGES)
    if kind == "running":
        op, word = rng.choice([(">", "largest"), ("<", "smallest")])
        doc = (f"Return a list whose i-th item is the {word} number among the first i + 1 "
               "numbers of $nums.")
        body = f"""
            $out = []
            for $x in $nums:
                if not $out or $x {op} $out[-1]:
                    $out.append($x)
                else:
                    $out.append($out[-1])
            return $out
        """
        name = "running_max" if op == ">" else "running_min"
        return _Draft("lists", name, "$nums: list[int]", "list[int]", doc, body, sample,
                      _LIST_EDGES)
    if kind == "prefix":
        start = rng.randint(-5, 10)
        doc = (f"Start from {start}, add the numbers of $nums one at a time, and return the list "
               "of totals after each addition.")
        body = f"""
            $out = []
            $acc = {start}
            for $x in $nums:
                $acc += $x
                $out.append($acc)
            return $out
        """
        return _Draft("lists", "prefix_sums", "$nums: list[int]", "list[int]", doc, body, sample,
                      _LIST_EDGES)
    op, word, name = rng.choice([("-", "minus", "differences"), ("+", "plus", "pair_sums"),
                                 ("*", "times", "pair_products")])
    doc = (f"Return the list of $nums[i] {word} $nums[i - 1] for every index i from 1 to the "
           "end of $nums.")
    body = f"""
        $out = []
        for i in range(1, len($nums)):
            $out.append($nums[i] {op} $nums[i - 1])
        return $out
    """
    return _Draft("lists", name, "$nums: list[int]", "list[int]", doc, body,
                  _int_list(-4, 9, 6, min_len=2), _LIST_EDGES)


def _indexing(rng: random.Random) -> _Draft:
    """Index arithmetic: strides, index classes, windows, reversal, mirror, rotation."""
    kind = rng.choice(["stride", "index_sum", "window", "reverse", "ends", "rotate", "fixed",
                       "stride_filter"])
    sample = _int_list(-5, 12, 8)
    edges = _LIST_EDGES
    if kind == "stride":
        k = rng.randint(2, 5)
        start = rng.randint(0, k - 1)
        doc = f"Return every {k}-th number of $nums, starting at index {start}."
        body = f"""
            $out = []
            for i in range({start}, len($nums), {k}):
                $out.append($nums[i])
            return $out
        """
        return _Draft("indexing", "every_kth", "$nums: list[int]", "list[int]", doc, body,
                      sample, edges)
    if kind == "index_sum":
        k = rng.randint(2, 4)
        r = rng.randint(0, k - 1)
        doc = f"Return the sum of the numbers of $nums whose index i has i % {k} == {r}."
        body = f"""
            $acc = 0
            for i in range(len($nums)):
                if i % {k} == {r}:
                    $acc += $nums[i]
            return $acc
        """
        return _Draft("indexing", "sum_at_positions", "$nums: list[int]", "int", doc, body,
                      sample, edges)
    if kind == "window":
        w = rng.randint(2, 5)
        doc = f"Return the sums of every {w} consecutive numbers of $nums, from left to right."
        body = f"""
            $out = []
            for i in range(len($nums) - {w} + 1):
                $out.append(sum($nums[i:i + {w}]))
            return $out
        """
        return _Draft("indexing", "window_sums", "$nums: list[int]", "list[int]", doc, body,
                      sample, edges)
    if kind == "reverse":
        skip = rng.randint(0, 3)
        doc = (f"Return the numbers of $nums in reverse order, leaving out the last {skip}."
               if skip else "Return the numbers of $nums in reverse order.")
        body = f"""
            $out = []
            for i in range(len($nums) - {1 + skip}, -1, -1):
                $out.append($nums[i])
            return $out
        """
        return _Draft("indexing", "reversed_copy", "$nums: list[int]", "list[int]", doc, body,
                      sample, edges)
    if kind == "ends":
        op, word = rng.choice([("+", "sum"), ("-", "difference"), ("*", "product")])
        doc = (f"Return the list of $nums[i] {op} $nums[len($nums) - 1 - i] for i in the first "
               f"half of $nums (the {word} of each number with its mirror).")
        body = f"""
            $out = []
            for i in range(len($nums) // 2):
                $out.append($nums[i] {op} $nums[len($nums) - 1 - i])
            return $out
        """
        return _Draft("indexing", f"mirror_{word}s", "$nums: list[int]", "list[int]", doc, body,
                      sample, edges)
    if kind == "rotate":
        k = rng.randint(1, 5)
        doc = f"Return $nums rotated left by {k}: the item at index i moves to index i - {k}, " \
              "wrapping around."
        body = f"""
            $out = []
            for i in range(len($nums)):
                $out.append($nums[(i + {k}) % len($nums)])
            return $out
        """
        return _Draft("indexing", "rotate_left", "$nums: list[int]", "list[int]", doc, body,
                      sample, edges)
    if kind == "fixed":
        k = rng.randint(0, 4)
        op, words, name = rng.choice([(">", "greater than", "count_above_index"),
                                      ("<", "less than", "count_below_index"),
                                      ("==", "equal to", "count_at_index")])
        doc = f"Return how many indexes i of $nums have $nums[i] {words} i * {k}."
        body = f"""
            $count = 0
            for i in range(len($nums)):
                if $nums[i] {op} i * {k}:
                    $count += 1
            return $count
        """
        return _Draft("indexing", name, "$nums: list[int]", "int", doc, body,
                      _int_list(-3, 15, 8, near=(0, k, 2 * k, 3 * k)), edges)
    k = rng.randint(2, 4)
    start = rng.randint(0, k - 1)
    cond = _condition(rng, compound=0.0).on("$nums[i]")
    doc = (f"Look at every {k}-th number of $nums, starting at index {start}, and return the sum "
           f"of those that are {cond.words}.")
    body = f"""
        $acc = 0
        for i in range({start}, len($nums), {k}):
            if {cond.expr}:
                $acc += $nums[i]
        return $acc
    """
    return _Draft("indexing", f"stride_sum_{cond.tag}", "$nums: list[int]", "int", doc, body,
                  _int_list(-5, 12, 8, cond.near), edges)


def _search(rng: random.Random) -> _Draft:
    """Early returns: first index / value, all, any, sortedness, last index, first repeat."""
    kind = rng.choice(["first_index", "first_value", "all", "any", "sorted", "last_index",
                       "repeat"])
    cond = _condition(rng).on("$x")
    sample = _int_list(-5, 12, 6, cond.near)
    edges = _LIST_EDGES
    if kind == "first_index":
        at = cond.on("$nums[i]")
        doc = f"Return the index of the first number in $nums that is {cond.words}, or -1 if " \
              "there is none."
        body = f"""
            for i in range(len($nums)):
                if {at.expr}:
                    return i
            return -1
        """
        return _Draft("search", f"first_{cond.tag}", "$nums: list[int]", "int", doc, body,
                      sample, edges)
    if kind == "last_index":
        at = cond.on("$nums[i]")
        doc = f"Return the index of the last number in $nums that is {cond.words}, or -1 if " \
              "there is none."
        body = f"""
            for i in range(len($nums) - 1, -1, -1):
                if {at.expr}:
                    return i
            return -1
        """
        return _Draft("search", f"last_{cond.tag}", "$nums: list[int]", "int", doc, body,
                      sample, edges)
    if kind == "first_value":
        default = rng.choice([0, -1, 100, -100])
        doc = f"Return the first number in $nums that is {cond.words}, or {default} if there " \
              "is none."
        body = f"""
            for $x in $nums:
                if {cond.expr}:
                    return $x
            return {default}
        """
        return _Draft("search", f"find_{cond.tag}", "$nums: list[int]", "int", doc, body,
                      sample, edges)
    if kind in ("all", "any"):
        every = kind == "all"
        doc = (f"Return True if every number in $nums is {cond.words} (True for an empty list), "
               "else False." if every else
               f"Return True if some number in $nums is {cond.words}, else False.")
        body = f"""
            for $x in $nums:
                if {cond.negated if every else cond.expr}:
                    return {not every}
            return {every}
        """
        return _Draft("search", f"{kind}_{cond.tag}", "$nums: list[int]", "bool", doc, body,
                      sample, edges)
    if kind == "sorted":
        op, words, name = rng.choice([("<", "never decreases", "is_non_decreasing"),
                                      ("<=", "strictly increases", "is_increasing"),
                                      (">", "never increases", "is_non_increasing")])
        doc = f"Return True if $nums {words} from left to right, else False."
        body = f"""
            for i in range(1, len($nums)):
                if $nums[i] {op} $nums[i - 1]:
                    return False
            return True
        """
        def sorted_sample(rng: random.Random) -> tuple:
            (nums,) = _int_list(-3, 8, 5)(rng)
            order = rng.random()
            if order < 0.3:
                nums.sort()
            elif order < 0.6:
                nums.sort(reverse=True)
            return (nums,)
        return _Draft("search", name, "$nums: list[int]", "bool", doc, body, sorted_sample,
                      (([],), ([2, 2],), ([1, 3],), ([3, 1],)))
    doc = "Return the first number of $nums that already appeared earlier in it, or -1 if no " \
          "number repeats."
    body = """
        seen = []
        for $x in $nums:
            if $x in seen:
                return $x
            seen.append($x)
        return -1
    """
    return _Draft("search", "first_repeat", "$nums: list[int]", "int", doc, body,
                  _int_list(0, 6, 6), edges)


def _counting(rng: random.Random) -> _Draft:
    """Counting with a dict: occurrences, remainders, matching keys, most common, unique, k-times."""
    kind = rng.choice(["occurrences", "chars", "remainders", "most_common", "first_unique",
                       "at_least"])
    sample = _int_list(-1, 4, 7)  # few distinct values, so numbers repeat
    edges = _LIST_EDGES
    if kind == "occurrences":
        cond = _condition(rng).on("$x")
        doc = f"Return a dict mapping each number of $nums that is {cond.words} to how many " \
              "times it occurs."
        body = f"""
            $counts = {{}}
            for $x in $nums:
                if {cond.expr}:
                    $counts[$x] = $counts.get($x, 0) + 1
            return $counts
        """
        return _Draft("counting", f"count_each_{cond.tag}", "$nums: list[int]", "dict[int, int]",
                      doc, body, _int_list(-3, 9, 7, cond.near), edges)
    if kind == "chars":
        test = _char_test(rng)
        doc = f"Return a dict mapping each character of $s that is {test.singular} to how many " \
              "times it occurs."
        body = f"""
            $counts = {{}}
            for $ch in $s:
                if {test.expr}:
                    $counts[$ch] = $counts.get($ch, 0) + 1
            return $counts
        """
        return _Draft("counting", f"tally_{test.tag}", "$s: str", "dict[str, int]", doc, body,
                      _text(test.alphabet, 8), (("",),))
    if kind == "remainders":
        k = rng.randint(2, 7)
        doc = f"Return a dict mapping each remainder r = x % {k} of the numbers x in $nums to " \
              "how many numbers have it."
        body = f"""
            $counts = {{}}
            for $x in $nums:
                $counts[$x % {k}] = $counts.get($x % {k}, 0) + 1
            return $counts
        """
        return _Draft("counting", "count_remainders", "$nums: list[int]", "dict[int, int]", doc,
                      body, _int_list(-5, 12, 7), edges)
    if kind == "most_common":
        doc = "Return the number that occurs most often in $nums; on a tie, the one that " \
              "appears first. Return None for an empty list."
        body = """
            $counts = {}
            for $x in $nums:
                $counts[$x] = $counts.get($x, 0) + 1
            $best = None
            for $x in $counts:
                if $best is None or $counts[$x] > $counts[$best]:
                    $best = $x
            return $best
        """
        return _Draft("counting", "most_common", "$nums: list[int]", "int | None", doc, body,
                      sample, edges)
    if kind == "first_unique":
        default = rng.choice([-1, 0, 100])
        doc = f"Return the first number of $nums that occurs exactly once, or {default} if " \
              "there is none."
        body = f"""
            $counts = {{}}
            for $x in $nums:
                $counts[$x] = $counts.get($x, 0) + 1
            for $x in $nums:
                if $counts[$x] == 1:
                    return $x
            return {default}
        """
        return _Draft("counting", "first_unique", "$nums: list[int]", "int", doc, body,
                      sample, edges)
    k = rng.randint(2, 4)
    doc = f"Return the numbers that occur at least {k} times in $nums, in the order in which " \
          "they first appear."
    body = f"""
        $counts = {{}}
        for $x in $nums:
            $counts[$x] = $counts.get($x, 0) + 1
        $out = []
        for $x in $counts:
            if $counts[$x] >= {k}:
                $out.append($x)
        return $out
    """
    return _Draft("counting", "frequent", "$nums: list[int]", "list[int]", doc, body,
                  _int_list(0, 4, 8), edges)


def _nested(rng: random.Random) -> _Draft:
    """Nested loops over pairs of positions, or over a grid of numbers."""
    kind = rng.choice(["pair_sum", "pair_cond", "inversions", "close_pairs", "grid",
                       "best_pair"])
    edges = _LIST_EDGES
    if kind == "pair_cond":
        op, word = rng.choice([("+", "sum"), ("-", "difference"), ("*", "product")])
        cond = _condition(rng).on(f"($nums[i] {op} $nums[j])")
        doc = (f"Return how many pairs of positions i < j in $nums have a {word} "
               f"$nums[i] {op} $nums[j] that is {cond.singular}.")
        body = f"""
            $count = 0
            for i in range(len($nums)):
                for j in range(i + 1, len($nums)):
                    if {cond.expr}:
                        $count += 1
            return $count
        """
        return _Draft("nested", f"count_pairs_{word}_{cond.tag}", "$nums: list[int]", "int", doc,
                      body, _int_list(-4, 9, 6), edges)
    if kind == "pair_sum":
        t = rng.randint(-5, 15)
        doc = f"Return how many pairs of positions i < j in $nums have $nums[i] + $nums[j] == {t}."
        body = f"""
            $count = 0
            for i in range(len($nums)):
                for j in range(i + 1, len($nums)):
                    if $nums[i] + $nums[j] == {t}:
                        $count += 1
            return $count
        """
        return _Draft("nested", "count_pairs_with_sum", "$nums: list[int]", "int", doc, body,
                      _int_list(t - 6, t + 6, 6, (0, t, t // 2, t - 1, 1)), edges)
    if kind == "inversions":
        op, words = rng.choice([(">", "greater than"), ("<", "less than"), ("==", "equal to")])
        doc = f"Return how many pairs of positions i < j in $nums have $nums[i] {words} $nums[j]."
        body = f"""
            $count = 0
            for i in range(len($nums)):
                for j in range(i + 1, len($nums)):
                    if $nums[i] {op} $nums[j]:
                        $count += 1
            return $count
        """
        name = {">": "count_inversions", "<": "count_rising_pairs", "==": "count_equal_pairs"}[op]
        return _Draft("nested", name, "$nums: list[int]", "int", doc, body,
                      _int_list(-2, 6, 6), edges)
    if kind == "close_pairs":
        d = rng.randint(0, 5)
        doc = f"Return how many pairs of positions i < j in $nums hold numbers at most {d} apart."
        body = f"""
            $count = 0
            for i in range(len($nums)):
                for j in range(i + 1, len($nums)):
                    if abs($nums[i] - $nums[j]) <= {d}:
                        $count += 1
            return $count
        """
        return _Draft("nested", "count_close_pairs", "$nums: list[int]", "int", doc, body,
                      _int_list(-3, 10, 6), edges)
    if kind == "grid":
        k = rng.randint(2, 7)
        op, words = rng.choice([("+", "sum"), ("*", "product"), ("-", "difference")])
        doc = (f"Return how many pairs (i, j) with 1 <= i <= $n and 1 <= j <= $n have a {words} "
               f"i {op} j that is a multiple of {k}.")
        body = f"""
            $count = 0
            for i in range(1, $n + 1):
                for j in range(1, $n + 1):
                    if (i {op} j) % {k} == 0:
                        $count += 1
            return $count
        """
        return _Draft("nested", f"grid_{words}_multiples", "$n: int", "int", doc, body,
                      _int_arg(1, 9), ((0,), (1,), (k,)))
    t = rng.randint(2, 20)
    doc = (f"Return the largest sum $nums[i] + $nums[j] over positions i < j that is less than "
           f"{t}, or -1 if no pair qualifies.")
    body = f"""
        $best = -1
        for i in range(len($nums)):
            for j in range(i + 1, len($nums)):
                total = $nums[i] + $nums[j]
                if total < {t} and total > $best:
                    $best = total
        return $best
    """
    return _Draft("nested", "best_pair_below", "$nums: list[int]", "int", doc, body,
                  _int_list(0, t, 6), edges)


def _digit_condition(rng: random.Random, base: int) -> _Cond:
    """A condition on a variable ``digit`` holding one digit in ``base``."""
    c = rng.randint(1, base - 2) if base > 2 else 1
    return rng.choice([
        _Cond(f"digit > {c}", f"digit <= {c}", *[f"greater than {c}"] * 2, f"above_{c}"),
        _Cond(f"digit < {c}", f"digit >= {c}", *[f"less than {c}"] * 2, f"below_{c}"),
        _Cond(f"digit == {c}", f"digit != {c}", *[f"equal to {c}"] * 2, f"equal_{c}"),
        _Cond(f"digit != {c}", f"digit == {c}", *[f"different from {c}"] * 2, f"not_{c}"),
        _Cond("digit % 2 == 0", "digit % 2 == 1", "even", "even", "even"),
        _Cond("digit % 2 == 1", "digit % 2 == 0", "odd", "odd", "odd"),
    ])


def _digits(rng: random.Random) -> _Draft:
    """While loops over the digits of a non-negative integer, in a base from 2 to 10."""
    kind = rng.choice(["digit_sum", "sum_if", "count_if", "product_if", "length", "reverse",
                       "largest", "divisions"])
    base = rng.choice([10, 10, 10, 2, 3, 4, 5, 6, 7, 8, 9])
    in_base = "" if base == 10 else f" written in base {base}"
    sample = _int_arg(0, 9999 if base == 10 else 300)
    edges = ((0,), (7,), (base,))
    if kind == "digit_sum":
        doc = f"Return the sum of the digits of the non-negative integer $n{in_base}."
        body = f"""
            $acc = 0
            while $n > 0:
                $acc += $n % {base}
                $n //= {base}
            return $acc
        """
        return _Draft("digits", "digit_sum", "$n: int", "int", doc, body, sample, edges)
    if kind in ("sum_if", "count_if"):
        cond = _digit_condition(rng, base)
        summing = kind == "sum_if"
        doc = (f"Return the {'sum' if summing else 'number'} of the digits of the non-negative "
               f"integer $n{in_base} that are {cond.words}.")
        body = f"""
            $acc = 0
            while $n > 0:
                digit = $n % {base}
                if {cond.expr}:
                    $acc += {'digit' if summing else 1}
                $n //= {base}
            return $acc
        """
        name = f"{'sum' if summing else 'count'}_digits_{cond.tag}"
        return _Draft("digits", name, "$n: int", "int", doc, body, sample, edges)
    if kind == "product_if":
        cond = _digit_condition(rng, base)
        doc = (f"Return the product of the digits of the non-negative integer $n{in_base} that "
               f"are {cond.words} (1 if there are none).")
        body = f"""
            $acc = 1
            while $n > 0:
                digit = $n % {base}
                if {cond.expr}:
                    $acc *= digit
                $n //= {base}
            return $acc
        """
        return _Draft("digits", f"product_digits_{cond.tag}", "$n: int", "int", doc, body,
                      sample, edges)
    if kind == "length":
        when = "" if base == 10 else f" when written in base {base}"
        doc = f"Return how many digits the non-negative integer $n has{when} (0 has one digit)."
        body = f"""
            if $n == 0:
                return 1
            $count = 0
            while $n > 0:
                $count += 1
                $n //= {base}
            return $count
        """
        return _Draft("digits", "count_digits", "$n: int", "int", doc, body, sample, edges)
    if kind == "reverse":
        doc = f"Return the non-negative integer $n with its digits{in_base} in reverse order " \
              "(so 120 becomes 21 in base 10)."
        body = f"""
            $acc = 0
            while $n > 0:
                $acc = $acc * {base} + $n % {base}
                $n //= {base}
            return $acc
        """
        return _Draft("digits", "reverse_digits", "$n: int", "int", doc, body, sample, edges)
    if kind == "largest":
        doc = f"Return the largest digit of the non-negative integer $n{in_base} (0 for 0)."
        body = f"""
            $best = 0
            while $n > 0:
                if $n % {base} > $best:
                    $best = $n % {base}
                $n //= {base}
            return $best
        """
        return _Draft("digits", "largest_digit", "$n: int", "int", doc, body, sample, edges)
    d = rng.randint(2, 5)
    c = rng.randint(0, 20)
    doc = f"Return how many times the non-negative integer $n must be divided by {d} " \
          f"(rounding down) until it is at most {c}."
    body = f"""
        $count = 0
        while $n > {c}:
            $n //= {d}
            $count += 1
        return $count
    """
    return _Draft("digits", "count_divisions", "$n: int", "int", doc, body,
                  _int_arg(0, 500, (c, c + 1, d * c + d)), ((0,), (c,), (c + 1,)))


@dataclass(frozen=True)
class Family:
    """A family of generated functions: its drafting function and its difficulty level."""

    draft: Callable[[random.Random], _Draft] = field(repr=False)
    level: int
    summary: str


FAMILIES: dict[str, Family] = {
    "accumulate": Family(_accumulate, 1, "sum / count / product over the numbers that match"),
    "classify": Family(_classify, 1, "thresholds, comparison, clamp, fizz-buzz, distance"),
    "strings": Family(_strings, 2, "count, remove, repeat, mask, uppercase, reverse characters"),
    "lists": Family(_lists, 2, "filter, map, running max/min, prefix sums, neighbours"),
    "indexing": Family(_indexing, 2, "strides, index classes, windows, mirror, rotation"),
    "search": Family(_search, 2, "early returns: first/last match, all, any, sorted, repeat"),
    "counting": Family(_counting, 3, "dict counting: occurrences, remainders, most common"),
    "nested": Family(_nested, 3, "nested loops over pairs of positions or a grid"),
    "digits": Family(_digits, 3, "while loops over the digits of an integer, any base"),
}
