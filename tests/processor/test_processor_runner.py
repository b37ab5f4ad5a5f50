"""The runner: grouping, the order of calls, late data, initial state, persistence across reopen."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processor_helpers import KEYED_ROWS, keyed_table, run, run_with_stats, table

from blobstate.processor import RunSpec, StatefulProcessor, grouping, run_partition
from blobstate.state.store import RocksStateStore


class Recorder(StatefulProcessor):
    """Records every key and the DataFrames it got; emits nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, list[pd.DataFrame]]] = []

    def init(self, handle):
        self.calls.append(("init", (), []))

    def handleInputRows(self, key, rows, timerValues):
        self.calls.append(("input", key, list(rows)))
        return iter([])

    def handleInitialState(self, key, initialState, timerValues):
        self.calls.append(("initial", key, [initialState]))

    def close(self):
        self.calls.append(("close", (), []))


def go(store: Any, processor: Any, data: Any, **kw: Any) -> Any:
    kw.setdefault("output_schema", "key STRING")
    return run_with_stats(processor, store, data, **kw)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(KEYED_ROWS, st.integers(1, 4))
def test_every_key_once_in_ascending_order_with_all_its_rows(
    store: Any, rows: list[tuple], max_rows: int
) -> None:
    data = keyed_table(rows)
    recorder = Recorder()
    run_with_stats(
        recorder, store, data, key_columns=["k1", "k2"], output_schema="k STRING", max_rows_per_frame=max_rows
    )
    inputs = [c for c in recorder.calls if c[0] == "input"]
    expected: dict[tuple, list[int]] = defaultdict(list)
    for k1, k2, v in rows:
        expected[(k1, k2)].append(v)
    # Spark's order: ascending, nulls first
    order = sorted(expected, key=lambda k: tuple((x is not None, x) for x in k))
    assert [c[1] for c in inputs] == order
    for _, key, frames in inputs:
        assert all(0 < len(f) <= max_rows for f in frames)
        assert all(isinstance(f.index, pd.RangeIndex) and f.index.start == 0 for f in frames)
        assert all(list(f.columns) == ["k1", "k2", "v"] for f in frames)
        got = [int(v) for f in frames for v in f["v"]]
        assert got == expected[key]  # input order within a key is kept


def test_calls_are_init_input_close(store: Any) -> None:
    recorder = Recorder()
    _, stats = go(store, recorder, table(key=["b", "a", "b"], v=[1, 2, 3]))
    assert [(c[0], c[1]) for c in recorder.calls] == [
        ("init", ()),
        ("input", ("a",)),
        ("input", ("b",)),
        ("close", ()),
    ]
    assert (stats.input_rows, stats.keys, stats.output_rows) == (3, 2, 0)


def test_empty_input_still_runs_init_timers_and_close(store: Any) -> None:
    recorder = Recorder()
    go(store, recorder, None)
    go(store, recorder, [])
    go(store, recorder, table(key=pa.array([], pa.string())))
    assert [c[0] for c in recorder.calls] == ["init", "close"] * 3


def test_input_as_record_batches_and_dtypes_like_spark(store: Any) -> None:
    batches = [
        pa.record_batch(
            {"key": ["a"], "small": pa.array([1], pa.int32()), "f": pa.array([0.5], pa.float32())}
        ),
        pa.record_batch(
            {"key": ["a"], "small": pa.array([2], pa.int32()), "f": pa.array([1.5], pa.float32())}
        ),
    ]
    recorder = Recorder()
    go(store, recorder, iter(batches))
    (frame,) = recorder.calls[1][2]
    # Spark's worker rebuilds rows, so small ints and floats arrive widened
    assert frame["small"].dtype == np.int64 and frame["f"].dtype == np.float64
    assert frame["small"].tolist() == [1, 2]


def test_frames_are_copies_on_write(store: Any) -> None:
    seen = []

    class Mutates(StatefulProcessor):
        def init(self, handle):
            pass

        def handleInputRows(self, key, rows, timerValues):
            for pdf in rows:
                pdf.loc[0, "v"] = -1
                seen.append(pdf)
            return iter([])

    data = table(key=["a", "a", "b"], v=[1, 2, 3])
    go(store, Mutates(), data)
    assert [f["v"].tolist() for f in seen] == [[-1, 2], [-1]]


def test_timestamps_and_keys_of_other_types(store: Any) -> None:
    recorder = Recorder()
    at = pa.array([dt.datetime(2024, 1, 1, 12)] * 2, pa.timestamp("us", tz="UTC"))
    data = pa.table({"day": pa.array([dt.date(2024, 1, 2), dt.date(2024, 1, 1)]), "at": at})
    go(store, recorder, data, key_columns=["day"])
    assert [c[1] for c in recorder.calls if c[0] == "input"] == [
        (dt.date(2024, 1, 1),),
        (dt.date(2024, 1, 2),),
    ]
    frame = recorder.calls[1][2][0]
    assert frame["at"].tolist() == [pd.Timestamp("2024-01-01 12:00")]  # Spark: naive, in the session zone


def test_event_time_drops_late_rows_and_reports_max_event_time(store: Any) -> None:
    recorder = Recorder()
    ms = [999, 1000, 1001, 5000]
    data = pa.table({"key": ["a", "b", "c", "d"], "ts": pa.array([v * 1000 for v in ms], pa.timestamp("us"))})
    max_event_time: list[int | None] = [None]
    _, stats = go(
        store,
        recorder,
        data,
        time_mode="EventTime",
        watermark_ms=2_000,
        late_watermark_ms=1_000,
        event_time_column="ts",
        max_event_time=max_event_time,
    )
    # rows at or before the late-events watermark are dropped (Spark: eventTime <= watermark)
    assert [c[1] for c in recorder.calls if c[0] == "input"] == [("c",), ("d",)]
    assert stats.late_rows_dropped == 2
    assert max_event_time == [5000] and stats.max_event_time_ms == 5000


def test_no_late_data_dropped_outside_event_time(store: Any) -> None:
    recorder = Recorder()
    data = pa.table({"key": ["a"], "ts": pa.array([0], pa.timestamp("ms"))})
    _, stats = go(
        store,
        recorder,
        data,
        time_mode="ProcessingTime",
        batch_timestamp_ms=1,
        watermark_ms=10,
        event_time_column="ts",
    )
    assert stats.late_rows_dropped == 0 and stats.keys == 1 and stats.max_event_time_ms == 0


def test_initial_state_runs_before_input(store: Any) -> None:
    recorder = Recorder()
    initial = table(id=["b", "c", "b"], seed=[1, 2, 3])
    _, stats = go(
        store,
        recorder,
        table(key=["a", "b"], v=[1, 2]),
        initial_state=initial,
        initial_state_key_columns=["id"],
    )
    assert [(c[0], c[1]) for c in recorder.calls] == [
        ("init", ()),
        ("initial", ("b",)),
        ("initial", ("c",)),
        ("input", ("a",)),
        ("input", ("b",)),
        ("close", ()),
    ]
    assert recorder.calls[1][2][0]["seed"].tolist() == [1, 3]
    assert stats.initial_state_keys == 2


def test_state_persists_across_batches_and_reopens(store_path: Any) -> None:
    from processors import RUNNING_COUNT_OUTPUT, RunningCount

    for i in range(3):
        with RocksStateStore.open(store_path) as s:
            rows = run(
                RunningCount(), s, table(key=["a", "b"], value=[i, 10]), output_schema=RUNNING_COUNT_OUTPUT
            )
    assert rows == [{"key": "a", "count": 3, "total": 3}, {"key": "b", "count": 3, "total": 30}]


def test_run_partition_checks_arguments_before_iterating(store: Any) -> None:
    with pytest.raises(ValueError, match="at least one grouping column"):
        run_partition(Recorder(), store, None, RunSpec(key_columns=[], output_schema="k STRING"))
    # nothing ran: no init
    recorder = Recorder()
    gen = run_partition(recorder, store, None, RunSpec(key_columns=["key"], output_schema="k STRING"))
    assert recorder.calls == []
    list(gen)
    assert [c[0] for c in recorder.calls] == ["init", "close"]


def test_fast_slicer_matches_iloc() -> None:
    frame = pd.DataFrame(
        {
            "i": np.arange(10),
            "s": [f"s{i}" if i % 3 else None for i in range(10)],
            "t": pd.date_range("2024-01-01", periods=10, freq="h"),
            "n": pd.array([1, None] * 5, dtype="Int64"),
        }
    )
    for start, stop in [(0, 10), (3, 7), (9, 10), (4, 4)]:
        expected = frame.iloc[start:stop].reset_index(drop=True)
        got = grouping.slicer()(frame, start, stop)
        pd.testing.assert_frame_equal(got, expected)


def test_writing_to_a_key_frame_leaves_the_other_keys_rows_alone() -> None:
    frame = pd.DataFrame({"i": np.arange(6), "s": [f"s{i}" for i in range(6)]})
    original = frame.copy()
    cut = grouping.slicer()(frame, 2, 4)
    cut.loc[0, "i"] = -1
    cut.loc[1, "s"] = "changed"
    cut["new"] = 1
    pd.testing.assert_frame_equal(frame, original)
    pd.testing.assert_frame_equal(grouping.slicer()(frame, 2, 4), original.iloc[2:4].reset_index(drop=True))


def test_dictionary_encoded_and_small_int_keys(store: Any) -> None:
    recorder = Recorder()
    data = pa.table(
        {"key": pa.array(["b", "a", "b"]).dictionary_encode(), "n": pa.array([3, 1, 2], pa.int8())}
    )
    go(store, recorder, data, key_columns=["key", "n"])
    assert [c[1] for c in recorder.calls if c[0] == "input"] == [("a", 1), ("b", 2), ("b", 3)]
