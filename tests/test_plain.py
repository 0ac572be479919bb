"""The plain codec: exact-type round trips, a decoder for untrusted replies that never raises
and never hashes, and strict equality checked against a naive second implementation."""

from __future__ import annotations

import json
import math
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.sandbox import plain

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=8), st.binary(max_size=8),
                    st.complex_numbers(allow_nan=False, allow_infinity=False))
keys = st.recursive(scalars, lambda inner: st.one_of(
    st.tuples(inner, inner), st.frozensets(inner, max_size=3)), max_leaves=6)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.sets(keys, max_size=4),
    st.frozensets(keys, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=20)
# anything json.loads can produce, with tag-shaped dicts among it
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=6)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["t", "v", "x"]), inner, max_size=3),
        st.fixed_dictionaries({"t": st.sampled_from(["int", "float", "list", "tuple", "set",
                                                     "frozenset", "dict", "complex", "bytes",
                                                     "other"]), "v": inner})),
    max_leaves=20)


def naive_strict_equal(a, b) -> bool:
    """Exact-type equality by hashing typed stand-ins (what strict_equal must agree with)."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(naive_strict_equal(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        ta = {typed(k): v for k, v in a.items()}
        tb = {typed(k): v for k, v in b.items()}
        return ta.keys() == tb.keys() and all(naive_strict_equal(v, tb[k]) for k, v in ta.items())
    if type(a) in (set, frozenset):
        return {typed(x) for x in a} == {typed(x) for x in b}
    return a == b


def typed(v):
    if type(v) is tuple:
        return tuple, tuple(typed(x) for x in v)
    if type(v) is frozenset:
        return frozenset, frozenset(typed(x) for x in v)
    return type(v), v


def wire(value):
    """What a child sends: the encoding, through JSON text."""
    return json.loads(json.dumps(plain.encode(value)))


@settings(max_examples=300, deadline=None)
@given(values)
def test_round_trips_keep_exact_types_whichever_decoder(value):
    trusted, untrusted = plain.decode(wire(value)), plain.decode_untrusted(wire(value))
    assert naive_strict_equal(trusted, value)
    assert plain.strict_equal(untrusted, value) and plain.strict_equal(value, untrusted)
    assert plain.strict_equal(trusted, untrusted)


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_strict_equal_agrees_with_the_naive_implementation(a, b):
    expected = naive_strict_equal(a, b)
    assert plain.strict_equal(a, b) is expected
    assert plain.strict_equal(plain.decode_untrusted(wire(a)), b) is expected


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_decoding_untrusted_input_never_raises_and_decode_raises_only_not_plain(obj):
    result = plain.decode_untrusted(obj)
    try:
        trusted = plain.decode(obj)
    except plain.NotPlain:
        assert result is plain.MALFORMED
    else:  # whatever decodes both ways means the same, unless a member or key repeats
        assert result is not plain.MALFORMED
        assert plain.strict_equal(result, trusted) or repeats(result) or has_nan(trusted)


def has_nan(value) -> bool:
    """Whether ``value`` holds a NaN anywhere (then it equals nothing, itself included)."""
    if type(value) is float:
        return math.isnan(value)
    if type(value) is complex:
        return math.isnan(value.real) or math.isnan(value.imag)
    if type(value) is dict:
        return any(has_nan(k) or has_nan(v) for k, v in value.items())
    if type(value) in (list, tuple, set, frozenset):
        return any(map(has_nan, value))
    return False


def has_nan_plain(value) -> bool:
    if type(value) is plain.PlainSet:
        return any(map(has_nan_plain, value.items))
    if type(value) is plain.PlainDict:
        return any(has_nan_plain(k) or has_nan_plain(v) for k, v in value.items)
    if type(value) in (list, tuple):
        return any(map(has_nan_plain, value))
    return has_nan(value)


def repeats(value) -> bool:
    """Whether a decoded set or dict somewhere in ``value`` repeats a member or key (a real
    one cannot: such a forged reply equals no real value). Call it on NaN-free values."""
    if has_nan_plain(value):
        return False
    if type(value) in (list, tuple):
        return any(map(repeats, value))
    if type(value) is plain.PlainSet:
        keys = [plain.canonical_key(x) for x in value.items]
        return len(set(keys)) < len(keys) or any(map(repeats, value.items))
    if type(value) is plain.PlainDict:
        keys = [plain.canonical_key(k) for k, _ in value.items]
        return len(set(keys)) < len(keys) or any(repeats(k) or repeats(v) for k, v in value.items)
    return False


def test_malformed_input_that_once_raised_or_took_seconds():
    for obj in ({"t": "float", "v": 10**400}, {"t": "int", "v": "7" * 5000},
                {"t": "int", "v": " 12"}, {"t": "set", "v": [{"t": "list", "v": []}]},
                {"t": "dict", "v": [[{"t": "dict", "v": []}, 1]]}, {"t": "complex", "v": [1]},
                {"t": "bytes", "v": "zz"}, {"t": "list"}, {"t": "list", "v": [1], "x": 0}):
        assert plain.decode_untrusted(obj) is plain.MALFORMED, obj
    deep: object = 1
    for _ in range(100):
        deep = {"t": "list", "v": [deep]}
    assert plain.decode_untrusted(deep) is plain.MALFORMED  # deeper than MAX_DEPTH
    assert plain.decode_untrusted([1] * 10, max_items=5) is plain.MALFORMED


def test_a_set_whose_members_hash_alike_costs_linear_time():
    n = 20_000
    members = [{"t": "int", "v": str(k * (2**61 - 1))} for k in range(1, n)]
    assert len({hash(k * (2**61 - 1)) for k in range(1, 100)}) == 1  # they do collide
    start = time.perf_counter()
    got = plain.decode_untrusted({"t": "set", "v": members})
    equal = plain.strict_equal(got, {1, 2})
    assert not equal and type(got) is plain.PlainSet and len(got) == n - 1
    assert plain.strict_equal(got, {k * (2**61 - 1) for k in range(1, 200)}) is False
    assert time.perf_counter() - start < 1.0  # building the set takes seconds


def test_nan_equals_nothing_and_the_zeros_are_equal():
    nan = float("nan")
    assert not plain.strict_equal(nan, nan)
    assert not plain.strict_equal({nan}, {nan}) and not plain.strict_equal({(nan,): 1}, {(nan,): 1})
    assert plain.strict_equal({0.0}, {-0.0}) and plain.strict_equal({0.0: 1}, {-0.0: 1})
    assert plain.strict_equal(complex(0.0, -0.0), complex(0.0, 0.0))
    assert math.isnan(plain.decode_untrusted(wire(nan)))


def test_a_forged_set_with_a_repeated_member_equals_no_real_set():
    forged = plain.decode_untrusted({"t": "set", "v": [1, 1]})
    assert type(forged) is plain.PlainSet and len(forged) == 2
    assert not plain.strict_equal(forged, {1}) and not plain.strict_equal(forged, {1, 2})
    dup_keys = plain.decode_untrusted({"t": "dict", "v": [[1, 2], [1, 2]]})
    assert not plain.strict_equal(dup_keys, {1: 2})
    assert repr(forged) == "{1, 1}" and bool(plain.decode_untrusted({"t": "set", "v": []})) is False
