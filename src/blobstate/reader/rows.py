"""The rows of one partition at one version (the executor side of the state reader)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.types import ArrayType, DataType, StructType, TimestampNTZType, TimestampType

from blobstate.blobstore import open_blob_store
from blobstate.reader.checkpoint import open_version, restored_partition
from blobstate.reader.schema import KEY, row_schema
from blobstate.reader.variables import TIMERS, StateReadError, declarations, entries, timers


def partition_rows(
    url: str, version: int, operator: str, partition: int, state_var: str, schema: StructType
) -> Iterator[tuple[Any, ...]]:
    """Restore ``partition`` at ``version`` into a temporary directory and yield its rows of ``state_var``
    (or of the timers), laid out as ``schema`` (:func:`blobstate.reader.schema.row_schema`)."""
    key_type = schema[KEY].dataType
    assert isinstance(key_type, StructType)
    arity = len(key_type.fields)
    with open_blob_store(url) as store:
        checkpoint = open_version(store, version)
        with restored_partition(store, checkpoint, operator, partition) as rocks:
            if state_var == TIMERS:
                for key, ts in timers(rocks, arity):
                    yield spark_value(key, key_type), ts, partition
                return
            var = declarations(rocks, where=checkpoint.describe(operator, partition)).get(state_var)
            if var is None:  # not declared in this partition: it holds none of it
                return
            expected = row_schema(key_type, var).fieldNames()
            if expected != schema.fieldNames():
                raise StateReadError(
                    f"state variable {state_var!r} of partition {partition} at version {version} of"
                    f" {store.url} is {var.kind} state{' with a TTL' if var.ttl else ''}, read as columns"
                    f" {expected}; the schema given has columns {schema.fieldNames()}"
                )
            ttl = var.ttl
            for entry in entries(rocks, var, arity):
                row = (spark_value(entry[0], key_type), *entry[1:])
                yield (*row, partition) if ttl else (*row[:-1], partition)


def spark_value(value: Any, dtype: DataType) -> Any:
    """A decoded key as the data source hands it to Spark for ``dtype``: a TIMESTAMP as an aware UTC
    datetime (a stored instant is its naive UTC reading), a TIMESTAMP_NTZ as a naive one."""
    if value is None:
        return None
    if isinstance(dtype, TimestampType):
        ts = pd.Timestamp(value)
        return (ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")).to_pydatetime(warn=False)
    if isinstance(dtype, TimestampNTZType):
        ts = pd.Timestamp(value)
        return (ts if ts.tz is None else ts.tz_convert("UTC").tz_localize(None)).to_pydatetime(warn=False)
    if isinstance(dtype, StructType):
        return tuple(spark_value(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True))
    if isinstance(dtype, ArrayType):
        return [spark_value(v, dtype.elementType) for v in value]
    return value
