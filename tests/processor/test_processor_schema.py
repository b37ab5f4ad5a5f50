"""DDL schema strings parse without a JVM into the StructType Spark would build."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
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
)

from blobstate.processor.schema import SchemaParseError, parse_ddl, to_arrow, to_struct_type


def test_simple_types_and_both_field_syntaxes() -> None:
    assert parse_ddl("a BOOLEAN, b tinyint, c SMALLINT, d int, e Integer, f BIGINT, g long") == StructType(
        [
            StructField("a", BooleanType()),
            StructField("b", ByteType()),
            StructField("c", ShortType()),
            StructField("d", IntegerType()),
            StructField("e", IntegerType()),
            StructField("f", LongType()),
            StructField("g", LongType()),
        ]
    )
    assert parse_ddl(
        "x: float, y: double, s: string, b: binary, d: date, t: timestamp, n: timestamp_ntz"
    ) == StructType(
        [
            StructField("x", FloatType()),
            StructField("y", DoubleType()),
            StructField("s", StringType()),
            StructField("b", BinaryType()),
            StructField("d", DateType()),
            StructField("t", TimestampType()),
            StructField("n", TimestampNTZType()),
        ]
    )


def test_nested_decimal_not_null_comment_and_quoted_names() -> None:
    parsed = parse_ddl(
        "`odd name` DECIMAL(10, 2) NOT NULL COMMENT 'money', "
        "tags ARRAY<STRING>, attrs MAP<STRING, ARRAY<INT>>, point STRUCT<x: DOUBLE, y DOUBLE>"
    )
    assert parsed.fields[0].name == "odd name"
    assert parsed.fields[0].dataType == DecimalType(10, 2)
    assert parsed.fields[0].nullable is False
    assert parsed.fields[0].metadata == {"comment": "money"}
    assert parsed.fields[1].dataType == ArrayType(StringType())
    assert parsed.fields[2].dataType == MapType(StringType(), ArrayType(IntegerType()))
    assert parsed.fields[3].dataType == StructType(
        [StructField("x", DoubleType()), StructField("y", DoubleType())]
    )
    assert parse_ddl("struct<a: int>") == StructType([StructField("a", IntegerType())])


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("", "empty DDL"),
        ("a", "unexpected end"),
        ("a INT,", "unexpected end"),
        ("a INTT", "unknown type 'INTT'"),
        ("a ARRAY<INT", "expected '>'"),
        ("a INT b INT", "unexpected 'b' at position 6"),
        ("a DECIMAL(x)", "expected a number"),
    ],
)
def test_errors_say_where(ddl: str, message: str) -> None:
    with pytest.raises(SchemaParseError, match=message):
        parse_ddl(ddl)


def test_to_struct_type_and_arrow() -> None:
    struct = StructType([StructField("a", LongType())])
    assert to_struct_type(struct, what="x") is struct
    assert to_struct_type(pa.schema([("a", pa.int64())]), what="x") == struct
    assert to_arrow(parse_ddl("a BIGINT, s STRING")) == pa.schema([("a", pa.int64()), ("s", pa.string())])
    with pytest.raises(TypeError, match="output must be a StructType or a DDL string, not int"):
        to_struct_type(5, what="output")
