"""The Python Murmur3 that places keys in a rescale is Spark's ``hash``: compared with ``F.hash`` on random
values of every key type a rescale supports, per column and over all columns (struct and unicode strings,
NaN and -0.0, narrow and wide decimals included), and its vectorized forms with the scalar one."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
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
