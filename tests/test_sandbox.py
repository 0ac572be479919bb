"""The sandbox's behaviour: statuses, per-test outcomes, grading, pool lifecycle.

Real worker processes throughout (no mocks); the adversarial cases live in
``test_sandbox_adversarial.py``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import psutil
import pytest

from labkit.sandbox import cgroups, hackscan
from labkit.sandbox.records import AssertTest, Candidate, IOCase, Status, TestSuite
from labkit.sandbox.pool import Sandbox, run_many
from labkit.sandbox.config import SandboxConfig
from labkit.sandbox.grading import grade
from labkit.sandbox.jobs import schedule

IS_ROOT = os.geteuid() == 0
ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(workers=2, timeout_s=3.0)) as sb:
        yield sb


def suite(*cases: IOCase, asserts: tuple[AssertTest, ...] = (), setup: str = "") -> TestSuite:
    return TestSuite(cases=cases, asserts=asserts, setup=setup)


ADD_SUITE = suite(IOCase((1, 2), 3), IOCase((-1, 1), 0), IOCase(([1], [2]), [1, 2]))


# ----------------------------------------------------------------------------- statuses


def test_passing_candidate_passes_every_test(sandbox):
    r = sandbox.run(Candidate(ADD, ADD_SUITE, "add"))
    assert r.status is Status.PASSED and r.ok
    assert (r.passed, r.total, r.fraction) == (3, 3, 1.0)
    assert [o.ok for o in r.outcomes] == [True] * 3
    assert {o.graded_in for o in r.outcomes} == {"parent"}
    assert r.error == "" and r.flags == () and r.wall_s > 0


def test_failing_candidate_reports_what_differs(sandbox):
    r = sandbox.run(Candidate("def add(a, b):\n    return a - b\n", ADD_SUITE, "add"))
    assert r.status is Status.FAILED
    assert r.passed == 0
    assert r.outcomes[0].detail == "expected 3 (int), got -1 (int)"
    assert r.error.startswith("3 of 3 tests failed; first: case0: expected 3 (int)")


def test_exception_in_one_test_fails_only_that_test(sandbox):
    code = "def inv(x):\n    return 1 / x\n"
    r = sandbox.run(Candidate(code, suite(IOCase((2,), 0.5), IOCase((0,), 0.0)), "inv"))
    assert r.status is Status.FAILED and r.passed == 1
    assert r.outcomes[1].detail == "raised ZeroDivisionError: division by zero"


@pytest.mark.parametrize("code, why", [
    ("def add(a, b)\n    return a + b\n", "SyntaxError"),
    ("import no_such_module_anywhere\ndef add(a, b):\n    return 0\n", "ModuleNotFoundError"),
    ("raise RuntimeError('at import')\n", "RuntimeError: at import"),
    ("def other():\n    pass\n", "entry point 'add' is not defined"),
    ("add = 3\n", "not defined or not callable"),
])
def test_code_that_does_not_load_is_an_error(sandbox, code, why):
    r = sandbox.run(Candidate(code, ADD_SUITE, "add"))
    assert r.status is Status.ERROR and r.passed == 0 and why in r.error
    assert all(o.detail == "not run" for o in r.outcomes)


def test_timeout_keeps_the_tests_reported_before_it(sandbox):
    code = "def f(x):\n    while x == 3:\n        pass\n    return x\n"
    tests = suite(*(IOCase((x,), x) for x in (1, 2, 3, 4)))
    r = sandbox.run(Candidate(code, tests, "f", timeout_s=0.5))
    assert r.status is Status.TIMEOUT
    assert [o.ok for o in r.outcomes] == [True, True, False, False]
    assert (r.passed, r.total) == (2, 4)
    assert 0.5 <= r.wall_s < 2.0


def test_per_test_limit_ends_a_loop_early_and_keeps_the_tests_before_it():
    """A candidate that loops on its third test: with a 0.3 s per-test limit the check ends
    about 0.3 s after the second test reported, not at the 4 s deadline; without the limit
    it runs to the deadline. The outcomes are the same either way."""
    code = "def f(x):\n    while x == 3:\n        pass\n    return x\n"
    tests = suite(*(IOCase((x,), x) for x in (1, 2, 3, 4)))
    runs = {}
    for limit in (0.3, None):
        with Sandbox(SandboxConfig(workers=1, timeout_s=4.0, test_timeout_s=limit)) as sb:
            runs[limit] = sb.run(Candidate(code, tests, "f"))
    short, full = runs[0.3], runs[None]
    for r in (short, full):
        assert r.status is Status.TIMEOUT
        assert [o.ok for o in r.outcomes] == [True, True, False, False]
    assert 0.3 <= short.wall_s < 2.0 and "per-test limit" in short.error
    assert full.wall_s >= 4.0 and "wall-clock deadline" in full.error
    # a slow but finishing test under the limit is not cut
    slow = "import time\ndef f(x):\n    time.sleep(0.1)\n    return x\n"
    with Sandbox(SandboxConfig(workers=1, timeout_s=4.0, test_timeout_s=0.3)) as sb:
        assert sb.run(Candidate(slow, tests, "f")).status is Status.PASSED
    with pytest.raises(ValueError, match="test_timeout_s"):
        SandboxConfig(test_timeout_s=0)


def test_stderr_tail_is_kept(sandbox):
    code = "import sys\ndef f():\n    print('x' * 5000, 'the end', file=sys.stderr)\n    return 1\n"
    r = sandbox.run(Candidate(code, suite(IOCase((), 1)), "f"))
    assert r.ok and r.stderr_tail.endswith("the end\n") and len(r.stderr_tail) <= 2048


# ----------------------------------------------------------------------------- grading


@pytest.mark.parametrize("returned, expected", [
    ("True", 1), ("1", True), ("1.0", 1), ("1", 1.0), ("(1, 2)", [1, 2]), ("[1, 2]", (1, 2)),
    ("{True}", {1}), ("{1: 'a'}", {1.0: 'a'}), ("'1'", 1), ("None", 0), ("b'a'", "a"),
])
def test_grading_uses_exact_types(sandbox, returned, expected):
    r = sandbox.run(Candidate(f"def f():\n    return {returned}\n", suite(IOCase((), expected)), "f"))
    assert r.status is Status.FAILED, (returned, expected)


def test_subclasses_of_builtins_are_not_plain_outputs(sandbox):
    code = ("class Int(int):\n    pass\n"
            "class Str(str):\n    pass\n"
            "def f(kind):\n    return Int(3) if kind == 'int' else Str('a')\n")
    r = sandbox.run(Candidate(code, suite(IOCase(("int",), 3), IOCase(("str",), "a")), "f"))
    assert r.status is Status.FAILED and r.passed == 0
    assert "not a plain value" in r.outcomes[0].detail
    assert "builtin_subclass" in r.flags


def test_exact_outputs_of_every_plain_type_pass(sandbox):
    values = [None, True, 0, -(2**70), 1.5, float("inf"), "s", b"\x00", 1 + 2j, (1, [2, {3: {4}}]),
              frozenset({(1, "a")}), {"k": (None, 1.0)}]
    code = "def f(v):\n    return v\n"
    r = sandbox.run(Candidate(code, suite(*(IOCase((v,), v) for v in values)), "f"))
    assert r.ok, r.error


def test_approx_compare_accepts_numbers_within_tolerance(sandbox):
    code = "def f(x):\n    return x\n"
    cases = [IOCase((1.0000001,), 1.0, "approx", 1e-6), IOCase((3,), 3.0, "approx", 1e-9),
             IOCase((1.1,), 1.0, "approx", 1e-6), IOCase((True,), 1.0, "approx", 0.5),
             IOCase((float("nan"),), 1.0, "approx", 1e9), IOCase(("1.0",), 1.0, "approx", 1.0)]
    r = sandbox.run(Candidate(code, suite(*cases), "f"))
    assert [o.ok for o in r.outcomes] == [True, True, False, False, False, False]


def test_truthy_and_falsy_compare(sandbox):
    code = "def f(x):\n    return x\n"
    cases = [IOCase(([1],), compare="truthy"), IOCase((0,), compare="falsy"),
             IOCase(("",), compare="truthy"), IOCase((1,), compare="falsy")]
    r = sandbox.run(Candidate(code, suite(*cases), "f"))
    assert [o.ok for o in r.outcomes] == [True, True, False, False]


def test_unknown_compare_mode_is_refused(sandbox):
    with pytest.raises(ValueError, match="unknown compare mode"):
        sandbox.run(Candidate(ADD, suite(IOCase((1, 2), 3, compare="close")), "add"))


def test_assert_tests_run_in_the_grader_with_setup(sandbox):
    tests = suite(asserts=(AssertTest("assert candidate(2, 3) == helper(5)", "a"),
                           AssertTest("assert candidate(2, 2) == 5", "b")),
                  setup="def helper(x):\n    return x\n")
    r = sandbox.run(Candidate(ADD, tests, "add"))
    assert r.status is Status.FAILED and r.passed == 1
    assert [(o.name, o.ok, o.graded_in) for o in r.outcomes] == [("a", True, "grader"),
                                                                 ("b", False, "grader")]
    assert r.outcomes[1].detail.startswith("raised AssertionError")


def test_assert_tests_see_the_candidates_exceptions_and_copies_of_the_arguments(sandbox):
    """Through the proxy a call that raises a builtin exception raises that exception in
    the test, and the candidate gets copies: mutating its argument changes nothing here."""
    code = ("def f(xs):\n    if not xs:\n        raise ValueError('empty')\n"
            "    xs.append(99)\n    return len(xs)\n")
    tests = suite(asserts=(
        AssertTest("try:\n    candidate([])\nexcept ValueError as e:\n"
                   "    assert str(e) == 'empty'\nelse:\n    assert False", "raises"),
        AssertTest("xs = [1, 2]\nassert candidate(xs) == 3 and xs == [1, 2]", "copies"),
        AssertTest("assert candidate(xs=[5]) == 2", "keywords"),
    ))
    r = sandbox.run(Candidate(code, tests, "f"))
    assert r.ok, r.outcomes


def test_failing_setup_fails_every_assert(sandbox):
    tests = suite(IOCase((1, 1), 2), asserts=(AssertTest("assert True"),), setup="1 / 0\n")
    r = sandbox.run(Candidate(ADD, tests, "add"))
    assert [o.ok for o in r.outcomes] == [True, False]
    assert "test setup failed: ZeroDivisionError" in r.outcomes[1].detail


def test_grade_is_a_pure_function_of_the_worker_report():
    cand = Candidate(ADD, ADD_SUITE, "add")
    lines = b'{"k":"load","ok":true}\n{"i":0,"v":3}\n{"i":1,"v":0}\n{"i":2,"v":{"t":"list","v":[1,2]}}\n'
    header = {"exit": 0, "signal": None, "timed_out": False, "capped": "", "wall_s": 0.01}
    assert grade(cand, header, lines + b'{"k":"end"}\n', {}).status is Status.PASSED
    assert grade(cand, header, lines, {}).status is Status.CRASHED  # no end line
    assert grade(cand, {**header, "exit": 1}, lines + b'{"k":"end"}\n', {}).status is Status.CRASHED


# ----------------------------------------------------------------------------- determinism


def test_random_and_hash_order_are_the_same_in_every_check(sandbox):
    code = ("import random\n"
            "def f():\n    return [random.random(), list({'apple', 'pear', 'fig', 'kiwi'})]\n")
    results = sandbox.run_many([Candidate(code, suite(IOCase((), None)), "f")] * 6)
    details = {r.outcomes[0].detail for r in results}
    assert len(details) == 1, details


def test_run_many_returns_results_in_input_order(sandbox):
    code = "import time\ndef f(x, delay):\n    time.sleep(delay)\n    return x\n"
    cands = [Candidate(code, suite(IOCase((i, 0.2 if i % 3 == 0 else 0.0), i)), "f", id=str(i))
             for i in range(12)]
    cands[5] = Candidate(code, suite(IOCase((5, 0.0), -1)), "f")
    results = sandbox.run_many(cands)
    assert [r.status for r in results] == [Status.FAILED if i == 5 else Status.PASSED for i in range(12)]


def test_schedule_sends_while_loops_first_and_keeps_input_order_otherwise():
    loop = "def f(x):\n    while x > 0:\n        x -= 1\n    return x\n"
    plain = "def f(x):\n    return x  # awhile, meanwhile: not loops\n"
    cands = [Candidate(loop if i in (2, 3, 6) else plain, suite(IOCase((0,), 0)), "f")
             for i in range(8)]
    assert schedule(cands, range(8)) == [2, 3, 6, 0, 1, 4, 5, 7]
    assert schedule(cands, [1, 6, 0, 3]) == [6, 3, 1, 0]  # only the indices given
    assert schedule(cands, []) == []
    assert schedule([cands[0]] * 3, range(3)) == [0, 1, 2]


def test_results_come_back_in_input_order_when_loops_are_sent_first(sandbox):
    loop = "def f(x):\n    n = 0\n    while n < x:\n        n += 1\n    return n * 10\n"
    plain = "def f(x):\n    return x * 10\n"
    cands = [Candidate(loop if i % 3 == 1 else plain, suite(IOCase((i,), 10 * i if i != 7 else -1)),
                       "f", id=str(i)) for i in range(10)]
    assert schedule(cands, range(10))[:3] == [1, 4, 7]  # the order really changes
    results = sandbox.run_many(cands)
    assert [r.status for r in results] == [Status.FAILED if i == 7 else Status.PASSED
                                           for i in range(10)]
    assert "70" in results[7].outcomes[0].detail  # its own output, 10 * 7


def test_fail_fast_grades_up_to_the_first_failure_and_stops_only_at_the_candidates_own():
    """A wrong answer (test 1) does not end the check: it runs on into the loop at x == 2
    until the per-test limit, since ending it at once would tell the candidate that its
    answer was wrong. An exception (which the candidate knows it raised) ends it at once.
    Either way nothing after the first failure is graded."""
    wrong = "def f(x):\n    while x == 2:\n        pass\n    return x + 1\n"
    raises = "def f(x):\n    if x == 1:\n        raise ValueError(x)\n" + wrong.split("\n", 1)[1]
    tests = suite(IOCase((0,), 1), IOCase((1,), 5), IOCase((2,), 3), IOCase((3,), 4))
    config = SandboxConfig(workers=1, timeout_s=5.0, test_timeout_s=1.5, fail_fast=True)
    with Sandbox(config) as sb:
        answered, raised = sb.run(Candidate(wrong, tests, "f")), sb.run(Candidate(raises, tests, "f"))
        assert sb.run(Candidate(ADD, ADD_SUITE, "add")).ok
    for r in (answered, raised):
        assert r.status is Status.FAILED and r.passed == 1, r
        assert [o.detail for o in r.outcomes][2:] == ["not run (stopped at the first failure)"] * 2
    assert answered.wall_s >= 1.5  # the per-test limit, counted from test 1's line
    assert raised.wall_s < 1.2  # the loop at x == 2 was not waited for (a loaded machine
    # may delay the stop, which the worker streams for after 50 ms, by some tenths)


# ----------------------------------------------------------------------------- the pool


def test_protections_are_reported(sandbox):
    p = sandbox.protections
    for always in ("parent_grading", "rlimits", "session", "wall_deadline", "output_cap",
                   "minimal_env", "process_sweep"):
        assert p[always], always
    if IS_ROOT:  # CI runs as root: everything is on
        assert all(p.values()), p
    r = sandbox.run(Candidate(ADD, ADD_SUITE, "add"))
    assert dict(r.protections) == p


def test_without_namespaces_or_uid_the_sandbox_says_so_and_still_works():
    config = SandboxConfig(workers=1, use_namespaces=False, drop_privileges=False)
    with Sandbox(config) as sb:
        p = sb.protections
        assert not any(p[k] for k in ("non_root_uid", "net_namespace", "mount_namespace",
                                      "ipc_namespace", "pid_namespace", "allowlist_root",
                                      "readonly_root", "hidden_paths", "private_tmp"))
        assert p["rlimits"] and p["wall_deadline"] and p["process_sweep"]
        assert sb.run(Candidate(ADD, ADD_SUITE, "add")).ok
        loop = sb.run(Candidate("def add(a, b):\n    while True: pass\n", ADD_SUITE, "add",
                                timeout_s=0.3))
        assert loop.status is Status.TIMEOUT


WORKER_SIDE = ("cgroups", "child", "grader", "isolation", "plain", "syscalls", "view", "wire")
"""The sandbox's standard-library-only modules a worker loads (labkit.sandbox.worker)."""


def test_a_worker_holds_only_the_standard_library_and_its_own_worker_side_modules(sandbox):
    """A check's process (forked from its warm worker) holds the modules the worker imported:
    the interpreter's own at start, standard library modules, and the sandbox's worker-side
    modules under ``_labkit_sandbox``; nothing of labkit's parent side, torch or numpy."""
    bare = subprocess.run([sys.executable, "-s", "-P", "-c", "import sys; print(*sys.modules)"],
                          capture_output=True, text=True, check=True, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}).stdout.split()
    code = ("import sys\n"
            "def f():\n"
            "    return sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names\n"
            "                  and not m.startswith('_sysconfigdata_'))\n")  # the platform's, for sysconfig
    want = sorted({m for m in bare if m.split(".")[0] not in sys.stdlib_module_names}
                  | {"_labkit_sandbox", *(f"_labkit_sandbox.{name}" for name in WORKER_SIDE)})
    r = sandbox.run(Candidate(code, suite(IOCase((), want)), "f"))
    assert r.ok, r.outcomes[0].detail


@pytest.mark.skipif(not IS_ROOT, reason="needs root: namespaces")
def test_every_standard_library_extension_module_imports_in_the_allow_list_view(sandbox):
    """The view holds the shared libraries of every extension module, not just of those the
    worker imported: what imports here imports in a check."""
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    dynload = Path(sysconfig.get_path("platstdlib", vars=base)) / "lib-dynload"
    names = sorted(path.name.split(".")[0] for path in dynload.glob("*.so"))
    probe = ("import importlib, sys, warnings\nwarnings.simplefilter('ignore')\n"
             "for name in sys.argv[1:]:\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "        print(name)\n"
             "    except ImportError:\n"
             "        pass\n")
    here = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True,
                          text=True, check=True).stdout.split()
    assert len(here) > 20
    code = ("import importlib\n"
            "def f(names):\n"
            "    failed = []\n"
            "    for name in names:\n"
            "        try:\n"
            "            importlib.import_module(name)\n"
            "        except BaseException as e:\n"
            "            failed.append(f'{name}: {e}')\n"
            "    return failed\n")
    r = sandbox.run(Candidate(code, suite(IOCase((here,), [])), "f"))
    assert sandbox.protections["allowlist_root"] and r.ok, r.outcomes


@pytest.mark.skipif(not IS_ROOT, reason="needs root: namespaces")
def test_without_the_allow_list_root_the_fallback_view_hides_the_checkout(monkeypatch):
    """Where the allow-list root cannot be built the worker falls back to the host's tree,
    read-only, with the configured paths hidden, and says so."""
    setup = Sandbox._setup_frame
    monkeypatch.setattr(Sandbox, "_setup_frame", lambda self: {**setup(self), "allowlist_root": False})
    code = f"import os\ndef f():\n    return os.path.exists({str(Path(__file__).resolve())!r})\n"
    with Sandbox(SandboxConfig(workers=1)) as sb:
        p = sb.protections
        assert not p["allowlist_root"]
        assert p["mount_namespace"] and p["readonly_root"] and p["hidden_paths"] and p["private_tmp"]
        assert sb.run(Candidate(code, suite(IOCase((), False)), "f")).ok
        assert sb.run(Candidate(ADD, ADD_SUITE, "add")).ok


@pytest.mark.skipif(not IS_ROOT, reason="needs root: namespaces")
def test_extra_paths_are_readable_and_nothing_else_next_to_them():
    top = Path("/srv") / f"labkit-extra-{os.getpid()}-{time.monotonic_ns()}"
    shared = top / "shared"
    try:
        shared.mkdir(parents=True)
        (shared / "data.txt").write_text("visible")
        (top / "secret.txt").write_text("hidden")
        for path in (top, shared, shared / "data.txt", top / "secret.txt"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        code = ("def f(path):\n"
                "    try:\n"
                "        return open(path).read()\n"
                "    except OSError as e:\n"
                "        return type(e).__name__\n")
        tests = suite(IOCase((str(shared / "data.txt"),), "visible"),
                      IOCase((str(top / "secret.txt"),), "FileNotFoundError"))
        with Sandbox(SandboxConfig(workers=1, extra_paths=(str(shared),))) as sb:
            r = sb.run(Candidate(code, tests, "f"))
        assert r.ok, r.outcomes
    finally:
        shutil.rmtree(top, ignore_errors=True)
    with pytest.raises(ValueError, match=r"extra_paths: '/tmp/data' is inside /tmp, which every "
                                         r"check gets as its own empty tmpfs"):
        SandboxConfig(extra_paths=("/tmp/data",))


def test_code_over_max_code_bytes_is_an_error_and_never_parsed():
    config = SandboxConfig(workers=1, max_code_bytes=4096)
    small = ADD + "# padding\n" * 100
    large = ADD + "# padding\n" * 1000
    with Sandbox(config) as sb:
        ok, refused = sb.run_many([Candidate(small, ADD_SUITE, "add"),
                                   Candidate(large, ADD_SUITE, "add")])
    assert ok.ok and ok.flags == ()
    assert refused.status is Status.ERROR and refused.passed == 0
    assert refused.flags == ("too_large",) and refused.wall_s == 0.0
    assert "more than max_code_bytes (4096); it was not parsed or run" in refused.error
    assert all(o.detail == "not run" for o in refused.outcomes)
    with pytest.raises(ValueError, match="max_code_bytes"):
        SandboxConfig(max_code_bytes=0)


def test_fifty_megabytes_of_statements_cost_neither_memory_nor_time(sandbox):
    """Parsing 50 MB of real statements took ~18 GB and ended in MemoryError; now it is
    refused by size, in the parent and in the hack scan."""
    code = "x = foo(a, b + 1, [c, d])\n" * (50_000_000 // 26)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    r = sandbox.run(Candidate(code, ADD_SUITE, "add"))
    assert r.status is Status.ERROR and r.flags == ("too_large",)
    assert hackscan.scan(code) == ("too_large",)
    assert time.monotonic() - start < 2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10  # KiB


def test_a_dead_worker_is_replaced_transparently(sandbox):
    before = {w.proc.pid for w in sandbox._workers if w is not None}
    for pid in before:
        os.kill(pid, 9)
    assert sandbox.run(Candidate(ADD, ADD_SUITE, "add")).ok
    slow = "import time\ndef add(a, b):\n    time.sleep(0.6)\n    return a + b\n"
    running = [w.proc.pid for w in sandbox._workers if w is not None]

    def kill_running() -> None:
        for pid in running:
            with contextlib.suppress(ProcessLookupError):  # one may be dead and reaped already
                os.kill(pid, 9)

    threading.Timer(0.3, kill_running).start()
    assert sandbox.run(Candidate(slow, ADD_SUITE, "add")).ok  # retried on a fresh worker
    after = {w.proc.pid for w in sandbox._workers if w is not None}
    assert after and not after & before


def test_close_stops_every_worker_and_module_run_many_cleans_up():
    sb = Sandbox(SandboxConfig(workers=2))
    pids = [w.proc.pid for w in sb.start()._workers]
    sb.close()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        sb.run(Candidate(ADD, ADD_SUITE, "add"))
    results = run_many([Candidate(ADD, ADD_SUITE, "add")] * 3, SandboxConfig(workers=1))
    assert [r.ok for r in results] == [True] * 3
    assert run_many([]) == []


def test_concurrent_callers_share_the_pool(sandbox):
    out: dict[int, list[bool]] = {}

    def call(k: int) -> None:
        out[k] = [r.ok for r in sandbox.run_many([Candidate(ADD, ADD_SUITE, "add")] * 5)]

    threads = [threading.Thread(target=call, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {k: [True] * 5 for k in range(3)}


# ----------------------------------------------------------------------------- cgroups

V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_CGROUP = "8:pids:/\n4:memory:/jobs/a1\n1:cpu:/\n0::/\n"


def test_cgroup_hierarchies_on_v1_hybrid_v2_and_from_a_containers_view():
    hybrid = cgroups.hierarchies(V1_MOUNTINFO, V1_CGROUP, v2_controllers=("hugetlb",))
    assert hybrid == {
        "memory": cgroups.Hierarchy(1, "/sys/fs/cgroup/memory", "/jobs/a1", ("memory",)),
        "pids": cgroups.Hierarchy(1, "/sys/fs/cgroup/pids", "/", ("pids",))}
    assert hybrid["memory"].directory("leaf") == "/sys/fs/cgroup/memory/jobs/a1/leaf"
    assert hybrid["pids"].directory() == "/sys/fs/cgroup/pids"
    v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    unified = cgroups.hierarchies(v2, "0::/user.slice/x.scope\n", ("cpu", "memory", "pids"))
    assert unified["memory"] == unified["pids"] == cgroups.Hierarchy(
        2, "/sys/fs/cgroup", "/user.slice/x.scope", ("memory", "pids"))
    # a hierarchy mounted from below its root (a container's view of its own cgroup)
    boxed = "40 30 0:35 /docker/ab /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    assert cgroups.hierarchies(boxed, "4:memory:/docker/ab/w\n")["memory"].directory() \
        == "/sys/fs/cgroup/memory/w"
    assert cgroups.hierarchies(boxed, "4:memory:/elsewhere\n") == {}  # not inside the mount
    spaced = "41 30 0:36 / /mnt/c\\040g rw - cgroup cgroup rw,pids\n"
    assert cgroups.hierarchies(spaced, "8:pids:/\n")["pids"].mount == "/mnt/c g"


def test_oom_kill_counts_of_both_versions():
    assert cgroups.oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3  # v1
    assert cgroups.oom_kill_count("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n") == 2  # v2
    assert cgroups.oom_kill_count("") == 0


# ----------------------------------------------------------------------------- hack flags


@pytest.mark.parametrize("code, flag", [
    ("import sys\nsys.exit(0)", "sys_exit"),
    ("exit()", "sys_exit"),
    ("from os import _exit as e\ne(0)", "os_exit"),
    ("class A:\n    def __eq__(self, o):\n        return True", "eq_override"),
    ("class A:\n    __ne__ = lambda s, o: False", "eq_override"),
    ("class A:\n    def __hash__(self):\n        return 0", "hash_override"),
    ("import builtins\nbuiltins.abs = lambda x: 0", "builtins_patch"),
    ("__builtins__['len'] = None", "builtins_patch"),
    ("import builtins as b\nsetattr(b, 'abs', None)", "builtins_patch"),
    ("import sys\nf = sys._getframe(1).f_back", "frame_access"),
    ("import inspect", "frame_access"),
    ("import gc\ngc.get_objects()", "gc"),
    ("import ctypes", "ctypes"),
    ("import sys\nsys.settrace(None)", "trace_hook"),
    ("import signal", "signal"),
    ("import unittest\nraise unittest.SkipTest()", "skip_test"),
    ("try:\n    pass\nexcept:\n    pass", "bare_except"),
    ("open('/proc/self/environ').read()", "proc_access"),
    ("open('x')", "file_io"),
    ("import subprocess", "process_spawn"),
    ("import os\nos.system('ls')", "process_spawn"),
    ("import socket", "network"),
    ("import atexit\natexit.register(print)", "atexit"),
    ("import time\ntime.time = lambda: 0", "monkeypatch"),
    ("import os\nos.write(3, b'x')", "raw_fd_io"),
    ("eval('1')", "dynamic_code"),
    ("().__class__.__base__.__subclasses__()", "introspection"),
    ("class S(str):\n    pass", "builtin_subclass"),
])
def test_hack_flags(code, flag):
    assert flag in hackscan.scan(code)
    assert flag in hackscan.FLAGS


def test_the_hack_scan_has_a_size_cap():
    code = "def f(x):\n    return x\n" + "# padding\n" * 30_000  # 300 kB
    assert hackscan.scan(code) == ("too_large",)
    assert hackscan.scan(code, max_bytes=1 << 20) == ()
    assert hackscan.scan("s = '" + "é" * 200_000 + "'\n") == ("too_large",)  # bytes, not chars
    assert "too_large" in hackscan.FLAGS


def test_clean_code_has_no_flags_and_syntax_errors_one():
    assert hackscan.scan("def f(xs):\n    return sorted(x * 2 for x in xs if x > 0)\n") == ()
    assert hackscan.scan("def f(:\n") == ("syntax_error",)
    flags = hackscan.scan("import sys, gc\nsys.exit(gc.collect())")
    assert flags == tuple(sorted(flags)) == ("gc", "sys_exit")


# ----------------------------------------------------------------------------- HumanEval


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes(sandbox):
    from labkit.env.humaneval import load_problems, problem_to_suite, reference_code

    problems = load_problems()
    cands = [Candidate(reference_code(p), problem_to_suite(p), p["entry_point"], id=p["task_id"])
             for p in problems]
    t0 = time.monotonic()
    results = sandbox.run_many(cands)
    failed = {c.id: r.error for c, r in zip(cands, results) if not r.ok}
    assert len(results) == 164 and not failed, failed
    assert time.monotonic() - t0 < 30
