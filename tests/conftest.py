import os
import re
import time
from collections import Counter

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""This process's pytest-xdist worker name (``gw0``...), ``None`` in a run without workers."""
if WORKER:  # one torch thread per worker: `make test` runs one worker per core
    os.environ.setdefault("OMP_NUM_THREADS", "1")

SHARED_GROUPS = {"smoke_lab": "smoke-lab", "lab": "browser", "browser": "browser"}
"""The pytest-xdist group of the tests that use each expensive session fixture (the first that
a test uses, in this order): a group runs on one worker (``--dist loadgroup``), so the smoke lab
is built once, and JupyterLab and Chromium start once for the browser tests; the two groups
can run side by side. A test that takes the smoke lab by name (``request.getfixturevalue``)
is marked ``xdist_group("smoke-lab")`` itself."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (it files each test by them)
def pytest_collection_modifyitems(config, items):
    """Each test that shares an expensive session fixture joins its group; a test that uses a
    module-scoped fixture joins its module's group, so that the fixture is built once (split
    over two workers, it was built on both)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        group = next((g for name, g in SHARED_GROUPS.items() if name in used), None)
        info = getattr(item, "_fixtureinfo", None)
        if group is None and info is not None and any(
                defs[-1].scope == "module" for defs in info.name2fixturedefs.values()):
            group = item.module.__name__
        if group:
            item.add_marker(pytest.mark.xdist_group(group))

CODE_SAMPLES = ["def f(x):\n    return x + 1\n", "def g(xs):\n    return [x * 2 for x in xs]\n",
                "### Fix the bug in this Python function.\n### Buggy\n### Fixed\n"] * 40


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A real HF folder holding a randomly initialised, very small Llama and its BPE."""
    from labkit.policy import tiny

    tok = tiny.train_tokenizer(CODE_SAMPLES, vocab_size=300)
    model = tiny.init_model(tok, tiny.TinyModelConfig(hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=2,
                                                      num_key_value_heads=2))
    return tiny.save(model, tok, tmp_path_factory.mktemp("m") / "tiny")


def toy_tasks():
    """Four one-line repair tasks with parent-graded tests."""
    from labkit.sandbox.records import IOCase, TestSuite
    from labkit.env.records import RepairTask

    specs = [("inc", "x + 1", "x - 1", lambda x: x + 1), ("dbl", "x * 2", "x * 3", lambda x: x * 2),
             ("neg", "-x", "x", lambda x: -x), ("sq", "x * x", "x + x", lambda x: x * x)]
    tasks = []
    for name, good, bad, fn in specs:
        suite = TestSuite(cases=tuple(IOCase(args=(v,), expected=fn(v), name=f"case_{i}")
                                      for i, v in enumerate((0, 1, 3, -2))))
        tasks.append(RepairTask(
            task_id=f"toy/{name}/bug0", problem_id=f"toy/{name}", source="toy", prompt="",
            buggy_code=f"def {name}(x):\n    return {bad}\n",
            reference_code=f"def {name}(x):\n    return {good}\n", tests=suite, entry_point=name,
            split="train"))
    return tasks


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory):
    """A very small Llama trained briefly (SFT) on the toy tasks: it writes code that
    sometimes passes and sometimes copies the bug, so RL has a signal."""
    from labkit.policy import tiny
    from labkit.policy.loading import load_policy
    from labkit.policy.prompts import training_text
    from labkit.policy.sft import SFTConfig, train_sft

    tasks = toy_tasks()
    pairs = [training_text(t, t.reference_code) for t in tasks]
    pairs += [training_text(t, t.buggy_code) for t in tasks[:2]]  # some copying, too
    tok = tiny.train_tokenizer([p + c for p, c in pairs] * 20, vocab_size=300)
    model = tiny.init_model(tok, tiny.TinyModelConfig(hidden_size=64, intermediate_size=128,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=4))
    path = tiny.save(model, tok, tmp_path_factory.mktemp("toy") / "model")
    pol = load_policy(str(path), reference="none")
    train_sft(pol.model, pol.tokenizer, pairs * 8,
              SFTConfig(lr=1e-2, batch_size=12, max_steps=120, warmup_steps=10), progress=False)
    return tiny.save(pol.model, pol.tokenizer, path)


@pytest.fixture(scope="session")
def smoke_lab(tmp_path_factory):
    """``make lab --smoke`` once per session: every notebook executed headless into one
    folder with its numbers and the report (``labkit.lab.run_lab``, two notebooks at once);
    its summary."""
    from labkit import lab

    out = tmp_path_factory.mktemp("lab")
    return lab.run_lab(out, smoke=True, jobs=2)  # two kernels: most notebooks use one thread


@pytest.fixture(params=["shared-prefix", "flat"])
def lean_attention(request, monkeypatch):
    """Run a test with every lean decode step on one attention path: the shared-prefix
    products or the flat fused kernel (test sizes are small, so by default they would all be
    flat). After the test, at least one step must have been built, all on that path."""
    from labkit.policy import lean

    flat = request.param == "flat"
    monkeypatch.setattr(lean, "FLAT_BYTES", 2**62 if flat else -1)
    built = []
    init = lean.LeanStep.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self.flat)

    monkeypatch.setattr(lean.LeanStep, "__init__", spy)
    yield request.param
    assert built and all(f == flat for f in built), (request.param, built)


# ------------------------------------------------------------------ the suite's own record
# LABKIT_TEST_RECORD=FILE (``make test-record``, ``make test-fast-record``) appends one JSON line
# when the run ends: which suite ran (``full``, ``fast``, or ``part`` for any other selection), wall
# seconds, outcomes, the 15 slowest tests (setup + call + teardown), whether the task cache
# was empty at the start (a fresh machine builds every task list the shipped ones, data/tasks,
# do not hold) and how many current shipped lists there were. docs/benchmarks.md's
# test-suite table is generated from docs/benchmarks/tests.jsonl.
_DURATIONS: dict[str, float] = {}
_OUTCOMES: Counter = Counter()
_STARTED: dict = {}


def pytest_sessionstart(session):
    if WORKER:  # the controller keeps the record; workers report their tests to it
        return
    from labkit.env.tasks import cache_dir, shipped_dir, shipped_specs, stale_shipped
    from labkit.machine import cpu_seconds

    shipped = shipped_dir()
    _STARTED.update(t0=time.time(), cpu0=cpu_seconds(own=True), fresh=not any(cache_dir().glob("*.jsonl")),
                    shipped=len(shipped_specs(shipped)) - len(stale_shipped(shipped)) if shipped else 0)


def pytest_runtest_logreport(report):
    test = re.sub(r"@[\w-]+$", "", report.nodeid)  # without pytest-xdist's "@<group>"
    _DURATIONS[test] = _DURATIONS.get(test, 0.0) + report.duration
    if report.when == "call" or report.outcome != "passed":
        _OUTCOMES[report.outcome if report.when == "call" else f"{report.outcome} in {report.when}"] += 1


def pytest_sessionfinish(session, exitstatus):
    if _STARTED:
        _STARTED.update(exit_status=int(exitstatus), seconds=round(time.time() - _STARTED["t0"], 1))


def pytest_unconfigure(config):
    """Written last, when pytest-xdist's workers have exited: their CPU time is then in this
    process's children's."""
    path = os.environ.get("LABKIT_TEST_RECORD")
    if not path or "exit_status" not in _STARTED:
        return
    from labkit.machine import append_record, cpu_seconds

    slowest = sorted(_DURATIONS.items(), key=lambda kv: -kv[1])[:15]
    args = config.invocation_params.args
    whole = not config.option.markexpr and not any(
        a.startswith("tests") or a.endswith(".py") or "::" in a for a in args)
    append_record(path, {
        "kind": "tests", "command": "pytest " + " ".join(args),
        "suite": os.environ.get("LABKIT_TEST_SUITE") or ("full" if whole else "part"),
        "workers": getattr(config.option, "numprocesses", None) or 1,
        "seconds": _STARTED["seconds"],
        "cpu_seconds": round(cpu_seconds(own=True) - _STARTED["cpu0"], 1), "fresh_task_cache": _STARTED["fresh"],
        "shipped_task_lists": _STARTED["shipped"],
        "install_seconds": float(os.environ.get("LABKIT_INSTALL_SECONDS") or 0) or None,
        "exit_status": _STARTED["exit_status"], "outcomes": dict(_OUTCOMES),
        "slowest": [{"test": k, "seconds": round(v, 1)} for k, v in slowest]})
