"""The declarations a processor stores in ``$meta`` follow the stored-schema rules both ways: what it
writes reads back with :mod:`blobstate.stored_schema`, and what it reads at a restart goes through it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from processor_helpers import run, table
from pyspark.sql import types as T

from blobstate.encoding import layout
from blobstate.processor import StatefulProcessor
from blobstate.stored_schema import MAX_DEPTH, StoredSchemaError

OUTPUT = "key STRING, n BIGINT"


def nested_struct(levels: int) -> T.StructType:
    schema = T.StructType([T.StructField("v", T.LongType())])
    for _ in range(levels - 1):
        schema = T.StructType([T.StructField("s", schema)])
    return schema


class Declares(StatefulProcessor):
    """Declares value state ``s`` with the given schema and keeps a count in it when it is flat."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("s", self.schema)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import pandas as pd

        yield pd.DataFrame({"key": [key[0]], "n": [sum(len(r) for r in rows)]})


def test_a_declaration_that_would_not_read_back_is_refused_when_declared(store: Any) -> None:
    run(
        Declares(nested_struct(MAX_DEPTH)),
        store,
        table(key=["a"], v=[1]),
        output_schema="key STRING, n BIGINT",
    )
    with pytest.raises(StoredSchemaError) as caught:
        run(Declares(nested_struct(MAX_DEPTH + 1)), store, table(key=["a"], v=[1]), output_schema=OUTPUT)
    message = str(caught.value)
    assert message.startswith("invalid value schema of state variable 's' as declared: field 's.s.s")
    assert f"nests deeper than {MAX_DEPTH} levels" in message


@pytest.mark.parametrize(
    ("stored", "problem"),
    [
        (b"\x80\x04\x95", "not JSON (UnicodeDecodeError"),
        (json.dumps({"kind": "value", "ttl": False}).encode(), "field 'schema': missing"),
        (json.dumps({"kind": "value", "schema": "x", "ttl": False}).encode(), "expected a struct"),
    ],
)
def test_a_restart_reads_the_stored_declaration_with_the_stored_schema_parser(
    store: Any, stored: bytes, problem: str
) -> None:
    store.put(layout.META_CF, layout.meta_key("s"), stored)
    with pytest.raises(StoredSchemaError) as caught:
        run(Declares("v BIGINT"), store, table(key=["a"], v=[1]), output_schema=OUTPUT)
    message = str(caught.value)
    assert "state variable 's' in $meta of the partition's committed state" in message and problem in message
