"""A tagged JSON codec for plain Python values with exact types.

Used for two things: writing test arguments / expected values to JSON, and carrying a
sandboxed child's return values back to a trusted process, which grades them. Only values
whose type is *exactly* one of the builtins below are accepted; a subclass of ``int`` (or an
object with a custom ``__eq__``) is refused, which is what stops "always equal" hacks.

This module imports nothing outside the standard library, so the sandbox worker can load
it by path without importing the rest of labkit.

Encoding (JSON-able): ``None``, ``bool``, ``int``, ``str`` map to themselves except that
large ints and non-finite floats are tagged; containers are ``{"t": tag, "v": [...]}``.

Two decoders:

* :func:`decode` gives real Python values (sets are built, so members are hashed). It is for
  data from a trusted source (task files, test arguments) and for the sandbox's grader
  process, whose time the check's own deadline bounds. It raises only :class:`NotPlain`.
* :func:`decode_untrusted` is what the parent uses on a sandboxed child's output. It never
  raises: anything malformed comes back as :data:`MALFORMED`. Its cost is linear in the
  size of its input: at most ``max_items`` values, ``max_depth`` levels, ints of at most
  :data:`MAX_INT_DIGITS` digits, and no member of a set and no key of a dict is hashed: they
  come back as :class:`PlainSet` / :class:`PlainDict`, holding the members in the order they
  were sent. :func:`strict_equal` compares those with real values without hashing either.
"""

from __future__ import annotations

import math
import re
import reprlib
from typing import Any

MAX_DEPTH = 64
MAX_ITEMS = 200_000
MAX_INT_DIGITS = 4300
"""Most digits of a tagged int that decoding converts (Python's default
``sys.int_info.default_max_str_digits``): converting decimal text to an int costs time
quadratic in its length, so the length is capped whatever the interpreter allows."""

_INT_TEXT = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}")
_FLOAT_WORDS = {"nan", "inf", "-inf"}


class NotPlain(TypeError):
    """Raised when a value is not made only of exact builtin types (or too big/deep)."""


class _Malformed:
    """The type of :data:`MALFORMED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MALFORMED"


MALFORMED = _Malformed()
"""What :func:`decode_untrusted` returns for input that no honest encoder writes."""


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


# ----------------------------------------------------------------------------- decoding


class PlainSet:
    """A decoded ``set`` or ``frozenset`` whose members were never hashed: ``kind`` is
    ``set`` or ``frozenset``, ``items`` the members in the order they were sent (a forged
    reply may repeat one; :func:`strict_equal` then finds it unequal to every real set)."""

    __slots__ = ("items", "kind")

    def __init__(self, kind: type, items: tuple):
        self.kind = kind
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        if not self.items:
            return f"{self.kind.__name__}()"
        inner = ", ".join(_short.repr(x) for x in self.items[:_short.maxset])
        more = ", ..." if len(self.items) > _short.maxset else ""
        text = "{" + inner + more + "}"
        return text if self.kind is set else f"frozenset({text})"


class PlainDict:
    """A decoded ``dict`` whose keys were never hashed: ``items`` holds the ``(key, value)``
    pairs in the order they were sent."""

    __slots__ = ("items",)

    def __init__(self, items: tuple):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        shown = ", ".join(f"{_short.repr(k)}: {_short.repr(v)}"
                          for k, v in self.items[:_short.maxdict])
        return "{" + shown + (", ..." if len(self.items) > _short.maxdict else "") + "}"


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 40
_short.maxset = _short.maxdict = _short.maxlist = _short.maxtuple = 8


def decode(obj: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> Any:
    """The value that :func:`encode` turned into ``obj``, as real Python values (sets and
    dicts are built, so their members are hashed). Raises :class:`NotPlain`, and nothing
    else, when ``obj`` is not such an encoding or exceeds the limits."""
    try:
        return _Decoder(max_depth, max_items, hashing=True).value(obj, 0)
    except NotPlain:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError, MemoryError) as e:
        raise NotPlain(f"not a plain-codec value: {type(e).__name__}: {e}"[:200]) from None


def decode_untrusted(obj: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> Any:
    """Like :func:`decode` for input a sandboxed candidate may have chosen, but never raises
    and never hashes what it decodes: malformed input (a wrong tag or shape, too many items,
    too deep, an int of more than :data:`MAX_INT_DIGITS` digits, a float out of range) gives
    :data:`MALFORMED`, and sets and dicts come back as :class:`PlainSet` /
    :class:`PlainDict`. Time and memory are linear in the size of ``obj``."""
    try:
        return _Decoder(max_depth, max_items, hashing=False).value(obj, 0)
    except BaseException as e:  # anything: the input is the attacker's
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return MALFORMED


class _Decoder:
    """One decoding walk: counts values against the item budget and checks the depth."""

    def __init__(self, max_depth: int, max_items: int, hashing: bool):
        self.max_depth = max_depth
        self.left = max_items
        self.hashing = hashing

    def value(self, obj: Any, depth: int) -> Any:
        self.left -= 1
        if self.left < 0:
            raise NotPlain("value has too many items")
        if depth > self.max_depth:
            raise NotPlain("value nested too deeply")
        t = type(obj)
        if obj is None or t is bool or t is str or t is int or t is float:
            return obj  # ints stay raw below 2**53; untagged floats are tolerated
        if t is not dict or len(obj) != 2 or "t" not in obj or "v" not in obj:
            raise NotPlain(f"not a plain-codec value: {t.__name__}")
        tag, v = obj["t"], obj["v"]
        if tag == "int":
            if type(v) is not str or not _INT_TEXT.fullmatch(v):
                raise NotPlain("a tagged int must be at most 4300 decimal digits")
            return int(v)
        if tag == "float":
            if type(v) in (int, float) or (type(v) is str and v in _FLOAT_WORDS):
                return float(v)  # OverflowError for an int out of a float's range
            raise NotPlain("a tagged float must be a number, 'nan', 'inf' or '-inf'")
        if tag == "complex":
            if type(v) is list and len(v) == 2 and all(type(x) in (int, float) for x in v):
                return complex(float(v[0]), float(v[1]))
            raise NotPlain("a complex must be two numbers")
        if tag == "bytes":
            if type(v) is not str:
                raise NotPlain("bytes must be hex text")
            return bytes.fromhex(v)
        if type(v) is not list:
            raise NotPlain(f"the items of a {tag!r} must be a list")
        items = [self.value(x, depth + 1) for x in v] if tag != "dict" else None
        if tag == "list":
            return items
        if tag == "tuple":
            return tuple(items)
        if tag in ("set", "frozenset"):
            kind = set if tag == "set" else frozenset
            if self.hashing:
                return kind(items)
            if not all(map(_is_key, items)):
                raise NotPlain("a set member must be hashable")
            return PlainSet(kind, tuple(items))
        if tag == "dict":
            pairs = []
            for pair in v:
                if type(pair) is not list or len(pair) != 2:
                    raise NotPlain("a dict item must be a [key, value] pair")
                pairs.append((self.value(pair[0], depth + 1), self.value(pair[1], depth + 1)))
            if self.hashing:
                return dict(pairs)
            if not all(_is_key(k) for k, _ in pairs):
                raise NotPlain("a dict key must be hashable")
            return PlainDict(tuple(pairs))
        raise NotPlain(f"unknown tag {str(tag)[:40]!r}")


def _is_key(value: Any) -> bool:
    """Whether a decoded value could be a set member or dict key (of a hashable type),
    decided without hashing it: tuples are walked, a frozenset's members were checked when
    it was decoded."""
    t = type(value)
    if t is tuple:
        return all(map(_is_key, value))
    if t is PlainSet:
        return value.kind is frozenset
    return t in _KEY_TYPES


_KEY_TYPES = (type(None), bool, int, float, complex, str, bytes)


# ----------------------------------------------------------------------------- comparing


class _HasNan(Exception):
    """A NaN inside a set member or dict key: such collections equal nothing."""


def exact_type(value: Any) -> type:
    """The type of a plain value, ``set``/``frozenset``/``dict`` for a decoded
    :class:`PlainSet` / :class:`PlainDict`."""
    t = type(value)
    if t is PlainSet:
        return value.kind
    if t is PlainDict:
        return dict
    return t


def _members(value: Any) -> tuple | list:
    return value.items if type(value) is PlainSet else list(value)


def _pairs(value: Any) -> tuple | list:
    return value.items if type(value) is PlainDict else list(value.items())


def strict_equal(got: Any, expected: Any) -> bool:
    """Equality with exact types, recursively (``True`` is not ``1``, ``1`` is not ``1.0``),
    also for set members and dict keys (``{True} != {1}``).

    Floats compare with ``==`` (so ``nan`` never equals anything, and ``0.0 == -0.0``); a
    set or a dict with ``nan`` in a member or key equals nothing. Sets and dicts (real ones
    or :class:`PlainSet` / :class:`PlainDict`) are compared through the sorted canonical
    keys of their members (:func:`canonical_key`), never by hashing them, so a collection a
    candidate chose costs ``O(n log n)`` here whatever its members hash to.
    """
    tg, te = exact_type(got), exact_type(expected)
    if tg is not te:
        return False
    if tg in (list, tuple):
        return len(got) == len(expected) and all(strict_equal(a, b) for a, b in zip(got, expected))
    try:
        if tg is dict:
            pg, pe = _pairs(got), _pairs(expected)
            if len(pg) != len(pe):
                return False
            kg = sorted((canonical_key(k), i) for i, (k, _) in enumerate(pg))
            ke = sorted((canonical_key(k), i) for i, (k, _) in enumerate(pe))
            return all(a == b for (a, _), (b, _) in zip(kg, ke)) and all(
                strict_equal(pg[i][1], pe[j][1]) for (_, i), (_, j) in zip(kg, ke))
        if tg in (set, frozenset):
            mg, me = _members(got), _members(expected)
            return len(mg) == len(me) and (sorted(map(canonical_key, mg))
                                           == sorted(map(canonical_key, me)))
    except _HasNan:
        return False
    return got == expected


def canonical_key(value: Any) -> str:
    """A text that two plain values share exactly when :func:`strict_equal` holds between
    them (for values without NaN): the exact type and the value, with set members and dict
    items in sorted order. Strings and bytes carry their length, so keys concatenate
    unambiguously. Raises ``_HasNan`` for a NaN anywhere inside."""
    t = exact_type(value)
    if value is None:
        return "n"
    if t is bool:
        return "T" if value else "F"
    if t is int:
        return f"i{value}"
    if t is float:
        return "f" + _float_text(value)
    if t is complex:
        return f"c{_float_text(value.real)},{_float_text(value.imag)}"
    if t is str:
        return f"s{len(value)}:{value}"
    if t is bytes:
        return f"b{len(value)}:{value.hex()}"
    if t is list or t is tuple:
        return ("[" if t is list else "(") + ",".join(map(canonical_key, value)) + "]"
    if t is set or t is frozenset:
        keys = sorted(map(canonical_key, _members(value)))
        return ("{" if t is set else "F{") + ",".join(keys) + "}"
    if t is dict:
        items = sorted(f"{canonical_key(k)}:{canonical_key(v)}" for k, v in _pairs(value))
        return "d{" + ",".join(items) + "}"
    raise NotPlain(f"type {t.__name__} is not a plain builtin type")


def _float_text(x: float) -> str:
    if math.isnan(x):
        raise _HasNan
    return repr(x + 0.0)  # -0.0 + 0.0 is 0.0: the two zeros are equal
