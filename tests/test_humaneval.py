"""HumanEval's check() -> TestSuite converter, its public examples, and the HumanEvalPack loader."""

import json
import math
import shutil
from pathlib import Path

import pytest

from labkit.env import humaneval as he
from labkit.env.humanevalpack import load_humanevalpack
from labkit.sandbox.records import AssertTest, Candidate, IOCase
from labkit.env.records import BugKind

FIXTURE = Path(__file__).parent / "fixtures" / "humanevalpack_small.jsonl"


@pytest.fixture(scope="module")
def problems():
    return he.load_problems()


def _suite(check_body: str, entry: str = "f", prompt: str = ""):
    return he.convert_test("def check(candidate):\n" + check_body, entry, prompt)


# ----------------------------------------------------------------------------- loading


def test_the_164_problems_load_from_the_package(problems):
    assert len(problems) == 164
    assert [p["task_id"] for p in problems[:2]] == ["HumanEval/0", "HumanEval/1"]
    for p in problems:
        assert {"prompt", "canonical_solution", "test", "entry_point"} <= set(p)
        assert f"def {p['entry_point']}(" in he.reference_code(p)


def test_every_problem_converts_and_the_counts_hold(problems):
    """The numbers docs/tasks.md reports: 1117 of 1181 asserts are graded in the parent."""
    stats = he.conversion_stats(problems)
    assert stats == {"problems": 164, "asserts": 1181, "io_cases": 1117, "child_asserts": 16,
                     "dropped": 48, "assert_tests": 16, "fully_parent_graded": 156,
                     "with_docstring_examples": 136}
    for p in problems:
        suite = he.problem_to_suite(p)
        assert suite.total > 0, p["task_id"]
        names = [c.name for c in suite.cases] + [a.name for a in suite.asserts]
        assert len(names) == len(set(names)), p["task_id"]


# ----------------------------------------------------------------------------- assert shapes


def test_equality_either_side_and_identity_become_eq_cases():
    conv = _suite("    assert candidate(1, 'a') == [1, 'a']\n"
                  "    assert (2, -3.5) == candidate((2,), -3)\n"
                  "    assert candidate([]) is None\n"
                  "    assert candidate(0) is True\n")
    assert conv.suite.cases == (
        IOCase((1, "a"), [1, "a"], "eq", name="case_0"),
        IOCase(((2,), -3), (2, -3.5), "eq", name="case_1"),
        IOCase(([],), None, "eq", name="case_2"),
        IOCase((0,), True, "eq", name="case_3"),
    )
    assert conv.suite.asserts == () and conv.parent_asserts == 4


def test_truthy_falsy_and_approximate_cases():
    conv = _suite("    assert candidate(3)\n"
                  "    assert not candidate('')\n"
                  "    assert abs(candidate(1.33) - 0.33) < 1e-6\n"
                  "    assert abs(0.5 - candidate(2)) <= 0.1\n")
    truthy, falsy, strict, loose = conv.suite.cases
    assert (truthy.compare, falsy.compare) == ("truthy", "falsy")
    assert (strict.compare, strict.expected, strict.tol) == ("approx", 0.33, 1e-6)
    # `<= tol` becomes `< the next float above tol`, which is the same test
    assert loose.args == (2,) and loose.tol == math.nextafter(0.1, math.inf)


def test_constant_expressions_are_folded_but_calls_are_not():
    conv = _suite("    assert candidate([1, 0 ** 0]) == (3 + 5, 2.0 / 4.0)\n"
                  "    assert candidate('ab' + 'c') == 'x' + 'x'\n"
                  "    assert candidate(2) == len('ab')\n")
    assert conv.suite.cases[0] == IOCase(([1, 1],), (8, 0.5), "eq", name="case_0")
    assert conv.suite.cases[1] == IOCase(("abc",), "xx", "eq", name="case_1")
    assert [a.name for a in conv.suite.asserts] == ["case_2"]


def test_asserts_without_the_candidate_are_dropped():
    conv = _suite("    assert True, 'message'\n    assert candidate(1) == 2\n    print\n")
    assert conv.dropped_asserts == 1 and len(conv.suite.cases) == 1
    assert conv.suite.asserts == ()


def test_a_flat_list_of_unconvertible_asserts_gives_one_assert_test_each():
    conv = _suite("    assert tuple(candidate([1])) == (1,)\n"
                  "    assert candidate(2) == 2\n"
                  "    assert f(3) != 4\n")  # the entry point called by name reads `candidate`
    assert conv.suite.asserts == (AssertTest("assert tuple(candidate([1])) == (1,)", "case_0"),
                                  AssertTest("assert candidate(3) != 4", "case_2"))
    assert len(conv.suite.cases) == 1 and conv.child_asserts == 2


def test_a_body_with_other_statements_is_kept_whole_with_trusted_helpers_in_setup():
    prompt = ("import math\n\ndef helper(x):\n    return math.floor(x)\n\n"
              "def f(x):\n    '''doc'''\n")
    test = ("METADATA = {'author': 'jt'}\n\n"
            "def check(candidate):\n"
            "    assert candidate(0) == 0\n"
            "    for i in range(3):\n"
            "        assert candidate(i) == helper(i)\n")
    conv = he.convert_test(test, "f", prompt)
    assert [c.name for c in conv.suite.cases] == ["case_0"]  # literal asserts are lifted out
    (body,) = conv.suite.asserts
    assert body.name == "check_body" and body.source.startswith("for i in range(3):")
    setup = conv.suite.setup
    assert "def helper(x)" in setup and "import math" in setup and "METADATA" in setup
    assert "def f(" not in setup and "def check" not in setup
    assert (conv.parent_asserts, conv.child_asserts) == (1, 1)


def test_humanevalpack_layout_with_the_entry_point_as_parameter():
    test = "def check(add):\n    assert add(1, 2) == 3\n    assert add(2, 2) > 3\n\ncheck(add)\n"
    suite = he.convert_test(test, "add").suite
    assert suite.cases == (IOCase((1, 2), 3, "eq", name="case_0"),)
    assert suite.asserts == (AssertTest("assert candidate(2, 2) > 3", "case_1"),)
    assert "check(" not in suite.setup


def test_a_test_without_check_is_refused():
    with pytest.raises(ValueError, match=r"task 'T/1': test must define exactly one check"):
        he.convert_test("assert True\n", "f", task_id="T/1")


# ----------------------------------------------------------------------------- public tests


def test_docstring_examples_in_the_common_notations():
    prompt = ('def f(x, y=0):\n    """Doc.\n'
              "    >>> f(1)\n    2\n"
              "    f([1, 2], 3) ==> [3]\n"
              "    f('a') ➞ 'b'\n"
              "    f(-1) should return 0.\n"
              "    f(q) == 1\n"  # not a literal: skipped
              '    """\n')
    examples = he.docstring_examples({"prompt": prompt, "entry_point": "f"})
    assert [(c.args, c.expected) for c in examples] == [((1,), 2), (([1, 2], 3), [3]),
                                                        (("a",), "b"), ((-1,), 0)]


def test_public_suite_prefers_docstring_examples_else_a_third_of_the_cases(problems):
    first = he.public_suite(problems[0])
    assert [c.args for c in first.cases] == [([1.0, 2.0, 3.0], 0.5),
                                             ([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)]
    no_examples = next(p for p in problems if p["task_id"] == "HumanEval/83")
    hidden = he.problem_to_suite(no_examples).cases
    assert he.public_suite(no_examples).cases == hidden[: -(-len(hidden) // 3)]


def test_every_canonical_solution_passes_its_suite_in_the_sandbox(problems):
    from labkit.sandbox.pool import run_many

    candidates = [Candidate(he.reference_code(p), he.problem_to_suite(p), p["entry_point"],
                            id=p["task_id"]) for p in problems]
    results = run_many(candidates)
    failing = [(c.id, r.status.value, r.error) for c, r in zip(candidates, results) if not r.ok]
    assert not failing
    assert sum(r.passed for r in results) == 1117 + 16


# ----------------------------------------------------------------------------- HumanEvalPack


def test_the_fixture_loads_with_kinds_spans_and_tests():
    tasks = load_humanevalpack(FIXTURE)
    assert [t.task_id for t in tasks] == [f"humanevalpack/HumanEval-{i}/bug0"
                                         for i in (0, 2, 4, 23, 27, 53)]
    assert {t.bugs[0].kind for t in tasks} == {k.value for k in (
        BugKind.MISSING_LOGIC, BugKind.EXCESS_LOGIC, BugKind.VARIABLE_MISUSE,
        BugKind.VALUE_MISUSE, BugKind.FUNCTION_MISUSE, BugKind.OPERATOR_MISUSE)}
    for t in tasks:
        (bug,) = t.bugs
        changed = [i + 1 for i, (a, b) in enumerate(zip(t.buggy_code.splitlines(),
                                                        t.reference_code.splitlines())) if a != b]
        assert changed == [bug.start_line] == [bug.end_line], t.task_id
        assert t.tests.total and t.public_tests.cases and t.problem_id in t.task_id
    add = tasks[-1]  # its check() loops over random inputs: one child-side test
    assert [a.name for a in add.tests.asserts] == ["check_body"]
    strlen = tasks[3]  # no example_test in the record: the docstring examples are used
    assert [c.args for c in strlen.public_tests.cases] == [("",), ("abc",)]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "pack.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_a_missing_file_names_the_file_and_the_format(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: no such file; pass the path of a "
                                                r"HumanEvalPack-format JSONL"):
        load_humanevalpack(tmp_path / "nope.jsonl")


def test_a_bad_json_line_names_the_line(tmp_path):
    good = FIXTURE.read_text().splitlines()[0]
    path = _write(tmp_path, [good, "{not json"])
    with pytest.raises(ValueError, match=r"pack\.jsonl:2: not valid JSON .*one JSON object"):
        load_humanevalpack(path)


def test_a_missing_field_names_line_task_and_field(tmp_path):
    record = _records()[1]
    del record["buggy_solution"]
    path = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(ValueError, match=r"pack\.jsonl:1 \(task 'Python/2'\): missing or "
                                         r"non-string field\(s\) \['buggy_solution'\]"):
        load_humanevalpack(path)


def test_an_unparsable_reference_names_the_field(tmp_path):
    record = _records()[0]
    record["canonical_solution"] = "    return (\n"
    path = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(ValueError, match=r"task 'Python/0'\): field 'canonical_solution' does "
                                         r"not make a valid module .*fix the record"):
        load_humanevalpack(path)


def test_an_unknown_bug_type_lists_the_known_ones(tmp_path):
    record = _records()[0]
    record["bug_type"] = "cosmic ray"
    path = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(ValueError, match=r"field 'bug_type': unknown bug type 'cosmic ray'; use "
                                         r"one of \[.*'value misuse'"):
        load_humanevalpack(path)


def test_a_test_without_check_names_the_field(tmp_path):
    record = _records()[0]
    record["test"] = "assert True\n"
    path = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(ValueError, match=r"\(task 'Python/0'\): field 'test': .*check\("):
        load_humanevalpack(path)


def test_repeated_tasks_and_empty_files_are_refused(tmp_path):
    line = FIXTURE.read_text().splitlines()[0]
    with pytest.raises(ValueError, match=r"pack\.jsonl:2: task 'Python/0' repeats line 1"):
        load_humanevalpack(_write(tmp_path, [line, line]))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no records"):
        load_humanevalpack(empty)


def test_the_file_may_live_anywhere(tmp_path):
    copy = tmp_path / "deep" / "pack.jsonl"
    copy.parent.mkdir()
    shutil.copy(FIXTURE, copy)
    assert len(load_humanevalpack(str(copy))) == 6


BROKEN_EXAMPLE = Path(__file__).parent / "fixtures" / "humanevalpack_broken_example.jsonl"


def test_a_broken_optional_example_test_falls_back_to_the_docstring_with_a_warning():
    """Upstream's ``Python/119`` has an ``example_test`` that does not parse; it used to abort
    the whole file. The fixture's second record has such a field (an unmatched ``)``)."""
    with pytest.warns(UserWarning, match=r"humanevalpack_broken_example\.jsonl:2 \(task "
                                         r"'Python/119'\): optional field 'example_test' is "
                                         r"unusable \(.*does not parse.*\); using the docstring"):
        tasks = load_humanevalpack(BROKEN_EXAMPLE)
    assert [t.task_id for t in tasks] == ["humanevalpack/HumanEval-0/bug0",
                                         "humanevalpack/HumanEval-119/bug0"]
    fix = tasks[1]
    assert [(c.args, c.expected) for c in fix.public_tests.cases] == [
        ((["()(", ")"],), "Yes"), (([")", ")"],), "No")]
    from labkit.sandbox.pool import run_many

    reference, buggy, public = run_many([
        Candidate(fix.reference_code, fix.tests, fix.entry_point),
        Candidate(fix.buggy_code, fix.tests, fix.entry_point),
        Candidate(fix.reference_code, fix.public_tests, fix.entry_point)])
    assert reference.ok and public.ok and not buggy.ok, (reference, buggy, public)


def test_a_broken_required_test_still_fails_with_file_and_line(tmp_path):
    record = json.loads(BROKEN_EXAMPLE.read_text().splitlines()[1])
    record["test"] = record["example_test"]  # the required field now does not parse
    path = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(ValueError, match=r"pack\.jsonl:1 \(task 'Python/119'\): field 'test': "
                                         r".*does not parse"):
        load_humanevalpack(path)


def test_a_prompt_that_does_not_parse_names_the_field(tmp_path):
    record = json.loads(BROKEN_EXAMPLE.read_text().splitlines()[1])
    record["example_test"] = ""
    record["prompt"] = "def match_parens(lst:\n"
    path = _write(tmp_path, [json.dumps(record)])
    with pytest.raises(ValueError, match=r"pack\.jsonl:1 \(task 'Python/119'\): field 'prompt' "
                                         r"does not parse"):
        load_humanevalpack(path)
