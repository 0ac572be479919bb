"""Human-written bugs: read a HumanEvalPack / HumanEvalFix file (Muennighoff et al. 2023,
"OctoPack", arXiv 2308.07124) that the user brings.

One JSON object a line with ``task_id, prompt, declaration, canonical_solution,
buggy_solution, bug_type, failure_symptoms, test, example_test, entry_point, signature,
docstring, instruction``. Each record becomes one :class:`RepairTask`:

* ``buggy_code`` = ``declaration + buggy_solution``; ``reference_code`` =
  ``declaration + canonical_solution`` (or ``prompt + canonical_solution`` when the first does
  not parse);
* hidden tests from ``test`` and public tests from ``example_test`` (else the docstring
  examples), both through :func:`labkit.env.humaneval.convert_test`. ``example_test`` is
  optional: when it does not convert (upstream's ``Python/119`` does not parse), the record
  keeps its docstring examples and a warning names the file, line and task;
* one :class:`BugSpan`: its kind from ``bug_type`` (``"value misuse"`` -> ``value_misuse``),
  its lines the buggy-side extent of a line diff against the reference.

The problem id of ``Python/12`` is ``HumanEval-12``, the id :mod:`labkit.env.tasks` gives the
same HumanEval problem, so both sources put it in the same split.

Every problem with a required field raises an error that names the file, the line, the task
and the field, and says what to do.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

from labkit.env.humaneval import convert_test, docstring_examples
from labkit.env.records import BugKind, BugSpan, RepairTask
from labkit.sandbox.records import TestSuite

REQUIRED = ("task_id", "prompt", "declaration", "canonical_solution", "buggy_solution", "bug_type",
            "test", "entry_point")
SOURCE = "humanevalpack"


def load_humanevalpack(path: str | Path) -> list[RepairTask]:
    """Read a HumanEvalPack-format JSONL file into repair tasks, in file order.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a bad line (not JSON,
    a missing field, an unknown bug type, a reference or test that does not parse, a repeated
    task id). Splits are not assigned here: :func:`labkit.env.tasks.load_tasks` does that.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; pass the path of a HumanEvalPack-format "
                                "JSONL file (one JSON object per line)")
    tasks: list[RepairTask] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            task = _record_to_task(_parse_line(line, path, lineno), path, lineno)
            if task.problem_id in seen:
                raise ValueError(f"{path}:{lineno}: task {task.meta['task_id']!r} repeats line "
                                 f"{seen[task.problem_id]}; keep one record per task")
            seen[task.problem_id] = lineno
            tasks.append(task)
    if not tasks:
        raise ValueError(f"{path}: no records; the file must hold one JSON object per line")
    return tasks


def _parse_line(line: str, path: Path, lineno: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); each "
                         "line must be one JSON object") from None
    if not isinstance(record, dict):  # a bad file, like bad JSON: one error type for both
        raise ValueError(  # noqa: TRY004
            f"{path}:{lineno}: a line holds a {type(record).__name__}, not a JSON object; each "
            "line must be one JSON object")
    return record


def _record_to_task(record: Mapping, path: Path, lineno: int) -> RepairTask:
    task_id = record.get("task_id", "<no task_id>")
    where = f"{path}:{lineno} (task {task_id!r})"
    missing = [k for k in REQUIRED if not isinstance(record.get(k), str)]
    if missing:
        raise ValueError(f"{where}: missing or non-string field(s) {missing}; a HumanEvalPack "
                         f"record needs {list(REQUIRED)}")
    entry = record["entry_point"]
    kind = _bug_kind(record["bug_type"], where)
    reference = _reference(record, where)
    buggy = record["declaration"] + record["buggy_solution"]
    try:
        tests = convert_test(record["test"], entry, reference, task_id).suite
    except ValueError as e:
        raise ValueError(f"{where}: field 'test': {e}; it must define check(<function>) with "
                         "asserts") from None
    if not tests.total:
        raise ValueError(f"{where}: field 'test': no assert in check() calls {entry}(); "
                         "the task could not be graded")
    problem_id = _problem_id(task_id)
    start, end = _changed_lines(reference, buggy)
    bug = BugSpan(kind.value, "human", start, end, record.get("failure_symptoms", "") or "")
    return RepairTask(
        task_id=f"{SOURCE}/{problem_id}/bug0",
        problem_id=problem_id,
        source=SOURCE,
        prompt=record["prompt"],
        buggy_code=buggy,
        reference_code=reference,
        tests=tests,
        entry_point=entry,
        bugs=(bug,),
        difficulty=1,
        public_tests=_public_tests(record, reference, where),
        meta={"task_id": task_id, "bug_type": record["bug_type"],
              "instruction": record.get("instruction", "")},
    )


def _bug_kind(bug_type: str, where: str) -> BugKind:
    value = re.sub(r"[\s-]+", "_", bug_type.strip().lower())
    try:
        return BugKind(value)
    except ValueError:
        raise ValueError(f"{where}: field 'bug_type': unknown bug type {bug_type!r}; use one of "
                         f"{[k.value.replace('_', ' ') for k in BugKind]}") from None


def _reference(record: Mapping, where: str) -> str:
    """``declaration + canonical_solution``, else ``prompt + canonical_solution``."""
    errors = []
    for head in ("declaration", "prompt"):
        code = record[head] + record["canonical_solution"]
        try:
            ast.parse(code)
            return code
        except SyntaxError as e:
            errors.append(f"{head} + canonical_solution: {e.msg} at line {e.lineno}")
    raise ValueError(f"{where}: field 'canonical_solution' does not make a valid module "
                     f"({'; '.join(errors)}); fix the record or remove the line")


def _problem_id(task_id: str) -> str:
    """``Python/12`` -> ``HumanEval-12`` (the HumanEval problem it is); other ids with ``/``
    replaced by ``-`` so a task id splits cleanly on ``/``."""
    match = re.fullmatch(r"(?:Python|HumanEval)/(\d+)", task_id)
    return f"HumanEval-{match[1]}" if match else task_id.replace("/", "-")


def _changed_lines(reference: str, buggy: str) -> tuple[int, int]:
    """The 1-based, inclusive lines of ``buggy`` that differ from ``reference``; a pure
    deletion is placed on the buggy line where the missing lines belong."""
    old, new = reference.splitlines(), buggy.splitlines()
    hunks = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
             if op[0] != "equal"]
    if not hunks:
        return 1, 1
    starts = [j1 + 1 if j2 > j1 else max(j1, 1) for _, _, _, j1, j2 in hunks]
    ends = [j2 if j2 > j1 else max(j1, 1) for _, _, _, j1, j2 in hunks]
    last = max(len(new), 1)
    return min(min(starts), last), min(max(ends), last)


def _public_tests(record: Mapping, reference: str, where: str) -> TestSuite:
    """``example_test`` converted when present, else the docstring examples.

    ``example_test`` is optional, so one that does not convert does not cost the task: a
    :class:`UserWarning` names the record and the docstring examples are used instead.
    """
    example = record.get("example_test") or ""
    if isinstance(example, str) and example.strip():
        try:
            return convert_test(example, record["entry_point"], reference,
                                record["task_id"]).suite
        except ValueError as e:
            warnings.warn(f"{where}: optional field 'example_test' is unusable ({e}); using "
                          "the docstring examples as public tests instead", stacklevel=4)
    elif example:
        warnings.warn(f"{where}: optional field 'example_test' is a {type(example).__name__}, "
                      "not a string; using the docstring examples as public tests instead",
                      stacklevel=4)
    try:
        return TestSuite(cases=tuple(docstring_examples(record)))
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"{where}: field 'prompt' does not parse ({e}); it must hold the "
                         "function's signature and docstring") from None
