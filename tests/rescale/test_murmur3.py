"""The Python Murmur3 that places keys in a rescale is Spark's ``hash``: compared with ``F.hash`` on random
values of every key type a rescale supports, per column and over all columns (struct and unicode strings,
NaN and -0.0, narrow and wide decimals included), and its vectorized forms with the scalar one."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Context, Decimal
from typing import Any

import numpy as np
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from blobstate.rescale.murmur3 import hash_bytes_column, hash_int32_column, hash_int64_column, spark_hash

SCHEMA = StructType(
    [
        StructField("a", LongType()),
        StructField("b", StringType()),
        StructField("c", IntegerType()),
        StructField("d", DoubleType()),
        StructField("e", BooleanType()),
        StructField("f", DateType()),
        StructField("g", TimestampType()),
        StructField("h", DecimalType(10, 2)),
        StructField("i", DecimalType(30, 3)),
        StructField("j", BinaryType()),
        StructField("k", StructType([StructField("x", IntegerType()), StructField("y", StringType())])),
        StructField("l", FloatType()),
        StructField("m", ShortType()),
    ]
)


def random_rows(n: int, seed: int) -> list[tuple]:
    rnd = random.Random(seed)

    def text() -> str | None:
        if rnd.random() < 0.1:
            return None
        return "".join(rnd.choice("ab\u00e9\u4e2d\U0001f600z") for _ in range(rnd.randint(0, 9)))

    utc = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    return [
        (
            rnd.randint(-(2**63), 2**63 - 1),
            text(),
            rnd.randint(-(2**31), 2**31 - 1),
            rnd.choice([rnd.uniform(-1e9, 1e9), -0.0, float("nan"), 1.5]),
            rnd.random() > 0.5,
            dt.date(1970, 1, 1) + dt.timedelta(days=rnd.randint(-9000, 90000)),
            utc + dt.timedelta(microseconds=rnd.randint(-(10**15), 10**15)),
            Decimal(rnd.randint(-(10**9), 10**9)) / 100,
            Decimal(rnd.randint(-(10**28), 10**28)) / 1000,
            bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 7))),
            (rnd.randint(-5, 5), text()),
            rnd.uniform(-100, 100),
            rnd.randint(-3000, 3000),
        )
        for _ in range(n)
    ]


def test_spark_hash_matches_spark(spark: Any) -> None:
    rows = random_rows(400, seed=11)
    names = SCHEMA.fieldNames()
    frame = spark.createDataFrame(rows, SCHEMA)
    got = frame.select(*[F.hash(c).alias(c) for c in names], F.hash(*names).alias("all")).collect()
    for row, hashes in zip(rows, got, strict=True):
        for i, name in enumerate(names):
            assert spark_hash((row[i],), StructType([SCHEMA.fields[i]])) == hashes[name], (name, row[i])
        assert spark_hash(row, SCHEMA) == hashes["all"]


def test_vectorized_hashes_equal_the_scalar_one() -> None:  # the scalar one is checked against Spark above
    rng = np.random.default_rng(3)
    longs = rng.integers(-(2**63), 2**63 - 1, size=500, dtype=np.int64)
    ints = rng.integers(-(2**31), 2**31 - 1, size=500, dtype=np.int64).astype(np.int32)
    long_schema = StructType([StructField("k", LongType())])
    int_schema = StructType([StructField("k", IntegerType())])
    assert hash_int64_column(longs).tolist() == [spark_hash((int(v),), long_schema) for v in longs]
    assert hash_int32_column(ints).tolist() == [spark_hash((int(v),), int_schema) for v in ints]
    # Strings of every length from 0 to 40 (all tails of Spark's byte-wise variant), multi-byte characters
    # and NUL bytes included, and raw binary values.
    texts = ["".join(rng.choice(list("aZ\x00é€😀"), size=int(n))) for n in rng.integers(0, 40, size=500)]
    blobs = [rng.bytes(int(n)) for n in rng.integers(0, 40, size=500)]
    string_schema = StructType([StructField("k", StringType())])
    binary_schema = StructType([StructField("k", BinaryType())])
    assert hash_bytes_column([t.encode() for t in texts]).tolist() == [
        spark_hash((t,), string_schema) for t in texts
    ]
    assert hash_bytes_column(blobs).tolist() == [spark_hash((b,), binary_schema) for b in blobs]


def boundary_columns() -> list[tuple[StructField, list[Any]]]:
    """Columns of every key type with its boundary values (and nulls): each integer width's extremes,
    -0.0, NaN and the infinities, every DECIMAL precision 1..38 at scales 0, p/2 and p with the unscaled
    values 0, +-1, +-(10^p - 1) and +-2^(8k-1) (+-1) that fit (where a two's complement byte array turns
    over), dates, instants and wall-clock times at their extremes, intervals, arrays and nested structs."""
    from pyspark.sql.types import ArrayType, ByteType, DayTimeIntervalType, TimestampNTZType

    columns: list[tuple[StructField, list[Any]]] = []
    for name, dtype, bits in (
        ("byte", ByteType(), 8),
        ("short", ShortType(), 16),
        ("int", IntegerType(), 32),
    ):
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        columns.append((StructField(name, dtype), [lo, lo + 1, -1, 0, 1, hi - 1, hi, None]))
    columns.append((StructField("long", LongType()), [-(2**63), -(2**63) + 1, -1, 0, 1, 2**63 - 1, None]))
    specials = [
        0.0,
        -0.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        1.5,
        -2.25,
        5e-324,
        1.7976931348623157e308,
    ]
    columns.append((StructField("double", DoubleType()), [*specials, None]))
    columns.append(
        (StructField("float", FloatType()), [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, None])
    )
    for p in range(1, 39):
        for s in sorted({0, p // 2, p}):
            top = 10**p - 1
            unscaled = {0, 1, -1, top, -top}
            for k in range(1, 17):
                edge = 2 ** (8 * k - 1)
                for u in (edge - 1, edge, edge + 1):
                    if u <= top:
                        unscaled.update({u, -u})
            values = [Decimal(u).scaleb(-s, context=Context(prec=80)) for u in sorted(unscaled)]
            columns.append((StructField(f"dec_{p}_{s}", DecimalType(p, s)), [*values, None]))
    columns.append(
        (StructField("string", StringType()), ["", "a", "\x00", "a\x00b", "\U0001f600\u00e9", None])
    )
    columns.append((StructField("binary", BinaryType()), [b"", b"\x00", b"\xff" * 5, bytes(range(9)), None]))
    columns.append((StructField("bool", BooleanType()), [True, False, None]))
    columns.append(
        (
            StructField("date", DateType()),
            [dt.date(1601, 1, 1), dt.date(1969, 12, 31), dt.date(9999, 12, 31), None],
        )
    )
    utc = dt.UTC
    instants = [
        dt.datetime(1601, 1, 1, tzinfo=utc),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
        dt.datetime(1970, 1, 1, tzinfo=utc),
        dt.datetime(2026, 11, 1, 8, 30, tzinfo=utc),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
    ]
    columns.append((StructField("ts", TimestampType()), [*instants, None]))
    columns.append(
        (StructField("ts_ntz", TimestampNTZType()), [t.replace(tzinfo=None) for t in instants] + [None])
    )
    columns.append(
        (
            StructField("interval", DayTimeIntervalType()),
            [dt.timedelta(0), dt.timedelta(microseconds=-1), dt.timedelta(days=99999), None],
        )
    )
    columns.append((StructField("array", ArrayType(LongType())), [[], [1, None, -(2**63)], None]))
    nested = StructType(
        [StructField("x", IntegerType()), StructField("y", StructType([StructField("z", StringType())]))]
    )
    columns.append((StructField("struct", nested), [(1, ("a",)), (None, None), (-1, (None,)), None]))
    return columns


def test_spark_hash_matches_spark_at_every_types_boundaries(spark: Any) -> None:
    """Every column on its own (the rows of a one-column frame), against Spark's ``hash`` and the
    partition ``pmod(hash, N)`` Spark's shuffle uses, for a few N."""
    from blobstate.rescale.murmur3 import spark_partition

    columns = boundary_columns()
    checked = 0
    for field, values in columns:
        schema = StructType([field])
        frame = spark.createDataFrame([(v,) for v in values], schema)
        got = frame.select(
            field.name, F.hash(field.name).alias("h"), F.pmod(F.hash(field.name), F.lit(7)).alias("p7")
        ).collect()
        assert len(got) == len(values)
        for value, row in zip(values, got, strict=True):
            mine = spark_hash((value,), schema)
            assert mine == row["h"], (field.simpleString(), value, mine, row["h"])
            assert spark_partition((value,), schema, 7) == row["p7"]
            checked += 1
    assert checked > 1000
