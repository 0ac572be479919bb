"""Held-out lists with a per-template cap: labkit.env.balanced."""

import random
from collections import Counter

import pytest

from labkit.env.balanced import balanced_tasks, cap_per_template
from labkit.env.records import RepairTask
from labkit.sandbox.records import TestSuite


def fake(i: int, template: str) -> RepairTask:
    return RepairTask(task_id=f"t{i}", problem_id=f"p{i}", source="synthetic", prompt="",
                      buggy_code="", reference_code="", tests=TestSuite(), entry_point="f",
                      meta={"template": template})


def stream(n: int, seed: int = 0) -> list[RepairTask]:
    """A skewed template stream: template 'a' about 40% of draws, 'b'..'k' the rest."""
    rng = random.Random(seed)
    return [fake(i, "a" if rng.random() < 0.4 else rng.choice("bcdefghijk")) for i in range(n)]


def naive_cap(tasks, cap):
    out = []
    for t in tasks:
        if sum(u.meta["template"] == t.meta["template"] for u in out) < cap:
            out.append(t)
    return out


def test_cap_keeps_the_first_tasks_of_each_template_in_order():
    tasks = stream(300, seed=1)
    for cap in (1, 3, 12, 500):
        kept = cap_per_template(tasks, cap)
        assert [t.task_id for t in kept] == [t.task_id for t in naive_cap(tasks, cap)]
        assert max(Counter(t.meta["template"] for t in kept).values()) <= cap
    assert len(cap_per_template(tasks, 1)) == 11


def test_balanced_list_does_not_depend_on_how_far_it_drew():
    full = stream(4000)
    calls = []

    def load(m):
        calls.append(m)
        return full[:m]

    out = balanced_tasks(60, 6, load)
    assert len(out) == 60 and max(Counter(t.meta["template"] for t in out).values()) <= 6
    assert calls[0] == 120 and calls == sorted(calls)  # starts at 2 n, grows by doubling
    for start in (60, 500, 4000):
        again = balanced_tasks(60, 6, lambda m: full[:m], problems=start)
        assert [t.task_id for t in again] == [t.task_id for t in out]
    # the cap binds: the skewed template is 40% of the stream's draws, 6 of 60 here
    assert Counter(t.meta["template"] for t in full[:60])["a"] > 6


def test_too_few_templates_for_the_cap_is_a_clear_error():
    with pytest.raises(ValueError, match="larger per-template cap"):
        balanced_tasks(100, 5, lambda m: stream(m))  # 11 templates x 5 < 100
    with pytest.raises(ValueError, match="cap must be >= 1"):
        cap_per_template(stream(5), 0)
    with pytest.raises(ValueError, match="records no template"):
        cap_per_template([RepairTask("x", "x", "humaneval", "", "", "", TestSuite(), "f")], 2)


def test_held_out_tasks_with_a_cap_are_the_splits_own_tasks():
    from labkit.env.tasks import load_tasks
    from labkit.experiments.paired import held_out_tasks

    capped = held_out_tasks(16, "test", 0, per_template=2)
    assert len(capped) == 16
    assert max(Counter(t.meta["template"] for t in capped).values()) <= 2
    drawn = {t.task_id: t for t in load_tasks("synthetic", split="test", n=64, seed=0)}
    assert all(t.task_id in drawn and t.to_dict() == drawn[t.task_id].to_dict() for t in capped)
    assert [t.task_id for t in held_out_tasks(16, "test", 0)] != [t.task_id for t in capped]
