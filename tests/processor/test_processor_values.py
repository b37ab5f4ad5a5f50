"""The typed state value encoding: same values as the old pickled encoding, strict refusal of anything else.

The pickle-based *reference* below is the old encoding, kept here (never in src) so every generated
schema and value is compared with exactly what earlier versions returned.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import pickle
import struct
import zoneinfo
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from blobstate.encoding.values import (
    EXPIRED,
    MARK,
    MARK_EXPIRY,
    StateCodec,
    ValueFormatError,
    storage_signature,
)
from blobstate.errors import BlobstateError
from blobstate.processor.errors import StateVariableError
from blobstate.processor.schema import parse_ddl

# -- the old encoding, as reference ---------------------------------------------------------------


def old_encode(value: Any, expiry_ms: int | None) -> bytes:
    body = pickle.dumps(value, 5)
    if expiry_ms is None:
        return b"\x00" + body
    return b"\x01" + (expiry_ms + (1 << 63)).to_bytes(8, "big") + body


def old_decode(data: bytes) -> Any:
    return pickle.loads(data[9:] if data[0] == 1 else data[1:])


def old_expiry(data: bytes) -> int | None:
    return int.from_bytes(data[1:9], "big") - (1 << 63) if data[0] == 1 else None


def same(a: Any, b: Any) -> bool:
    """Equal values of identical types: float bits, Decimal digits and exponent, wall clock, fold, zone."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, dt.datetime):
        return (
            a.replace(tzinfo=None) == b.replace(tzinfo=None)
            and a.fold == b.fold
            and repr(a.tzinfo) == repr(b.tzinfo)
        )
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return same(list(a), list(b)) and same(list(a.values()), list(b.values()))
    return a == b


# -- generated schemas and values ----------------------------------------------------------------

NAN_BITS = st.integers(0, (1 << 52) - 1).map(
    lambda m: struct.unpack("<d", struct.pack("<Q", 0x7FF0 << 48 | m | 1))[0]
)
FLOATS = st.one_of(st.floats(), st.sampled_from([math.nan, -math.nan, math.inf, -math.inf, -0.0]), NAN_BITS)
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(codec="utf-8"), max_size=6),
    st.sampled_from(["", "ä€𝄞", "\x00", "a\x00b", "\ud800", "x\udfffy"]),  # lone surrogates: pickle kept them
)
OFFSETS = st.timedeltas(
    min_value=-dt.timedelta(hours=23, minutes=59), max_value=dt.timedelta(hours=23, minutes=59)
)
ZONES = st.one_of(
    st.none(),
    st.just(dt.UTC),
    OFFSETS.map(dt.timezone),
    st.builds(dt.timezone, OFFSETS, st.text(max_size=4)),
    st.timezones(),
)
DATETIMES = st.builds(
    lambda d, fold: d.replace(fold=fold),
    st.datetimes(timezones=ZONES, allow_imaginary=True),
    st.integers(0, 1),
)
DECIMALS = st.decimals(allow_nan=True, allow_infinity=True)

LEAVES: list[tuple[DataType, st.SearchStrategy]] = [
    (BooleanType(), st.booleans()),
    (ByteType(), st.integers(-(2**7), 2**7 - 1)),
    (ShortType(), st.integers(-(2**15), 2**15 - 1)),
    (IntegerType(), st.integers(-(2**31), 2**31 - 1)),
    (LongType(), st.integers(-(2**63), 2**63 - 1)),
    (FloatType(), FLOATS),
    (DoubleType(), FLOATS),
    (StringType(), TEXT),
    (CharType(3), TEXT),
    (VarcharType(8), TEXT),
    (BinaryType(), st.binary(max_size=12)),
    (DateType(), st.dates()),
    (TimestampType(), DATETIMES),
    (TimestampNTZType(), DATETIMES),
    (DecimalType(10, 2), DECIMALS),
    (
        DayTimeIntervalType(),
        st.timedeltas(dt.timedelta(microseconds=-(2**63)), dt.timedelta(microseconds=2**63 - 1)),
    ),
]
KEY_LEAVES = [LongType(), IntegerType(), StringType(), BinaryType(), DateType(), BooleanType(), DoubleType()]


def fields_of(inner: st.SearchStrategy) -> st.SearchStrategy[StructType]:
    return st.lists(inner, min_size=1, max_size=4).map(
        lambda types: StructType([StructField(f"f{i}", t) for i, t in enumerate(types)])
    )


TYPES = st.recursive(
    st.sampled_from([t for t, _ in LEAVES]),
    lambda inner: st.one_of(
        inner.map(lambda t: ArrayType(t, True)),
        st.builds(lambda k, v: MapType(k, v, True), st.sampled_from(KEY_LEAVES), inner),
        fields_of(inner),
    ),
    max_leaves=5,
)
SCHEMAS = st.lists(TYPES, min_size=1, max_size=7).map(
    lambda types: StructType([StructField(f"c{i}", t) for i, t in enumerate(types)])
)
_LEAF_VALUES = {type(t): s for t, s in LEAVES}


def values_of(t: DataType) -> st.SearchStrategy:
    """Values of ``t`` (not null); nested positions may be null."""
    if isinstance(t, ArrayType):
        return st.lists(st.none() | values_of(t.elementType), max_size=4)
    if isinstance(t, MapType):
        keys = values_of(t.keyType).filter(lambda k: not (isinstance(k, float) and math.isnan(k)))
        return st.dictionaries(keys, st.none() | values_of(t.valueType), max_size=3)
    if isinstance(t, StructType):
        return rows_of(t)
    return _LEAF_VALUES[type(t)]


def rows_of(schema: StructType) -> st.SearchStrategy[tuple]:
    return st.tuples(*[st.none() | values_of(f.dataType) for f in schema.fields])


EXPIRIES = st.none() | st.integers(-(2**62), 2**62)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_values_decode_exactly_as_the_old_pickled_encoding_did(data: st.DataObject) -> None:
    schema = data.draw(SCHEMAS, "schema")
    row = data.draw(rows_of(schema), "row")
    expiry = data.draw(EXPIRIES, "expiry")
    codec = StateCodec("s", schema)

    stored = codec.encode(row, expiry)
    reference = old_encode(row, expiry)
    assert stored[0] == (MARK if expiry is None else MARK_EXPIRY)
    assert same(codec.decode(stored), old_decode(reference))
    assert codec.expiry(stored) == old_expiry(reference)
    live = codec.decode_live(stored, expiry - 1 if expiry is not None else 2**62)
    assert same(live, old_decode(reference))
    if expiry is not None:
        assert codec.decode_live(stored, expiry) is EXPIRED


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_list_chunks_decode_exactly_as_the_old_pickled_encoding_did(data: st.DataObject) -> None:
    schema = data.draw(SCHEMAS, "schema")
    rows = data.draw(st.lists(rows_of(schema), min_size=1, max_size=4), "rows")
    expiry = data.draw(EXPIRIES, "expiry")
    codec = StateCodec("l", schema)

    stored = codec.encode_list(rows, expiry)
    reference = old_encode(rows, expiry)
    assert same(codec.decode_list(stored), old_decode(reference))
    assert codec.list_length(stored) == len(rows)
    assert codec.expiry(stored) == old_expiry(reference)
    if expiry is not None:
        assert codec.decode_live_list(stored, expiry) is EXPIRED
        assert same(codec.decode_live_list(stored, expiry - 1), rows)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_old_encoding_is_refused_naming_variable_and_key(data: st.DataObject) -> None:
    schema = data.draw(SCHEMAS, "schema")
    row = data.draw(rows_of(schema), "row")
    old = old_encode(row, data.draw(EXPIRIES, "expiry"))
    codec = StateCodec("agg", schema)
    for read in (
        lambda: codec.decode(old, ("k1",)),
        lambda: codec.decode_live(old, 0, ("k1",)),
        lambda: codec.decode_list(old, ("k1",)),
        lambda: codec.decode_live_list(old, 0, ("k1",)),
        lambda: codec.expiry(old, ("k1",)),
        lambda: codec.list_length(old, ("k1",)),
    ):
        with pytest.raises(ValueFormatError) as info:
            read()
        message = str(info.value)
        assert "state variable 'agg'" in message and "grouping key ('k1',)" in message
        assert "old pickled encoding" in message and "Start a new checkpoint" in message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_truncated_and_trailing_bytes_are_refused(data: st.DataObject) -> None:
    schema = data.draw(SCHEMAS, "schema")
    row = data.draw(rows_of(schema), "row")
    codec = StateCodec("s", schema)
    stored = codec.encode(row, data.draw(EXPIRIES, "expiry"))
    for cut in range(len(stored)):
        with pytest.raises(ValueFormatError, match="state variable 's'"):
            codec.decode(stored[:cut])
    with pytest.raises(ValueFormatError, match="trailing"):
        codec.decode(stored + data.draw(st.binary(min_size=1, max_size=3)))
    chunk = codec.encode_list([row, row], None)
    for cut in range(len(chunk)):
        with pytest.raises(ValueFormatError):
            codec.decode_list(chunk[:cut])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_bytes_decode_or_raise_value_format_error_only(data: st.DataObject) -> None:
    """Whatever is stored, reading gives a value of the schema or ValueFormatError: no other failure."""
    schema = data.draw(SCHEMAS, "schema")
    codec = StateCodec("s", schema)
    stored = bytearray(codec.encode(data.draw(rows_of(schema), "row"), data.draw(EXPIRIES, "expiry")))
    for _ in range(data.draw(st.integers(1, 4))):
        stored[data.draw(st.integers(0, len(stored) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        stored = bytearray([MARK]) + data.draw(st.binary(max_size=40))
    for read in (codec.decode, codec.decode_list, lambda b: codec.decode_live(b, 0)):
        with contextlib.suppress(ValueFormatError):
            read(bytes(stored))


@pytest.mark.parametrize(
    ("written", "row", "read_as"),
    [
        ("n INT", (1,), "n BIGINT"),
        ("n BIGINT", (1,), "n INT"),
        ("a BIGINT, b BIGINT", (1, 2), "a BIGINT"),
        ("s STRING", ("a rather long string",), "n BIGINT"),
        ("n BIGINT", (1,), "s STRING"),
    ],
)
def test_bytes_of_another_width_are_refused(written: str, row: tuple, read_as: str) -> None:
    stored = StateCodec("s", parse_ddl(written)).encode(row, None)
    with pytest.raises(ValueFormatError, match="not a value of its schema"):
        StateCodec("s", parse_ddl(read_as)).decode(stored)


def test_other_markers_and_empty_values_are_refused() -> None:
    codec = StateCodec("s", parse_ddl("n BIGINT"))
    good = codec.encode((7,), None)
    for bad in (
        b"",
        b"\x02" + good[1:],
        b"\xff" + good[1:],
        b"\xb2" + good[1:],
        bytes([MARK_EXPIRY]) + b"\x00" * 3,
    ):
        with pytest.raises(ValueFormatError, match="state variable 's'"):
            codec.decode_live(bad, 0, ("k",))


def test_refusals_name_the_field() -> None:
    codec = StateCodec("s", parse_ddl("n BIGINT, name STRING"))
    stored = bytearray(codec.encode((1, "ok"), None))
    stored[-1] = 0xFF  # invalid UTF-8
    with pytest.raises(ValueFormatError, match="field 'name': invalid UTF-8"):
        codec.decode(bytes(stored), ("k",))
    nested = StateCodec("s", parse_ddl("tags ARRAY<STRING>"))
    stored = bytearray(nested.encode((["a", "b"],), None))
    stored[-1] = 0xFF
    with pytest.raises(ValueFormatError, match=r"field 'tags\[1\]': invalid UTF-8"):
        nested.decode(bytes(stored))


def test_unknown_time_zone_names_are_refused() -> None:
    codec = StateCodec("s", parse_ddl("t TIMESTAMP"))
    stored = codec.encode((dt.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")),), None)
    for name in (b"Nowhere/Atall", b"../../etc/passw", b"Europe/Berli\xff"):
        bad = stored.replace(b"Europe/Berlin", name)
        bad = bad[:1] + bad[1:].replace(
            len(b"Europe/Berlin").to_bytes(4, "little"), len(name).to_bytes(4, "little"), 1
        )
        with pytest.raises(ValueFormatError, match="time zone"):
            codec.decode(bad)


# -- writing: conversions and errors -------------------------------------------------------------


def test_numpy_and_pandas_scalars_are_stored_as_python_values() -> None:
    codec = StateCodec(
        "s", parse_ddl("a BIGINT, b DOUBLE, c BOOLEAN, d TIMESTAMP, e STRING, f INTERVAL, g ARRAY<INT>")
    )
    row = (
        np.int64(3),
        np.float32(1.5),
        np.bool_(True),
        pd.Timestamp("2024-01-01 12:00", tz="Europe/Berlin"),
        np.str_("x"),
        pd.Timedelta(seconds=3),
        np.array([1, 2], dtype=np.int8),
    )
    decoded = codec.decode(codec.encode(row, None))
    expected = (
        3,
        1.5,
        True,
        dt.datetime(2024, 1, 1, 12, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")),
        "x",
        dt.timedelta(seconds=3),
        [1, 2],
    )
    assert same(decoded, expected)
    assert same(codec.decode(codec.encode((pd.NA, np.nan, None, pd.NaT, None, None, None), None)),
                (None, math.nan, None, None, None, None, None))  # fmt: skip


def test_lossless_widenings() -> None:
    codec = StateCodec("s", parse_ddl("x DOUBLE, y FLOAT, p DECIMAL(10,2), t ARRAY<BIGINT>, b BINARY"))
    decoded = codec.decode(codec.encode((1, -(2**60), 5, (1, 2), bytearray(b"ab")), None))
    assert same(decoded, (1.0, float(-(2**60)), Decimal(5), [1, 2], b"ab"))


@pytest.mark.parametrize(
    ("ddl", "row", "message"),
    [
        ("n INT", ("x",), "field 'n' (INT) cannot hold str 'x'"),
        ("n INT", (True,), "field 'n' (INT) cannot hold bool True"),
        ("n TINYINT", (200,), "field 'n' (TINYINT) 200 is out of range (-128..127)"),
        ("n INT", (2**31,), "2147483648 is out of range (-2147483648..2147483647)"),
        ("n BIGINT", (-(2**63) - 1,), "is out of range"),
        ("x DOUBLE", (True,), "field 'x' (DOUBLE) cannot hold bool"),
        ("x DOUBLE", (Decimal("1.5"),), "cannot hold Decimal"),
        ("x DOUBLE", (10**400,), "int 1000"),
        ("x DOUBLE", (2**53 + 1,), "int 9007199254740993 cannot be stored exactly as a double"),
        ("f BOOLEAN", (1,), "field 'f' (BOOLEAN) cannot hold int 1"),
        ("s STRING", (b"x",), "field 's' (STRING) cannot hold bytes"),
        ("d DATE", (dt.datetime(2024, 1, 1),), "a datetime; write its .date()"),
        ("t TIMESTAMP", (1704067200000000000,), "nanoseconds"),
        ("t TIMESTAMP", (dt.datetime(2024, 1, 1, tzinfo=type("Tz", (dt.tzinfo,), {})()),), "time zone"),
        ("i INTERVAL", (dt.timedelta(days=999_999_999),), "out of range"),
        ("p DECIMAL(10,2)", (1.5,), "field 'p' (DECIMAL) cannot hold float"),
        ("a ARRAY<INT>", ([1, "2"],), "field 'a[1]' (INT) cannot hold str"),
        ("m MAP<STRING, INT>", ({"k": "v"},), "field 'm[0]' (INT) cannot hold str 'v'"),
        ("m MAP<INT, INT>", ({"k": 1},), "field 'm[key 0]' (INT) cannot hold str 'k'"),
        ("s STRUCT<a: INT, b: STRING>", ((1, 2),), "field 's.b' (STRING) cannot hold int 2"),
        ("s STRUCT<a: INT, b: STRING>", ((1,),), "field 's' (STRUCT<a: INT, b: STRING>) has 2 field"),
        ("n INT, s STRING", (1,), "has 2 field(s), got 1"),
    ],
)
def test_values_that_do_not_fit_are_refused_naming_variable_and_field(
    ddl: str, row: tuple, message: str
) -> None:
    codec = StateCodec("counts", parse_ddl(ddl))
    for write in (
        lambda: codec.encode(row, None),
        lambda: codec.encode(row, 5),
        lambda: codec.encode_list([row], None),
    ):
        with pytest.raises(StateVariableError, match="state variable 'counts'") as info:
            write()
        assert message in str(info.value)


def test_unsupported_types_are_refused_at_declaration() -> None:
    from pyspark.sql.types import NullType, YearMonthIntervalType

    for t in (NullType(), YearMonthIntervalType()):
        with pytest.raises(StateVariableError, match=r"Cannot declare state variable 'v'.*cannot hold"):
            StateCodec("v", StructType([StructField("x", t)]))


def test_errors_belong_to_the_exception_tree() -> None:
    assert issubclass(ValueFormatError, BlobstateError)
    assert issubclass(StateVariableError, BlobstateError)


@given(SCHEMAS, SCHEMAS)
def test_storage_signature_tells_layouts_apart(a: StructType, b: StructType) -> None:
    sig_a, sig_b = storage_signature(a.jsonValue()), storage_signature(b.jsonValue())
    assert "?" not in sig_a
    if sig_a == sig_b:  # then values of one decode as the other
        row = tuple(None for _ in a.fields)
        assert StateCodec("s", b).decode(StateCodec("s", a).encode(row, None)) == row
    renamed = StructType([StructField(f.name + "_x", f.dataType, False) for f in a.fields])
    assert storage_signature(renamed.jsonValue()) == sig_a
