"""Generated programs (labkit.policy.pretrain_data.generated): every shape comes up and runs, the shape key is
blind to names and constants but not to structure, no held-out template's shape is ever
generated, and the repair tasks are valid (reference passes, buggy code fails, in the sandbox)."""

import ast
import random

from labkit.env import synthetic
from labkit.policy.pretrain_data import generated
from labkit.sandbox.records import Candidate, Status
from labkit.sandbox.pool import run_many
from labkit.env.tasks import load_tasks

WORDS = ("total", "mark", "shift", "pair", "value")


def test_every_shape_is_drawn_and_its_code_runs_on_its_own_inputs():
    rng = random.Random(3)
    seen = set()
    for _ in range(300):
        program = generated.draw_program(rng, WORDS)
        seen.add(program.shape)
        tree = ast.parse(program.code)
        assert not any(isinstance(n, (ast.While, ast.Import, ast.ImportFrom)) for n in ast.walk(tree))
        assert program.name in program.code.splitlines()[0]
    assert seen == set(generated.SHAPES)


def test_shape_key_ignores_names_constants_and_direction_but_not_structure():
    a = 'def f(n: int) -> str:\n    if n < 3:\n        return "a"\n    return "b"\n'
    b = 'def gomo_pair(zaq: int) -> str:\n    if zaq >= 11:\n        return "up"\n    return "down"\n'
    c = 'def f(n: int) -> str:\n    if n % 3 == 1:\n        return "a"\n    return "b"\n'
    d = 'def f(n: int, m: int) -> str:\n    if n < m:\n        return "a"\n    return "b"\n'
    assert generated.shape_key(a) == generated.shape_key(b)
    assert len({generated.shape_key(x) for x in (a, c, d)}) == 3


def test_no_generated_problem_has_a_held_out_templates_shape():
    banned = generated.held_out_shapes(0)
    # the check can fail: a held-out template's own code is in the banned set
    test_task = load_tasks("synthetic", "test", n=10, seed=0)[0]
    assert generated.shape_key(test_task.reference_code) in banned
    # e.g. the classify template held out for test (level_of / side_of if-chains)
    chain = 'def q(v: int) -> str:\n    if v < 2:\n        return "a"\n    if v < 9:\n        return "b"\n    return "c"\n'
    assert generated.shape_key(chain) in banned
    problems = generated.generated_problems(400, seed=1, words=WORDS)
    assert len(problems) == 400 and len({p.problem_id for p in problems}) == 400
    assert not {generated.shape_key(p.reference_code) for p in problems} & banned
    # and they are many shapes, not a few templates again
    assert len({p.template for p in problems}) > 150


def test_generated_tasks_are_valid_repairs_with_examples_the_buggy_code_fails():
    tasks = generated.generated_tasks(6, seed=0, bugs_per_problem=2, words=WORDS)
    assert tasks and all(t.task_id.startswith("generated/generated-") for t in tasks)
    runs = run_many([Candidate(t.reference_code, t.tests, t.entry_point, 2.0) for t in tasks]
                    + [Candidate(t.buggy_code, t.tests, t.entry_point, 2.0) for t in tasks])
    assert all(r.status == Status.PASSED for r in runs[:len(tasks)])
    assert all(r.status != Status.PASSED for r in runs[len(tasks):])
    for task, buggy in zip(tasks, runs[len(tasks):]):
        assert task.buggy_code != task.reference_code and task.bugs
        assert task.prompt.startswith(task.reference_code.splitlines()[0])
        shown = {c.name for c in task.public_tests.cases}
        failing = {o.name for o in buggy.outcomes if not o.ok}
        assert shown <= {c.name for c in task.tests.cases}
        if failing:  # the prompt shows at least one case the buggy code gets wrong
            assert shown & failing
        assert synthetic.N_EXAMPLES == len(task.public_tests.cases) or len(task.tests.cases) < 3
