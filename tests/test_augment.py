"""Renaming augmentation: same task under other names, still a valid repair task."""

import random

from labkit.env.augment import identifiers, rename_identifiers
from labkit.env.records import Candidate
from labkit.env.sandbox import Sandbox
from labkit.env.tasks import load_tasks


def test_identifiers_are_the_defined_names_in_order():
    code = "def f(xs, k):\n    total = 0\n    for x in xs:\n        total += len(str(x))\n    return total\n"
    assert identifiers(code) == ["f", "xs", "k", "total", "x"]  # len, str: builtins
    assert identifiers("def f(:\n") == []


def test_renamed_tasks_stay_valid_and_use_no_old_name():
    tasks = load_tasks("synthetic", "train", n=12, seed=0)
    renamed = [rename_identifiers(t, random.Random(i)) for i, t in enumerate(tasks)]
    with Sandbox() as sb:
        ref = sb.run_many([Candidate(t.reference_code, t.tests, t.entry_point) for t in renamed])
        bug = sb.run_many([Candidate(t.buggy_code, t.tests, t.entry_point) for t in renamed])
    assert all(r.ok for r in ref) and not any(b.ok for b in bug)
    for old, new in zip(tasks, renamed):
        assert new.task_id == old.task_id + "~renamed" and new.entry_point != old.entry_point
        for name in identifiers(old.reference_code):
            assert name not in identifiers(new.reference_code)
        assert f"def {new.entry_point}(" in new.prompt and f">>> {new.entry_point}(" in new.prompt
        # the same fix: the two programs differ by the same lines, up to names
        assert old.reference_code.count("\n") == new.reference_code.count("\n")
