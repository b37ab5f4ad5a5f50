"""Output: DataFrames checked against the output schema, converted as Spark converts them, batched."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from processor_helpers import run, table

from blobstate.processor import OutputSchemaError, StatefulProcessor, StatefulProcessorError, run_partition


class Emits(StatefulProcessor):
    """Returns ``make(key)`` from handleInputRows."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        return self.make(key)


DATA = table(key=["a", "b"], value=[1, 2])


def go(store: Any, make: Any, schema: Any = "key STRING, n BIGINT", **kw: Any) -> list:
    return run(Emits(make), store, DATA, output_schema=schema, **kw)


def test_missing_and_extra_columns_are_named(store: Any) -> None:
    with pytest.raises(OutputSchemaError, match=r"handleInputRows.*missing column\(s\) \['n'\]"):
        go(store, lambda k: iter([pd.DataFrame({"key": [k[0]]})]))
    with pytest.raises(OutputSchemaError, match=r"unexpected column\(s\) \['extra'\]"):
        go(store, lambda k: iter([pd.DataFrame({"key": [k[0]], "n": [1], "extra": [2]})]))


def test_columns_are_assigned_by_name_or_by_position(store: Any) -> None:
    assert go(store, lambda k: iter([pd.DataFrame({"n": [1], "key": [k[0]]})])) == [
        {"key": "a", "n": 1},
        {"key": "b", "n": 1},
    ]
    assert go(store, lambda k: iter([pd.DataFrame([[k[0], 2]])])) == [
        {"key": "a", "n": 2},
        {"key": "b", "n": 2},
    ]
    with pytest.raises(OutputSchemaError, match="3 unnamed column"):
        go(store, lambda k: iter([pd.DataFrame([[k[0], 2, 3]])]))


def test_handlers_must_return_iterators_of_dataframes(store: Any) -> None:
    with pytest.raises(StatefulProcessorError, match="handleInputRows returned None"):
        go(store, lambda k: None)
    with pytest.raises(StatefulProcessorError, match=r"returned a DataFrame.*yield"):
        go(store, lambda k: pd.DataFrame({"key": [k[0]], "n": [1]}))
    with pytest.raises(OutputSchemaError, match="yielded a dict"):
        go(store, lambda k: iter([{"key": k[0], "n": 1}]))


def test_empty_frames_and_no_output(store: Any) -> None:
    assert go(store, lambda k: iter([pd.DataFrame(), pd.DataFrame(columns=["key", "n"])])) == []
    assert go(store, lambda k: iter([])) == []


def test_values_are_converted_to_the_schema_types_as_spark_does(store: Any) -> None:
    schema = (
        "key STRING, small INT, ratio DOUBLE, flag BOOLEAN, day DATE, at TIMESTAMP_NTZ, tags ARRAY<STRING>"
    )

    def make(k):
        yield pd.DataFrame(
            {
                "key": [k[0]],
                "small": np.array([7], dtype=np.int64),
                "ratio": [float("nan")],
                "flag": [True],
                "day": [dt.date(2024, 2, 29)],
                "at": [pd.Timestamp("2024-01-01 10:00:00.123456")],
                "tags": [["x", "y"]],
            }
        )

    rows = go(store, make, schema)
    assert rows[0] == {
        "key": "a",
        "small": 7,
        "ratio": None,  # Spark turns NaN into null on the way to Arrow
        "flag": True,
        "day": dt.date(2024, 2, 29),
        "at": dt.datetime(2024, 1, 1, 10, 0, 0, 123456),
        "tags": ["x", "y"],
    }


def test_unsafe_conversions_fail_with_the_column_name(store: Any) -> None:
    with pytest.raises(OutputSchemaError, match="'small'"):
        go(store, lambda k: iter([pd.DataFrame({"key": [k[0]], "small": [2**40]})]), "key STRING, small INT")
    with pytest.raises(OutputSchemaError, match="'n'"):
        go(store, lambda k: iter([pd.DataFrame({"key": [k[0]], "n": ["not a number"]})]))


def test_output_follows_the_declared_arrow_schema(store: Any) -> None:
    schema = pa.schema([pa.field("key", pa.string()), pa.field("n", pa.int64())])
    batches = list(
        run_partition(
            Emits(lambda k: iter([pd.DataFrame({"key": [k[0]], "n": [1]})])),
            store,
            DATA,
            key_columns=["key"],
            output_schema=schema,
        )
    )
    assert [b.schema for b in batches] == [schema]


def test_many_frames_are_emitted_in_order_in_bounded_batches(store: Any) -> None:
    n = 2_500
    data = table(key=[f"k{i:05d}" for i in range(n)], value=list(range(n)))

    def make(k):
        i = int(k[0][1:])
        if i % 7 == 0:  # a second layout (other column order, float values) now and then
            yield pd.DataFrame({"n": [float(i)], "key": [k[0]]})
        else:
            yield pd.DataFrame({"key": [k[0], k[0]], "n": [i, -i]})

    batches = list(
        run_partition(
            Emits(make),
            store,
            data,
            key_columns=["key"],
            output_schema="key STRING, n BIGINT",
            flush_rows=1000,
        )
    )
    assert all(b.num_rows <= 1000 + 2 for b in batches) and len(batches) > 3
    got = pa.Table.from_batches(batches).to_pylist()
    expected = []
    for i in range(n):
        key = f"k{i:05d}"
        expected += [{"key": key, "n": i}] if i % 7 == 0 else [{"key": key, "n": i}, {"key": key, "n": -i}]
    assert got == expected


def test_string_and_timestamp_columns_of_many_frames(store: Any) -> None:
    n = 300
    data = table(key=[f"k{i:03d}" for i in range(n)], value=list(range(n)))

    def make(k):
        i = int(k[0][1:])
        yield pd.DataFrame(
            {
                "key": [k[0]],
                "label": [None if i % 5 == 0 else f"label-{i}"],
                "at": [pd.Timestamp("2024-01-01") + pd.Timedelta(seconds=i)],
            }
        )

    rows = run(Emits(make), store, data, output_schema="key STRING, label STRING, at TIMESTAMP_NTZ")
    assert len(rows) == n
    assert rows[5] == {"key": "k005", "label": None, "at": dt.datetime(2024, 1, 1, 0, 0, 5)}
    assert rows[7]["label"] == "label-7"
