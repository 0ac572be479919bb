"""The synthetic generator: determinism, identity, diversity, each family's code and tests."""

import ast
import time
from pathlib import Path

import pytest

from labkit.env import synthetic as sy
from labkit.env.humaneval import docstring_examples
from labkit.sandbox.plain import strict_equal
from labkit.sandbox.records import Candidate, IOCase, TestSuite

PER_FAMILY = 40


@pytest.fixture(scope="module")
def by_family():
    return {f: sy.generate_problems(PER_FAMILY, seed=5, families=[f]) for f in sy.FAMILIES}


def _run(problem, args):
    namespace = {}
    exec(problem.reference_code, namespace)  # noqa: S102 (the generator's own code)
    return namespace[problem.entry_point](*args)


def test_at_least_seven_families_with_levels():
    assert len(sy.FAMILIES) >= 7
    assert {f.level for f in sy.FAMILIES.values()} == {1, 2, 3}


def test_a_seed_gives_the_same_problems_and_another_seed_others():
    first = sy.generate_problems(60, seed=3)
    assert first == sy.generate_problems(60, seed=3)
    other = sy.generate_problems(60, seed=4)
    assert [p.problem_id for p in first] != [p.problem_id for p in other]


def test_a_problem_is_the_same_whichever_seed_found_it():
    """Ids hash the behaviour; names, tests and examples are seeded by that hash."""
    a = {p.problem_id: p for p in sy.generate_problems(300, seed=1, families=["classify"])}
    b = {p.problem_id: p for p in sy.generate_problems(300, seed=2, families=["classify"])}
    shared = set(a) & set(b)
    assert len(shared) > 30
    assert all(a[i] == b[i] for i in shared)


def test_problems_are_distinct_and_diverse():
    problems = sy.generate_problems(400, seed=0)
    assert len({p.problem_id for p in problems}) == 400
    assert len({p.reference_code for p in problems}) == 400
    assert {p.family for p in problems} == set(sy.FAMILIES)
    assert len({p.entry_point for p in problems}) > 100
    # the vocabulary stays small: parameter names come from the VOCAB lists
    params = {a.arg for p in problems for a in ast.parse(p.reference_code).body[0].args.args}
    assert params <= {name for names in sy.VOCAB.values() for name in names}


def test_each_family_writes_short_valid_functions(by_family):
    for family, problems in by_family.items():
        assert len(problems) == PER_FAMILY
        for p in problems:
            assert p.family == family and p.problem_id.startswith(f"{family}-")
            tree = ast.parse(p.reference_code)
            assert [type(n) for n in tree.body] == [ast.FunctionDef], p.problem_id
            assert tree.body[0].name == p.entry_point
            assert 5 <= len(p.reference_code.splitlines()) <= 15, p.reference_code
            assert p.reference_code.splitlines()[0] == p.signature


def test_each_familys_tests_are_the_references_outputs(by_family):
    for problems in by_family.values():
        for p in problems:
            cases = p.tests.cases
            assert 6 <= len(cases) <= 10 and p.tests.asserts == ()
            assert len({repr(c.args) for c in cases}) == len(cases)
            assert len({repr(c.expected) for c in cases}) >= 2, p.problem_id
            assert any(c.name.startswith("edge_") for c in cases)
            for case in cases:
                assert case.compare == "eq"
                assert strict_equal(_run(p, case.args), case.expected), (p.problem_id, case)


def test_edge_cases_cover_empty_zero_and_negative_inputs(by_family):
    lists = by_family["accumulate"][0].tests.cases
    assert [c.args for c in lists[:3]] == [([],), ([0],), ([-3, 4],)]
    assert by_family["strings"][0].tests.cases[0].args == ("",)
    assert (0,) in [c.args for c in by_family["digits"][0].tests.cases]


def test_prompts_state_the_behaviour_and_carry_the_examples(by_family):
    for problems in by_family.values():
        for p in problems:
            assert 2 <= len(p.examples) <= 3
            assert all(case in p.tests.cases for case in p.examples)
            assert p.prompt.startswith(p.signature + '\n    """')
            assert " ".join(p.description.split()[:4]) in " ".join(p.prompt.split())
            for case in p.examples:
                call = f">>> {p.entry_point}({', '.join(map(repr, case.args))})"
                assert f"{call}\n    {case.expected!r}\n" in p.prompt
            # the same parser that reads HumanEval docstrings finds exactly these examples
            found = docstring_examples({"prompt": p.prompt, "entry_point": p.entry_point})
            assert [(c.args, c.expected) for c in found] == [(c.args, c.expected)
                                                            for c in p.examples]


def test_docs_show_one_true_example_per_family():
    """docs/tasks.md prints seed 0's first problem of each family; it must stay the truth."""
    docs = (Path(__file__).parents[1] / "docs" / "tasks.md").read_text()
    block = docs.split("```python\n")[-1].split("```")[0]
    shown = "\n".join(line.split("  #")[0].rstrip() for line in block.splitlines())
    for family in sy.FAMILIES:
        (p,) = sy.generate_problems(1, seed=0, families=[family])
        body = p.reference_code.split("\n", 1)[1]
        assert p.prompt + body in shown + "\n", family


def test_choose_examples_puts_failing_cases_first():
    cases = tuple(IOCase((i,), i % 3, name=f"case_{i}") for i in range(8))
    suite = TestSuite(cases=cases)
    chosen = sy.choose_examples(suite, failing={"case_5", "case_7"})
    assert [c.name for c in chosen][:3] == sorted([c.name for c in chosen])  # suite order
    assert {"case_5", "case_7"} <= {c.name for c in chosen} and len(chosen) == 3
    assert len({c.expected for c in chosen}) == 3  # new outputs preferred
    assert len(sy.choose_examples(suite, failing={"case_1"}, k=2)) == 2


def test_the_reference_passes_its_tests_in_the_sandbox(by_family):
    from labkit.sandbox.pool import run_many

    problems = [p for ps in by_family.values() for p in ps[:6]]
    results = run_many([Candidate(p.reference_code, p.tests, p.entry_point, 2.0, id=p.problem_id)
                        for p in problems])
    assert [(p.problem_id, r.error) for p, r in zip(problems, results) if not r.ok] == []


def test_generation_is_fast():
    sy.generate_problems(20, seed=9)  # warm up
    start = time.perf_counter()
    sy.generate_problems(600, seed=9)
    assert time.perf_counter() - start < 3.0  # ~1,500 a second on an idle 2-core machine


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match=r"unknown synthetic families \['loops'\]; choose from"):
        sy.generate_problems(1, families=["loops"])
    with pytest.raises(ValueError, match=r"n must be >= 0, got -1"):
        sy.generate_problems(-1)
