"""Python source as the lab compares it: parsed quietly, docstrings dropped, normalised.

Pure text and syntax-tree functions (no sandbox, no torch), shared by the feedback components
(:mod:`labkit.env.feedback`: the ``noop`` signal, the tree edit distance) and the credit
floor's diffs (:mod:`labkit.credit.diffs`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import threading
import warnings


_WARNINGS_LOCK = threading.RLock()


@contextlib.contextmanager
def _quiet_compiler():
    """Silence the warnings Python's compiler prints for dubious but valid code (``1if``, a
    bad escape like ``'\\d'``: ``SyntaxWarning`` or, before 3.12, ``DeprecationWarning``).
    They are about the policy's programs, not the lab's, and would fill the logs.

    ``warnings.catch_warnings`` saves and restores the process's one filter list, so two
    threads inside it at once (sampling threads, feedback components) could restore each
    other's state and leave the filters changed for good; a lock keeps one thread inside at
    a time (a parse takes microseconds)."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def parse_candidate(code: str) -> ast.Module:
    """``ast.parse`` of a generated program, without compiler warnings (:func:`_quiet_compiler`)."""
    with _quiet_compiler():
        return ast.parse(code, "<candidate>")


def _strip_docstrings(module: ast.Module) -> ast.Module:
    for n in ast.walk(module):
        body = getattr(n, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            n.body = body[1:] or [ast.Pass()]
    return module


@functools.lru_cache(maxsize=8192)
def _parse(code: str) -> ast.Module:
    return _strip_docstrings(parse_candidate(code))


@functools.lru_cache(maxsize=8192)
def normalise_code(code: str) -> str:
    """Code with comments, docstrings and whitespace normalised away (via the ast);
    falls back to stripping trailing whitespace when the code does not parse. Memoised: a
    step compares every candidate with its task's buggy code, 8 times the same one."""
    try:
        return ast.unparse(_parse(code))
    except (SyntaxError, ValueError):
        return "\n".join(line.rstrip() for line in code.strip().splitlines())


def is_noop(buggy: str, candidate: str) -> bool:
    """True when the candidate is the buggy program unchanged (up to normalisation)."""
    return normalise_code(buggy) == normalise_code(candidate)
