from labkit.env.records import RepairTask
from labkit.sandbox.records import TestSuite
from labkit.policy.prompts import build_prompt, extract_code, plain_prompt

TASK = RepairTask(task_id="t", problem_id="p", source="s", prompt="", entry_point="f",
                  buggy_code="def f(x):\n    return x - 1\n",
                  reference_code="def f(x):\n    return x + 1\n", tests=TestSuite())
FIX = "def f(x):\n    return x + 1\n"


def test_plain_prompt_layout():
    p = plain_prompt(TASK)
    assert p == ("### Fix the bug in this Python function.\n### Buggy\n"
                 "def f(x):\n    return x - 1\n### Fixed\n")
    assert "### Feedback\nfailed: f(1)\n" in plain_prompt(TASK, "failed: f(1)")
    assert build_prompt(TASK) == p  # no tokenizer -> plain


def test_problem_section_only_when_the_code_lacks_its_docstring():
    import dataclasses

    spec = 'def f(x):\n    """Add one.\n\n    >>> f(1)\n    2\n    """'
    synthetic = dataclasses.replace(TASK, prompt=spec)
    p = plain_prompt(synthetic)
    assert p.index("### Problem\n" + spec + "\n") < p.index("### Buggy\n")
    humaneval_like = dataclasses.replace(TASK, prompt=spec, buggy_code=spec + "\n    return x - 1\n")
    assert "### Problem" not in plain_prompt(humaneval_like)


def test_extract_plain_and_fenced():
    assert extract_code(FIX) == FIX
    assert extract_code(FIX + "### Buggy\nblah") == FIX
    assert extract_code("Here you go:\n```python\n" + FIX + "```\nHope it helps") == FIX
    assert extract_code("```py\n" + FIX) == FIX  # unclosed fence
    assert extract_code(FIX + "\nThis fixes the off-by-one.\n") == FIX  # trailing chatter
    assert extract_code("") == ""
    assert extract_code("def f(:\n") == "def f(:\n"  # nothing parses: keep it for the sandbox



def test_parsing_a_sample_prints_no_syntax_warning():
    """``extract_code`` asks only whether a completion parses: code that parses with a
    SyntaxWarning ("1if") is kept, and, under Python's default warning settings (a script, a
    notebook), nothing is printed, where a plain ``ast.parse`` prints the warning."""
    import subprocess
    import sys

    code = "def f(x):\n    return 1if x else 2\n"
    script = ("import ast\nfrom labkit.policy.prompts import extract_code\n"
              f"assert extract_code({code!r}) == {code!r}\nprint('parsed')\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == "parsed\n", run.stderr
    assert "SyntaxWarning" not in run.stderr, run.stderr
    plain = subprocess.run([sys.executable, "-c", f"import ast; ast.parse({code!r})"],
                           capture_output=True, text=True, timeout=60)
    assert "SyntaxWarning: invalid decimal literal" in plain.stderr  # what the filter hides
