"""The task entry point: splits, the source registry, validation through the sandbox, caching."""

import collections
import json
from pathlib import Path

import pytest

from labkit.env import synthetic
from labkit.sandbox.records import Candidate, SandboxResult, Status, TestOutcome, TestSuite
from labkit.env.records import RepairTask, Split
from labkit.env.tasks import SOURCES, load_tasks, split_of, template_split, validate_tasks

FIXTURE = str(Path(__file__).parent / "fixtures" / "humanevalpack_small.jsonl")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets an empty task cache of its own, and no shipped lists."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LABKIT_SHIPPED_TASKS", "")


def refuse_to_run(candidates):
    raise AssertionError(f"nothing should run here, got {len(candidates)} candidates")


class CountingRunner:
    """The real sandbox, counting the candidates it is given."""

    def __init__(self):
        from labkit.sandbox.pool import run_many

        self.run_many, self.calls = run_many, 0

    def __call__(self, candidates):
        self.calls += len(candidates)
        return self.run_many(candidates)


# ----------------------------------------------------------------------------- splits


def test_split_of_is_deterministic_and_close_to_the_fractions():
    ids = [f"problem-{i}" for i in range(20_000)]
    splits = [split_of(i) for i in ids]
    assert splits == [split_of(i) for i in ids]
    assert all(isinstance(s, Split) for s in splits)
    counts = collections.Counter(splits)
    assert abs(counts[Split.TRAIN] / 20_000 - 0.8) < 0.01
    assert abs(counts[Split.TEST] / 20_000 - 0.1) < 0.01
    assert [split_of(i, seed=1) for i in ids] != splits  # the seed reshuffles
    assert {split_of(i, fractions=(0, 0, 1)) for i in ids[:100]} == {Split.TEST}


def test_split_of_pins_known_values():
    """Golden values: a change here silently moves problems between splits."""
    assert [split_of(f"HumanEval-{i}").value for i in range(8)] == [
        "train", "train", "val", "test", "val", "train", "train", "train"]


def test_bad_fractions_are_explained():
    with pytest.raises(ValueError, match=r"fractions must be three non-negative numbers \(train, "
                                         r"val, test\) summing to 1, got \(0.5, 0.5\)"):
        split_of("x", fractions=(0.5, 0.5))


@pytest.mark.slow
def test_splits_are_disjoint_by_problem_not_by_bug():
    loaded = {s: load_tasks("synthetic", s, n=5, seed=2, bugs_per_problem=2, validate=False,
                            runner=refuse_to_run, cache=False) for s in ("train", "val", "test")}
    problems = {s: {t.problem_id for t in tasks} for s, tasks in loaded.items()}
    assert not (problems["train"] & problems["val"] or problems["train"] & problems["test"]
                or problems["val"] & problems["test"])
    for split, tasks in loaded.items():
        assert len(problems[split]) == 5
        assert {t.split for t in tasks} == {split}
        assert all(template_split(t.meta["template"]).value == split for t in tasks)
    variants = collections.Counter(t.problem_id for t in loaded["train"])
    assert max(variants.values()) == 2  # both bugs of a problem stay together
    templates = {s: {t.meta["template"] for t in tasks} for s, tasks in loaded.items()}
    assert not (templates["train"] & templates["val"] or templates["train"] & templates["test"])


def test_template_split_holds_out_whole_templates_per_family():
    from labkit.env import synthetic
    from labkit.env.tasks import TEMPLATE_FRACTIONS

    for family in synthetic.FAMILIES:
        census = synthetic.family_templates(family)
        splits = collections.Counter(template_split(t).value for t, _, _ in census)
        assert splits["test"] == max(1, round(TEMPLATE_FRACTIONS[2] * len(census))), family
        assert splits["val"] <= round(TEMPLATE_FRACTIONS[1] * len(census)), family
        # held-out templates are recombinations: their skeleton keeps a training template
        trained = {sk for t, _, sk in census if template_split(t).value == "train"}
        assert all(sk in trained for t, _, sk in census if template_split(t).value != "train")
    # two spellings and two constants of one shape share a template
    a = next(p for p in synthetic.iter_problems(0) if p.entry_point.startswith("sum_above"))
    b = next(p for p in synthetic.iter_problems(1) if p.entry_point.startswith("sum_at_least"))
    assert a.template == b.template and a.problem_id != b.problem_id


def test_in_template_split_is_the_instance_split_of_training_templates():
    from labkit.env.tasks import synthetic_problems

    inside = synthetic_problems("in_template", 30)
    train = {p.template for p in synthetic_problems("train", 400)}
    assert all(template_split(p.template).value == "train" for p in inside)
    assert {p.template for p in inside} & train
    with pytest.raises(ValueError, match="in_template.*synthetic tasks only"):
        load_tasks("humaneval", "in_template", validate=False, cache=False)


@pytest.mark.slow
def test_no_held_out_problem_is_solved_by_a_training_reference():
    """The template split plus the leak pool: on the experiments' training sets no training
    reference passes every hidden test of a held-out problem, and no template is shared."""
    from labkit.env.overlap import overlap_report
    from labkit.env.tasks import synthetic_problems

    train = synthetic_problems("train", 2000, seed=0)
    for split in ("test", "val"):
        rep = overlap_report(train, synthetic_problems(split, 200, seed=0), split)
        assert rep["solved_by_train_frac"] == 0.0 and rep["shared_templates"] == 0, rep
    inside = overlap_report(train, synthetic_problems("in_template", 100, seed=0))
    assert inside["shared_templates"] > 0 and inside["solved_by_train_frac"] > 0  # it can fail


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, message", [
    ({"source": "leetcode"},
     r"unknown task source 'leetcode'; choose one of \['humaneval', 'synthetic', 'humanevalpack'\]"),
    ({"source": "humaneval", "split": "dev"},
     r"unknown split 'dev'; choose one of \['train', 'val', 'test', 'in_template'\] or None"),
    ({"source": "humanevalpack"},
     r"source 'humanevalpack' needs path=<a HumanEvalPack-format JSONL file>"),
    ({"source": "humaneval", "path": FIXTURE}, r"path is only read by source 'humanevalpack'"),
    ({"source": "synthetic"}, r"source 'synthetic' is unlimited: pass n=<number of problems>"),
    ({"source": "synthetic", "n": 3, "n_bugs": 0}, r"n_bugs must be >= 1, got 0"),
    ({"source": "synthetic", "n": 3, "families": ["loops"]},
     r"unknown synthetic families \['loops'\]"),
    ({"source": "humaneval", "fractions": (1, 1, 1)}, r"fractions must be three non-negative"),
])
def test_bad_arguments_name_the_problem_and_the_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_tasks(runner=refuse_to_run, **kwargs)


def test_a_missing_humanevalpack_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl: no such file"):
        load_tasks("humanevalpack", path=str(tmp_path / "missing.jsonl"), runner=refuse_to_run)


# ----------------------------------------------------------------------------- without running code


def test_unvalidated_loads_run_nothing_and_are_deterministic():
    first = load_tasks("synthetic", n=6, seed=4, validate=False, runner=refuse_to_run)
    again = load_tasks("synthetic", n=6, seed=4, validate=False, runner=refuse_to_run, cache=False)
    assert first == again and len(first) == 6
    for t in first:
        assert t.task_id == f"synthetic/{t.problem_id}/bug0"
        assert t.buggy_code != t.reference_code and t.difficulty == len(t.bugs) == 1
        assert t.meta["family"] in synthetic.FAMILIES


def test_several_bugs_per_task_raise_the_difficulty():
    tasks = load_tasks("synthetic", n=4, seed=1, n_bugs=2, validate=False, runner=refuse_to_run)
    assert tasks and all(t.difficulty == len(t.bugs) == 2 for t in tasks)


def test_validate_tasks_reports_each_kind_of_failure():
    good = load_tasks("synthetic", n=3, seed=0, validate=False, runner=refuse_to_run)

    def fake_runner(candidates):  # task 0 fine, task 1's reference fails, task 2's bug passes
        verdicts = [True, False, False, False, True, True]
        return [SandboxResult(Status.PASSED if ok else Status.FAILED, int(ok), 1,
                              (TestOutcome("case_0", ok),), error="" if ok else "case_0 failed")
                for ok in verdicts[: len(candidates)]]

    report = validate_tasks(good, runner=fake_runner)
    assert report["tasks"] == 3 and report["reference_pass"] == 2 and report["buggy_fail"] == 2
    assert report["failures"] == [good[1].task_id, good[2].task_id]
    assert "reference failed: case_0 failed" in report["details"][good[1].task_id]
    assert report["details"][good[2].task_id] == "buggy code passes every test"


# ----------------------------------------------------------------------------- through the sandbox


def test_synthetic_tasks_show_an_example_the_buggy_code_fails():
    from labkit.sandbox.pool import run_many

    tasks = load_tasks("synthetic", "train", n=8, seed=0, bugs_per_problem=2)
    assert len(tasks) >= 12 and {t.source for t in tasks} == {"synthetic"}
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert validate_tasks(tasks)["failures"] == []
    runs = run_many([Candidate(t.buggy_code, t.public_tests, t.entry_point, 2.0) for t in tasks])
    for task, result in zip(tasks, runs):
        assert 2 <= len(task.public_tests.cases) <= 3
        assert all(case in task.tests.cases for case in task.public_tests.cases)
        assert not result.ok, f"{task.task_id}: the buggy code passes every example in its prompt"
        for case in task.public_tests.cases:
            assert f"{case.expected!r}" in task.prompt
        assert task.meta["buggy_status"] in ("failed", "error")


def test_humaneval_tasks_are_valid():
    tasks = load_tasks("humaneval", n=5, seed=0)
    assert [t.task_id for t in tasks] == [f"humaneval/HumanEval-{i}/bug0" for i in range(5)]
    report = validate_tasks(tasks)
    assert report == {"tasks": 5, "reference_pass": 5, "buggy_fail": 5, "failures": [],
                      "details": {}}
    for t in tasks:
        assert t.reference_code.startswith(t.prompt) and t.buggy_code.startswith(t.prompt)
        assert t.meta["humaneval_id"] == t.problem_id.replace("-", "/")
        assert t.public_tests.cases and t.split == split_of(t.problem_id).value


def test_public_examples_the_reference_fails_are_dropped():
    from labkit.env import humaneval
    from labkit.sandbox.pool import run_many
    from labkit.env.tasks import _keep_passing_examples, _Problem

    p = humaneval.load_problems()[47]  # median(): its second docstring example is wrong
    problem = _Problem("HumanEval-47", p["prompt"], humaneval.reference_code(p),
                       p["entry_point"], humaneval.problem_to_suite(p), humaneval.public_suite(p))
    assert len(problem.public_tests.cases) == 2
    (kept,) = _keep_passing_examples([problem], run_many, None)
    assert [c.args for c in kept.public_tests.cases] == [([3, 1, 2, 4, 5],)]


def test_humanevalpack_tasks_through_the_registry():
    tasks = load_tasks("humanevalpack", path=FIXTURE)
    assert len(tasks) == 6 and all(t.source == "humanevalpack" for t in tasks)
    assert all(t.split == split_of(t.problem_id).value for t in tasks)
    test_only = load_tasks("humanevalpack", "test", path=FIXTURE)
    assert {t.task_id for t in test_only} == {t.task_id for t in tasks if t.split == "test"}


def test_validated_lists_are_cached_and_reloaded_without_running(tmp_path):
    runner = CountingRunner()
    first = load_tasks("synthetic", "val", n=3, seed=7, runner=runner)
    assert runner.calls > 0
    (cached,) = (tmp_path / "cache" / "tasks").glob("synthetic-val-*.jsonl")
    assert len(cached.read_text().splitlines()) == len(first)
    assert load_tasks("synthetic", "val", n=3, seed=7, runner=refuse_to_run) == first
    cached.write_text("{broken\n")  # a damaged cache is rebuilt, not trusted
    assert load_tasks("synthetic", "val", n=3, seed=7, runner=runner) == first
    assert RepairTask.from_dict(json.loads(cached.read_text().splitlines()[0])) == first[0]


def test_a_cached_draw_serves_a_shorter_list_and_is_extended_to_a_longer_one():
    """A list of n problems is the first n problems' tasks of a longer draw: a shorter list
    comes from a cached longer one with nothing run, and a longer list builds only the
    problems beyond the longest cached shorter one; both equal a build from nothing."""
    whole = CountingRunner()
    fresh = {n: load_tasks("synthetic", "val", n=n, seed=7, cache=False,
                           runner=whole if n == 5 else None) for n in (2, 5)}
    first = CountingRunner()
    load_tasks("synthetic", "val", n=3, seed=7, runner=first)
    assert load_tasks("synthetic", "val", n=2, seed=7, runner=refuse_to_run) == fresh[2]
    extend = CountingRunner()
    assert load_tasks("synthetic", "val", n=5, seed=7, runner=extend) == fresh[5]
    assert 0 < extend.calls < whole.calls and first.calls + extend.calls == whole.calls
    assert load_tasks("synthetic", "val", n=5, seed=7, runner=refuse_to_run) == fresh[5]
    # another spec (here: another seed) never serves
    assert load_tasks("synthetic", "val", n=2, seed=8, cache=False) == \
        load_tasks("synthetic", "val", n=2, seed=8)


# ----------------------------------------------------------------------------- shipped lists


def test_shipped_lists_are_read_instead_of_built_and_only_for_the_sandbox(tmp_path, monkeypatch, request):
    """``ship`` writes each spec's list at its own n with the census; a fresh cache then reads
    them with nothing run or drafted. A caller with its own runner, or code that changed since
    the ship, builds instead."""
    from labkit.env import tasks

    monkeypatch.setattr(tasks, "LEAK_POOL", (30, (0, 1)))  # a small pool, quick to generate
    tasks._leak_pool.cache_clear()
    for cached in (tasks._leak_pool, tasks._template_splits):  # no small pool outlives the test
        request.addfinalizer(cached.cache_clear)
    specs = [{"source": "synthetic", "split": "val", "n": n, "seed": 7} for n in (2, 3)]
    manifest = tasks.ship(specs, tmp_path / "shipped")
    assert [e["tasks"] for e in manifest["lists"]] == [len(load_tasks("synthetic", "val", n=n, seed=7))
                                                       for n in (2, 3)]
    built = {n: load_tasks("synthetic", "val", n=n, seed=7, cache=False) for n in (2, 3)}
    monkeypatch.setenv("LABKIT_SHIPPED_TASKS", str(tmp_path / "shipped"))
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "empty"))
    tasks._template_splits.cache_clear()
    monkeypatch.setattr(tasks, "_default_runner", lambda: refuse_to_run)
    monkeypatch.setattr(tasks, "_census_splits", lambda *a: pytest.fail("the census was redrafted"))
    monkeypatch.setattr(tasks, "_leak_pool_entries", lambda *a: pytest.fail("the leak pool was regenerated"))
    for n in (2, 3):
        assert load_tasks("synthetic", "val", n=n, seed=7) == built[n]
    assert template_split(built[2][0].meta["template"]) == Split.VAL
    tasks._leak_pool.cache_clear()
    pool = tasks._leak_pool(0, tasks.TEMPLATE_FRACTIONS)
    assert sum(map(len, pool.by_params.values())) == len({p.problem_id for stream in (0, 1) for p in
                                                          tasks.synthetic_problems("train", 30, seed=stream)})
    tasks._leak_pool.cache_clear()
    assert tasks.stale_shipped(tmp_path / "shipped") == []
    counting = CountingRunner()
    assert load_tasks("synthetic", "val", n=2, seed=7, runner=counting) == built[2]
    assert counting.calls > 0
    monkeypatch.setattr(tasks, "_code_version", lambda: "changed")
    assert len(tasks.stale_shipped(tmp_path / "shipped")) == 2
    with pytest.raises(AssertionError, match="nothing should run"):
        load_tasks("synthetic", "val", n=2, seed=7)


@pytest.mark.slow
def test_the_repository_ships_current_lists_equal_to_a_build(monkeypatch):
    """The shipped lists (data/tasks) are those of the current code, and the smallest
    synthetic one equals a build from nothing."""
    from labkit.env import tasks

    specs = tasks.shipped_specs()
    assert specs, "data/tasks ships no task lists; run: python -m labkit tasks ship --log FILE"
    assert tasks.stale_shipped() == [], ("the code that builds task lists changed since they were "
                                         "shipped; run: python -m labkit tasks ship")
    spec = min((s for s in specs if s["source"] == "synthetic"), key=lambda s: s["n"])
    monkeypatch.setenv("LABKIT_SHIPPED_TASKS", str(tasks.SHIPPED_DIR))
    shipped = load_tasks(**spec)
    assert shipped == load_tasks(**spec, cache=False)


def test_every_source_is_registered():
    assert SOURCES == ("humaneval", "synthetic", "humanevalpack")


# ----------------------------------------------------------------------------- multi-hunk


def _suite(fn, inputs):
    from labkit.sandbox.records import IOCase

    return TestSuite(cases=tuple(IOCase(args=(x,), expected=fn(x), name=f"case_{i}")
                                 for i, x in enumerate(inputs)))


REF = "def f(x):\n    y = x + 1\n    z = 0\n    if x > 3:\n        z = 10\n    return y + z\n"


def test_multi_hunk_catches_golden():
    """Two bugs in separate regions, each caught by its own tests: valid; two bugs whose tests
    coincide (or a bug no test catches) are not."""
    from labkit.sandbox.pool import Sandbox
    from labkit.env.tasks import multi_hunk_catches

    suite = _suite(lambda x: x + 1 + (10 if x > 3 else 0), [0, 1, 5, 9])
    # "x + 2" fails every test, "z = 11" those with x > 3: bug 2 has no test of its own
    two = REF.replace("x + 1", "x + 2").replace("z = 10", "z = 11")
    separate = REF.replace("x > 3", "x > 6").replace("return y + z", "return y + z if x else 0")
    with Sandbox() as sb:
        assert multi_hunk_catches(REF, two, suite, "f", sb.run_many) is None
        catches = multi_hunk_catches(REF, separate, suite, "f", sb.run_many)
        assert catches == [frozenset({"case_2"}), frozenset({"case_0"})]
        assert multi_hunk_catches(REF, REF.replace("x > 3", "x > 6"), suite, "f", sb.run_many) is None


@pytest.mark.slow
def test_multi_hunk_tasks_are_validated_hunk_by_hunk():
    from labkit.env.edits import revert_hunks, split_hunks
    from labkit.sandbox.pool import Sandbox

    tasks = load_tasks("synthetic", "train", n=12, n_bugs=2, multi_hunk=True, cache=False)
    assert tasks, "some of 12 problems must give a two-hunk task"
    with Sandbox() as sb:
        for t in tasks:
            assert "/2bugs" in t.task_id and len(t.bug_kinds) == 2 == len(t.meta["hunk_tests"])
            hunks = split_hunks(t.reference_code, t.buggy_code)
            assert len(hunks) == 2
            results = sb.run_many([Candidate(c, t.tests, t.entry_point) for c in
                                   (t.reference_code, t.buggy_code,
                                    *(revert_hunks(t.buggy_code, hunks, [i]) for i in range(2)))])
            assert results[0].ok and not results[1].ok
            for i, r in enumerate(results[2:]):  # partial repair: partial reward
                assert results[1].passed < r.passed < r.total
                fixed = {o.name for o in r.outcomes if o.ok} - {o.name for o in results[1].outcomes if o.ok}
                assert fixed <= set(t.meta["hunk_tests"][i])
