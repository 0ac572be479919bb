"""Renaming augmentation: same task under other names, still a valid repair task."""

import random

import pytest
from labkit.policy.pretrain_data.augment import identifiers, name_words, rename_identifiers
from labkit.env.feedback import defines_entry_point
from labkit.sandbox.records import Candidate
from labkit.sandbox.pool import Sandbox
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


def test_compound_names_are_snake_case_from_the_pool_and_the_task_stays_valid():
    tasks = load_tasks("synthetic", "train", n=12, seed=0)
    words = name_words(t.prompt for t in tasks)
    assert words == sorted(words) and all(w.isalpha() and w.islower() and 3 <= len(w) <= 10 for w in words)
    renamed = [rename_identifiers(t, random.Random(i), style="compound", words=words) for i, t in enumerate(tasks)]
    with Sandbox() as sb:
        ref = sb.run_many([Candidate(t.reference_code, t.tests, t.entry_point) for t in renamed])
    assert all(r.ok for r in ref)
    parts = [t.entry_point.split("_") for t in renamed]
    assert all(2 <= len(p) <= 4 for p in parts)
    assert any(w in words for p in parts for w in p)  # half the parts are real words
    for old, new in zip(tasks, renamed):
        assert f"def {new.entry_point}(" in new.prompt and f"def {new.entry_point}(" in new.reference_code
        assert old.entry_point not in identifiers(new.reference_code)


def test_short_style_is_the_default_and_an_unknown_style_is_refused():
    task = load_tasks("synthetic", "train", n=1, seed=0)[0]
    assert rename_identifiers(task, random.Random(3)) == rename_identifiers(task, random.Random(3), style="short")
    assert "_" not in rename_identifiers(task, random.Random(3)).entry_point
    with pytest.raises(ValueError, match="rename style 'long'"):
        rename_identifiers(task, random.Random(3), style="long")


def test_defines_entry_point_reads_the_name_even_from_broken_code():
    assert defines_entry_point("def helper(x):\n    return x\n\ndef f(xs):\n    return xs\n", "f")
    assert not defines_entry_point("def f_2(xs):\n    return xs\n", "f")
    assert defines_entry_point("def f(xs):\n    return xs +\n", "f")  # does not parse
    assert not defines_entry_point("    def f(x):\n        pass\n", "f")  # not top level


def test_pretrain_refuses_an_unknown_rename_style_before_building_data(tmp_path):
    from labkit.policy.pretrain import PretrainConfig, pretrain_tiny

    with pytest.raises(ValueError, match="rename_style 'long': expected one of short, compound"):
        pretrain_tiny(PretrainConfig(out=str(tmp_path / "m"), rename_style="long"))
    assert not (tmp_path / "m").exists()


def test_relabelled_tasks_return_fresh_labels_and_stay_valid_by_execution():
    from labkit.policy.pretrain_data.augment import relabel_strings, string_labels

    assert string_labels('def f(n):\n    if n:\n        return "near"\n    return "far"\n') == ["near", "far"]
    assert string_labels('def f(n):\n    return str(n)\n') == []
    tasks = [t for t in load_tasks("synthetic", "train", n=300, seed=0) if string_labels(t.reference_code)]
    assert len(tasks) >= 5
    words = name_words(t.prompt for t in tasks)
    relabelled = [relabel_strings(t, random.Random(i), words=words) for i, t in enumerate(tasks)]
    with Sandbox() as sb:
        ref = sb.run_many([Candidate(t.reference_code, t.tests, t.entry_point) for t in relabelled])
        public = sb.run_many([Candidate(t.reference_code, t.public_tests, t.entry_point) for t in relabelled])
        bug = sb.run_many([Candidate(t.buggy_code, t.tests, t.entry_point) for t in relabelled])
        # the old reference no longer passes: the tests expect the new labels
        old = sb.run_many([Candidate(o.reference_code, t.tests, t.entry_point) for o, t in zip(tasks, relabelled)])
    assert all(r.ok for r in ref) and all(r.ok for r in public) and not any(b.ok for b in bug)
    assert not any(r.ok for r in old)
    for o, t in zip(tasks, relabelled):
        assert t.task_id == o.task_id + "~relabelled" and t.entry_point == o.entry_point
        new = string_labels(t.reference_code)
        assert len(new) == len(string_labels(o.reference_code)) and not set(new) & set(string_labels(o.reference_code))
        assert all(f'"{w}"' in t.prompt or f"'{w}'" in t.prompt for w in new)  # the description still says
    other = load_tasks("synthetic", "train", n=40, seed=0)
    plain = next(t for t in other if not string_labels(t.reference_code))
    assert relabel_strings(plain, random.Random(0)) is plain


def test_flipped_comparisons_mirror_the_same_ones_in_both_codes_and_stay_valid_by_execution():
    from labkit.policy.pretrain_data.augment import flip_comparisons, flippable_comparisons

    code = "def f(xs, k):\n    if k > 14 and 2 <= len(xs) < 9:\n        return xs [0]== k\n    return k != 0\n"
    assert flippable_comparisons(code) == 3  # the chained one is left alone
    # a naive second implementation: the two mirrored comparisons written out by hand
    from labkit.env.records import RepairTask
    from labkit.sandbox.records import TestSuite

    task = RepairTask(task_id="t", problem_id="t", source="synthetic", prompt="def f(xs, k):\n",
                      buggy_code=code, reference_code=code,
                      entry_point="f", tests=TestSuite(), public_tests=TestSuite())
    flipped = flip_comparisons(task, random.Random(0), p=1.0)
    assert flipped.reference_code == ("def f(xs, k):\n    if 14 < k and 2 <= len(xs) < 9:\n"
                                      "        return k== xs [0]\n    return 0 != k\n")
    assert flip_comparisons(task, random.Random(0), p=0.0) is task

    tasks = [t for t in load_tasks("synthetic", "train", n=40, seed=0) if flippable_comparisons(t.reference_code)]
    assert len(tasks) >= 10
    flipped = [flip_comparisons(t, random.Random(i), p=1.0) for i, t in enumerate(tasks)]
    with Sandbox() as sb:
        ref = sb.run_many([Candidate(t.reference_code, t.tests, t.entry_point) for t in flipped])
        bug = sb.run_many([Candidate(t.buggy_code, t.tests, t.entry_point) for t in flipped])
    assert all(r.ok for r in ref) and not any(b.ok for b in bug)
    for o, t in zip(tasks, flipped):
        assert t.task_id == o.task_id + "~flipped" and t.prompt == o.prompt
        assert t.reference_code != o.reference_code
        assert flippable_comparisons(t.reference_code) == flippable_comparisons(o.reference_code)
        # mirroring twice gives the code back: the same comparisons, only their faces turned
        assert flip_comparisons(t, random.Random(0), p=1.0).reference_code == o.reference_code
