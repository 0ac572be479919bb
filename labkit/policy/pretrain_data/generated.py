"""Generated programs: random functions from a small grammar, as repair pairs for SFT.

The synthetic families (:mod:`labkit.env.synthetic`) are a few dozen hand-written behaviours
with constants and names varied. A small model trained on them learns each training
template's *shape* by heart: shown a held-out template's buggy code it copies the first line,
then writes the training template it knows best (a ``level_of`` if-chain comes back as
``distance_label``'s ``if n == c`` / ``abs(n - c) <= d`` shape, docs/tiny_model.md).
Renaming (:mod:`labkit.policy.pretrain_data.augment`) varies the words of a template, never its shape.

Here the shape itself is drawn: if-chains over one or two integers with any of several
condition kinds and returned values, loops over a list with or without a filter and with one
of several updates, loops over a string's characters, index loops, straight-line arithmetic,
each with an optional guard first. Names are fresh compound words, string labels fresh words,
and the docstring says nothing a model could write the code from (only examples), so the
code shown is the one place the answer can come from: what a repair needs everywhere.

**No held-out template comes back.** A generated program whose :func:`shape_key` (the code
with names, literals and comparison directions abstracted away, as
:func:`labkit.env.synthetic.template_of` abstracts a template, and every identifier numbered
by first appearance) equals that of a synthetic ``val`` or ``test`` template is dropped
(:func:`held_out_shapes`); a test checks it. Shapes the training templates have may come
back, as they may in training anyway.

:func:`generated_tasks` turns problems into validated repair tasks: bugs from
:func:`labkit.env.bugs.inject_validated` (caught by the tests, run in the sandbox), examples
chosen among the cases the buggy code fails, exactly as synthetic tasks are built. The
references are run in this process to compute the expected outputs: the grammar writes no
``while`` loop, no recursion and no import, so a reference ends in microseconds.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from labkit.env import bugs, synthetic
from labkit.policy.pretrain_data.augment import fresh_name
from labkit.sandbox.records import Candidate, TestSuite
from labkit.env.records import RepairTask
from labkit.sandbox.pool import run_many
from labkit.env.tasks import Split, template_split
from labkit.seeding import derive_seed

FAMILY = "generated"
SHAPES = ("chain", "list_loop", "index_loop", "text_loop", "arithmetic")
_OPS = ("<", "<=", ">", ">=", "==", "!=")
_LETTERS = "abcdeiklmnorstuxyz"
_DOCS = ("Compute a value from {args}, as the examples show.",
         "Return the result for {args}.",
         "Work out the answer for {args}; see the examples.")


@dataclass(frozen=True)
class GeneratedProgram:
    """One drawn function: its code, a sampler of argument tuples and edge cases."""

    name: str
    params: str
    returns: str
    body: str
    sample: Callable[[random.Random], tuple]
    edges: tuple[tuple, ...]
    shape: str

    @property
    def code(self) -> str:
        return f"def {self.name}({self.params}) -> {self.returns}:\n{self.body}"


class _Namer:
    """Fresh names for one program: the function two to four parts, variables one or two."""

    def __init__(self, rng: random.Random, words: Sequence[str]):
        self.rng, self.words, self.taken = rng, words, set()

    def var(self) -> str:
        return fresh_name(self.rng, self.taken, words=self.words, parts=1 + (self.rng.random() < 0.3))

    def function(self) -> str:
        return fresh_name(self.rng, self.taken, words=self.words, parts=self.rng.randint(2, 4))

    def label(self) -> str:
        word = (self.rng.choice(self.words) if self.words and self.rng.random() < 0.6
                else fresh_name(self.rng, self.taken))
        return f'"{word}"'


def _indent(lines: Sequence[str], depth: int = 1) -> str:
    return "".join("    " * depth + line + "\n" for line in lines)


def _cond_on(rng: random.Random, x: str, lo: int, hi: int, other: str | None = None) -> str:
    """A condition on integer ``x``: a comparison, a remainder, a distance, a range, the
    other parameter, or two of these joined."""
    kind = rng.choice(["cmp", "cmp", "mod", "abs", "range"] + (["other"] if other else []))
    c = rng.randint(lo, hi)
    if kind == "cmp":
        cond = f"{x} {rng.choice(_OPS)} {c}"
    elif kind == "mod":
        m = rng.randint(2, 5)
        cond = f"{x} % {m} {rng.choice(('==', '!='))} {rng.randrange(m)}"
    elif kind == "abs":
        cond = f"abs({x} - {c}) {rng.choice(('<=', '>', '<'))} {rng.randint(1, 4)}"
    elif kind == "range":
        cond = f"{c} <= {x} <= {c + rng.randint(1, 6)}"
    else:
        cond = f"{x} {rng.choice(_OPS)} {other}"
    if rng.random() < 0.2:
        cond = f"{cond} {rng.choice(('and', 'or'))} {_cond_on(rng, x, lo, hi)}"
    return cond


def _value(rng: random.Random, kind: str, namer: _Namer, x: str) -> str:
    if kind == "label":
        return namer.label()
    if kind == "int":
        return str(rng.randint(-5, 20))
    return rng.choice([f"{x} * {rng.randint(2, 4)}", f"{x} + {rng.randint(1, 9)}",
                       f"{x} - {rng.randint(1, 9)}", f"-{x}", f"{x} // {rng.randint(2, 4)}"])


def _chain(rng: random.Random, namer: _Namer) -> GeneratedProgram:
    x = namer.var()
    y = namer.var() if rng.random() < 0.3 else None
    kind = rng.choice(["label", "label", "int", "expr"])
    lines = []
    for _ in range(rng.randint(1, 3)):
        lines += [f"if {_cond_on(rng, x, -6, 15, y)}:", f"    return {_value(rng, kind, namer, x)}"]
    lines.append(f"return {_value(rng, kind, namer, x)}")
    params = f"{x}: int" + (f", {y}: int" if y else "")
    one = synthetic._int_arg(-10, 20)
    sample = (lambda r: one(r) + one(r)) if y else one
    edges = ((0, 0),) if y else ((0,),)
    return GeneratedProgram(namer.function(), params, "str" if kind == "label" else "int",
                            _indent(lines), sample, edges, "chain")


def _list_loop(rng: random.Random, namer: _Namer) -> GeneratedProgram:
    xs, x, acc = namer.var(), namer.var(), namer.var()
    update = rng.choice(["sum", "scaled", "count", "product", "collect", "best"])
    init, step, ret = {
        "sum": ("0", f"{acc} += {x}", acc),
        "scaled": ("0", f"{acc} += {x} * {rng.randint(2, 3)}", acc),
        "count": ("0", f"{acc} += 1", acc),
        "product": ("1", f"{acc} *= {x}", acc),
        "collect": ("[]", f"{acc}.append({_value(rng, 'expr', namer, x)})", acc),
        "best": (f"{xs}[0]", None, acc),
    }[update]
    lines = []
    guarded = update == "best" or rng.random() < 0.3
    if guarded:
        lines += [f"if not {xs}:", f"    return {'[]' if update == 'collect' else rng.randint(-1, 1)}"]
    lines.append(f"{acc} = {init}")
    lines.append(f"for {x} in {xs}:")
    body = ([f"if {x} {rng.choice(('>', '<'))} {acc}:", f"    {acc} = {x}"] if update == "best"
            else [step])
    if update != "best" and rng.random() < 0.7:
        body = [f"if {_cond_on(rng, x, -3, 9)}:"] + ["    " + b for b in body]
    if rng.random() < 0.15:
        body = [f"if {x} == {rng.randint(-3, 9)}:", f"    return {acc}"] + body
    lines += ["    " + b for b in body]
    if update == "collect" and rng.random() < 0.4:
        ret = f"len({acc})"
    elif update != "collect" and rng.random() < 0.3:
        ret = f"{acc} {rng.choice(('+', '-', '*'))} {rng.randint(1, 3)}"
    lines.append(f"return {ret}")
    returns = "list[int]" if update == "collect" and ret == acc else "int"
    return GeneratedProgram(namer.function(), f"{xs}: list[int]", returns, _indent(lines),
                            synthetic._int_list(-4, 12, 6), (([],),) if guarded else (([1],),),
                            "list_loop")


def _index_loop(rng: random.Random, namer: _Namer) -> GeneratedProgram:
    xs, i, acc = namer.var(), namer.var(), namer.var()
    start = rng.choice([0, 0, 1])
    cond = rng.choice([f"{i} % {rng.randint(2, 3)} == {rng.randint(0, 1)}",
                       f"{xs}[{i}] {rng.choice(_OPS)} {rng.randint(-2, 8)}",
                       f"{xs}[{i}] {rng.choice(('>', '<', '=='))} {xs}[{i} - 1]" if start else
                       f"{xs}[{i}] != {rng.randint(0, 5)}"])
    update = rng.choice([f"{acc} += {xs}[{i}]", f"{acc} += {i}", f"{acc} += 1",
                         f"{acc} = {acc} * 2 + {xs}[{i}]"])
    lines = [f"{acc} = 0", f"for {i} in range({start}, len({xs})):", f"    if {cond}:",
             f"        {update}", f"return {acc}"]
    return GeneratedProgram(namer.function(), f"{xs}: list[int]", "int", _indent(lines),
                            synthetic._int_list(-3, 9, 7), (([],), ([2, 2],)), "index_loop")


def _text_loop(rng: random.Random, namer: _Namer) -> GeneratedProgram:
    s, ch, out = namer.var(), namer.var(), namer.var()
    letters = "".join(sorted(rng.sample(_LETTERS, rng.randint(1, 4))))
    test = rng.choice([f'{ch} in "{letters}"', f'{ch} not in "{letters}"', f'{ch} == "{letters[0]}"',
                       f"{ch}.isdigit()", f"{ch}.isupper()"])
    counting = rng.random() < 0.3
    if counting:
        lines = [f"{out} = 0", f"for {ch} in {s}:", f"    if {test}:", f"        {out} += {rng.randint(1, 3)}"]
    else:
        add = rng.choice([f"{ch}", f"{ch}.upper()", f"{ch}.lower()", f"{ch} * 2", f'"{rng.choice(_LETTERS)}"'])
        lines = [f'{out} = ""', f"for {ch} in {s}:", f"    if {test}:",
                 f"        {out} = {out} + {add}" if rng.random() < 0.7 else f"        {out} = {add} + {out}"]
        if rng.random() < 0.4:
            lines += ["    else:", f"        {out} = {out} + {ch}"]
    lines.append(f"return {out}" if rng.random() < 0.8 or counting else f"return len({out})")
    returns = "int" if counting or lines[-1].startswith("return len") else "str"
    alphabet = _LETTERS + "AEK19"
    return GeneratedProgram(namer.function(), f"{s}: str", returns, _indent(lines),
                            synthetic._text(alphabet, 8), (("",),), "text_loop")


def _arithmetic(rng: random.Random, namer: _Namer) -> GeneratedProgram:
    a, b, t, u = namer.var(), namer.var(), namer.var(), namer.var()
    lines = [f"{t} = {a} * {rng.randint(2, 5)} {rng.choice(('+', '-'))} {b}",
             f"{u} = {t} {rng.choice(('%', '//'))} {rng.randint(2, 7)}"]
    if rng.random() < 0.6:
        lines += [f"if {t} {rng.choice(_OPS)} {u}:", f"    {t} = {t} - {rng.randint(1, 9)}"]
    lines.append(rng.choice([f"return {t} + {u}", f"return max({t}, {u})", f"return {t} * {u}",
                             f"return {u} - {t}"]))
    one = synthetic._int_arg(-9, 20)
    return GeneratedProgram(namer.function(), f"{a}: int, {b}: int", "int", _indent(lines),
                            lambda r: one(r) + one(r), ((0, 0),), "arithmetic")


_DRAW = {"chain": _chain, "list_loop": _list_loop, "index_loop": _index_loop,
         "text_loop": _text_loop, "arithmetic": _arithmetic}


def draw_program(rng: random.Random, words: Sequence[str] = ()) -> GeneratedProgram:
    """One random function (shape drawn from :data:`SHAPES`, chains twice as often)."""
    shape = rng.choice(SHAPES + ("chain",))
    return _DRAW[shape](rng, _Namer(rng, words))


# ----------------------------------------------------------------------------- shapes


_BUILTINS = frozenset(dir(builtins))


class _Numbered(ast.NodeTransformer):
    """Every identifier numbered by first appearance (builtins and attributes stay:
    ``sorted(xs)`` and ``len(xs)`` are different shapes)."""

    def __init__(self):
        self.ids: dict[str, str] = {}

    def _id(self, name: str) -> str:
        return self.ids.setdefault(name, f"v{len(self.ids)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in _BUILTINS:
            node.id = self._id(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._id(node.arg)
        node.annotation = None
        return node


def shape_key(code: str) -> str:
    """The code's template, name-blind: :func:`labkit.env.synthetic.template_of`'s abstraction
    (function name, literals and comparison direction dropped) after every identifier is
    numbered by first appearance. Two programs with one key are one template under other
    names and constants."""
    tree = ast.parse(code)
    tree = _Numbered().visit(synthetic._Abstract().visit(tree))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def held_out_shapes(seed: int = 0) -> frozenset[str]:
    """The :func:`shape_key` of every synthetic template outside the training split (``val``,
    ``test``) for split seed ``seed``, from the same census of drafts the split is made of
    (the stream :func:`labkit.env.synthetic.family_templates` draws: every template the split
    assigns is met in it)."""
    keys = set()
    for family in synthetic.FAMILIES:
        rng = random.Random(f"labkit.synthetic.templates:{family}")
        for _ in range(3_000):
            draft = synthetic.FAMILIES[family].draft(rng)
            if template_split(synthetic.template_of(draft), seed) in (Split.VAL, Split.TEST):
                code, roles, _ = synthetic._identify(draft)
                keys.add(shape_key(code.substitute({r: synthetic.VOCAB[r][0] for r in roles})))
    return frozenset(keys)


def generated_problems(n: int, seed: int = 0, words: Sequence[str] = (),
                       split_seed: int = 0) -> list[synthetic.SyntheticProblem]:
    """``n`` distinct generated problems (tests and examples from running the reference),
    none of a held-out synthetic template's shape (:func:`held_out_shapes`)."""
    rng = random.Random(f"labkit.generated:{seed}")
    banned = held_out_shapes(split_seed)
    seen: set[str] = set()
    out: list[synthetic.SyntheticProblem] = []
    while len(out) < n:
        program = draw_program(rng, words)
        code = program.code
        if code in seen or shape_key(code) in banned:
            continue
        seen.add(code)
        try:
            out.append(_realise(program, rng))
        except (ArithmeticError, IndexError, TypeError, ValueError):
            continue  # the drawn code fails on its own inputs (a // 0 ...): draw again
    return out


def _realise(program: GeneratedProgram, rng: random.Random) -> synthetic.SyntheticProblem:
    code = program.code
    namespace: dict = {}
    exec(compile(code, f"<generated {program.name}>", "exec"), namespace)  # noqa: S102 (our grammar)
    draft = synthetic._Draft(FAMILY, program.name, program.params, program.returns, "", "",
                             program.sample, program.edges)
    tests = TestSuite(cases=synthetic._select_tests(namespace[program.name], draft, rng))
    if len({repr(c.expected) for c in tests.cases}) < 2:
        raise ValueError("one output for every test")
    args = ", ".join(a.split(":")[0] for a in program.params.split(", "))
    digest = hashlib.sha256(code.encode()).hexdigest()
    return synthetic.SyntheticProblem(
        problem_id=f"{FAMILY}-{digest[:10]}", family=FAMILY, entry_point=program.name,
        signature=code.splitlines()[0], description=rng.choice(_DOCS).format(args=args),
        reference_code=code, tests=tests, examples=synthetic.choose_examples(tests), level=1,
        template=f"{FAMILY}/{shape_key(code)[:10]}")


def generated_tasks(n: int, seed: int = 0, bugs_per_problem: int = 2, words: Sequence[str] = (),
                    runner=None, timeout_s: float = 2.0) -> list[RepairTask]:
    """Repair tasks of ``n`` generated problems: up to ``bugs_per_problem`` validated bugs each
    (the tests catch them, checked in the sandbox), examples chosen among the cases the buggy
    code fails, as for synthetic tasks. Task ids ``generated/<problem>/bug<k>``."""
    run = runner or run_many
    tasks = []
    for problem in generated_problems(n, seed, words):
        try:
            found = bugs.inject_validated(
                problem.reference_code, problem.tests, problem.entry_point,
                seed=derive_seed(seed, FAMILY, problem.problem_id), n=bugs_per_problem,
                runner=run, timeout_s=timeout_s, batch_size=2 * bugs_per_problem + 2)
        except ValueError:
            continue  # the reference fails a test in the sandbox: not a usable problem
        results = run([Candidate(v.code, problem.tests, problem.entry_point, timeout_s,
                                 id=f"{problem.problem_id}:{k}") for k, v in enumerate(found)])
        for k, (variant, result) in enumerate(zip(found, results)):
            failed = {o.name for o in result.outcomes if not o.ok} or \
                {c.name for c in problem.tests.cases}
            examples = synthetic.choose_examples(problem.tests, failed)
            tasks.append(RepairTask(
                task_id=f"{FAMILY}/{problem.problem_id}/bug{k}", problem_id=problem.problem_id,
                source=FAMILY, prompt=problem.prompt_with(examples), buggy_code=variant.code,
                reference_code=problem.reference_code, tests=problem.tests,
                entry_point=problem.entry_point, bugs=tuple(variant.bugs),
                public_tests=TestSuite(cases=examples),
                meta={"family": FAMILY, "level": 1, "template": problem.template,
                      "buggy_status": variant.status, "buggy_passed": variant.passed,
                      "tests_total": variant.total}))
    return tasks


__all__ = ["SHAPES", "GeneratedProgram", "draw_program", "shape_key", "held_out_shapes",
           "generated_problems", "generated_tasks"]
