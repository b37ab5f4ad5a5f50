"""The vectorized API (``api="arrow"``) on a real RocksDB store: same state as the per-key APIs, docs'
examples against plain-Python models, bulk state and timers, and the errors a user gets."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from processor_helpers import run
from pyspark.sql import Row

from blobstate.demo.running_count import ArrowRunningCount, RowRunningCount, RunningCount
from blobstate.processor import (
    ArrowStatefulProcessor,
    RunSpec,
    StatefulProcessor,
    StateVariableError,
    run_partition,
)
from blobstate.processor.errors import ImplicitKeyError, OutputSchemaError
from blobstate.state.store import RocksStateStore

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ARROW_API.md"
OUTPUT = "key STRING, count BIGINT, total BIGINT"


def docs_namespace() -> dict[str, Any]:
    """The processors of every Python block of docs/ARROW_API.md, as written, in one namespace: each block
    up to where it starts Spark to run its processor (tests/test_docs.py runs the blocks whole)."""
    namespace: dict[str, Any] = {}
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 3
    for block in blocks:
        definitions = block.split("\nspark = SparkSession", 1)[0]
        assert definitions != block, "an ARROW_API example no longer starts its session as `spark = ...`"
        exec(compile(definitions, str(DOCS), "exec"), namespace)
    return namespace


def random_batches(seed: int, batches: int, events: int, keys: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        idx = rng.integers(0, keys, events)
        out.append(pa.table({"key": [f"k{i}" for i in idx], "value": rng.integers(-50, 1000, events)}))
    return out


def running_count_model(batches: list[pa.Table]) -> list[dict[str, tuple[int, int]]]:
    state: dict[str, tuple[int, int]] = {}
    per_batch = []
    for table in batches:
        touched = {}
        for key, value in zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True):
            count, total = state.get(key, (0, 0))
            state[key] = touched[key] = (count + 1, total + value)
        per_batch.append(touched)
    return per_batch


def as_dict(rows: list[dict[str, Any]]) -> dict[Any, tuple[int, int]]:
    return {r["key"]: (r["count"], r["total"]) for r in rows}


def test_arrow_running_count_writes_byte_for_byte_the_state_of_the_row_api(tmp_path: Path) -> None:
    batches = random_batches(1, 4, 3000, 800)
    expected = running_count_model(batches)
    arrow_store = RocksStateStore.open(tmp_path / "arrow")
    row_store = RocksStateStore.open(tmp_path / "row")
    for i, table in enumerate(batches):
        ours = run(
            ArrowRunningCount(), arrow_store, table, key_columns=["key"], output_schema=OUTPUT, api="arrow"
        )
        run(RowRunningCount(), row_store, table, key_columns=["key"], output_schema=OUTPUT, api="row")
        assert as_dict(ours) == expected[i]
        assert len(ours) == len(expected[i])
        assert sorted(arrow_store.take_changelog()) == sorted(row_store.take_changelog())
    for cf in ("agg", "$meta"):
        assert list(arrow_store.items(cf)) == list(row_store.items(cf))


def test_one_checkpoint_can_switch_between_the_arrow_row_and_pandas_apis(store: RocksStateStore) -> None:
    batches = random_batches(2, 6, 500, 120)
    expected = running_count_model(batches)
    runners = [
        (ArrowRunningCount, "arrow"),
        (RowRunningCount, "row"),
        (ArrowRunningCount, "arrow"),
        (RunningCount, "pandas"),
        (ArrowRunningCount, "arrow"),
        (RowRunningCount, "row"),
    ]
    for i, (table, (processor, api)) in enumerate(zip(batches, runners, strict=True)):
        rows = run(processor(), store, table, key_columns=["key"], output_schema=OUTPUT, api=api)
        assert as_dict(rows) == expected[i], f"batch {i} ({api})"


def test_keys_of_every_vectorized_type_encode_as_the_per_key_codec_does(store: RocksStateStore) -> None:
    """Null, empty, NUL-bearing and non-ASCII strings; ints of every width; floats with -0.0 and NaN;
    bools; a date (the per-row fallback); two-column keys."""
    import datetime as dt

    from blobstate.encoding import codec
    from blobstate.processor.columnar import encode_keys

    table = pa.table(
        {
            "s": pa.array(["a", None, "", "x\x00y", "ü", "a"]),
            "i8": pa.array([1, -1, None, 127, -128, 0], pa.int8()),
            "i64": pa.array([0, -(2**63), 2**63 - 1, None, 5, -5], pa.int64()),
            "f": pa.array([0.0, -0.0, float("nan"), None, -1.5, float("inf")]),
            "f32": pa.array([1.5, -2.25, None, 0.0, -0.0, 3.0], pa.float32()),
            "b": pa.array([True, False, None, True, False, True]),
            "d": pa.array([dt.date(2024, 1, 1), None, dt.date(1960, 5, 6), dt.date(2024, 1, 1), None, None]),
        }
    )
    for columns in (["s"], ["i8"], ["i64"], ["f"], ["f32"], ["b"], ["d"], ["s", "i64"], ["b", "f", "s"]):
        keys = table.select(columns)
        expected = [codec.encode_key(tuple(row[c] for c in columns)) for row in keys.to_pylist()]
        assert encode_keys(keys) == expected, columns


def test_value_columns_round_trip_nulls_and_types_and_match_the_per_row_codec() -> None:
    from pyspark.sql.types import StructType

    from blobstate.encoding.values import StateCodec
    from blobstate.processor.columnar import ValueColumns
    from blobstate.processor.schema import to_arrow, to_struct_type

    schemas = {
        "fixed": "a BIGINT, b INT, c DOUBLE, d BOOLEAN, e TINYINT, f SMALLINT, g FLOAT, h BIGINT, i INT",
        "text": "name STRING, n BIGINT",
    }
    rows = {
        "fixed": [(1, 2, 0.5, True, 3, 4, 1.5, -9, 7), (None, -1, None, False, None, 0, None, 2**40, None)],
        "text": [("x", 1), (None, None)],
    }
    for kind, ddl in schemas.items():
        schema: StructType = to_struct_type(ddl, what="test schema")
        per_row = StateCodec("v", schema)
        columns = ValueColumns(per_row, schema, to_arrow(schema))
        assert columns.vectorized == (kind == "fixed")
        table = pa.Table.from_pylist(
            [dict(zip(schema.names, r, strict=True)) for r in rows[kind]], to_arrow(schema)
        )
        encoded = columns.encode(table, None, ["k0", "k1"])
        assert encoded == [per_row.encode(r, None) for r in rows[kind]]
        decoded = columns.decode([encoded[0], None, encoded[1]], 0, [b"a", b"b", b"c"])
        assert decoded.to_pylist()[0] == table.to_pylist()[0]
        assert decoded.to_pylist()[1] == dict.fromkeys(schema.names)
        assert decoded.to_pylist()[2] == table.to_pylist()[1]


def test_a_corrupt_stored_value_is_refused_naming_the_variable(store: RocksStateStore) -> None:
    from blobstate.encoding.values import ValueFormatError

    table = pa.table({"key": ["a", "b"], "value": [1, 2]})
    run(ArrowRunningCount(), store, table, key_columns=["key"], output_schema=OUTPUT, api="arrow")
    good = store.get("agg", b"\x06a\x00\x00")
    assert good is not None
    store.put("agg", b"\x06b\x00\x00", good[:-3])  # truncated
    with pytest.raises(ValueFormatError, match="agg"):
        run(ArrowRunningCount(), store, table, key_columns=["key"], output_schema=OUTPUT, api="arrow")


def test_the_docs_running_count_runs_as_written(store: RocksStateStore) -> None:
    running_count = docs_namespace()["RunningCount"]
    batches = random_batches(3, 3, 400, 50)
    expected = running_count_model(batches)
    for i, table in enumerate(batches):
        rows = run(running_count(), store, table, key_columns=["key"], output_schema=OUTPUT, api="arrow")
        assert as_dict(rows) == expected[i]


SESSIONS = "user STRING, start_ms BIGINT, end_ms BIGINT, events BIGINT"


def test_the_docs_sessionizer_closes_sessions_as_a_plain_model_does(store: RocksStateStore) -> None:
    """Processing-time sessions with a 1000 ms gap over batches 400 ms apart, some users idle."""
    sessions = docs_namespace()["Sessions"]
    gap = 1000
    rng = np.random.default_rng(4)
    open_sessions: dict[str, list[int]] = {}  # user -> [start, events, timer]
    for b in range(12):
        now = 10_000 + 400 * b
        users = [f"u{i}" for i in rng.integers(0, 8, int(rng.integers(0, 6)))] if b < 9 else []
        table = pa.table({"user": pa.array(users, pa.string()), "n": pa.array(range(len(users)), pa.int64())})
        expected = []
        for user in users:
            s = open_sessions.setdefault(user, [now, 0, 0])
            s[1] += 1
            s[2] = now + gap
        for user, (start, events, timer) in sorted(open_sessions.items(), key=lambda kv: (kv[1][2], kv[0])):
            if timer <= now:
                expected.append({"user": user, "start_ms": start, "end_ms": timer, "events": events})
        for row in expected:
            del open_sessions[row["user"]]
        rows = run(
            sessions(gap_ms=gap),
            store,
            table if users else None,
            key_columns=["user"],
            output_schema=SESSIONS,
            time_mode="ProcessingTime",
            batch_timestamp_ms=now,
            api="arrow",
        )
        assert sorted(rows, key=lambda r: r["user"]) == sorted(expected, key=lambda r: r["user"]), (
            f"batch {b}"
        )
    assert not open_sessions


def test_the_docs_top_n_keeps_the_three_highest_scores_per_player(store: RocksStateStore) -> None:
    top_three = docs_namespace()["TopThree"]
    rng = np.random.default_rng(5)
    seen: dict[str, list[int]] = defaultdict(list)
    for _ in range(5):
        players = [f"p{i}" for i in rng.integers(0, 20, 60)]
        scores = rng.integers(0, 100, 60).tolist()
        for p, s in zip(players, scores, strict=True):
            seen[p].append(s)
        table = pa.table({"player": players, "score": pa.array(scores, pa.int64())})
        rows = run(
            top_three(),
            store,
            table,
            key_columns=["player"],
            output_schema="player STRING, top ARRAY<BIGINT>",
            api="arrow",
        )
        assert {r["player"]: r["top"] for r in rows} == {
            p: sorted(seen[p], reverse=True)[:3] for p in set(players)
        }
    # the lists are the per-key API's list state: a row-API processor reads the same top three
    everyone = pa.table({"player": sorted(seen), "score": pa.array([-1] * len(seen), pa.int64())})
    rows = run(
        ReadTop(),
        store,
        everyone,
        key_columns=["player"],
        output_schema="player STRING, top ARRAY<BIGINT>",
        api="row",
    )
    assert {r["player"]: r["top"] for r in rows} == {p: sorted(s, reverse=True)[:3] for p, s in seen.items()}


class ReadTop(StatefulProcessor):
    """Row API: each player's kept scores, as stored by the arrow API's TopThree."""

    def init(self, handle: Any) -> None:
        self.top = handle.getListState("top", "score BIGINT")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        yield Row(player=key[0], top=[s for (s,) in self.top.get()])


class Misuse(ArrowStatefulProcessor):
    def __init__(self, what: str) -> None:
        self.what = what

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("v", "n BIGINT")

    def handleInputBatch(self, batch: Any, timerValues: Any) -> Any:
        if self.what == "rows":
            self.state.update_many({"n": [1]})
        elif self.what == "column":
            self.state.update_many({"m": [1] * batch.num_keys})
        elif self.what == "overflow":
            self.state.update_many({"n": pa.array([1e30] * batch.num_keys, pa.float64())})
        elif self.what == "each":
            for _ in batch.each():
                self.state.get_many()
        elif self.what == "output":
            yield pa.table({"key": batch.keys["key"]})
        elif self.what == "frame":
            yield {"key": ["a"]}
        yield from ()


@pytest.mark.parametrize(
    ("what", "error", "text"),
    [
        ("rows", StateVariableError, "got 1 rows for 2 keys"),
        ("column", StateVariableError, r"lack column\(s\) \['n'\]"),
        ("overflow", StateVariableError, "column 'n'"),
        ("each", ImplicitKeyError, "bulk operations work on the keys"),
        ("output", OutputSchemaError, r"without output column\(s\) \['count'"),
        ("frame", OutputSchemaError, "must yield pyarrow Tables or RecordBatches"),
    ],
)
def test_misuse_gets_an_error_naming_what_is_wrong(
    store: RocksStateStore, what: str, error: type, text: str
) -> None:
    table = pa.table({"key": ["a", "b", "a"], "value": [1, 2, 3]})
    with pytest.raises(error, match=text):
        run(Misuse(what), store, table, key_columns=["key"], output_schema=OUTPUT, api="arrow")


def test_a_vectorized_processor_run_with_another_api_is_refused_and_vice_versa(
    store: RocksStateStore,
) -> None:
    table = pa.table({"key": ["a"], "value": [1]})
    with pytest.raises(TypeError, match="api='arrow'"):
        list(
            run_partition(
                ArrowRunningCount(), store, table, RunSpec(key_columns=["key"], output_schema=OUTPUT)
            )
        )
    with pytest.raises(TypeError, match="ArrowStatefulProcessor"):
        list(
            run_partition(
                RunningCount(), store, table, RunSpec(key_columns=["key"], output_schema=OUTPUT, api="arrow")
            )
        )


class TimerPerKey(ArrowStatefulProcessor):
    """Registers two timers per key; expired timers report (key, expiry)."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputBatch(self, batch: Any, timerValues: Any) -> Any:
        now = timerValues.getCurrentProcessingTimeInMs()
        self.handle.registerTimers(now + 10)
        self.handle.registerTimers(
            pa.array([now + 20 if i % 2 == 0 else None for i in range(batch.num_keys)])
        )
        return []

    def handleExpiredTimers(self, timers: Any, timerValues: Any) -> Any:
        yield pa.table(
            {
                "key": timers.keys["key"],
                "count": timers.expiry_ms,
                "total": pa.array([len(timers)] * len(timers)),
            }
        )


def test_bulk_timers_fire_once_each_with_a_key_once_per_call(store: RocksStateStore) -> None:
    table = pa.table({"key": ["a", "b", "c"], "value": [1, 2, 3]})
    kwargs = {"key_columns": ["key"], "output_schema": OUTPUT, "api": "arrow", "time_mode": "ProcessingTime"}
    assert run(TimerPerKey(), store, table, batch_timestamp_ms=100, **kwargs) == []
    fired = run(TimerPerKey(), store, None, batch_timestamp_ms=125, **kwargs)
    # a and c have timers at 110 and 120: two calls (three keys, then two); b only at 110
    assert sorted((r["key"], r["count"], r["total"]) for r in fired) == [
        ("a", 110, 3),
        ("a", 120, 2),
        ("b", 110, 3),
        ("c", 110, 3),
        ("c", 120, 2),
    ]
    assert run(TimerPerKey(), store, None, batch_timestamp_ms=200, **kwargs) == []
    assert list(store.items("$timers")) == []


def test_nulls_in_a_not_null_output_column_are_refused_naming_it(store: RocksStateStore) -> None:
    table = pa.table({"key": pa.array(["a", None], pa.string()), "value": [1, 2]})
    with pytest.raises(OutputSchemaError, match=r"nulls in output column\(s\) \['key'\], which are NOT NULL"):
        run(
            ArrowRunningCount(),
            store,
            table,
            key_columns=["key"],
            output_schema="key STRING NOT NULL, count BIGINT, total BIGINT",
            api="arrow",
        )
