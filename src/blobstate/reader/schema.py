"""The Spark schema of the rows the state reader returns, from the recorded state variable schemas.

Columns follow Spark's state reader (``format("statestore")``) for ``transformWithState``:

- value state: ``key`` (struct of the grouping key), ``value`` (struct), ``partition_id``;
- list state, one row per element: ``key``, ``list_element``, ``partition_id``;
- map state, one row per entry: ``key``, ``user_map_key``, ``user_map_value``, ``partition_id``;
- timers, one row per registered timer: ``key``, ``expiration_timestamp_ms``, ``partition_id``.

A variable declared with a TTL has ``expiration_timestamp_ms`` (epoch ms) before ``partition_id``.
The grouping key's types come from the operator's ``key_schema`` in ``metadata.json`` when the
checkpoint records one, otherwise from the types of the stored keys (the key encoding is tagged: an int
is an int, a string a string).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from blobstate.encoding.codec import Key
from blobstate.reader.variables import StateVariable

KEY = "key"
PARTITION_ID = "partition_id"
EXPIRATION = "expiration_timestamp_ms"
VALUE = "value"
LIST_ELEMENT = "list_element"
USER_MAP_KEY = "user_map_key"
USER_MAP_VALUE = "user_map_value"


def python_type(value: Any) -> DataType | None:
    """The Spark type of a decoded key component (None for a null, which says nothing)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    if isinstance(value, str):
        return StringType()
    if isinstance(value, bytes):
        return BinaryType()
    if isinstance(value, _dt.datetime):
        return TimestampType() if value.tzinfo is not None else TimestampNTZType()
    if isinstance(value, _dt.date):
        return DateType()
    if isinstance(value, _dt.timedelta):
        return DayTimeIntervalType()
    if isinstance(value, Decimal):
        return DecimalType(38, 18)
    return StringType()


def infer_key_schema(names: Sequence[str], keys: Iterable[Key]) -> StructType:
    """A struct of the key columns typed by the first non-null value of each in ``keys`` (string if none)."""
    types: list[DataType | None] = [None] * len(names)
    for key in keys:
        for i, v in enumerate(key):
            if types[i] is None:
                types[i] = python_type(v)
        if all(t is not None for t in types):
            break
    return StructType([StructField(n, t or StringType(), True) for n, t in zip(names, types, strict=True)])


def row_schema(key_schema: StructType, var: StateVariable | None) -> StructType:
    """The rows' schema for ``var`` (None: the timers)."""
    fields = [StructField(KEY, key_schema, False)]
    if var is None:
        fields.append(StructField(EXPIRATION, LongType(), False))
    else:
        if var.kind == "value":
            fields.append(StructField(VALUE, var.value_type(), True))
        elif var.kind == "list":
            fields.append(StructField(LIST_ELEMENT, var.value_type(), True))
        else:
            user_key = var.user_key_type()
            assert user_key is not None  # parse_declaration requires one of a map
            fields.append(StructField(USER_MAP_KEY, user_key, False))
            fields.append(StructField(USER_MAP_VALUE, var.value_type(), True))
        if var.ttl:
            fields.append(StructField(EXPIRATION, LongType(), True))
    fields.append(StructField(PARTITION_ID, IntegerType(), False))
    return StructType(fields)
