"""Weak-feedback signals for a candidate fix: named components, each a pure function.

Given a task and a candidate program, the lab computes (the reshaping blog post's
components; ``docs/feedback.md`` and ``docs/training.md``):

=================  ==========================================================================
``r_test``         fraction of the hidden tests passed, ``passed / total``
``r_pass``         ``1`` if every test passed, else ``0``
``r_feedback``     what the learner is told under the run's feedback regime
                   (``FeedbackConfig.mode``: ``dense`` = ``r_test``, ``binary`` = ``r_pass``,
                   ``public``, ``noisy``, ``coarse``; :func:`r_feedback`); the reshaped
                   reward's test term reads it, evaluation keeps to the hidden tests
``r_compile``      ``1`` if the candidate parses and its module loads (sandbox status is not
                   ``error``), else ``0``
``r_precision``    ``exp(-lambda * d)``, ``d`` a normalised distance between the buggy and the
                   candidate syntax trees (Zhang-Shasha tree edit distance over the ``ast``,
                   divided by the larger tree's size; a cheaper token-level Levenshtein
                   distance is the ``token`` option)
``r_style``        ``exp(-alpha * v)``, ``v`` the number of style violations: ruff lint findings
                   (bare ``except``, unused imports/names, complexity) plus one if ``black``
                   would reformat the code
``r_progress``     a one-off bonus from :class:`ProgressTracker` when a bug kind the policy kept
                   failing is finally fixed (stateful, checkpointable)
``hack``           ``1`` if the sandbox's syntax-tree scan raised a hack flag, else ``0``; the
                   reshaping floor turns it into a penalty. Unparsable code is not a hack: it
                   has ``r_compile = 0`` and no flag
``noop``           ``1`` if the candidate is the buggy code unchanged (after normalisation)
=================  ==========================================================================

Components stay separate here; weighting and gating them (e.g. paying ``r_precision``
only when the tests improve, since the unchanged buggy code maximises it) is the
reshaping floor's job.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import json
import math
import random
import re
import tempfile
import tokenize
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Iterable, Literal, Mapping, Sequence

from labkit.env.code import _parse, _quiet_compiler, is_noop, normalise_code, parse_candidate  # noqa: F401
from labkit.sandbox.records import Candidate, SandboxResult, Status, TestOutcome
from labkit.env.records import Components, RepairTask
from labkit.machine import run_own_session
from labkit.sandbox.pool import Sandbox, default_sandbox, run_distinct

# Flags of the sandbox's scan that are not reward hacks, and what prices them instead: a bare
# ``except`` is a style finding (``r_style``); code that does not parse is a failed attempt,
# priced by ``r_compile`` and reported as its own rate (``compile/syntax_error``); code over
# the sandbox's ``max_code_bytes`` is graded an error without being parsed (``too_large``).
NOT_HACK_FLAGS = frozenset({"bare_except", "syntax_error", "too_large"})


# ----------------------------------------------------------------------------- config


@dataclass
class FeedbackConfig:
    """Parameters of the feedback components."""

    precision_lambda: float = 2.0
    """``lambda`` in ``r_precision = exp(-lambda * d)``; d is in [0, 1]."""
    precision_distance: Literal["tree", "token"] = "tree"
    """``tree``: normalised Zhang-Shasha edit distance over the ast; ``token``: normalised
    Levenshtein distance over Python tokens (about 20x cheaper)."""
    style_alpha: float = 0.5
    """``alpha`` in ``r_style = exp(-alpha * violations)``."""
    style_rules: tuple[str, ...] = ("E722", "F401", "F841", "F811", "C901", "E711", "E712")
    """ruff rules counted as style violations (bare except, unused import/name, redefinition,
    complexity, comparisons to None/True)."""
    style_max_complexity: int = 8
    """McCabe complexity above which C901 fires."""
    style_check_format: bool = True
    """Count one violation when ``black`` would reformat the candidate."""
    repeats: int = 1
    """Evaluate the tests this many times and average ``r_test`` (for flaky/noisy signals);
    the status and flags come from the first run."""
    progress_patience: int = 3
    """A bug kind counts as 'kept failing' after this many failed attempts in a row."""
    progress_bonus: float = 1.0
    """Size of the one-off ``r_progress`` bonus."""
    mode: Literal["dense", "binary", "public", "noisy", "coarse", "flipped"] = "dense"
    """The feedback regime: what the learner is told, ``r_feedback`` (:func:`r_feedback`).
    ``dense``: the fraction of hidden tests passed; ``binary``: 1 only when every hidden test
    passes; ``public``: the fraction of the *visible* examples passed (incomplete tests:
    fitting the examples is the hack to watch); ``noisy``: the fraction after flipping each
    test outcome with probability ``noise_p``; ``coarse``: the fraction rounded down to one
    of ``coarse_levels`` levels; ``flipped``: the binary verdict, flipped with probability
    ``noise_p`` (wrong labels). Evaluation always uses the hidden tests."""
    noise_p: float = 0.1
    """``noisy``: probability that a test outcome is flipped; ``flipped``: that the whole
    pass/fail verdict is."""
    coarse_levels: int = 4
    """``coarse``: levels of the quantised fraction (``0, 1/(k-1), ..., 1``)."""

    def validate(self) -> None:
        if self.precision_lambda < 0:
            raise ValueError("precision_lambda must be >= 0")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")
        if self.progress_patience < 1:
            raise ValueError("progress_patience must be >= 1")
        if not 0 <= self.noise_p <= 0.5:
            raise ValueError(f"noise_p must be in [0, 0.5] (a flip rate above one half inverts "
                             f"the signal), got {self.noise_p}")
        if self.coarse_levels < 2:
            raise ValueError(f"coarse_levels must be >= 2, got {self.coarse_levels}")


# ----------------------------------------------------------------------------- tests


def r_test(result: SandboxResult) -> float:
    """``r_test = passed / total`` (0 when no test was collected): ``SandboxResult.fraction``."""
    return result.fraction


def r_pass(result: SandboxResult) -> float:
    """``r_pass = 1[status == passed]``."""
    return 1.0 if result.status == Status.PASSED else 0.0


def r_compile(code: str, result: SandboxResult | None = None) -> float:
    """``r_compile = 1[code parses] * 1[module loads]`` (loading known from a sandbox result)."""
    try:
        with _quiet_compiler():
            compile(code, "<candidate>", "exec")
    except (SyntaxError, ValueError):
        return 0.0
    if result is not None and result.status == Status.ERROR:
        return 0.0
    return 1.0


# ----------------------------------------------------------------------------- regimes


FEEDBACK_MODES = ("dense", "binary", "public", "noisy", "coarse", "flipped")


def r_feedback(result: SandboxResult, mode: str = "dense", *,
               public: Collection[str] | SandboxResult | None = None, noise_p: float = 0.1,
               levels: int = 4, rng: random.Random | None = None) -> float:
    """The reward a learner is told under a feedback regime, from the hidden-test result.

    With ``o_j`` the hidden test outcomes and ``n`` their number:

    * ``dense``: ``sum_j o_j / n`` (= ``r_test``);
    * ``binary``: ``1[every o_j]`` (= ``r_pass``);
    * ``public``: ``sum_{j in V} o_j / |V|`` over the visible examples ``V`` (``public``: their
      names when they are among the hidden tests, else the result of running them);
    * ``noisy``: ``sum_j (o_j XOR e_j) / n``, ``e_j ~ Bernoulli(noise_p)`` drawn from ``rng``;
    * ``coarse``: ``floor(dense * (levels - 1)) / (levels - 1)``: a 70% pass rate at 4 levels
      reads 1/3, so the signal says little about which change helped;
    * ``flipped``: ``1[every o_j] XOR e``, ``e ~ Bernoulli(noise_p)`` drawn from ``rng``: a
      pass/fail label that is wrong with probability ``noise_p``.

    Code that did not load has no outcomes and gets 0 under every regime."""
    outcomes = [o.ok for o in result.outcomes]
    total = result.total or len(outcomes)
    if mode == "dense":
        return r_test(result)
    if mode == "binary":
        return r_pass(result)
    if mode == "coarse":
        k = levels - 1
        return math.floor(r_test(result) * k + 1e-9) / k
    if mode == "noisy":
        if not total:
            return 0.0
        passed = list(outcomes) + [False] * (total - len(outcomes))  # uncollected tests failed
        flips = noise_flips(rng or random.Random(0), total, noise_p)
        return sum(ok != e for ok, e in zip(passed, flips)) / total
    if mode == "flipped":
        return float((r_pass(result) >= 1.0) != ((rng or random.Random(0)).random() < noise_p))
    if mode == "public":
        if isinstance(public, SandboxResult):
            return r_test(public)
        names = set(public or ())
        if not names:
            raise ValueError("feedback mode 'public' needs the visible examples' names or results")
        by_name = {o.name: o.ok for o in result.outcomes}
        return sum(by_name.get(n, False) for n in names) / len(names)
    raise ValueError(f"unknown feedback mode {mode!r}; choose one of {list(FEEDBACK_MODES)}")


def noise_flips(rng: random.Random, n: int, p: float) -> list[bool]:
    """The ``noisy`` regime's flips ``e_j ~ Bernoulli(p)`` for ``n`` test outcomes, drawn from
    ``rng`` in test order (one draw per test)."""
    return [rng.random() < p for _ in range(n)]


def told_pass(components: Mapping[str, float]) -> bool:
    """Whether the feedback regime *told* the learner that every test passed:
    ``r_feedback = 1`` (every hidden test under ``dense``, ``binary`` and ``coarse``, every
    visible example under ``public``, every flipped outcome under ``noisy``, a label that reads
    pass under ``flipped``). What reads a
    pass to pay or steer training (the progress bonus, the curriculum) reads this, never the
    hidden ``r_pass``, so that a regime reveals nothing beyond its own observation
    (docs/feedback.md, "What each part of the reward reads")."""
    return components["r_feedback"] >= 1.0 - 1e-9


def r_feedback_of_record(record: Mapping, config: FeedbackConfig, seed: int = 0) -> float:
    """``r_feedback`` of a stored rollout record (``rollouts.jsonl``) under another regime:
    its per-test outcomes (``tests``: ``[name, ok]`` pairs, ``tests_total``) and its visible
    examples' names (``public_tests``) are all a regime needs, so a stored batch can be
    re-read as if the run had been told something else."""
    if "tests" not in record:
        raise ValueError("this rollout record holds no per-test outcomes (written by an older "
                         "labkit); re-run the step to compare feedback regimes")
    outs = tuple(TestOutcome(name, bool(ok)) for name, ok in record["tests"])
    passed = sum(o.ok for o in outs)
    total = int(record.get("tests_total", len(outs)))
    result = SandboxResult(status=Status.PASSED if outs and passed == total else Status.FAILED,
                           passed=passed, total=total, outcomes=outs)
    public = record.get("public_tests") or None
    if config.mode == "public" and public and not set(public) <= {o.name for o in outs}:
        raise ValueError(f"record {record.get('task_id')}: its visible examples were not among "
                         "the graded tests, so the 'public' regime cannot be re-read from it")
    return r_feedback(result, config.mode, public=public, noise_p=config.noise_p,
                      levels=config.coarse_levels, rng=random.Random(f"{seed}:{record.get('task_id')}:"
                                                                    f"{record.get('sample')}"))


# ----------------------------------------------------------------------------- precision


def defines_entry_point(candidate: str, entry_point: str) -> bool:
    """True when the candidate has a top-level ``def entry_point(``: the repair kept the
    function's name. A small model that garbles a long name (``reverse_without_s`` for
    ``reverse_without_vowels``) fails every test however good the body, so evaluation reports
    how often names come through. Read from the text, so it works on code that does not parse."""
    return re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", candidate, flags=re.MULTILINE) is not None


def _label(n: ast.AST) -> str:
    if isinstance(n, ast.Name):
        return f"Name:{n.id}"
    if isinstance(n, ast.Constant):
        return f"Const:{n.value!r}"
    if isinstance(n, ast.Attribute):
        return f"Attr:{n.attr}"
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return f"{type(n).__name__}:{n.name}"
    if isinstance(n, ast.arg):
        return f"arg:{n.arg}"
    return type(n).__name__


def _children(n: ast.AST) -> list[ast.AST]:
    return [c for c in ast.iter_child_nodes(n) if not isinstance(c, (ast.Load, ast.Store, ast.Del))]


def _size(n: ast.AST) -> int:
    return 1 + sum(_size(c) for c in _children(n))


def _zss(nodes: list[ast.AST]):
    """The ``zss`` package's tree of a statement run (the tests' reference implementation)."""
    from zss import Node

    def build(n: ast.AST) -> Node:
        node = Node(_label(n))
        for c in _children(n):
            node.addkid(build(c))
        return node

    root = Node("block")
    for n in nodes:
        root.addkid(build(n))
    return root


def _postorder(nodes: list[ast.AST]) -> tuple[list[str], list[int]]:
    """Labels and leftmost-leaf indices, in post-order, of the tree ``block(nodes...)``."""
    labels: list[str] = []
    leftmost: list[int] = []

    def visit(label: str, kids: list[ast.AST]) -> int:
        first = -1
        for k in kids:
            at = visit(_label(k), _children(k))
            if first < 0:
                first = leftmost[at]
        labels.append(label)
        leftmost.append(first if first >= 0 else len(labels) - 1)
        return len(labels) - 1

    visit("block", nodes)
    return labels, leftmost


def _keyroots(leftmost: list[int]) -> list[int]:
    """For each leftmost leaf, the highest node having it (Zhang and Shasha's key roots)."""
    last: dict[int, int] = {}
    for i, left in enumerate(leftmost):
        last[left] = i
    return sorted(last.values())


def _ted(a: list[ast.AST], b: list[ast.AST]) -> int:
    """Unit-cost Zhang-Shasha tree edit distance between ``block(a...)`` and ``block(b...)``
    (Zhang and Shasha 1989): insert, delete and relabel cost 1; labels are :func:`_label`.
    The same number as ``zss.simple_distance`` on :func:`_zss` trees (a test checks), with
    the forest-distance table on plain lists and the unit costs inlined."""
    la, pa = _postorder(a)
    lb, pb = _postorder(b)
    n, m = len(la), len(lb)
    td = [[0] * m for _ in range(n)]
    kb = _keyroots(pb)
    for i in _keyroots(pa):
        li = pa[i]
        rows = i - li + 2
        for j in kb:
            lj = pb[j]
            cols = j - lj + 2
            fd = [[0] * cols for _ in range(rows)]
            first = fd[0]
            for y in range(1, cols):
                first[y] = y
            for x in range(1, rows):
                ia = li + x - 1
                left_a = pa[ia]
                label_a = la[ia]
                row, prev = fd[x], fd[x - 1]
                row[0] = x
                td_a = td[ia]
                whole_a = left_a == li
                for y in range(1, cols):
                    jb = lj + y - 1
                    best = prev[y] + 1
                    ins = row[y - 1] + 1
                    if ins < best:
                        best = ins
                    if whole_a and pb[jb] == lj:
                        sub = prev[y - 1] + (label_a != lb[jb])
                        if sub < best:
                            best = sub
                        row[y] = best
                        td_a[jb] = best
                    else:
                        sub = fd[left_a - li][pb[jb] - lj] + td_a[jb]
                        row[y] = sub if sub < best else best
    return td[n - 1][m - 1]


def _block_distance(a: list[ast.stmt], b: list[ast.stmt]) -> int:
    """Tree edit distance between two statement blocks, computed piecewise.

    Statements are aligned by ``difflib`` on their ``ast.dump``; equal statements cost 0,
    a compound statement of the same kind and header in both (``def``, ``for``, ``while``,
    ``if``, ``with``) is compared body against body (recursively), and each remaining
    replaced / inserted / deleted run is priced by Zhang-Shasha (:func:`_ted`) on just that run. The
    result is an upper bound of the full tree edit distance that is exact for the usual
    repair (one or a few local edits) and orders of magnitude cheaper.
    """
    import difflib

    da, db = [ast.dump(s) for s in a], [ast.dump(s) for s in b]
    total = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, da, db, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        xa, xb = a[i1:i2], b[j1:j2]
        if len(xa) == len(xb) == 1 and _same_header(xa[0], xb[0]):
            total += _block_distance(xa[0].body, xb[0].body)
            total += _block_distance(getattr(xa[0], "orelse", []), getattr(xb[0], "orelse", []))
            continue
        if not xa or not xb:
            total += sum(_size(s) for s in xa + xb)
            continue
        total += _ted(xa, xb)
    return total


_HEADER_FIELDS = {ast.FunctionDef: ("name", "args", "decorator_list", "returns"),
                  ast.For: ("target", "iter"), ast.While: ("test",), ast.If: ("test",),
                  ast.With: ("items",)}


def _same_header(x: ast.stmt, y: ast.stmt) -> bool:
    fields = _HEADER_FIELDS.get(type(x))
    if fields is None or type(x) is not type(y):
        return False
    return all(_dump_field(getattr(x, f)) == _dump_field(getattr(y, f)) for f in fields)


def _dump_field(v) -> str:
    if isinstance(v, list):
        return "|".join(_dump_field(i) for i in v)
    return ast.dump(v) if isinstance(v, ast.AST) else repr(v)


@functools.lru_cache(maxsize=65536)
def tree_distance(a: str, b: str) -> float:
    """``d = TED(ast(a), ast(b)) / max(|a|, |b|)`` in [0, 1], docstrings ignored.

    TED is the unit-cost Zhang-Shasha tree edit distance, computed piecewise over the
    statements that differ (:func:`_block_distance`); ``|a|`` counts ast nodes. A program
    that does not parse is at distance 1 from anything. Memoised: a GRPO group often holds
    the same program several times, and a task's buggy code meets it again at every step.
    """
    if a == b:
        return 0.0
    try:
        ma, mb = _parse(a), _parse(b)
    except (SyntaxError, ValueError):
        return 1.0
    size = max(_size(ma), _size(mb), 1)
    return min(1.0, _block_distance(ma.body, mb.body) / size)


def _tokens(code: str) -> list[str]:
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code.split()


def token_distance(a: str, b: str) -> float:
    """``d = Levenshtein(tokens(a), tokens(b)) / max(len_a, len_b)`` in [0, 1] (rapidfuzz)."""
    from rapidfuzz.distance import Levenshtein

    ta, tb = _tokens(a), _tokens(b)
    return Levenshtein.normalized_distance(ta, tb)


def r_precision(buggy: str, candidate: str, lam: float = 2.0,
                distance: Literal["tree", "token"] = "tree") -> float:
    """``r_precision = exp(-lambda * d(buggy, candidate))``: small, surgical edits score high.

    Note the trap: the unchanged buggy code scores exactly 1. Gate it in reshaping.
    """
    d = tree_distance(buggy, candidate) if distance == "tree" else token_distance(buggy, candidate)
    return math.exp(-lam * d)


# ----------------------------------------------------------------------------- style


@dataclass(frozen=True)
class StyleReport:
    violations: tuple[str, ...]  # ruff codes, plus "format" when black would reformat
    score: float


@functools.lru_cache(maxsize=8192)
def _black_ok(code: str) -> bool:
    import black

    try:
        return black.format_str(code, mode=black.Mode()) == code
    except Exception:  # black's own parse errors: unformattable code is a style failure
        return False


def style_many(codes: Sequence[str], config: FeedbackConfig | None = None) -> list[StyleReport]:
    """Style reports for many programs with ONE ruff process (files in a temp dir).

    ``r_style = exp(-alpha * v)``, v = number of ruff findings in ``config.style_rules``
    (+1 when ``black`` would reformat). Code that does not parse scores 0.
    """
    cfg = config or FeedbackConfig()
    found: dict[int, list[str]] = defaultdict(list)
    parses = []
    for code in codes:
        try:
            parse_candidate(code)
            parses.append(True)
        except (SyntaxError, ValueError):
            parses.append(False)
    if any(parses):
        with tempfile.TemporaryDirectory(prefix="labkit-style-") as tmp:
            for i, code in enumerate(codes):
                if parses[i]:
                    Path(tmp, f"c{i}.py").write_text(code)
            cmd = ["ruff", "check", "--no-cache", "--isolated", "--output-format", "json",
                   "--select", ",".join(cfg.style_rules),
                   "--config", f"lint.mccabe.max-complexity={cfg.style_max_complexity}", tmp]
            # its own session: a terminal's Ctrl-C asks the trainer to finish the step under way
            proc = run_own_session(_ruff_cmd(cmd), capture_output=True, text=True, timeout=120)
            if proc.returncode not in (0, 1):
                raise RuntimeError(f"ruff failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}")
            for item in json.loads(proc.stdout or "[]"):
                idx = int(Path(item["filename"]).stem[1:])
                found[idx].append(item["code"] or "syntax")
    out = []
    for i, code in enumerate(codes):
        if not parses[i]:
            out.append(StyleReport(("syntax",), 0.0))
            continue
        v = sorted(found.get(i, []))
        if cfg.style_check_format and not _black_ok(code):
            v.append("format")
        out.append(StyleReport(tuple(v), math.exp(-cfg.style_alpha * len(v))))
    return out


def _ruff_cmd(cmd: list[str]) -> list[str]:
    """Run the ruff binary that belongs to this interpreter's environment."""
    import shutil
    import sys

    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe), *cmd[1:]]
    found = shutil.which("ruff")
    if found is None:
        raise RuntimeError("ruff is not installed; run `make install` (it is a labkit dependency)")
    return [found, *cmd[1:]]


def r_style(code: str, config: FeedbackConfig | None = None) -> float:
    """``r_style = exp(-alpha * violations)`` for one program (see :func:`style_many`)."""
    return style_many([code], config)[0].score


# ----------------------------------------------------------------------------- hacks


def hack_flags(result: SandboxResult) -> tuple[str, ...]:
    """The sandbox's flags that count as reward hacking (:data:`NOT_HACK_FLAGS` removed)."""
    return tuple(f for f in result.flags if f not in NOT_HACK_FLAGS)


def r_hack(result: SandboxResult) -> float:
    """``1`` if any hack flag was raised, else ``0`` (reshaping multiplies it by a penalty)."""
    return 1.0 if hack_flags(result) else 0.0


# ----------------------------------------------------------------------------- progress


class ProgressTracker:
    """Pays a one-off bonus when a bug kind the policy keeps failing is finally fixed.

    For each bug kind k it counts failed attempts in a row, ``f_k``. An attempt on a task
    with kinds K that passes earns ``r_progress = bonus`` if some ``k in K`` has
    ``f_k >= patience`` (then ``f_k`` resets), else 0. A pass resets the counters of its
    kinds; a failure increments them. State is a plain dict for checkpoints.
    """

    def __init__(self, patience: int = 3, bonus: float = 1.0):
        self.patience = patience
        self.bonus = bonus
        self.fail_streak: dict[str, int] = defaultdict(int)
        self.unlocked: dict[str, int] = defaultdict(int)  # times each kind paid a bonus

    def update(self, bug_kinds: Iterable[str], passed: bool) -> float:
        kinds = list(bug_kinds) or ["unknown"]
        if not passed:
            for k in kinds:
                self.fail_streak[k] += 1
            return 0.0
        paid = 0.0
        for k in kinds:
            if self.fail_streak[k] >= self.patience:
                paid = self.bonus
                self.unlocked[k] += 1
            self.fail_streak[k] = 0
        return paid

    def state_dict(self) -> dict:
        return {"patience": self.patience, "bonus": self.bonus,
                "fail_streak": dict(self.fail_streak), "unlocked": dict(self.unlocked)}

    def load_state_dict(self, state: Mapping) -> None:
        self.patience = int(state["patience"])
        self.bonus = float(state["bonus"])
        self.fail_streak = defaultdict(int, state["fail_streak"])
        self.unlocked = defaultdict(int, state["unlocked"])


# ----------------------------------------------------------------------------- all together


@dataclass(frozen=True)
class Feedback:
    """The named components for one candidate, with the sandbox result they came from."""

    task_id: str
    components: Components
    result: SandboxResult
    style: StyleReport
    hack_flags: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "components": self.components.to_dict(),
                "result": self.result.to_dict(), "style_violations": list(self.style.violations),
                "hack_flags": list(self.hack_flags)}


def evaluate_many(
    tasks: Sequence[RepairTask],
    codes: Sequence[str],
    *,
    config: FeedbackConfig | None = None,
    sandbox=None,
    progress: ProgressTracker | None = None,
    seed: int = 0,
) -> list[Feedback]:
    """Score candidate ``codes[i]`` for ``tasks[i]``: one batched sandbox call per repeat
    (each distinct program checked once, :func:`~labkit.sandbox.pool.run_distinct`), one ruff
    process for all, then the pure component functions.

    A :class:`~labkit.sandbox.pool.Sandbox` batch runs on a helper thread while this one
    computes the components that read only the code (style, precision, no-op); the results
    are those of doing one after the other (any other ``sandbox`` object runs in this
    thread). The checks run in the sandbox's worker processes, so where cores are to spare
    the two overlap; on 2 cores both keep the CPU busy and the overlap gains little.

    ``sandbox`` is a :class:`labkit.sandbox.pool.Sandbox` (default: the process-wide one).
    ``progress`` (optional) is updated in input order with what the regime told
    (:func:`told_pass`) and pays ``r_progress``. ``seed`` seeds
    the ``noisy`` regime's flips (candidate ``i`` draws from ``Random((seed, i))``).
    """
    if len(tasks) != len(codes):
        raise ValueError(f"evaluate_many: {len(tasks)} tasks but {len(codes)} candidates")
    cfg = config or FeedbackConfig()
    if sandbox is None:
        sandbox = default_sandbox()
    cands = [Candidate(code=c, tests=t.tests, entry_point=t.entry_point, id=t.task_id)
             for t, c in zip(tasks, codes)]

    def check() -> list[list[SandboxResult]]:
        return [run_distinct(sandbox, cands) for _ in range(cfg.repeats)]

    def code_only() -> tuple[list[StyleReport], list[float], list[bool]]:
        return (style_many(codes, cfg),
                [r_precision(t.buggy_code, c, cfg.precision_lambda, cfg.precision_distance)
                 for t, c in zip(tasks, codes)],
                [is_noop(t.buggy_code, c) for t, c in zip(tasks, codes)])

    if isinstance(sandbox, Sandbox):  # labkit's pool is safe to drive from another thread
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="labkit-sandbox") as pool:
            pending = pool.submit(check)
            styles, precision, noop = code_only()
            runs = pending.result()
    else:  # a sandbox of the caller's own may need this thread (signal handlers, say)
        runs = check()
        styles, precision, noop = code_only()
    public = _public_views(tasks, codes, runs[0], sandbox) if cfg.mode == "public" else None
    out = []
    for i, (task, code) in enumerate(zip(tasks, codes)):
        result = runs[0][i]
        flags = hack_flags(result)
        comps = Components(
            r_test=sum(r_test(run[i]) for run in runs) / len(runs),
            r_pass=r_pass(result),
            r_feedback=sum(r_feedback(run[i], cfg.mode, public=public[i] if public else None,
                                      noise_p=cfg.noise_p, levels=cfg.coarse_levels,
                                      rng=random.Random(f"{seed}:{i}:{k}"))
                           for k, run in enumerate(runs)) / len(runs),
            r_compile=r_compile(code, result),
            r_precision=precision[i],
            r_style=styles[i].score,
            hack=1.0 if flags else 0.0,
            noop=1.0 if noop[i] else 0.0,
        )
        if progress is not None:  # pays on what the regime told, not on the hidden outcome
            comps = dataclasses.replace(comps, r_progress=progress.update(task.bug_kinds,
                                                                          told_pass(comps)))
        out.append(Feedback(task.task_id, comps, result, styles[i], flags))
    return out


def _public_views(tasks: Sequence[RepairTask], codes: Sequence[str],
                  hidden: Sequence[SandboxResult], sandbox) -> list:
    """Per candidate, what the ``public`` regime reads: the visible examples' names when the
    hidden run graded them (synthetic examples are hidden cases), else a run of the visible
    examples themselves (one batched sandbox call for all such candidates)."""
    views: list = [None] * len(tasks)
    todo = []
    for i, (t, res) in enumerate(zip(tasks, hidden)):
        names = [c.name for c in t.public_tests.cases]
        if not names:
            raise ValueError(f"task {t.task_id} has no visible examples for feedback mode 'public'")
        graded = {o.name for o in res.outcomes}
        if set(names) <= graded or (not res.outcomes and set(names) <= {c.name for c in t.tests.cases}):
            views[i] = names
        else:
            todo.append(i)
    if todo:
        results = sandbox.run_many([Candidate(code=codes[i], tests=tasks[i].public_tests,
                                              entry_point=tasks[i].entry_point,
                                              id=f"{tasks[i].task_id}:public") for i in todo])
        for i, r in zip(todo, results):
            views[i] = r
    return views


class BuggyBaselines:
    """Each task's unchanged buggy code scored under a feedback regime, once per task: the
    precision gate's baseline (:func:`labkit.credit.reshaping.precision_gate` compares a
    candidate's test term with its buggy code's). Checkpointable (``state_dict``)."""

    def __init__(self, config: FeedbackConfig | None = None, sandbox=None, seed: int = 0):
        self.config = config or FeedbackConfig()
        self.sandbox = sandbox
        self.seed = seed
        self.components: dict[str, Components] = {}

    def of(self, tasks: Sequence[RepairTask]) -> list[Components]:
        """The buggy code's components of each task (scored now for tasks not seen before,
        one batched call)."""
        todo = list({t.task_id: t for t in tasks if t.task_id not in self.components}.values())
        if todo:
            fb = evaluate_many(todo, [t.buggy_code for t in todo], config=self.config,
                               sandbox=self.sandbox, seed=self.seed)
            for t, f in zip(todo, fb):
                self.components[t.task_id] = f.components
        return [self.components[t.task_id] for t in tasks]

    def state_dict(self) -> dict:
        return {"components": {k: c.to_dict() for k, c in self.components.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        self.components = {k: Components.from_dict(c) for k, c in state["components"].items()}

