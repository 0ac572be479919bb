"""Prompts for repair tasks, and robust extraction of the fixed program from a completion.

Two formats:

* **chat** — when the tokenizer has a chat template (instruction-tuned checkpoints such as
  Qwen2.5-Coder-Instruct): one user message holding the instruction, the buggy program
  and optional feedback; the model answers with the fixed program in a code fence.
* **plain** — for base models and the embedded tiny model, a fixed, documented layout::

      ### Fix the bug in this Python function.
      ### Problem           (only when the buggy program does not carry its own docstring)
      <signature + docstring with examples>
      ### Buggy
      <buggy program>
      ### Feedback            (only in later turns of a multi-turn episode)
      <execution feedback>
      ### Fixed
      <the model writes the whole fixed program here, then EOS>

The completion is always the whole fixed program. :func:`extract_code` pulls it out of
what a model actually writes: a fenced block (```` ```python ````), or plain code followed
by chatter, or a completion that restarts a ``###`` section.
"""

from __future__ import annotations

import re

from labkit.env.code import parse_candidate
from labkit.env.records import RepairTask

INSTRUCTION = "Fix the bug in this Python function."
PLAIN_HEADER = f"### {INSTRUCTION}\n"
PLAIN_PROBLEM = "### Problem\n"
PLAIN_BUGGY = "### Buggy\n"
PLAIN_FEEDBACK = "### Feedback\n"
PLAIN_FIXED = "### Fixed\n"


def problem_statement(task: RepairTask) -> str | None:
    """The task's prompt (signature + docstring) when the buggy program does not already
    contain it (synthetic tasks keep the docstring with its examples out of the code;
    HumanEval's buggy programs start with it)."""
    spec = task.prompt.strip()
    if not spec or spec in task.buggy_code:
        return None
    return spec


def plain_prompt(task: RepairTask, feedback: str | None = None) -> str:
    """The plain format (see module docstring). Ends right where the fixed program starts."""
    parts = [PLAIN_HEADER]
    spec = problem_statement(task)
    if spec:
        parts += [PLAIN_PROBLEM, spec + "\n"]
    parts += [PLAIN_BUGGY, task.buggy_code.rstrip() + "\n"]
    if feedback:
        parts += [PLAIN_FEEDBACK, feedback.rstrip() + "\n"]
    parts.append(PLAIN_FIXED)
    return "".join(parts)


def chat_messages(task: RepairTask, feedback: str | None = None) -> list[dict]:
    """The chat format: one user message; the answer is expected in a ```python fence."""
    body = (f"{INSTRUCTION} Reply with the whole corrected program in one ```python code "
            f"block and nothing else.\n\n")
    spec = problem_statement(task)
    if spec:
        body += f"The function should do this:\n```python\n{spec}\n```\n\n"
    body += f"```python\n{task.buggy_code.rstrip()}\n```\n"
    if feedback:
        body += f"\nYour previous attempt was run against the tests:\n{feedback.rstrip()}\n"
    return [{"role": "user", "content": body}]


def build_prompt(task: RepairTask, tokenizer=None, feedback: str | None = None,
                 use_chat_template: bool | None = None) -> str:
    """Prompt text for ``task``: the tokenizer's chat template when it has one (or when
    ``use_chat_template`` forces it), the plain format otherwise."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template is None:
        use_chat_template = has_template
    if use_chat_template:
        if not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        return tokenizer.apply_chat_template(chat_messages(task, feedback), tokenize=False,
                                             add_generation_prompt=True)
    return plain_prompt(task, feedback)


def training_text(task: RepairTask, fixed_code: str, feedback: str | None = None) -> tuple[str, str]:
    """(prompt, completion) for supervised fine-tuning in the plain format."""
    return plain_prompt(task, feedback), fixed_code.rstrip() + "\n"


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def _parses(code: str) -> bool:
    try:
        parse_candidate(code)  # without the compiler's warnings about dubious code ("1if")
        return True
    except (SyntaxError, ValueError):
        return False


def _longest_parsing_prefix(lines: list[str]) -> str:
    for end in range(len(lines), 0, -1):
        code = "\n".join(lines[:end]).rstrip() + "\n"
        if _parses(code):
            return code
    return ""


def extract_code(completion: str) -> str:
    """The fixed program inside ``completion``.

    Order of attempts: the first fenced code block (closed or not); else the text up to a
    line starting with ``###`` (the model began a new section); then, if that does not
    parse, the longest prefix of whole lines that does (trailing chatter dropped). If
    nothing parses, the text up to the first ``###`` is returned as it is, so the sandbox
    reports the syntax error instead of the extractor hiding it.
    """
    m = _FENCE.search(completion)
    if m:
        text = m.group(1)
    else:
        text = re.split(r"^###", completion, maxsplit=1, flags=re.M)[0]
    text = text.strip("\n")
    if not text.strip():
        return ""
    code = text.rstrip() + "\n"
    if _parses(code):
        return code
    prefix = _longest_parsing_prefix(text.splitlines())
    if prefix and ("def " in prefix or "class " in prefix):
        return prefix
    return code
