"""A tagged JSON codec for plain Python values with exact types.

Used for two things: writing test arguments / expected values to JSON, and carrying a
sandboxed child's return values back to the parent, which grades them. Only values whose
type is *exactly* one of the builtins below are accepted; a subclass of ``int`` (or an
object with a custom ``__eq__``) is refused, which is what stops "always equal" hacks.

This module imports nothing outside the standard library, so the sandbox worker can load
it by path without importing the rest of labkit.

Encoding (JSON-able): ``None``, ``bool``, ``int``, ``str`` map to themselves except that
large ints and non-finite floats are tagged; containers are ``{"t": tag, "v": [...]}``.
"""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 64
MAX_ITEMS = 200_000


class NotPlain(TypeError):
    """Raised when a value is not made only of exact builtin types (or too big/deep)."""


def encode(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> Any:
    budget = [max_items]

    def enc(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise NotPlain(f"value has more than {max_items} items")
        if depth > max_depth:
            raise NotPlain(f"value nested deeper than {max_depth}")
        t = type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            if -(2**53) < v < 2**53:
                return v
            try:
                return {"t": "int", "v": str(v)}
            except ValueError as e:  # more digits than sys.get_int_max_str_digits()
                raise NotPlain(f"int too large to encode: {e}") from None
        if t is float:
            if math.isfinite(v):
                return {"t": "float", "v": v}
            return {"t": "float", "v": repr(v)}  # 'nan', 'inf', '-inf'
        if t is list:
            return {"t": "list", "v": [enc(x, depth + 1) for x in v]}
        if t is tuple:
            return {"t": "tuple", "v": [enc(x, depth + 1) for x in v]}
        if t is set or t is frozenset:
            return {"t": t.__name__, "v": [enc(x, depth + 1) for x in v]}
        if t is dict:
            return {"t": "dict", "v": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        if t is complex:
            return {"t": "complex", "v": [v.real, v.imag]}
        if t is bytes:
            return {"t": "bytes", "v": v.hex()}
        raise NotPlain(f"type {t.__module__}.{t.__qualname__} is not a plain builtin type")

    return enc(value, 0)


def decode(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if type(obj) is int:
        return obj
    if type(obj) is float:  # tolerate untagged floats written by hand
        return obj
    if not isinstance(obj, dict) or "t" not in obj:
        raise NotPlain(f"not a plain-codec value: {obj!r:.80}")
    t, v = obj["t"], obj.get("v")
    if t == "int":
        return int(v)
    if t == "float":
        return float(v)
    if t == "list":
        return [decode(x) for x in v]
    if t == "tuple":
        return tuple(decode(x) for x in v)
    if t == "set":
        return {decode(x) for x in v}
    if t == "frozenset":
        return frozenset(decode(x) for x in v)
    if t == "dict":
        return {decode(k): decode(x) for k, x in v}
    if t == "complex":
        return complex(v[0], v[1])
    if t == "bytes":
        return bytes.fromhex(v)
    raise NotPlain(f"unknown tag {t!r}")


def strict_equal(got: Any, expected: Any) -> bool:
    """Equality with exact types, recursively (``True`` is not ``1``, ``1`` is not ``1.0``),
    also for set members and dict keys (``{True} != {1}``).

    Floats compare with ``==`` (so ``nan`` never equals anything).
    """
    tg, te = type(got), type(expected)
    if tg is not te:
        return False
    if tg in (list, tuple):
        return len(got) == len(expected) and all(strict_equal(a, b) for a, b in zip(got, expected))
    if tg is dict:
        typed_got = {_typed_key(k): v for k, v in got.items()}
        typed_expected = {_typed_key(k): v for k, v in expected.items()}
        return typed_got.keys() == typed_expected.keys() and all(
            strict_equal(v, typed_expected[k]) for k, v in typed_got.items())
    if tg in (set, frozenset):
        return {_typed_key(x) for x in got} == {_typed_key(x) for x in expected}
    return got == expected


def _typed_key(value: Any) -> Any:
    """A hashable stand-in for a set member or dict key that also carries its exact type, so
    that ``1``, ``1.0`` and ``True`` (equal and equally hashed in Python) stay apart."""
    t = type(value)
    if t is tuple:
        return t, tuple(_typed_key(x) for x in value)
    if t is frozenset:
        return t, frozenset(_typed_key(x) for x in value)
    return t, value
