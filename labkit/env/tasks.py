"""Repair tasks: the one entry point the rest of the lab loads tasks through.

Three sources, one record (:class:`~labkit.env.records.RepairTask`):

=================  ==========================================================================
``humaneval``      the 164 HumanEval problems (:mod:`labkit.env.humaneval`), bugs injected by
                   :mod:`labkit.env.bugs`
``synthetic``      generated functions (:mod:`labkit.env.synthetic`), bugs injected likewise;
                   the prompt shows 2-3 examples, at least one of which the buggy code fails
``humanevalpack``  human-written bugs from a HumanEvalPack-format file the user brings
                   (:mod:`labkit.env.humanevalpack`); ``path`` is required
=================  ==========================================================================

Splits never put one problem in two places. Synthetic problems are split by *template*
(:func:`template_split`): per family a fixed share of templates (the code shape before names
and constants, :func:`labkit.env.synthetic.template_of`) is held out for ``val`` and ``test``,
so no held-out problem is a training problem with other constants; ``in_template`` holds out a
share of the training templates' instances (the old instance split, under a name that says
what it is). HumanEval and HumanEvalPack problems are split by hashing the problem id
(:func:`split_of`). Injected bugs are validated by execution in the sandbox: the reference
passes every test and the buggy code fails at least one. That costs sandbox time, so validated
lists are cached as JSONL under ``$LABKIT_CACHE`` (default ``~/.cache/labkit/tasks``), keyed by
every parameter and by a hash of the code that builds them. The repository ships the lists
that the lab and its tests load, built by that code (``data/tasks``, :func:`ship`): a list
found there is read instead of built, and a change to the code that builds lists leaves them
unread until they are shipped again. Each synthetic problem's tasks
depend on that problem alone, so a list of ``n`` problems is the first ``n`` problems' tasks
of any longer list of the same spec: a cached longer list gives a shorter one, and a cached
shorter list is extended by building only the problems beyond it::

    tasks = load_tasks("synthetic", "train", n=2000, bugs_per_problem=3)
    report = validate_tasks(tasks)        # {"tasks": ..., "reference_pass": ..., ...}
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gzip
import hashlib
import json
import os
import random
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.env import bugs, humaneval, synthetic
from labkit.env.edits import revert_hunks, split_hunks
from labkit.env.humanevalpack import load_humanevalpack
from labkit.env.overlap import ReferencePool, pool_entries
from labkit.env.records import BugSpan, RepairTask, Split
from labkit.sandbox.records import Candidate, SandboxResult, TestSuite
from labkit.sandbox.pool import run_many
from labkit.seeding import derive_seed

Runner = Callable[[Sequence[Candidate]], list[SandboxResult]]
"""Runs candidates in a sandbox, one result per candidate, in order
(:func:`labkit.sandbox.pool.run_many` by default)."""

SOURCES = ("humaneval", "synthetic", "humanevalpack")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
"""Train / val / test shares of *problems* (HumanEval, HumanEvalPack)."""
TEMPLATE_FRACTIONS = (0.7, 0.1, 0.2)
"""Train / val / test shares of each synthetic family's *templates*."""
IN_TEMPLATE_SHARE = 0.1
"""Share of the training templates' problems held out as the ``in_template`` split."""
LEAK_POOL = (2000, (0, 1, 2))
"""``(n, seeds)``: the training problems a held-out synthetic problem must not be solved by,
the first ``n`` train problems of each generator stream in ``seeds`` (the streams the
experiments train on). See :func:`synthetic_split`."""
SYNTHETIC_TIMEOUT_S = 2.0
"""Sandbox deadline per check for synthetic code: references run in microseconds, so a
mutant that needs more is an endless loop, dropped quickly instead of after the default."""

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "tasks"
"""Where the repository ships the task lists the lab and its tests load (:func:`ship`)."""

# The modules whose code decides what a task list contains; their text is part of the cache
# key. The sandbox is not: it decides verdicts, which a change to it should not alter.
_BUILDERS = ("tasks.py", "humaneval.py", "humanevalpack.py", "synthetic.py", "bugs.py",
             "records.py", "plain.py")


# ----------------------------------------------------------------------------- splits


def split_of(problem_id: str, seed: int = 0,
             fractions: Sequence[float] = DEFAULT_FRACTIONS) -> Split:
    """The split of a problem: a hash of ``(seed, problem_id)`` mapped to [0, 1) and cut at the
    cumulative ``fractions`` (train, val, test). Stable across runs, machines and Python
    versions (``hashlib``, not ``hash()``)."""
    fractions = _check_fractions(fractions)
    digest = hashlib.sha256(f"labkit-split:{seed}:{problem_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < fractions[0]:
        return Split.TRAIN
    if u < fractions[0] + fractions[1]:
        return Split.VAL
    return Split.TEST


def template_split(template: str, seed: int = 0,
                   fractions: Sequence[float] = TEMPLATE_FRACTIONS) -> Split:
    """The split of a synthetic template (``family/<hash>``).

    Held-out templates are *recombinations*: a template is held out only where training
    keeps another template of the same skeleton (the loop-and-branch shape,
    :func:`labkit.env.synthetic.template_of` with ``skeleton=True``), so a held-out problem
    asks for a condition and a shape training has seen, never together. Per family the
    eligible templates (skeletons with two or more) are ordered by a hash of
    ``(seed, template)`` and taken in turn, skipping any whose skeleton would lose its last
    training template: ``round(f_test * n)`` (at least one) for ``test``, then
    ``round(f_val * n)`` for ``val``, ``n`` the family's templates; the rest train. A
    template the census never met (vanishingly rare) falls back to :func:`split_of` on its
    id."""
    return _template_splits(seed, tuple(_check_fractions(fractions))).get(
        template) or split_of(template, seed, fractions)


@functools.lru_cache(maxsize=8)
def _template_splits(seed: int, fractions: tuple[float, float, float]) -> dict[str, Split]:
    """Every census template's split, read from the task cache or the shipped lists when a
    run of this code wrote it there (the census drafts 27,000 functions: seconds per
    process), else computed and cached."""
    return {t: Split(v) for t, v in _derived("template-splits", seed, fractions).items()}


def _derived_name(kind: str, seed: int, fractions: tuple[float, ...]) -> str:
    """The cache name of what the splits derive once per ``(seed, fractions)``: the census
    (``template-splits``) and the leak pool's references (``leak-pool``)."""
    key = json.dumps({"seed": seed, "fractions": fractions, "code": _code_version()})
    return f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def _derived(kind: str, seed: int, fractions: tuple[float, ...]) -> Any:
    """The JSON value ``kind`` (a key of :data:`_DERIVED`) of ``(seed, fractions)`` from the task
    cache, else from the shipped lists (gzipped there), else computed and written to the cache."""
    name = _derived_name(kind, seed, fractions)
    shipped = shipped_dir()
    for file in (cache_dir() / name, shipped and shipped / (name + ".gz")):
        try:
            return json.loads(gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_text())
        except (AttributeError, OSError, ValueError, EOFError):  # no folder, no file, a bad one
            continue
    value = _DERIVED[kind](seed, fractions)
    _write_text(cache_dir() / name, json.dumps(value))
    return value


def _census_splits(seed: int, fractions: tuple[float, float, float]) -> dict[str, Split]:
    out: dict[str, Split] = {}
    for family in synthetic.FAMILIES:
        census = synthetic.family_templates(family)
        left = collections.Counter(sk for _, _, sk in census)  # training templates per skeleton
        order = sorted(census, key=lambda row: hashlib.sha256(
            f"labkit-template:{seed}:{row[0]}".encode()).digest())
        n_test = max(1, round(fractions[2] * len(census))) if fractions[2] > 0 else 0
        n_val = round(fractions[1] * len(census))
        for t, _, _ in census:
            out[t] = Split.TRAIN
        for split, want in ((Split.TEST, n_test), (Split.VAL, n_val)):
            for t, _, sk in order:
                if want == 0:
                    break
                if out[t] == Split.TRAIN and left[sk] >= 2:
                    out[t] = split
                    left[sk] -= 1
                    want -= 1
    return out


def synthetic_split(problem: synthetic.SyntheticProblem, seed: int = 0,
                    fractions: Sequence[float] = TEMPLATE_FRACTIONS) -> Split | None:
    """A synthetic problem's split: its template's (:func:`template_split`), except that

    * :data:`IN_TEMPLATE_SHARE` of the training templates' problems (by a hash of the problem
      id) form ``in_template``;
    * a problem of a held-out template whose hidden tests are all passed by some training
      reference of the :data:`LEAK_POOL` is in *no* split (``None``). Different templates can
      still coincide on eight tests (``x > 12 or x even`` is ``x even`` on inputs up to 12;
      a clamp and a largest-digit function agree on small inputs); such a problem is not held
      out in any useful sense, so it is dropped rather than evaluated on."""
    split = template_split(problem.template, seed, fractions)
    if split != Split.TRAIN:
        return None if _leak_pool(seed, tuple(fractions)).solves(problem) else split
    digest = hashlib.sha256(f"labkit-in-template:{seed}:{problem.problem_id}".encode()).digest()
    return Split.IN_TEMPLATE if int.from_bytes(digest[:8], "big") / 2**64 < IN_TEMPLATE_SHARE \
        else Split.TRAIN


@functools.lru_cache(maxsize=4)
def _leak_pool(seed: int, fractions: tuple[float, ...]) -> ReferencePool:
    """The :data:`LEAK_POOL` training references, read from the task cache or the shipped
    lists when a run of this code wrote them there (generating them takes seconds per
    process), else generated and cached."""
    return ReferencePool(entries=_derived("leak-pool", seed, fractions))


def _leak_pool_entries(seed: int, fractions: tuple[float, ...]) -> list:
    n, streams = LEAK_POOL
    train: dict[str, synthetic.SyntheticProblem] = {}
    for stream in streams:
        for p in synthetic_problems("train", n, seed=stream, split_seed=seed, fractions=fractions):
            train.setdefault(p.problem_id, p)
    return pool_entries(list(train.values()))


_DERIVED: dict[str, Callable[[int, tuple], Any]] = {
    "template-splits": lambda seed, fractions: {
        t: v.value for t, v in sorted(_census_splits(seed, fractions).items())},
    "leak-pool": lambda seed, fractions: _leak_pool_entries(seed, fractions),
}
"""What the synthetic split derives once per ``(seed, fractions)``, as JSON values: the
census's split of every template, and the leak pool's references (:func:`pool_entries`)."""


def synthetic_problems(split: str, n: int, seed: int = 0, split_seed: int = 0,
                       fractions: Sequence[float] = TEMPLATE_FRACTIONS
                       ) -> list[synthetic.SyntheticProblem]:
    """The first ``n`` problems of the synthetic stream for ``seed`` that fall in ``split``
    (before any bug is injected): what :func:`load_tasks` builds its tasks from."""
    out = []
    for p in synthetic.iter_problems(seed):
        if len(out) >= n:
            break
        if split == Split.TRAIN.value:  # never needs the leak pool (which is built from this)
            ok = template_split(p.template, split_seed, fractions) == Split.TRAIN and \
                synthetic_split(p, split_seed, fractions) == Split.TRAIN
        else:
            found = synthetic_split(p, split_seed, fractions)
            ok = found is not None and found.value == split
        if ok:
            out.append(p)
    return out


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(f) for f in fractions)
    if len(values) != 3 or min(values) < 0 or abs(sum(values) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers (train, val, test) "
                         f"summing to 1, got {tuple(fractions)}")
    return values  # type: ignore[return-value]


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class TaskSpec:
    """Everything that decides a task list; it is also the cache key (with the code hash)."""

    source: str
    """``humaneval``, ``synthetic`` or ``humanevalpack``."""
    split: str | None = None
    """``train``, ``val``, ``test``, or ``None`` for all problems."""
    n: int | None = None
    """Number of problems (in the split). Required for ``synthetic``; ``None`` elsewhere
    means every problem. Each problem gives up to ``bugs_per_problem`` tasks."""
    seed: int = 0
    """Seeds the synthetic generator and bug injection (per problem, via ``derive_seed``)."""
    path: str | None = None
    """The HumanEvalPack-format JSONL file (``humanevalpack`` only)."""
    bugs_per_problem: int = 1
    """Distinct buggy variants per problem (injected sources); fewer when a problem has too
    few bugs its tests catch."""
    n_bugs: int = 1
    """Bugs planted in each variant; also the task's ``difficulty``."""
    validate: bool = True
    """Run code in the sandbox: keep only bugs the tests catch (reference passes, buggy code
    fails), pick synthetic examples the buggy code fails, and drop public examples the
    reference fails. ``False`` runs nothing: bugs are drawn blind and may pass every test."""
    split_seed: int = 0
    """Seed of :func:`split_of`; keep it fixed across experiments so splits stay put."""
    fractions: tuple[float, float, float] | None = None
    """Train / val / test shares: of each family's templates for ``synthetic`` (default
    :data:`TEMPLATE_FRACTIONS`), of problems elsewhere (default :data:`DEFAULT_FRACTIONS`)."""
    families: tuple[str, ...] | None = None
    """Synthetic families to draw from (default: all of :data:`synthetic.FAMILIES`)."""
    operators: tuple[str, ...] | None = None
    """Bug operators to inject with (default: all of :mod:`labkit.env.bugs`' registry)."""
    include_syntax: bool = False
    """Allow the opt-in syntax-error operators."""
    timeout_s: float | None = None
    """Sandbox deadline per check; ``None``: :data:`SYNTHETIC_TIMEOUT_S` for synthetic code,
    the sandbox's default otherwise."""
    multi_hunk: bool = False
    """With ``n_bugs >= 2``: keep only variants whose bugs are separate hunks of the diff,
    each caught by tests no other bug fails, where reverting any one bug fixes only tests of
    its own (:func:`multi_hunk_catches`, checked by execution); a partial repair then earns
    partial reward. Task ids read ``.../<n>bugs<k>``; ``meta["hunk_tests"]`` lists each bug's
    tests."""

    def split_of(self, problem_id: str,
                 generated: synthetic.SyntheticProblem | None = None) -> Split | None:
        """The split of one problem of this spec's source (``None``: in no split)."""
        if generated is not None:
            return synthetic_split(generated, self.split_seed, self.fractions or TEMPLATE_FRACTIONS)
        return split_of(problem_id, self.split_seed, self.fractions or DEFAULT_FRACTIONS)

    def check(self) -> None:
        """Raise ``ValueError`` naming the bad parameter and the valid choices."""
        if self.source not in SOURCES:
            raise ValueError(f"unknown task source {self.source!r}; choose one of {list(SOURCES)}")
        splits = [s.value for s in Split]
        if self.split is not None and self.split not in splits:
            raise ValueError(f"unknown split {self.split!r}; choose one of {splits} or None")
        if self.source == "humanevalpack" and not self.path:
            raise ValueError("source 'humanevalpack' needs path=<a HumanEvalPack-format JSONL "
                             "file>; the lab does not download it")
        if self.source != "humanevalpack" and self.path:
            raise ValueError(f"path is only read by source 'humanevalpack', not {self.source!r}")
        if self.source == "synthetic" and self.n is None:
            raise ValueError("source 'synthetic' is unlimited: pass n=<number of problems>")
        for name in ("n", "bugs_per_problem", "n_bugs"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "n" else 1):
                raise ValueError(f"{name} must be {'>= 0' if name == 'n' else '>= 1'}, "
                                 f"got {value}")
        if self.fractions is not None:
            _check_fractions(self.fractions)
        if self.source != "synthetic" and self.split == Split.IN_TEMPLATE.value:
            raise ValueError(f"split 'in_template' exists for synthetic tasks only (they have "
                             f"templates); {self.source!r} has train, val and test")
        if self.multi_hunk and (self.n_bugs < 2 or not self.validate):
            raise ValueError(f"multi_hunk needs n_bugs >= 2 and validate=True (got n_bugs="
                             f"{self.n_bugs}, validate={self.validate})")
        if self.families is not None:
            unknown = sorted(set(self.families) - set(synthetic.FAMILIES))
            if unknown:
                raise ValueError(f"unknown synthetic families {unknown}; choose from "
                                 f"{sorted(synthetic.FAMILIES)}")


# ----------------------------------------------------------------------------- loading


def load_tasks(source: str, split: str | None = None, *, n: int | None = None, seed: int = 0,
               path: str | None = None, bugs_per_problem: int = 1, n_bugs: int = 1,
               validate: bool = True, split_seed: int = 0,
               fractions: Sequence[float] | None = None,
               families: Iterable[str] | None = None, operators: Iterable[str] | None = None,
               include_syntax: bool = False, timeout_s: float | None = None,
               multi_hunk: bool = False, runner: Runner | None = None, cache: bool = True,
               progress: bool = False) -> list[RepairTask]:
    """Load repair tasks from a source; the parameters are documented on :class:`TaskSpec`.

    Task ids are ``f"{source}/{problem_id}/bug{k}"``. ``runner`` replaces the sandbox
    (default :func:`labkit.sandbox.pool.run_many`). ``cache=False`` neither reads nor writes the
    cache; ``progress`` shows a bar over problems while bugs are injected.
    """
    spec = TaskSpec(source, split, n, seed, str(path) if path else None, bugs_per_problem,
                    n_bugs, validate, split_seed,
                    tuple(float(f) for f in fractions) if fractions is not None else None,
                    tuple(families) if families is not None else None,
                    tuple(operators) if operators is not None else None, include_syntax,
                    timeout_s, multi_hunk)
    spec.check()
    cache_file = _cache_file(spec) if cache else None
    if cache_file is not None:
        shipped = shipped_dir() if runner is None else None
        if shipped is not None:
            _log_spec(spec)
        for file in (cache_file, shipped and shipped / (cache_file.name + ".gz")):
            cached = _read_cache(file) if file is not None and file.is_file() else None
            if cached is not None:
                return cached
    if spec.source == "humanevalpack":
        tasks = _humanevalpack_tasks(spec, runner)
    elif cache_file is not None and spec.source == "synthetic":
        tasks = _from_cached_draws(spec, cache_file, runner, progress)
    else:
        tasks = _injected_tasks(spec, runner, progress)
    if cache_file is not None:
        _write_cache(cache_file, tasks)
    return tasks


def _from_cached_draws(spec: TaskSpec, cache_file: Path, runner: Runner | None,
                       progress: bool) -> list[RepairTask]:
    """The tasks of ``spec`` (synthetic) from a cached draw of the same spec with another
    ``n``: the first ``n`` problems' tasks of a longer one, or a shorter one extended by
    building the problems beyond it; built whole when neither is cached."""
    shipped = shipped_dir() if runner is None else None
    folders = [(shipped, ".gz")] if shipped is not None else []
    draws = {n: f for folder, suffix in folders + [(cache_file.parent, "")]  # the cache wins ties
             for f in folder.glob(_draw_pattern(cache_file) + suffix)
             if (n := _draw_size(f)) is not None}
    longer = min((n for n in draws if n > spec.n), default=None)
    cached = _read_cache(draws[longer]) if longer is not None else None
    if cached is not None:
        ids = {p.problem_id for p in _problems(spec)}
        return [t for t in cached if t.problem_id in ids]
    shorter = max((n for n in draws if n < spec.n), default=None)
    cached = _read_cache(draws[shorter]) if shorter is not None else None
    if cached is not None:
        return cached + _injected_tasks(spec, runner, progress, skip=shorter)
    return _injected_tasks(spec, runner, progress)


@dataclass(frozen=True)
class _Problem:
    """A problem before bugs: what every injected source provides."""

    problem_id: str
    prompt: str
    reference_code: str
    entry_point: str
    tests: TestSuite
    public_tests: TestSuite
    meta: Mapping[str, Any] = field(default_factory=dict)
    generated: synthetic.SyntheticProblem | None = None  # re-renders the prompt per bug


@dataclass(frozen=True)
class _Variant:
    """One buggy version of a problem."""

    code: str
    bugs: tuple[BugSpan, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)


def _problems(spec: TaskSpec) -> list[_Problem]:
    def wanted(problem_id: str, generated: synthetic.SyntheticProblem | None = None) -> bool:
        found = spec.split_of(problem_id, generated)
        return found is not None and (spec.split is None or found.value == spec.split)

    if spec.source == "humaneval":
        chosen = [p for p in humaneval.load_problems() if wanted(_humaneval_id(p))]
        return [_Problem(_humaneval_id(p), p["prompt"], humaneval.reference_code(p),
                         p["entry_point"], humaneval.problem_to_suite(p),
                         humaneval.public_suite(p), {"humaneval_id": p["task_id"]})
                for p in chosen[: spec.n]]
    out: list[_Problem] = []
    stream = synthetic.iter_problems(spec.seed, families=spec.families)
    while len(out) < (spec.n or 0):
        try:
            p = next(stream)
        except RuntimeError as e:
            raise ValueError(f"only {len(out)} synthetic problems fall in split {spec.split!r} "
                             f"before the generator runs out ({e}); ask for fewer") from None
        if wanted(p.problem_id, p):
            out.append(_Problem(p.problem_id, p.prompt, p.reference_code, p.entry_point, p.tests,
                                TestSuite(cases=p.examples),
                                {"family": p.family, "level": p.level, "template": p.template},
                                generated=p))
    return out


def _humaneval_id(problem: Mapping) -> str:
    return problem["task_id"].replace("/", "-")  # HumanEval/0 -> HumanEval-0


def _injected_tasks(spec: TaskSpec, runner: Runner | None, progress: bool,
                    skip: int = 0) -> list[RepairTask]:
    """The tasks of ``spec``'s problems after the first ``skip`` (each problem's tasks depend
    on that problem alone)."""
    problems = _problems(spec)[skip:]
    timeout = spec.timeout_s
    if timeout is None and spec.source == "synthetic":
        timeout = SYNTHETIC_TIMEOUT_S
    run = runner or _default_runner()

    def variants(problem: _Problem) -> list[_Variant]:
        if not spec.validate:
            return _blind_variants(problem, spec)
        try:
            return _validated_variants(problem, spec, run, timeout)
        except ValueError as e:  # the reference failed its own tests
            raise ValueError(f"{spec.source} problem {problem.problem_id}: {e}") from e

    shown: Iterable[_Problem] = problems
    if progress:
        from tqdm.auto import tqdm

        shown = tqdm(problems, desc=f"{spec.source} tasks", unit="problem")
    per_problem = [variants(p) for p in shown]

    if spec.validate:
        problems = _keep_passing_examples(problems, run, timeout)
        failing = _failing_cases(problems, per_problem, run, timeout)
    else:
        failing = [[frozenset()] * len(v) for v in per_problem]
    tasks = []
    for problem, found_variants, fails in zip(problems, per_problem, failing):
        split = spec.split_of(problem.problem_id, problem.generated).value
        for k, (variant, failed) in enumerate(zip(found_variants, fails)):
            prompt, public = problem.prompt, problem.public_tests
            if problem.generated is not None:
                examples = synthetic.choose_examples(problem.tests, failed)
                prompt = problem.generated.prompt_with(examples)
                public = TestSuite(cases=examples)
            tag = f"{spec.n_bugs}bugs{k}" if spec.n_bugs > 1 else f"bug{k}"
            tasks.append(RepairTask(
                task_id=f"{spec.source}/{problem.problem_id}/{tag}",
                problem_id=problem.problem_id,
                source=spec.source,
                prompt=prompt,
                buggy_code=variant.code,
                reference_code=problem.reference_code,
                tests=problem.tests,
                entry_point=problem.entry_point,
                bugs=tuple(variant.bugs),
                difficulty=len(variant.bugs),
                split=split,
                public_tests=public,
                meta={**problem.meta, **variant.meta},
            ))
    return tasks


def _validated_variants(problem: _Problem, spec: TaskSpec, run: Runner,
                        timeout: float | None) -> list[_Variant]:
    want = spec.bugs_per_problem * (4 if spec.multi_hunk else 1)  # most draws fail the check
    found = bugs.inject_validated(
        problem.reference_code, problem.tests, problem.entry_point,
        seed=derive_seed(spec.seed, spec.source, problem.problem_id), n=want,
        n_bugs=spec.n_bugs, operators=spec.operators, include_syntax=spec.include_syntax,
        runner=run, timeout_s=timeout, batch_size=min(16, 2 * want + 2))
    out = []
    for v in found:
        meta = {"buggy_status": v.status, "buggy_passed": v.passed, "tests_total": v.total}
        if spec.multi_hunk:
            catches = multi_hunk_catches(problem.reference_code, v.code, problem.tests,
                                         problem.entry_point, run, timeout)
            if catches is None:
                continue
            meta["hunk_tests"] = [sorted(c) for c in catches]
        out.append(_Variant(v.code, v.bugs, meta))
        if len(out) == spec.bugs_per_problem:
            break
    return out


def multi_hunk_catches(reference: str, buggy: str, tests: TestSuite, entry_point: str,
                       run: Runner, timeout: float | None = None) -> list[frozenset[str]] | None:
    """Each bug's failing tests if ``buggy`` is a valid multi-hunk repair task, else ``None``.

    With ``h_1..h_k`` the hunks of ``buggy`` against ``reference`` (:func:`labkit.env.edits.
    split_hunks`), ``F_i`` the tests failing with bug ``i`` alone (every other hunk put back),
    ``F`` those failing with all bugs and ``G_i`` with all but bug ``i``, it is valid when
    ``k >= 2`` and for every ``i``: ``U_i = F_i - union_{j != i} F_j`` is not empty (bug ``i`` is
    caught by a test no other bug fails) and ``U_i <= F - G_i <= F_i`` (reverting bug ``i``
    fixes its own unique tests, and only tests bug ``i`` fails). Returns ``[F_1, ..., F_k]``.
    Costs ``2k + 1`` sandbox runs."""
    hunks = split_hunks(reference, buggy)
    k = len(hunks)
    if k < 2:
        return None
    alone = [revert_hunks(buggy, hunks, [j for j in range(k) if j != i]) for i in range(k)]
    fixed_one = [revert_hunks(buggy, hunks, [i]) for i in range(k)]
    codes = [buggy, *alone, *fixed_one]
    results = run([Candidate(c, tests, entry_point, timeout, id=f"multi-hunk:{n}")
                   for n, c in enumerate(codes)])
    every = frozenset(c.name for c in tests.cases)

    def failing(result: SandboxResult) -> frozenset[str]:
        if not result.outcomes:  # did not load: every test failed
            return every
        return frozenset(o.name for o in result.outcomes if not o.ok)

    all_bugs = failing(results[0])
    single = [failing(r) for r in results[1:k + 1]]
    without = [failing(r) for r in results[k + 1:]]
    for i in range(k):
        others = frozenset().union(*(single[j] for j in range(k) if j != i))
        unique, fixed = single[i] - others, all_bugs - without[i]
        if not unique or not unique <= fixed <= single[i]:
            return None
    return single


def _blind_variants(problem: _Problem, spec: TaskSpec) -> list[_Variant]:
    """Up to ``bugs_per_problem`` distinct injections, none of them run."""
    rng = random.Random(derive_seed(spec.seed, spec.source, problem.problem_id))
    seen = {bugs.normal_form(problem.reference_code)}
    out: list[_Variant] = []
    for _ in range(20 * spec.bugs_per_problem):
        if len(out) == spec.bugs_per_problem:
            break
        try:
            injection = bugs.inject(problem.reference_code, problem.entry_point, rng, spec.n_bugs,
                                    spec.operators, spec.include_syntax)
        except bugs.NoSiteError:
            break
        key = bugs.normal_form(injection.code)
        if key not in seen:
            seen.add(key)
            out.append(_Variant(injection.code, injection.bugs))
    return out


def _keep_passing_examples(problems: list[_Problem], run: Runner,
                           timeout: float | None) -> list[_Problem]:
    """Drop public examples the reference fails (HumanEval docstrings hold a few wrong ones).
    Generated problems need no run: their examples are hidden cases the reference passes."""
    written = [i for i, p in enumerate(problems) if p.generated is None]
    results = run([Candidate(problems[i].reference_code, problems[i].public_tests,
                             problems[i].entry_point, timeout, id=f"{problems[i].problem_id}:public")
                   for i in written])
    kept = list(problems)
    for i, result in zip(written, results):
        kept[i] = dataclasses.replace(kept[i],
                                      public_tests=_passing_part(kept[i].public_tests, result))
    return kept


def _passing_part(suite: TestSuite, result: SandboxResult) -> TestSuite:
    ok = {o.name for o in result.outcomes if o.ok}
    return TestSuite(tuple(c for c in suite.cases if c.name in ok),
                     tuple(a for a in suite.asserts if a.name in ok), suite.setup)


def _failing_cases(problems: list[_Problem], per_problem: list[list[_Variant]], run: Runner,
                   timeout: float | None) -> list[list[frozenset[str]]]:
    """For generated problems, the names of the cases each buggy variant fails (the prompt's
    examples are chosen from them); empty sets for the others, which need no run."""
    jobs = [(i, k, Candidate(v.code, p.tests, p.entry_point, timeout, id=f"{p.problem_id}:{k}"))
            for i, (p, vs) in enumerate(zip(problems, per_problem)) if p.generated is not None
            for k, v in enumerate(vs)]
    out: list[list[frozenset[str]]] = [[frozenset()] * len(vs) for vs in per_problem]
    for (i, k, candidate), result in zip(jobs, run([c for _, _, c in jobs])):
        names = {o.name for o in result.outcomes if not o.ok}
        if not names:  # no per-test outcomes: the code did not load, so every case failed
            names = {c.name for c in candidate.tests.cases}
        out[i][k] = frozenset(names)
    return out


def _humanevalpack_tasks(spec: TaskSpec, runner: Runner | None) -> list[RepairTask]:
    tasks = []
    for task in load_humanevalpack(spec.path):
        split = spec.split_of(task.problem_id).value
        if spec.split is None or split == spec.split:
            tasks.append(dataclasses.replace(task, split=split))
    tasks = tasks[: spec.n]
    if not spec.validate or not tasks:
        return tasks
    run = runner or _default_runner()
    report = validate_tasks(tasks, run)
    if report["failures"]:
        warnings.warn(f"{spec.path}: dropped {len(report['failures'])} task(s) whose reference "
                      f"fails or whose buggy code passes: {report['details']}", stacklevel=3)
    kept = [t for t in tasks if t.task_id not in set(report["failures"])]
    public = run([Candidate(t.reference_code, t.public_tests, t.entry_point, spec.timeout_s,
                            id=t.task_id) for t in kept])
    return [dataclasses.replace(t, public_tests=_passing_part(t.public_tests, r))
            for t, r in zip(kept, public)]


def _default_runner() -> Runner:
    return run_many


# ----------------------------------------------------------------------------- validation


def validate_tasks(tasks: Sequence[RepairTask], runner: Runner | None = None) -> dict:
    """Run every task's reference and buggy code against its hidden tests, in one batch.

    Returns ``{"tasks": n, "reference_pass": k, "buggy_fail": m, "failures": [task ids],
    "details": {task id: why}}``; a task fails when its reference does not pass every test or
    its buggy code passes them all.
    """
    run = runner or _default_runner()
    candidates = [Candidate(code, t.tests, t.entry_point, id=f"{t.task_id}:{role}")
                  for t in tasks for role, code in (("reference", t.reference_code),
                                                    ("buggy", t.buggy_code))]
    results = run(candidates)
    report: dict = {"tasks": len(tasks), "reference_pass": 0, "buggy_fail": 0, "failures": [],
                    "details": {}}
    for i, task in enumerate(tasks):
        reference, buggy = results[2 * i], results[2 * i + 1]
        report["reference_pass"] += reference.ok
        report["buggy_fail"] += not buggy.ok
        problems = []
        if not reference.ok:
            problems.append(f"reference {reference.status.value}: {reference.error}")
        if buggy.ok:
            problems.append("buggy code passes every test")
        if problems:
            report["failures"].append(task.task_id)
            report["details"][task.task_id] = "; ".join(problems)
    return report


# ----------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """``$LABKIT_CACHE/tasks`` if set, else ``~/.cache/labkit/tasks``."""
    root = os.environ.get("LABKIT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "labkit") / "tasks"


def shipped_dir() -> Path | None:
    """The shipped task lists: ``$LABKIT_SHIPPED_TASKS`` if set (empty: none), else the
    repository's ``data/tasks`` where it exists (an editable install or a checkout)."""
    env = os.environ.get("LABKIT_SHIPPED_TASKS")
    folder = Path(env) if env else None if env == "" else SHIPPED_DIR
    return folder if folder is not None and folder.is_dir() else None


def _log_spec(spec: TaskSpec) -> None:
    """Append ``spec`` to the JSONL file ``$LABKIT_TASK_LOG`` when it is set: the lists a run
    loads where shipped lists would serve, which :func:`ship` can then ship."""
    log = os.environ.get("LABKIT_TASK_LOG")
    if log and spec.path is None:
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps(dataclasses.asdict(spec)) + "\n")


def ship(specs: Iterable[Mapping[str, Any]], folder: str | Path | None = None,
         progress: bool = False) -> dict:
    """Build the task lists of ``specs`` (dicts of :class:`TaskSpec` fields, as
    ``$LABKIT_TASK_LOG`` records them) and write each, gzipped under its cache name, into
    ``folder`` (default :data:`SHIPPED_DIR`) with ``manifest.json``: the code version, and per
    list its file, spec and task count.

    Every distinct spec is shipped at its own ``n``, so that loading it never generates its
    problems (a shorter draw served by a longer one does); specs naming a file (``path``) are
    skipped. What the splits derive once per ``(split_seed, fractions)`` (the template census,
    the leak pool's references) is shipped beside them.
    Lists are built with the sandbox, not read from an earlier ship (the task cache still
    serves); files of an earlier ship that are not in the new one are removed. Returns the
    manifest.
    """
    folder = Path(folder) if folder is not None else SHIPPED_DIR
    chosen: dict[str, TaskSpec] = {}
    for fields in specs:
        spec = _spec_of(fields)
        spec.check()
        if spec.path is None:
            chosen[_cache_file(spec).name + ".gz"] = spec
    folder.mkdir(parents=True, exist_ok=True)
    lists, censuses = [], set()
    for name, spec in sorted(chosen.items()):
        tasks = load_tasks(**dataclasses.asdict(spec), runner=run_many, progress=progress)
        _write_gz(folder / name, _jsonl(tasks))
        lists.append({"file": name, "tasks": len(tasks), "spec": dataclasses.asdict(spec)})
        if spec.source == "synthetic":
            censuses.add((spec.split_seed, tuple(_check_fractions(spec.fractions or TEMPLATE_FRACTIONS))))
    derived = set()
    for seed, fractions in sorted(censuses):
        for kind in _DERIVED:
            name = _derived_name(kind, seed, fractions) + ".gz"
            _write_gz(folder / name, json.dumps(_derived(kind, seed, fractions)))
            derived.add(name)
    keep = {entry["file"] for entry in lists} | derived
    for old in folder.glob("*.gz"):
        if old.name not in keep:
            old.unlink()
    manifest = {"code": _code_version(), "lists": lists}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def shipped_specs(folder: str | Path | None = None) -> list[dict]:
    """The specs of the shipped lists (``manifest.json``), ``[]`` where nothing is shipped."""
    manifest = Path(folder or SHIPPED_DIR) / "manifest.json"
    return [e["spec"] for e in json.loads(manifest.read_text())["lists"]] if manifest.is_file() else []


def _spec_of(fields: Mapping[str, Any]) -> TaskSpec:
    """A :class:`TaskSpec` from its fields as JSON holds them (lists for tuples)."""
    return TaskSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def stale_shipped(folder: str | Path | None = None) -> list[str]:
    """The shipped lists the current code would not read: their cache name under this code is
    not in ``folder`` (the code that builds lists changed since :func:`ship`)."""
    folder = Path(folder or SHIPPED_DIR)
    names = [_cache_file(_spec_of(spec)).name + ".gz" for spec in shipped_specs(folder)]
    return [n for n in names if not (folder / n).is_file()]


def _code_version() -> str:
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in _BUILDERS:
        file = here / name
        digest.update(name.encode() + (file.read_bytes() if file.is_file() else b"<absent>"))
    return digest.hexdigest()


def _cache_file(spec: TaskSpec) -> Path:
    """``<source>-<split>-<digest of every parameter but n, and the code>-n<n>.jsonl``: draws
    of one spec that differ only in ``n`` share a prefix, so a longer one can serve."""
    key: dict[str, Any] = {**dataclasses.asdict(spec), "code": _code_version()}
    del key["n"]
    if spec.path:  # the file's content, not its name, decides the tasks
        file = Path(spec.path)
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such file; pass the path of a HumanEvalPack-"
                                    "format JSONL file (one JSON object per line)")
        key["path"] = hashlib.sha256(file.read_bytes()).hexdigest()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    size = "all" if spec.n is None else str(spec.n)
    return cache_dir() / f"{spec.source}-{spec.split or 'all'}-{digest}-n{size}.jsonl"


def _draw_pattern(file: Path) -> str:
    """Glob of the cache files of ``file``'s spec with any ``n``."""
    return file.name.rsplit("-n", 1)[0] + "-n*.jsonl"


def _draw_size(file: Path) -> int | None:
    size = file.name.rsplit("-n", 1)[1].removesuffix(".gz").removesuffix(".jsonl")
    return int(size) if size.isdigit() else None


def _read_cache(file: Path) -> list[RepairTask] | None:
    """The cached tasks (JSONL, gzipped where the name ends in ``.gz``), or ``None`` when the
    file cannot be read (it is then rebuilt)."""
    try:
        opener = gzip.open if file.suffix == ".gz" else open
        with opener(file, "rt", encoding="utf-8") as lines:
            return [RepairTask.from_dict(json.loads(line)) for line in lines if line.strip()]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(file: Path, tasks: list[RepairTask]) -> None:
    _write_text(file, _jsonl(tasks))


def _jsonl(tasks: Sequence[RepairTask]) -> str:
    return "".join(json.dumps(task.to_dict()) + "\n" for task in tasks)


def _write_gz(file: Path, text: str) -> None:
    """``text`` gzipped into ``file``, byte for byte the same for the same text."""
    file.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))


def _write_text(file: Path, text: str) -> None:
    """Write ``text`` to ``file`` whole or not at all (a temporary file, then a rename), so
    that processes sharing the cache never read half a file."""
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, file)
