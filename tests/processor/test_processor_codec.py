"""Key encoding: round trips, determinism, prefix-freeness, order of keys and timestamps."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobstate.encoding import codec

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.dates(),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
)
keys = st.lists(scalars, min_size=1, max_size=4).map(tuple)


@given(keys)
def test_key_round_trip(key: tuple) -> None:
    data = codec.encode_key(key)
    decoded, end = codec.decode_key(data, len(key))
    assert end == len(data)
    assert decoded == key
    assert [type(a) for a in decoded] == [type(b) for b in key]


@given(st.data())
def test_keys_of_one_arity_are_prefix_free(data: st.DataObject) -> None:
    arity = data.draw(st.integers(1, 3))
    a = data.draw(st.tuples(*[scalars] * arity))
    b = data.draw(st.tuples(*[scalars] * arity))
    ea, eb = codec.encode_key(a), codec.encode_key(b)
    # one grouping key's bytes are never a prefix of another's: prefix scans stay within one key
    assert ea == eb or not (eb.startswith(ea) or ea.startswith(eb))
    assert (ea == eb) == (a == b and [type(x) for x in a] == [type(x) for x in b])


def test_equal_keys_give_equal_bytes_regardless_of_object_identity() -> None:
    s = "sensor"
    assert codec.encode_key((s, s)) == codec.encode_key(("sens" + "or", "".join(["sen", "sor"])))
    assert codec.encode_key((np.int64(5),)) == codec.encode_key((5,))
    assert codec.encode_key((np.float64(1.5), np.bool_(True))) == codec.encode_key((1.5, True))
    # Spark groups -0.0 with 0.0 and all NaNs together
    assert codec.encode_key((-0.0,)) == codec.encode_key((0.0,))
    assert codec.encode_key((float("nan"),)) == codec.encode_key((-math.nan,))


def test_bool_and_int_keys_differ() -> None:
    assert codec.encode_key((True,)) != codec.encode_key((1,))
    assert codec.encode_key((1,)) != codec.encode_key((1.0,))


def test_timestamp_date_and_nested_keys_round_trip() -> None:
    ts = pd.Timestamp("2024-05-06 07:08:09.123456789")
    aware = pd.Timestamp("2024-05-06 07:08:09", tz="Europe/Berlin")
    key = (ts, aware, dt.date(2020, 2, 29), Decimal("1.50"), pd.Timedelta(seconds=3), ("a", (1, None)))
    decoded, _ = codec.decode_key(codec.encode_key(key), len(key))
    # an aware time is an instant: it comes back as its UTC reading, whatever zone it was given in
    assert decoded == (ts, pd.Timestamp("2024-05-06 05:08:09"), *key[2:])
    assert codec.encode_key((aware,)) == codec.encode_key((aware.tz_convert("America/Los_Angeles"),))
    assert codec.encode_key((aware,)) == codec.encode_key((aware.tz_convert("UTC").tz_localize(None),))
    # a python datetime and the equal pandas Timestamp are one key
    assert codec.encode_key((dt.datetime(2024, 1, 1, 12),)) == codec.encode_key(
        (pd.Timestamp("2024-01-01 12:00"),)
    )
    assert codec.encode_key((np.datetime64("2024-01-01T12:00"),)) == codec.encode_key(
        (pd.Timestamp("2024-01-01 12:00"),)
    )


def test_unsupported_key_type_is_named() -> None:
    with pytest.raises(codec.KeyEncodingError, match="set"):
        codec.encode_key(({1, 2},))


@given(st.lists(st.integers(-(2**62), 2**62), min_size=2, max_size=20))
def test_timestamp_bytes_sort_like_numbers(values: list[int]) -> None:
    assert sorted(values, key=codec.encode_ts) == sorted(values)
    for v in values:
        assert codec.decode_ts(codec.encode_ts(v)) == v


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=2, max_size=20))
def test_int_keys_sort_like_numbers(values: list[int]) -> None:
    assert sorted(values, key=lambda v: codec.encode_key((v,))) == sorted(values)


@given(st.lists(st.text(max_size=6), min_size=2, max_size=20))
def test_str_keys_sort_like_strings(values: list[str]) -> None:
    assert sorted(values, key=lambda v: codec.encode_key((v,))) == sorted(values)


@given(st.lists(st.floats(allow_nan=False), min_size=2, max_size=20))
def test_float_keys_sort_like_numbers(values: list[float]) -> None:
    assert [codec.encode_key((v,)) for v in sorted(values)] == sorted(codec.encode_key((v,)) for v in values)


def test_strings_with_nul_characters_stay_prefix_free() -> None:
    a, b = codec.encode_key(("x",)), codec.encode_key(("x\x00y",))
    assert not b.startswith(a)
    assert codec.decode_key(b, 1)[0] == ("x\x00y",)
    assert not codec.encode_key((b"\x00",)).startswith(codec.encode_key((b"",)))
