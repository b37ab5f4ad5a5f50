"""The rows of one partition at one version (the executor side of the state reader)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.types import StructType

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
                    yield key, ts, partition
                return
            var = declarations(rocks, where=checkpoint.describe(operator, partition)).get(state_var)
            if var is None:  # not declared in this partition: it holds none of it
                return
            expected = row_schema(key_type, var).fieldNames()
            if expected != schema.fieldNames():
                raise StateReadError(
                    f"state variable {state_var!r} of partition {partition} at version {version} of {url} is"
                    f" {var.kind} state{' with a TTL' if var.ttl else ''}, read as columns {expected}; the"
                    f" schema given has columns {schema.fieldNames()}"
                )
            ttl = var.ttl
            for entry in entries(rocks, var, arity):
                yield (*entry, partition) if ttl else (*entry[:-1], partition)
