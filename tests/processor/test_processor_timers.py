"""Timers: register/delete/list per key, firing after the input, in (expiry, key) order, by time mode."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from processor_helpers import run, run_with_stats, table

from blobstate.processor import (
    InvalidHandleStateError,
    InvalidTimeModeError,
    StatefulProcessor,
)

OUTPUT = "key STRING, event STRING, at BIGINT"


class TimerScript(StatefulProcessor):
    """Input rows (key, op, t): register/delete/list timers; every callback is logged in ``calls``."""

    def __init__(self, on_fire: Any = None) -> None:
        self.calls: list[tuple] = []
        self.on_fire = on_fire

    def init(self, handle):
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        self.calls.append(("input", key))
        out = []
        for pdf in rows:
            for op, t in zip(pdf["op"], pdf["t"], strict=True):
                if op == "register":
                    self.handle.registerTimer(int(t))
                elif op == "delete":
                    self.handle.deleteTimer(int(t))
                elif op == "list":
                    out.append((key[0], "list:" + ",".join(map(str, self.handle.listTimers())), -1))
        return iter([pd.DataFrame(out, columns=["key", "event", "at"])] if out else [])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        at = expiredTimerInfo.getExpiryTimeInMs()
        self.calls.append(("timer", key, at))
        if self.on_fire is not None:
            self.on_fire(self.handle, key, at)
        yield pd.DataFrame({"key": [key[0]], "event": ["fired"], "at": [at]})


def ops(*rows: tuple[str, str, int]) -> pa.Table:
    return table(key=[r[0] for r in rows], op=[r[1] for r in rows], t=[r[2] for r in rows])


def proc_batch(store: Any, ts: int, data: pa.Table | None, processor: Any = None, **kw: Any) -> tuple:
    processor = processor or TimerScript()
    rows, stats = run_with_stats(
        processor, store, data, output_schema=OUTPUT, time_mode="ProcessingTime", batch_timestamp_ms=ts, **kw
    )
    return rows, stats, processor


def test_register_list_and_delete(store: Any) -> None:
    proc_batch(
        store,
        0,
        ops(("a", "register", 300), ("a", "register", 100), ("a", "register", 200), ("b", "register", 50)),
    )
    rows, _, _ = proc_batch(store, 0, ops(("a", "delete", 200), ("a", "list", 0), ("b", "list", 0)))
    assert rows == [
        {"key": "a", "event": "list:100,300", "at": -1},
        {"key": "b", "event": "list:50", "at": -1},
    ]


def test_registering_twice_and_deleting_unknown_timers_are_no_ops(store: Any) -> None:
    proc_batch(store, 0, ops(("a", "register", 100), ("a", "register", 100), ("a", "delete", 999)))
    rows, stats, _ = proc_batch(store, 100, None)
    assert rows == [{"key": "a", "event": "fired", "at": 100}]
    assert stats.timers_fired == 1


def test_due_timers_fire_after_all_input_in_expiry_then_key_order(store: Any) -> None:
    proc_batch(
        store,
        0,
        ops(("b", "register", 100), ("a", "register", 100), ("a", "register", 50), ("c", "register", 101)),
    )
    rows, stats, processor = proc_batch(store, 100, ops(("z", "list", 0), ("a", "list", 0)))
    assert processor.calls == [
        ("input", ("a",)),
        ("input", ("z",)),
        ("timer", ("a",), 50),
        ("timer", ("a",), 100),
        ("timer", ("b",), 100),
    ]
    # timers due at the batch time fire (expiry <= batch timestamp), later ones wait
    assert [r["at"] for r in rows if r["event"] == "fired"] == [50, 100, 100]
    assert stats.timers_fired == 3
    rows, _, _ = proc_batch(store, 101, None)
    assert rows == [{"key": "c", "event": "fired", "at": 101}]


def test_a_fired_timer_is_deleted_and_list_timers_sees_the_rest(store: Any) -> None:
    proc_batch(store, 0, ops(("a", "register", 10), ("a", "register", 20)))
    seen = []

    def on_fire(handle, key, at):
        seen.append(list(handle.listTimers()))

    proc_batch(store, 15, None, TimerScript(on_fire))
    # Spark deletes the timer after handleExpiredTimer returns, so the handler still lists it
    assert seen == [[10, 20]]
    rows, _, _ = proc_batch(store, 15, ops(("a", "list", 0)))
    assert rows == [{"key": "a", "event": "list:20", "at": -1}]


def test_timers_registered_while_firing_wait_for_the_next_batch(store: Any) -> None:
    proc_batch(store, 0, ops(("a", "register", 10)))

    def reschedule(handle, key, at):
        handle.registerTimer(at - 5)  # already due, but registered during timer processing

    rows, _, _ = proc_batch(store, 10, None, TimerScript(reschedule))
    assert [r["at"] for r in rows] == [10]
    rows, _, _ = proc_batch(store, 10, None)
    assert [r["at"] for r in rows] == [5]


def test_a_handler_deleting_another_due_timer_prevents_it_firing(store: Any) -> None:
    proc_batch(store, 0, ops(("a", "register", 10), ("a", "register", 20)))

    def cancel_later(handle, key, at):
        handle.deleteTimer(20)

    rows, stats, _ = proc_batch(store, 30, None, TimerScript(cancel_later))
    assert [r["at"] for r in rows] == [10]
    assert stats.timers_fired == 1


def test_event_time_timers_fire_by_watermark_not_processing_time(store: Any) -> None:
    def evt(ts: int, watermark: int, data: pa.Table | None, processor: Any = None) -> tuple:
        processor = processor or TimerScript()
        rows, _ = run_with_stats(
            processor,
            store,
            data,
            output_schema=OUTPUT,
            time_mode="EventTime",
            batch_timestamp_ms=ts,
            watermark_ms=watermark,
        )
        return rows, processor

    evt(0, 0, ops(("a", "register", 1_000)))
    rows, _ = evt(10**9, 999, None)
    assert rows == []
    rows, _ = evt(0, 1_000, None)
    assert rows == [{"key": "a", "event": "fired", "at": 1_000}]


def test_timer_values_per_time_mode(tmp_path: Any) -> None:
    from blobstate.state.store import RocksStateStore

    seen = []

    class Probe(StatefulProcessor):
        def init(self, handle):
            pass

        def handleInputRows(self, key, rows, timerValues):
            seen.append((timerValues.getCurrentProcessingTimeInMs(), timerValues.getCurrentWatermarkInMs()))
            return iter([])

    data = ops(("a", "x", 0))
    for i, mode in enumerate(["None", "ProcessingTime", "EventTime"]):
        with RocksStateStore.open(tmp_path / str(i)) as s:
            run(Probe(), s, data, output_schema=OUTPUT, time_mode=mode, batch_timestamp_ms=5, watermark_ms=3)
    with RocksStateStore.open(tmp_path / "no-watermark") as s:
        run(Probe(), s, data, output_schema=OUTPUT, time_mode="ProcessingTime", batch_timestamp_ms=5)
    # Spark passes -1 for both in time mode None, and -1 for a watermark the query does not have
    assert seen == [(-1, -1), (5, 3), (5, 3), (5, -1)]


def test_timers_need_a_time_mode(store: Any) -> None:
    with pytest.raises(InvalidTimeModeError, match="registerTimer with time mode None"):
        run(TimerScript(), store, ops(("a", "register", 1)), output_schema=OUTPUT, time_mode="None")


@pytest.mark.parametrize("where", ["init", "close"])
def test_timers_only_in_handlers(store: Any, where: str) -> None:
    class Misplaced(TimerScript):
        def init(self, handle):
            self.handle = handle
            if where == "init":
                handle.registerTimer(5)

        def close(self):
            list(self.handle.listTimers())

    with pytest.raises(InvalidHandleStateError, match=r"registerTimer|listTimers"):
        proc_batch(store, 0, ops(("a", "list", 0)), Misplaced())


def test_timer_state_survives_reopening_the_store(store_path: Any) -> None:
    from blobstate.state.store import RocksStateStore

    with RocksStateStore.open(store_path) as s:
        proc_batch(s, 0, ops(("a", "register", 7), ("b", "register", 3)))
    with RocksStateStore.open(store_path) as s:
        rows, _, _ = proc_batch(s, 10, None)
    assert [(r["key"], r["at"]) for r in rows] == [("b", 3), ("a", 7)]


def test_timer_keys_decode_to_the_grouping_key_types(store: Any) -> None:
    fired = []

    class Multi(StatefulProcessor):
        def init(self, handle):
            self.handle = handle

        def handleInputRows(self, key, rows, timerValues):
            self.handle.registerTimer(1)
            return iter([])

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            fired.append(key)
            return iter([])

    data = pa.table({"k1": pa.array([7], pa.int32()), "k2": ["x"], "k3": pa.array([None], pa.string())})
    run(
        Multi(),
        store,
        data,
        key_columns=["k1", "k2", "k3"],
        output_schema=OUTPUT,
        time_mode="ProcessingTime",
        batch_timestamp_ms=0,
    )
    run(
        Multi(),
        store,
        None,
        key_columns=["k1", "k2", "k3"],
        output_schema=OUTPUT,
        time_mode="ProcessingTime",
        batch_timestamp_ms=1,
    )
    assert fired == [(7, "x", None)]
