"""Shared helpers of the engine's end-to-end and Spark-compatibility tests.

Input batches are parquet files, one per micro-batch, with increasing modification times, read by a file
source with ``maxFilesPerTrigger=1`` (so batch ``i`` is file ``i``). Queries run to completion with
``processAllAvailable``; a :class:`BatchRecorder` sink keeps each batch's output rows as a sorted list.
Processors defined here are imported by Spark's Python workers (the ``spark`` fixture puts this
directory on their ``PYTHONPATH``).
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Row as SparkRow

from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT as RUNNING_COUNT_OUTPUT
from blobstate.demo.running_count import ArrowRunningCount as ArrowRunningCount
from blobstate.demo.running_count import RowRunningCount as RowRunningCount
from blobstate.demo.running_count import RunningCount as RunningCount
from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

KV_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.int64())])
KV_DDL = "key STRING, value BIGINT"

SPARK_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

Row = tuple[Any, ...]


# ---------------------------------------------------------------------------------------------- input
def kv_table(rows: Sequence[tuple[str, int]]) -> pa.Table:
    """A ``key STRING, value BIGINT`` batch."""
    return pa.table({"key": [k for k, _ in rows], "value": [v for _, v in rows]}, schema=KV_SCHEMA)


def write_batch_files(directory: Path, tables: Sequence[pa.Table], first: int = 0) -> list[Path]:
    """Write ``tables`` as ``batch-<first + i>.parquet``, each file's mtime later than the one before.

    The file source orders files by modification time; each file appears atomically (written under a
    hidden name, which the source ignores, then renamed).
    """
    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 3600
    paths = []
    for i, table in enumerate(tables, start=first):
        path = directory / f"batch-{i:05d}.parquet"
        tmp = directory / f".batch-{i:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.utime(tmp, (base + i, base + i))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def file_stream(spark: Any, directory: Path, schema: str) -> Any:
    """A streaming DataFrame over ``directory`` that takes one file per micro-batch."""
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))


# ---------------------------------------------------------------------------------------------- output
class BatchRecorder:
    """A ``foreachBatch``-style sink: each batch id's rows (sorted tuples) and how often it was called."""

    def __init__(self) -> None:
        self.rows: dict[int, list[Row]] = {}
        self.calls: Counter[int] = Counter()
        self._lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = sorted((tuple(r) for r in frame.collect()), key=_sort_key)
        with self._lock:
            self.calls[batch_id] += 1
            self.rows[batch_id] = rows

    def nonempty(self) -> dict[int, list[Row]]:
        """The batches that produced output."""
        return {b: r for b, r in sorted(self.rows.items()) if r}


def _sort_key(row: Row) -> tuple:
    return tuple((v is not None, v) for v in row)


def sorted_rows(rows: Sequence[Row]) -> list[Row]:
    """``rows`` sorted the way :class:`BatchRecorder` sorts them (nulls first)."""
    return sorted(rows, key=_sort_key)


# ---------------------------------------------------------------------------------------------- running
@contextmanager
def spark_conf(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """Set session conf values for the duration of the block, then restore the previous values."""
    previous = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def run_to_end(query: Any) -> None:
    """Process every available input file, then stop the query (re-raising its failure, if any)."""
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def run_blobstate(
    spark: Any,
    input_dir: Path,
    checkpoint: Path | str,
    processor: Any,
    *,
    input_schema: str = KV_DDL,
    key: str | Sequence[str] = "key",
    output_schema: str,
    num_partitions: int = 2,
    local_dir: Path,
    sink: BatchRecorder | None = None,
    **options: Any,
) -> tuple[BatchRecorder, list[Any]]:
    """Run ``processor`` with blobstate over every file of ``input_dir``; returns the sink and reports."""
    import blobstate

    recorder = sink if sink is not None else BatchRecorder()
    query = blobstate.transform_with_state(
        file_stream(spark, input_dir, input_schema),
        key=key,
        processor=processor,
        output_schema=output_schema,
        checkpoint=str(checkpoint),
        sink=recorder,
        num_partitions=num_partitions,
        local_dir=str(local_dir),
        async_cleanup=False,
        **options,
    )
    run_to_end(query)
    return recorder, blobstate.batch_reports(query)


def run_spark_tws(
    spark: Any,
    input_dir: Path,
    checkpoint: Path,
    processor: Any,
    *,
    input_schema: str = KV_DDL,
    key: str = "key",
    output_schema: str,
    output_mode: str = "Update",
    time_mode: str = "None",
    event_time_column: str | None = None,
    watermark_delay_ms: int = 0,
    api: str = "pandas",
) -> BatchRecorder:
    """Run ``processor`` with Spark's own ``transformWithStateInPandas`` (RocksDB state store), or with
    its row-based ``transformWithState`` when ``api`` is ``row``, at Spark's defaults otherwise."""
    recorder = BatchRecorder()
    settings = {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB_PROVIDER}
    with spark_conf(spark, settings):
        df = file_stream(spark, input_dir, input_schema)
        if event_time_column is not None:
            df = df.withWatermark(event_time_column, f"{watermark_delay_ms} milliseconds")
        grouped = df.groupBy(key)
        transform = grouped.transformWithState if api == "row" else grouped.transformWithStateInPandas
        query = (
            transform(
                statefulProcessor=processor,
                outputStructType=output_schema,
                outputMode=output_mode,
                timeMode=time_mode,
            )
            .writeStream.outputMode(output_mode.lower())
            .foreachBatch(recorder)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        run_to_end(query)
    assert list(checkpoint.glob("state/0/*/SSTs")), "Spark's state did not use the RocksDB provider"
    return recorder


# ---------------------------------------------------------------------------------------------- processors
def reference_running_count(batches: Sequence[Sequence[tuple[str, int]]]) -> dict[int, list[Row]]:
    """Plain-Python running count and sum per key: each batch's rows ``(key, count, total)``."""
    state: dict[str, tuple[int, int]] = {}
    out: dict[int, list[Row]] = {}
    for batch_id, rows in enumerate(batches):
        touched = set()
        for k, v in rows:
            c, t = state.get(k, (0, 0))
            state[k] = (c + 1, t + v)
            touched.add(k)
        out[batch_id] = sorted_rows([(k, *state[k]) for k in touched])
    return out


EVENT_DDL = "key STRING, ts TIMESTAMP"
EVENT_SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
SESSION_OUTPUT = (
    "key STRING, kind STRING, start_ms BIGINT, last_ms BIGINT, events BIGINT, watermark_ms BIGINT,"
    " start TIMESTAMP"
)
SESSION_GAP_MS = 10_000
SESSION_WATERMARK_DELAY_MS = 5_000


def event_table(rows: Sequence[tuple[str, int]]) -> pa.Table:
    """A ``key STRING, ts TIMESTAMP`` batch from ``(key, epoch ms)`` pairs."""
    ts = pa.array([ms * 1000 for _, ms in rows], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.table({"key": [k for k, _ in rows], "ts": ts}, schema=EVENT_SCHEMA)


def _epoch_ms(series: pd.Series, timezone: str) -> pd.Series:
    """Epoch ms of timestamps that Spark hands over as naive wall-clock times of the session time zone."""
    if getattr(series.dt, "tz", None) is None:
        series = series.dt.tz_localize(timezone)
    return series.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ms]").astype("int64")


class EventTimeSessions(StatefulProcessor):
    """Event-time sessions (time mode EventTime): a timer at ``last event + gap`` closes a session.

    Emits an ``input`` row per key per batch (the session so far and the watermark the handler saw) and
    a ``closed`` row when the watermark passes the timer; output :data:`SESSION_OUTPUT`. ``timezone`` is
    the session time zone (``spark.sql.session.timeZone``): Spark hands timestamps to processors, and
    reads the ``start`` timestamp they emit, as naive wall-clock times of that zone.
    """

    def __init__(self, gap_ms: int = SESSION_GAP_MS, timezone: str = "UTC") -> None:
        self.gap_ms = gap_ms
        self.timezone = timezone

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the open session of each key."""
        self.handle = handle
        self.session = handle.getValueState("session", "start_ms BIGINT, last_ms BIGINT, events BIGINT")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Extend the key's session and move its timer to the new last event + gap."""
        times = [int(t) for pdf in rows for t in _epoch_ms(pdf["ts"], self.timezone)]
        old = self.session.get()
        start, last, events = min(times), max(times), len(times)
        if old is not None:
            self.handle.deleteTimer(old[1] + self.gap_ms)
            start, last, events = min(start, old[0]), max(last, old[1]), events + old[2]
        self.session.update((start, last, events))
        self.handle.registerTimer(last + self.gap_ms)
        watermark = timerValues.getCurrentWatermarkInMs()
        yield self._row(key, "input", start, last, events, watermark)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """The watermark passed last event + gap: emit the session and forget it."""
        start, last, events = self.session.get()
        self.session.clear()
        watermark = timerValues.getCurrentWatermarkInMs()
        yield self._row(key, "closed", start, last, events, watermark)

    def _row(self, key: Any, kind: str, start: int, last: int, events: int, watermark: int) -> pd.DataFrame:
        wall_clock = pd.Timestamp(start, unit="ms", tz="UTC").tz_convert(self.timezone).tz_localize(None)
        row = (key[0], kind, start, last, events, watermark, wall_clock)
        return pd.DataFrame([row], columns=_SESSION_COLUMNS)


_SESSION_COLUMNS = ["key", "kind", "start_ms", "last_ms", "events", "watermark_ms", "start"]

T0 = 1_700_000_000_000
"""Event-time origin of :data:`EVENT_BATCHES` (epoch ms)."""

EVENT_BATCHES: list[list[tuple[str, int]]] = [
    # watermark for timers 0, for late rows 0; afterwards T0 + 3s - 5s
    [("a", T0), ("a", T0 + 2_000), ("b", T0 + 1_000), ("c", T0 + 3_000)],
    # timers T0 - 2s, late rows 0: c's older event is accepted; afterwards T0 + 30s - 5s
    [("b", T0 + 20_000), ("d", T0 + 30_000), ("c", T0 - 1_000)],
    # timers T0 + 25s, late rows T0 - 2s: a at T0 - 3s is late and dropped; f at T0 is only behind the
    # timer watermark, so it is accepted and its session closes at once; a and c close
    [("a", T0 - 3_000), ("e", T0 + 26_000), ("d", T0 + 31_000), ("f", T0), ("g", T0 + 60_000)],
    # timers T0 + 55s, late rows T0 + 25s: b, d and e close; g stays open
    [("h", T0 + 61_000)],
]
"""Event-time input: late rows, timers firing, and the one-batch lag of Spark's late-row watermark."""


def expected_event_time_sessions() -> dict[int, list[tuple]]:
    """What :class:`EventTimeSessions` emits for :data:`EVENT_BATCHES` (see the comments there)."""
    w1, w2, w3 = T0 - 2_000, T0 + 25_000, T0 + 55_000
    batches = {
        0: [
            ("a", "input", T0, T0 + 2_000, 2, 0),
            ("b", "input", T0 + 1_000, T0 + 1_000, 1, 0),
            ("c", "input", T0 + 3_000, T0 + 3_000, 1, 0),
        ],
        1: [
            ("b", "input", T0 + 1_000, T0 + 20_000, 2, w1),
            ("c", "input", T0 - 1_000, T0 + 3_000, 2, w1),
            ("d", "input", T0 + 30_000, T0 + 30_000, 1, w1),
        ],
        2: [
            ("a", "closed", T0, T0 + 2_000, 2, w2),  # the late event at T0 - 3s was dropped
            ("c", "closed", T0 - 1_000, T0 + 3_000, 2, w2),
            ("d", "input", T0 + 30_000, T0 + 31_000, 2, w2),
            ("e", "input", T0 + 26_000, T0 + 26_000, 1, w2),
            ("f", "closed", T0, T0, 1, w2),
            ("f", "input", T0, T0, 1, w2),
            ("g", "input", T0 + 60_000, T0 + 60_000, 1, w2),
        ],
        3: [
            ("b", "closed", T0 + 1_000, T0 + 20_000, 2, w3),
            ("d", "closed", T0 + 30_000, T0 + 31_000, 2, w3),
            ("e", "closed", T0 + 26_000, T0 + 26_000, 1, w3),
            ("h", "input", T0 + 61_000, T0 + 61_000, 1, w3),
        ],
        # Batch 3 moved the watermark, so Spark (and blobstate) run a batch without input; no session
        # of g or h is closed by it yet.
        4: [],
    }
    # collect() gives TIMESTAMP values as naive datetimes in the local time zone of this process
    return {
        b: sorted_rows([(*r, datetime.datetime.fromtimestamp(r[2] / 1000)) for r in rows])
        for b, rows in batches.items()
    }


REMINDERS_OUTPUT = "key STRING, kind STRING, count BIGINT, timers BIGINT, recent BIGINT, flags BIGINT"
HOUR_MS = 3_600_000


class Reminders(StatefulProcessor):
    """Processing-time timers and TTL with outputs independent of the wall clock (time mode ProcessingTime).

    Every batch with input for a key replaces the key's timers with one at ``now + 1 ms`` (due in the next
    batch, which always starts later) and one an hour away (never due in a test). ``count`` lives an hour;
    ``recent`` (ListState) and ``flags`` (MapState) live 1 ms, so a batch never sees an earlier batch's.
    Output :data:`REMINDERS_OUTPUT`: per key and batch an ``input`` row, per fired timer a ``timer`` row,
    each with the count, the timers then listed and the sizes of ``recent`` and ``flags``.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables, each with a TTL."""
        self.handle = handle
        self.count = handle.getValueState("count", "n BIGINT", ttlDurationMs=HOUR_MS)
        self.recent = handle.getListState("recent", "value BIGINT", ttlDurationMs=1)
        self.flags = handle.getMapState("flags", "flag STRING", "value BIGINT", ttlDurationMs=1)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Count, remember the values briefly, and replace the key's timers."""
        now = timerValues.getCurrentProcessingTimeInMs()
        values = sorted(int(v) for pdf in rows for v in pdf["value"])
        leftovers = len(list(self.recent.get())) + len(list(self.flags.keys()))
        timers = list(self.handle.listTimers())
        for ts in timers:
            self.handle.deleteTimer(ts)
        self.handle.registerTimer(now + 1)
        self.handle.registerTimer(now + HOUR_MS)
        old = self.count.get()
        count = (old[0] if old is not None else 0) + len(values)
        self.count.update((count,))
        self.recent.appendList([(v,) for v in values])
        self.flags.updateValue(("seen",), (len(values),))
        if values[0] < 0:
            self.flags.updateValue(("negative",), (values[0],))
        recent = len(list(self.recent.get()))
        flags = len(list(self.flags.keys()))
        yield pd.DataFrame(
            [(key[0], "input", count, len(timers), recent + 100 * leftovers, flags)],
            columns=_REMINDER_COLUMNS,
        )

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Report the key's state as the timer sees it (its short-lived state has expired)."""
        old = self.count.get()
        row = (
            key[0],
            "timer",
            old[0] if old is not None else -1,
            len(list(self.handle.listTimers())),
            len(list(self.recent.get())),
            len(list(self.flags.keys())),
        )
        yield pd.DataFrame([row], columns=_REMINDER_COLUMNS)


_REMINDER_COLUMNS = ["key", "kind", "count", "timers", "recent", "flags"]


class RowReminders(Reminders):
    """:class:`Reminders` written for Spark's row-based ``transformWithState``: Rows in and out."""

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        """The same state work as :class:`Reminders`, on Row objects."""
        frames = iter([pd.DataFrame({"value": [row.value for row in rows]})])
        for frame in Reminders.handleInputRows(self, key, frames, timerValues):
            yield from (SparkRow(**r) for r in frame.to_dict("records"))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        """The same report as :class:`Reminders`, as a Row."""
        for frame in Reminders.handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            yield from (SparkRow(**r) for r in frame.to_dict("records"))
