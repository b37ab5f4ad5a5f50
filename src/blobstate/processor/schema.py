"""Schemas given as ``StructType``, DDL strings or Arrow schemas, parsed without a JVM.

PySpark parses DDL strings through the JVM; a Python worker has none, so this module parses the
DDL subset that state and output schemas use: ``name TYPE [NOT NULL] [COMMENT '...']`` (or
``name: TYPE``) separated by commas, with the Spark SQL type names, ``decimal(p, s)``,
``char(n)``/``varchar(n)``, ``array<T>``, ``map<K, V>``, ``struct<...>`` and backquoted names.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
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

from blobstate.errors import ConfigurationError


class SchemaParseError(ConfigurationError, ValueError):
    """A DDL string could not be parsed; the message shows where."""


_SIMPLE: dict[str, type[DataType]] = {
    "boolean": BooleanType,
    "bool": BooleanType,
    "tinyint": ByteType,
    "byte": ByteType,
    "smallint": ShortType,
    "short": ShortType,
    "int": IntegerType,
    "integer": IntegerType,
    "bigint": LongType,
    "long": LongType,
    "float": FloatType,
    "real": FloatType,
    "double": DoubleType,
    "string": StringType,
    "binary": BinaryType,
    "date": DateType,
    "timestamp": TimestampType,
    "timestamp_ltz": TimestampType,
    "timestamp_ntz": TimestampNTZType,
}

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*')|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(.))")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                break
            kind = "quoted" if m.group(1) else "string" if m.group(2) else "ident" if m.group(3) else None
            kind = kind or ("number" if m.group(4) else "punct")
            value = m.group(m.lastindex or 0)
            if kind == "quoted":
                value = value[1:-1].replace("``", "`")
            if value.strip():
                self.tokens.append((kind, value, m.start(m.lastindex or 0)))
            pos = m.end()
        self.i = 0

    def error(self, message: str) -> SchemaParseError:
        where = self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text)
        return SchemaParseError(f"{message} at position {where} of DDL {self.text!r}")

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end")
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        if self.peek() is None:
            raise self.error(f"expected {value!r}, found the end")
        tok = self.next()
        if tok[1].lower() != value:
            self.i -= 1
            raise self.error(f"expected {value!r}, found {tok[1]!r}")

    def accept(self, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] != "quoted" and tok[1].lower() == value:
            self.i += 1
            return True
        return False

    def number(self) -> int:
        kind, value, _ = self.next()
        if kind != "number":
            self.i -= 1
            raise self.error(f"expected a number, found {value!r}")
        return int(value)

    def data_type(self) -> DataType:
        kind, value, _ = self.next()
        if kind != "ident":
            self.i -= 1
            raise self.error(f"expected a type name, found {value!r}")
        name = value.lower()
        if name in _SIMPLE:
            return _SIMPLE[name]()
        if name in ("decimal", "dec", "numeric"):
            if self.accept("("):
                precision = self.number()
                scale = self.number() if self.accept(",") else 0
                self.expect(")")
                return DecimalType(precision, scale)
            return DecimalType(10, 0)
        if name in ("char", "character", "varchar"):
            self.expect("(")
            length = self.number()
            self.expect(")")
            return VarcharType(length) if name == "varchar" else CharType(length)
        if name == "array":
            self.expect("<")
            element = self.data_type()
            self.expect(">")
            return ArrayType(element, True)
        if name == "map":
            self.expect("<")
            key = self.data_type()
            self.expect(",")
            value_type = self.data_type()
            self.expect(">")
            return MapType(key, value_type, True)
        if name == "struct":
            self.expect("<")
            fields = [] if self.accept(">") else self.fields(closing=">")
            if fields:
                self.expect(">")
            return StructType(fields)
        if name == "interval":
            return DayTimeIntervalType()
        self.i -= 1
        raise self.error(f"unknown type {value!r}")

    def field(self) -> StructField:
        kind, name, _ = self.next()
        if kind not in ("ident", "quoted"):
            self.i -= 1
            raise self.error(f"expected a field name, found {name!r}")
        self.accept(":")
        data_type = self.data_type()
        nullable = True
        metadata: dict[str, Any] = {}
        while True:
            if self.accept("not"):
                self.expect("null")
                nullable = False
            elif self.accept("comment"):
                kind, text, _ = self.next()
                if kind != "string":
                    self.i -= 1
                    raise self.error("expected a quoted comment")
                metadata["comment"] = text[1:-1]
            else:
                break
        return StructField(name, data_type, nullable, metadata or None)

    def fields(self, closing: str | None = None) -> list[StructField]:
        fields = [self.field()]
        while self.accept(","):
            fields.append(self.field())
        tok = self.peek()
        if tok is not None and (closing is None or tok[1] != closing):
            raise self.error(f"unexpected {tok[1]!r}")
        return fields


def parse_ddl(text: str) -> StructType:
    """Parse a DDL schema string such as ``"count BIGINT, sum DOUBLE"`` into a StructType."""
    parser = _Parser(text)
    if parser.peek() is None:
        raise SchemaParseError(f"empty DDL schema {text!r}")
    tokens = parser.tokens
    if len(tokens) > 1 and tokens[0][1].lower() == "struct" and tokens[1][1] == "<":
        result = parser.data_type()
        rest = parser.peek()
        if rest is not None:
            raise parser.error(f"unexpected {rest[1]!r}")
        assert isinstance(result, StructType)
        return result
    return StructType(parser.fields())


def to_struct_type(schema: Any, *, what: str) -> StructType:
    """Accept a StructType, a DDL string or a pyarrow Schema; ``what`` names the schema in errors."""
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        try:
            return parse_ddl(schema)
        except SchemaParseError as e:
            raise SchemaParseError(f"{what}: {e}") from None
    if isinstance(schema, pa.Schema):
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(schema)
    raise TypeError(f"{what} must be a StructType or a DDL string, not {type(schema).__name__}")


def to_arrow(schema: StructType, timezone: str = "UTC") -> pa.Schema:
    """The Arrow schema Spark uses for ``schema`` (no JVM needed)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone=timezone)
