"""Output: DataFrames checked against the output schema, converted as Spark converts them, batched."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from processor_helpers import run, shows_no_cause, table

from blobstate.processor import (
    OutputSchemaError,
    RunSpec,
    StatefulProcessor,
    StatefulProcessorError,
    run_partition,
)


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
    with pytest.raises(OutputSchemaError) as raised:
        go(store, lambda k: iter([pd.DataFrame({"key": [k[0]]})]))
    assert str(raised.value) == (
        "handleInputRows for grouping key ('a',) yielded a DataFrame with missing column(s) ['n'];"
        " the output schema is (key string, n bigint)"
    )
    with pytest.raises(
        OutputSchemaError, match=r"\('a',\) yielded a DataFrame with unexpected column\(s\) \['extra'\]"
    ):
        go(store, lambda k: iter([pd.DataFrame({"key": [k[0]], "n": [1], "extra": [2]})]))
    with pytest.raises(OutputSchemaError, match=r"duplicated column\(s\) \['n'\]"):
        go(store, lambda k: iter([pd.DataFrame([[k[0], 1, 2]], columns=["key", "n", "n"])]))


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


KEYS = table(key=[f"k{i:02d}" for i in range(50)], value=list(range(50)))
"""Fifty keys: a misfit yielded for ``k37`` must be traced back to that key among the others."""


class EmitsFor(StatefulProcessor):
    """Yields ``good`` in column ``col`` for every key but ``k37``, which gets ``bad``. Every third key
    yields its columns in another order, so a flush holds several runs of frames."""

    def __init__(self, col: str, good: Any, bad: Any) -> None:
        self.col, self.good, self.bad = col, good, bad

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        value = self.bad if key[0] == "k37" else self.good
        columns = {"key": [key[0]], self.col: [value]}
        if int(key[0][1:]) % 3 == 0:
            columns = dict(reversed(columns.items()))
        yield pd.DataFrame(columns)


MISFITS = [
    ("n BIGINT", 1, "not a number", "output column 'n' (bigint) cannot hold 'not a number' (str)"),
    ("n BIGINT", 1.0, 1.5, "output column 'n' (bigint) cannot hold 1.5 (float): not a whole number"),
    (
        "n INT",
        np.int64(7),
        np.int64(2**40),
        "output column 'n' (int) cannot hold 1099511627776 (int): out of range -2147483648..2147483647",
    ),
    (
        "n BIGINT",
        1,
        2**70,
        "output column 'n' (bigint) cannot hold 1180591620717411303424 (int): out of range"
        " -9223372036854775808..9223372036854775807",
    ),
    (
        "n BIGINT NOT NULL",
        1,
        None,
        "output column 'n' (bigint NOT NULL) cannot hold None: the column is NOT NULL",
    ),
    (
        "n DOUBLE NOT NULL",
        0.5,
        float("nan"),
        "output column 'n' (double NOT NULL) cannot hold nan (float): the column is NOT NULL",
    ),
    (
        "n TIMESTAMP",
        pd.Timestamp("2024-01-01"),
        "yesterday",
        "output column 'n' (timestamp) cannot hold 'yesterday' (str)",
    ),
    ("n ARRAY<INT>", [1, 2], [1, "two"], "output column 'n' (array<int>) cannot hold [1, 'two'] (list)"),
    ("n ARRAY<INT>", [1, 2], 3, "output column 'n' (array<int>) cannot hold 3 (int)"),
    (
        "n STRUCT<x: INT, y: STRING>",
        {"x": 1, "y": "a"},
        5,
        "output column 'n' (struct<x:int,y:string>) cannot hold 5 (int)",
    ),
    (
        "n STRUCT<x: INT NOT NULL>",
        {"x": 1},
        {"x": None},
        "output column 'n' (struct<x:int>) cannot hold {'x': None} (dict)",
    ),
    ("n MAP<STRING, INT>", {"a": 1}, [1, 2], "output column 'n' (map<string,int>) cannot hold [1, 2] (list)"),
    ("n STRING", "s", 5, "output column 'n' (string) cannot hold 5 (int)"),
    ("n BOOLEAN", True, "yes", "output column 'n' (boolean) cannot hold 'yes' (str)"),
]


@pytest.mark.parametrize("flush_rows", [65_536, 7])
@pytest.mark.parametrize(
    ("column", "good", "bad", "message"), MISFITS, ids=[m[0] + repr(m[2]) for m in MISFITS]
)
def test_a_value_that_does_not_fit_names_column_type_value_and_key(
    store: Any, column: str, good: Any, bad: Any, message: str, flush_rows: int
) -> None:
    with pytest.raises(OutputSchemaError) as raised:
        run(
            EmitsFor("n", good, bad),
            store,
            KEYS,
            output_schema=f"key STRING, {column}",
            flush_rows=flush_rows,
        )
    assert str(raised.value) == (
        f"{message}, yielded by handleInputRows for grouping key ('k37',); yield a value of that type"
        " or change the output schema"
    )
    assert shows_no_cause(raised.value)  # no pyarrow traceback below the message
    assert "spark.sql" not in str(raised.value)


def test_a_long_value_is_shortened_in_the_message(store: Any) -> None:
    with pytest.raises(OutputSchemaError) as raised:
        run(EmitsFor("n", 1, "z" * 500), store, KEYS, output_schema="key STRING, n BIGINT")
    assert f"cannot hold '{'z' * 76}... (str), yielded by handleInputRows for grouping key ('k37',)" in str(
        raised.value
    )


def test_a_misfit_from_a_timer_names_the_timer_handler(store: Any) -> None:
    class TimerEmits(StatefulProcessor):
        def init(self, handle):
            self.handle = handle

        def handleInputRows(self, key, rows, timerValues):
            self.handle.registerTimer(5)
            return iter([])

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            yield pd.DataFrame({"key": [key[0]], "n": ["late" if key[0] == "k37" else "1"]})

    with pytest.raises(
        OutputSchemaError,
        match=r"^output column 'n' \(bigint\) cannot hold 'late' \(str\), yielded"
        r" by handleExpiredTimer for grouping key \('k37',\);",
    ):
        run(
            TimerEmits(),
            store,
            KEYS,
            output_schema="key STRING, n BIGINT",
            time_mode="ProcessingTime",
            batch_timestamp_ms=10,
        )


def test_conversions_spark_accepts_still_convert(store: Any) -> None:
    schema = "key STRING, small INT, maybe BIGINT, parsed BIGINT, naive TIMESTAMP, aware TIMESTAMP, day DATE"

    def make(k):
        yield pd.DataFrame(
            {
                "key": [k[0]],
                "small": np.array([2**31 - 1], dtype=np.int64),  # int64 to int32 when in range
                "maybe": pd.array([pd.NA], dtype="Int64"),  # pandas NA to null
                "parsed": ["42"],  # a numeric string casts, as in Spark
                "naive": [pd.Timestamp("2024-01-01 10:00")],  # read in the session time zone
                "aware": [pd.Timestamp("2024-01-01 10:00", tz="Europe/Paris")],
                "day": ["2024-02-29"],
            }
        )

    rows = go(store, make, schema, timezone="Asia/Tokyo")
    utc = dt.UTC
    row = rows[0]
    assert {**row, "naive": row["naive"].astimezone(utc), "aware": row["aware"].astimezone(utc)} == {
        "key": "a",
        "small": 2**31 - 1,
        "maybe": None,
        "parsed": 42,
        "naive": dt.datetime(2024, 1, 1, 1, tzinfo=utc),  # 10:00 in Tokyo
        "aware": dt.datetime(2024, 1, 1, 9, tzinfo=utc),
        "day": dt.date(2024, 2, 29),
    }


def test_output_follows_the_declared_arrow_schema(store: Any) -> None:
    schema = pa.schema([pa.field("key", pa.string()), pa.field("n", pa.int64())])
    batches = list(
        run_partition(
            Emits(lambda k: iter([pd.DataFrame({"key": [k[0]], "n": [1]})])),
            store,
            DATA,
            RunSpec(key_columns=["key"], output_schema=schema),
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
            RunSpec(key_columns=["key"], output_schema="key STRING, n BIGINT", flush_rows=1000),
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
