"""Timers on an idle stream: blobstate runs batches without input when Spark's own operator would.

A per-user session processor with a processing-time timeout runs under Spark's
``transformWithStateInPandas`` and under blobstate, at the same time, over the same input directory and
timeline: clicks, an idle period several times the timeout, clicks again. Spark (no-data batches on, its
default) closes every session during the idle period, so each user ends with two sessions. A stream
processor that waited for input would instead merge the old session and the new clicks into one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from engine_helpers import SPARK_ROCKSDB_PROVIDER, BatchRecorder, kv_table, spark_conf, write_batch_files
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

import blobstate

pytestmark = pytest.mark.spark

TIMEOUT_MS = 4_000
"""The session timeout (processing time)."""
IDLE_SECONDS = 60
"""The longest idle period: the first sessions must be closed by then (Spark takes about 2 timeouts)."""
TRIGGER = "1 second"
OUTPUT = "user STRING, session BIGINT, clicks BIGINT"
USERS = ["ann", "bob", "cid", "dee", "eve"]


class ClickSessions(StatefulProcessor):
    """Sessions per user: a session closes (and is emitted) TIMEOUT_MS of processing time after its last
    click; the next click starts the user's next session."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the open session and the count of the user's sessions."""
        self.handle = handle
        self.open = handle.getValueState("open", "clicks BIGINT")
        self.sessions = handle.getValueState("sessions", "n BIGINT")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Add the clicks to the open session (opening one if needed) and push its timeout back."""
        clicks = sum(len(pdf) for pdf in rows)
        current = self.open.get()
        if current is None:
            done = self.sessions.get()
            self.sessions.update(((done[0] if done else 0) + 1,))
        self.open.update(((current[0] if current else 0) + clicks,))
        for ts in list(self.handle.listTimers()):
            self.handle.deleteTimer(ts)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + TIMEOUT_MS)
        yield from ()

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Close the session: emit it."""
        current = self.open.get()
        number = self.sessions.get()
        self.open.clear()
        if current is not None:
            yield pd.DataFrame({"user": [key[0]], "session": [number[0]], "clicks": [current[0]]})


def _start_spark(spark: Any, input_dir: Path, checkpoint: Path, sink: BatchRecorder) -> Any:
    df = spark.readStream.schema("key STRING, value BIGINT").parquet(str(input_dir))
    return (
        df.groupBy("key")
        .transformWithStateInPandas(
            statefulProcessor=ClickSessions(),
            outputStructType=OUTPUT,
            outputMode="Update",
            timeMode="ProcessingTime",
        )
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=TRIGGER)
        .start()
    )


def _start_blobstate(spark: Any, input_dir: Path, tmp_path: Path, sink: BatchRecorder) -> Any:
    return blobstate.transform_with_state(
        spark.readStream.schema("key STRING, value BIGINT").parquet(str(input_dir)),
        key="key",
        processor=ClickSessions(),
        output_schema=OUTPUT,
        checkpoint=str(tmp_path / "ckpt"),
        sink=sink,
        num_partitions=2,
        local_dir=str(tmp_path / "local"),
        time_mode="processingtime",
        trigger_interval=TRIGGER,
    )


def _all_rows(recorder: BatchRecorder) -> list[tuple]:
    return sorted(row for rows in recorder.rows.values() for row in rows)


def _wait_for(recorders: list[BatchRecorder], rows: int, deadline: float) -> None:
    while time.monotonic() < deadline and any(len(_all_rows(r)) < rows for r in recorders):
        time.sleep(0.5)


def test_an_idle_period_closes_sessions_as_spark_does(spark: Any, tmp_path: Path) -> None:
    first = [(u, 1) for u in USERS for _ in range(1 + USERS.index(u))]
    second = [(u, 1) for u in USERS[:3] for _ in range(10)]
    expected = sorted(
        [(u, 1, c) for u, c in Counter(u for u, _ in first).items()]
        + [(u, 2, c) for u, c in Counter(u for u, _ in second).items()]
    )
    input_dir = tmp_path / "in"
    input_dir.mkdir()
    theirs, ours = BatchRecorder(), BatchRecorder()
    with spark_conf(spark, {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB_PROVIDER}):
        spark_query = _start_spark(spark, input_dir, tmp_path / "spark-ckpt", theirs)
    blobstate_query = _start_blobstate(spark, input_dir, tmp_path, ours)
    try:
        write_batch_files(input_dir, [kv_table(first)])
        # No input from now on until both closed the first sessions (or the deadline passed).
        _wait_for([theirs, ours], len(USERS), time.monotonic() + IDLE_SECONDS)
        closed_while_idle = (_all_rows(theirs), _all_rows(ours))
        write_batch_files(input_dir, [kv_table(second)], first=1)
        _wait_for([theirs, ours], len(expected), time.monotonic() + 90)
    finally:
        spark_query.stop()
        blobstate_query.stop()

    first_sessions = [r for r in expected if r[1] == 1]
    assert closed_while_idle[0] == first_sessions, "Spark itself did not close the sessions while idle"
    assert closed_while_idle[1] == first_sessions, "blobstate did not close the sessions while idle"
    assert _all_rows(ours) == _all_rows(theirs) == expected
    reports = blobstate.batch_reports(blobstate_query)
    closing = [r for r in reports if r.input_rows == 0 and r.output_rows > 0]
    assert closing, "no batch without input emitted the closed sessions"


def test_await_input_drained_returns_while_no_data_batches_keep_running(spark: Any, tmp_path: Path) -> None:
    """In ProcessingTime mode a batch runs every trigger (Spark's ``processAllAvailable`` never returns
    there); ``awaitInputDrained`` returns once everything written before it was processed and committed."""
    input_dir = tmp_path / "in"
    input_dir.mkdir()
    ours = BatchRecorder()
    query = _start_blobstate(spark, input_dir, tmp_path, ours)
    try:
        write_batch_files(input_dir, [kv_table([(u, 1) for u in USERS]), kv_table([("ann", 1)] * 7)])
        query.awaitInputDrained()
        assert sum(r.input_rows for r in blobstate.batch_reports(query)) == len(USERS) + 7
        write_batch_files(input_dir, [kv_table([("bob", 1)] * 3)], first=2)
        query.awaitInputDrained()
        assert sum(r.input_rows for r in blobstate.batch_reports(query)) == len(USERS) + 10
        assert query.isActive  # drained, not stopped: no-data batches go on
    finally:
        query.stop()
