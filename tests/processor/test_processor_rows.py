"""The row-based API (``api="row"``, Spark's ``transformWithState``): Rows in, Rows out, same state."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from processor_helpers import KEYED_ROWS, keyed_table, run, run_with_stats, shows_no_cause, table
from pyspark.sql import Row

from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, RowRunningCount, RunningCount
from blobstate.processor import OutputSchemaError, StatefulProcessor, StatefulProcessorError
from blobstate.state.store import RocksStateStore


class RowRecorder(StatefulProcessor):
    """Records each key with the Rows it got and each initial-state row; emits nothing."""

    def __init__(self) -> None:
        self.inputs: list[tuple[tuple, list[Row]]] = []
        self.initial: list[tuple[tuple, Row]] = []

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        self.inputs.append((key, list(rows)))
        return iter([])

    def handleInitialState(self, key: Any, initialState: Row, timerValues: Any) -> None:
        self.initial.append((key, initialState))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(KEYED_ROWS)
def test_every_key_once_in_ascending_order_with_all_its_rows_as_rows(
    store: Any, rows: list[tuple[Any, Any, int]]
) -> None:
    data = keyed_table(rows)
    recorder = RowRecorder()
    run(recorder, store, data, key_columns=["k1", "k2"], output_schema="v BIGINT", api="row")
    keys = [k for k, _ in recorder.inputs]
    assert len(keys) == len(set(keys))

    def order(k: tuple) -> tuple:
        return tuple((v is not None, v) for v in k)  # ascending, nulls first

    assert keys == sorted(keys, key=order)
    expected: dict[tuple, list[tuple]] = {}
    for r in rows:
        expected.setdefault((r[0], r[1]), []).append(r)
    for key, got in recorder.inputs:
        assert all(isinstance(r, Row) and list(r.__fields__) == ["k1", "k2", "v"] for r in got)
        assert sorted(tuple(r) for r in got) == sorted(expected[key])


def test_row_and_pandas_processors_keep_the_same_state(store_path: Any) -> None:
    batches = [
        table(key=["a", "b", "a"], value=[1, 2, 3]),
        table(key=["b", "c"], value=[10, -5]),
    ]
    outputs = {}
    for api, processor in (("pandas", RunningCount), ("row", RowRunningCount)):
        with RocksStateStore.open(store_path / api) as store:
            outputs[api] = [
                run(processor(), store, b, output_schema=RUNNING_COUNT_OUTPUT, api=api) for b in batches
            ]
    assert outputs["row"] == outputs["pandas"]
    assert sorted(outputs["row"][1], key=lambda r: r["key"]) == [
        {"key": "b", "count": 2, "total": 12},
        {"key": "c", "count": 1, "total": -5},
    ]


def test_initial_state_is_handed_over_one_row_at_a_time(store: Any) -> None:
    recorder = RowRecorder()
    initial = table(key=["b", "a", "b"], count=[1, 2, 3], total=[10, 20, 30])
    run(recorder, store, None, output_schema="v BIGINT", initial_state=initial, api="row")
    assert [(k, tuple(r)) for k, r in recorder.initial] == [
        (("a",), ("a", 2, 20)),
        (("b",), ("b", 1, 10)),
        (("b",), ("b", 3, 30)),
    ]


def test_row_based_initial_state_seeds_the_counters(store: Any) -> None:
    initial = table(key=["a", "a"], count=[1, 2], total=[5, 6])
    out = run(
        RowRunningCount(),
        store,
        table(key=["a"], value=[100]),
        output_schema=RUNNING_COUNT_OUTPUT,
        initial_state=initial,
        api="row",
    )
    assert out == [{"key": "a", "count": 4, "total": 111}]


class Yields(StatefulProcessor):
    """Yields whatever it was built with, once per key."""

    def __init__(self, item: Any) -> None:
        self.item = item

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        yield self.item


WHERE = "handleInputRows for grouping key ('a',)"
SCHEMA_TEXT = "(key string, n bigint)"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            ("a", 1),
            f"{WHERE} yielded a tuple; with the row-based API it must yield pyspark.sql.Row objects with"
            f" the output fields {SCHEMA_TEXT}",
        ),
        ({"key": "a"}, f"{WHERE} yielded a dict; with the row-based API"),
        (
            Row(key="a"),
            f"{WHERE} yielded a Row that lacks field(s) ['n'] (n bigint): Row(key='a') (Row); the output"
            f" schema is {SCHEMA_TEXT}",
        ),
        (
            Row("key", "n")("a"),
            f"{WHERE} yielded a Row that lacks field(s) ['n'] (n bigint): Row(key='a') (Row); the output"
            f" schema is {SCHEMA_TEXT}",
        ),
        (
            Row("a", 1),
            f"{WHERE} yielded <Row('a', 1)> (Row) without field names; build it as Row(name=value, ...)"
            f" with the output fields {SCHEMA_TEXT}",
        ),
    ],
)
def test_bad_output_rows_are_named(store: Any, item: Any, message: str) -> None:
    with pytest.raises(OutputSchemaError) as raised:
        run(Yields(item), store, table(key=["a"], value=[1]), output_schema="key STRING, n BIGINT", api="row")
    assert str(raised.value).startswith(message)


class YieldsFor(StatefulProcessor):
    """Yields ``Row(key=..., n=good)`` for every key but ``k37``, which gets ``Row(key=..., n=bad)``."""

    def __init__(self, good: Any, bad: Any) -> None:
        self.good, self.bad = good, bad

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Row]:
        yield Row(key=key[0], n=self.bad if key[0] == "k37" else self.good)


FIFTY_KEYS = table(key=[f"k{i:02d}" for i in range(50)], value=list(range(50)))

ROW_MISFITS = [
    ("n BIGINT", 1, "not a number", "output column 'n' (bigint) cannot hold 'not a number' (str)"),
    (
        "n INT",
        7,
        2**40,
        "output column 'n' (int) cannot hold 1099511627776 (int): out of range -2147483648..2147483647",
    ),
    (
        "n BIGINT NOT NULL",
        1,
        None,
        "output column 'n' (bigint NOT NULL) cannot hold None: the column is NOT NULL",
    ),
    (
        "n TIMESTAMP",
        dt.datetime(2024, 1, 1),
        "yesterday",
        "output column 'n' (timestamp) cannot hold 'yesterday' (str)",
    ),
    ("n ARRAY<INT>", [1], [1, "two"], "output column 'n' (array<int>) cannot hold [1, 'two'] (list)"),
    (
        "n STRUCT<x: INT, y: STRING>",
        Row(x=1, y="a"),
        5,
        "output column 'n' (struct<x:int,y:string>) cannot hold 5 (int)",
    ),
    (
        "n STRUCT<x: INT NOT NULL>",
        Row(x=1),
        Row(x=None),
        "output column 'n' (struct<x:int>) cannot hold {'x': None} (dict)",
    ),
]


@pytest.mark.parametrize("flush_rows", [65_536, 7])
@pytest.mark.parametrize(("column", "good", "bad", "message"), ROW_MISFITS, ids=[m[0] for m in ROW_MISFITS])
def test_a_value_that_does_not_fit_names_column_type_value_and_key(
    store: Any, column: str, good: Any, bad: Any, message: str, flush_rows: int
) -> None:
    with pytest.raises(OutputSchemaError) as raised:
        run(
            YieldsFor(good, bad),
            store,
            FIFTY_KEYS,
            output_schema=f"key STRING, {column}",
            api="row",
            flush_rows=flush_rows,
        )
    assert str(raised.value) == (
        f"{message}, yielded by handleInputRows for grouping key ('k37',); yield a value of that type"
        " or change the output schema"
    )
    assert shows_no_cause(raised.value)


def test_every_row_must_carry_every_output_field(store: Any) -> None:
    class SecondLacks(YieldsFor):
        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Row]:
            yield Row(key=key[0]) if key[0] == "k37" else Row(key=key[0], n=1)

    with pytest.raises(
        OutputSchemaError, match=r"^handleInputRows for grouping key \('k37',\) yielded a Row that"
    ):
        run(SecondLacks(1, 1), store, FIFTY_KEYS, output_schema="key STRING, n BIGINT", api="row")


def test_extra_fields_are_ignored_and_missing_nullable_fields_are_an_error(store: Any) -> None:
    out, stats = run_with_stats(
        Yields(Row(n=5, key="a", extra=1.5)),
        store,
        table(key=["a", "b"], value=[1, 2]),
        output_schema="key STRING, n BIGINT",
        api="row",
    )
    assert out == [{"key": "a", "n": 5}, {"key": "a", "n": 5}]
    assert stats.output_rows == 2


def test_returning_a_row_instead_of_yielding_it_is_named(store: Any) -> None:
    class ReturnsRow(Yields):
        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            return Row(key="a", n=1)

    with pytest.raises(StatefulProcessorError, match="returned a Row; it must return an iterator of Rows"):
        run(
            ReturnsRow(None),
            store,
            table(key=["a"], value=[1]),
            output_schema="key STRING, n BIGINT",
            api="row",
        )


def test_unknown_api_is_refused(store: Any) -> None:
    with pytest.raises(ValueError, match="api must be one of"):
        run(RowRecorder(), store, None, output_schema="v BIGINT", api="rows")
