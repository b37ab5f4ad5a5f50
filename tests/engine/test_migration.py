"""Moving a running job between Spark's own state store and blobstate, each way, without losing state.

The job is a plain Spark processor (pyspark's own classes) with a value and a list state variable. It
runs over the first input batches on one engine and stops; its state is read with that engine's state
reader (Spark's ``format("statestore")`` or ``blobstate.read_state``, which lay rows out alike), turned
into an initial state, and handed to the other engine's query (blobstate's ``initial_state`` or Spark's
``initialState``), which reads the later batches from a directory of their own. Every output, before
and after the move, equals the output of the job that never moved (computed in plain Python), and the
state at the end holds every key, those the later batches never touched included. The two runs use
different partition counts: the initial state is grouped by key, so a move may change the count.
Timers are moved by a processor that registers them again from the timer readers' rows.

An event-time job (two value variables, event-time timers) moves with what ``blobstate.read_moved_state``
reads (every declared variable, the timers, the watermark; refused when a variable is forgotten) onto
input whose first rows are late by the old query's watermark: the moved run equals the old engine's
own run continued from its checkpoint over the same later input, outputs and final state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from engine_helpers import (
    EVENT_DDL,
    SPARK_ROCKSDB_PROVIDER,
    BatchRecorder,
    event_table,
    file_stream,
    kv_table,
    run_blobstate,
    run_spark_tws,
    run_to_end,
    sorted_rows,
    spark_conf,
    write_batch_files,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

import blobstate
from blobstate.reader.moving import MissingStateVariableError, MovedState

pytestmark = pytest.mark.spark

OUTPUT = "key STRING, count BIGINT, total BIGINT, recent STRING"
RECENT = 3
"""How many of a key's latest values the list state keeps."""

BATCHES = [
    [("a", 1), ("b", 2), ("a", 3), ("c", 4)],
    [("a", 10), ("c", 7), ("d", -1), ("a", 2)],
    # after the move: b and d come back; c is never seen again, so only the final state shows it moved
    [("a", 5), ("b", 6), ("e", 0)],
    [("d", 8), ("a", 4), ("b", -3), ("e", 9)],
]
MOVE_AFTER = 2
"""Batches the job runs before the move."""


class MovableCount(StatefulProcessor):
    """Per key: a running count and total (ValueState ``agg``) and its last values (ListState ``recent``).

    ``handleInitialState`` takes one row per key: ``count``, ``total`` and ``recent``, the list in
    order, as :func:`initial_state` builds it from either engine's state reader. A batch's values are
    appended sorted, so the outputs do not depend on row order.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the two state variables."""
        self.agg = handle.getValueState("agg", "count BIGINT, total BIGINT")
        self.recent = handle.getListState("recent", "value BIGINT")

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """Seed the key's state from the state reader's row."""
        for row in initialState.to_dict("records"):
            self.agg.update((int(row["count"]), int(row["total"])))
            self.recent.put([(int(v),) for v in row["recent"]])

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Add the batch's values to the count, the total and the list; emit them."""
        values = sorted(int(v) for pdf in rows for v in pdf["value"])
        old = self.agg.get()
        count, total = (int(old[0]), int(old[1])) if old is not None else (0, 0)
        self.agg.update((count + len(values), total + sum(values)))
        recent = [int(v) for (v,) in self.recent.get()] + values
        self.recent.put([(v,) for v in recent[-RECENT:]])
        yield pd.DataFrame(
            [(key[0], count + len(values), total + sum(values), ",".join(map(str, recent[-RECENT:])))],
            columns=["key", "count", "total", "recent"],
        )


def reference(batches: Sequence[Sequence[tuple[str, int]]]) -> tuple[dict[int, list], dict[str, tuple]]:
    """The job that never moved, in plain Python: each batch's output rows and the final state per key."""
    state: dict[str, tuple[int, int, list[int]]] = {}
    out: dict[int, list] = {}
    for batch_id, rows in enumerate(batches):
        by_key: dict[str, list[int]] = {}
        for k, v in rows:
            by_key.setdefault(k, []).append(v)
        for k, values in by_key.items():
            count, total, recent = state.get(k, (0, 0, []))
            state[k] = (count + len(values), total + sum(values), (recent + sorted(values))[-RECENT:])
        out[batch_id] = sorted_rows([(k, *state[k][:2], ",".join(map(str, state[k][2]))) for k in by_key])
    return out, {k: (c, t, tuple(r)) for k, (c, t, r) in state.items()}


def initial_state(agg: DataFrame, recent: DataFrame) -> DataFrame:
    """One row per key (``key``, ``count``, ``total``, ``recent``) from a state reader's rows.

    ``agg`` and ``recent`` are the rows of the two variables, as read (either reader). A list reads as
    one row per element in list order: numbering the rows right after the read keeps that order through
    the grouping, which does not keep it by itself. (Spark's analyzer refuses that numbering inside a
    streaming query's ``initialState``; blobstate's ``initial_state`` takes it.)
    """
    values = agg.select(F.col("key.key").alias("key"), "value.count", "value.total")
    elements = recent.select(
        F.col("key.key").alias("key"),
        F.monotonically_increasing_id().alias("pos"),
        F.col("list_element.value").alias("value"),
    )
    lists = elements.groupBy("key").agg(
        F.transform(F.sort_array(F.collect_list(F.struct("pos", "value"))), lambda e: e["value"]).alias(
            "recent"
        )
    )
    return values.join(lists, "key", "full_outer").select(
        "key",
        F.coalesce("count", F.lit(0)).alias("count"),
        F.coalesce("total", F.lit(0)).alias("total"),
        F.coalesce("recent", F.array().cast("array<bigint>")).alias("recent"),
    )


def final_state(agg: DataFrame, recent: DataFrame) -> dict[str, tuple]:
    """The state a reader shows, per key: ``(count, total, recent)``."""
    rows = initial_state(agg, recent).collect()
    return {r["key"]: (r["count"], r["total"], tuple(r["recent"])) for r in rows}


def spark_state(spark: Any, checkpoint: Path) -> tuple[DataFrame, DataFrame]:
    """The rows of ``agg`` and ``recent`` from Spark's own state reader (the latest committed batch)."""

    def read(var: str) -> DataFrame:
        return spark.read.format("statestore").option("stateVarName", var).load(str(checkpoint))

    return read("agg"), read("recent")


def blobstate_state(spark: Any, checkpoint: Path) -> tuple[DataFrame, DataFrame]:
    """The rows of ``agg`` and ``recent`` from ``blobstate.read_state`` (the latest committed version)."""

    def read(var: str) -> DataFrame:
        return blobstate.read_state(spark, str(checkpoint), state_var=var)

    return read("agg"), read("recent")


def run_spark(
    spark: Any, input_dir: Path, checkpoint: Path, initial: DataFrame | None = None
) -> BatchRecorder:
    """Run :class:`MovableCount` with Spark's own ``transformWithStateInPandas`` (RocksDB state store)."""
    recorder = BatchRecorder()
    with spark_conf(spark, {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB_PROVIDER}):
        query = (
            file_stream(spark, input_dir, "key STRING, value BIGINT")
            .groupBy("key")
            .transformWithStateInPandas(
                statefulProcessor=MovableCount(),
                outputStructType=OUTPUT,
                outputMode="Update",
                timeMode="None",
                initialState=initial.groupBy("key") if initial is not None else None,
            )
            .writeStream.foreachBatch(recorder)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        run_to_end(query)
    return recorder


def write_input(tmp_path: Path) -> tuple[Path, Path]:
    """The batches before the move in ``old/``, those after it in ``new/`` (one file per batch)."""
    tables = [kv_table(b) for b in BATCHES]
    write_batch_files(tmp_path / "old", tables[:MOVE_AFTER])
    write_batch_files(tmp_path / "new", tables[MOVE_AFTER:], first=MOVE_AFTER)
    return tmp_path / "old", tmp_path / "new"


def split(outputs: dict[int, list]) -> tuple[dict[int, list], dict[int, list]]:
    """The never-moved job's outputs before the move, and after it renumbered from batch 0 (a moved
    query is a new query: its batch ids start again at 0)."""
    before = {b: rows for b, rows in outputs.items() if b < MOVE_AFTER}
    after = {b - MOVE_AFTER: rows for b, rows in outputs.items() if b >= MOVE_AFTER}
    return before, after


def test_a_spark_job_moves_to_blobstate_with_its_state(spark: Any, tmp_path: Path) -> None:
    old_input, new_input = write_input(tmp_path)
    expected, expected_state = reference(BATCHES)
    before, after = split(expected)

    on_spark = run_spark(spark, old_input, tmp_path / "spark-ckpt")
    assert on_spark.rows == before

    initial = initial_state(*spark_state(spark, tmp_path / "spark-ckpt"))
    on_blobstate, _ = run_blobstate(
        spark,
        new_input,
        tmp_path / "ckpt",
        MovableCount(),
        output_schema=OUTPUT,
        num_partitions=3,
        local_dir=tmp_path / "local",
        initial_state=initial.groupBy("key"),
    )
    assert on_blobstate.rows == after

    moved = final_state(*blobstate_state(spark, tmp_path / "ckpt"))
    assert moved == expected_state
    assert moved["c"] == (2, 11, (4, 7)), "a key the later batches never touched was not moved"


def test_a_blobstate_job_moves_to_spark_with_its_state(spark: Any, tmp_path: Path) -> None:
    old_input, new_input = write_input(tmp_path)
    expected, expected_state = reference(BATCHES)
    before, after = split(expected)

    on_blobstate, _ = run_blobstate(
        spark,
        old_input,
        tmp_path / "ckpt",
        MovableCount(),
        output_schema=OUTPUT,
        num_partitions=3,
        local_dir=tmp_path / "local",
    )
    assert on_blobstate.rows == before

    # Spark refuses monotonically_increasing_id() in an initialState: the state goes through a table
    initial_state(*blobstate_state(spark, tmp_path / "ckpt")).write.parquet(str(tmp_path / "moved"))
    initial = spark.read.parquet(str(tmp_path / "moved"))
    on_spark = run_spark(spark, new_input, tmp_path / "spark-ckpt", initial)
    assert on_spark.rows == after

    moved = final_state(*spark_state(spark, tmp_path / "spark-ckpt"))
    assert moved == expected_state
    assert moved["c"] == (2, 11, (4, 7)), "a key the later batches never touched was not moved"


TIMED_OUTPUT = "key STRING, kind STRING, count BIGINT"
FAR = 4_000_000_000_000
"""A processing-time timer never due in a test (epoch ms, in 2096)."""


class TimedCount(StatefulProcessor):
    """A count per key (ValueState ``count``) with two processing-time timers per key: one due in the
    next batch, which emits the count, and one never due. ``handleInitialState`` takes one row per key,
    ``n`` and ``timers`` (the key's timers as the state reader lists them), and registers them again."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the count."""
        self.handle = handle
        self.count = handle.getValueState("count", "n BIGINT")

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """Seed the count and the timers from the state readers' rows."""
        for row in initialState.to_dict("records"):
            self.count.update((int(row["n"]),))
            for ts in row["timers"]:
                self.handle.registerTimer(int(ts))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Count and register the two timers."""
        old = self.count.get()
        count = sum(len(pdf) for pdf in rows) + (int(old[0]) if old is not None else 0)
        self.count.update((count,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        self.handle.registerTimer(FAR)
        yield pd.DataFrame([(key[0], "input", count)], columns=["key", "kind", "count"])

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Emit the count."""
        yield pd.DataFrame([(key[0], "timer", int(self.count.get()[0]))], columns=["key", "kind", "count"])


def timers_by_key(timers: DataFrame) -> dict[str, list[int]]:
    """A timer reader's rows (either reader) per key, sorted."""
    rows = timers.select("key.key", "expiration_timestamp_ms").collect()
    out: dict[str, list[int]] = {}
    for key, ts in rows:
        out.setdefault(key, []).append(ts)
    return {k: sorted(v) for k, v in sorted(out.items())}


def test_timers_move_with_the_state_when_the_processor_registers_them_again(
    spark: Any, tmp_path: Path
) -> None:
    """Timers are not among a variable's rows: both readers list them apart, the same way, and a
    processor registers them again in ``handleInitialState``. A timer due after the move fires in the
    moved query's first batch; one not yet due is still registered there."""
    write_batch_files(tmp_path / "old", [kv_table([("a", 1), ("b", 2), ("a", 3)])])
    write_batch_files(tmp_path / "new", [kv_table([("b", 5), ("c", 6)])], first=1)
    # processing-time mode runs a batch at every trigger unless no-data batches are off
    with spark_conf(spark, {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}):
        on_spark = run_spark_tws(
            spark,
            tmp_path / "old",
            tmp_path / "spark-ckpt",
            TimedCount(),
            output_schema=TIMED_OUTPUT,
            time_mode="ProcessingTime",
        )
        assert on_spark.rows == {0: [("a", "input", 2), ("b", "input", 1)]}

        spark_timers = spark.read.format("statestore").option("readRegisteredTimers", "true")
        timers = spark_timers.load(str(tmp_path / "spark-ckpt"))
        moved_timers = timers_by_key(timers)
        assert sorted(moved_timers) == ["a", "b"] and all(
            len(t) == 2 and t[1] == FAR for t in moved_timers.values()
        )
        counts = (
            spark.read.format("statestore").option("stateVarName", "count").load(str(tmp_path / "spark-ckpt"))
        )
        initial = counts.select(F.col("key.key").alias("key"), "value.n").join(
            timers.groupBy(F.col("key.key").alias("key")).agg(
                F.collect_list("expiration_timestamp_ms").alias("timers")
            ),
            "key",
        )
        on_blobstate, _ = run_blobstate(
            spark,
            tmp_path / "new",
            tmp_path / "ckpt",
            TimedCount(),
            output_schema=TIMED_OUTPUT,
            local_dir=tmp_path / "local",
            time_mode="ProcessingTime",
            initial_state=initial.groupBy("key"),
        )
    # a's and b's timers from the Spark run fire with the counts they see after the move
    assert on_blobstate.rows == {
        0: [("a", "timer", 2), ("b", "input", 2), ("b", "timer", 2), ("c", "input", 1)]
    }
    after = timers_by_key(blobstate.read_state(spark, str(tmp_path / "ckpt"), timers=True))
    assert after["a"] == [FAR], "the timer not yet due was not moved"
    # b and c: the timer their input registered after the move, due in the next batch, and the far one
    assert sorted(after) == ["a", "b", "c"]
    assert [(len(after[k]), after[k][-1]) for k in ("b", "c")] == [(2, FAR), (2, FAR)]


# ---------------------------------------------------------------------------------------------- event time
SESSION_OUTPUT = (
    "key STRING, kind STRING, start_ms BIGINT, last_ms BIGINT, events BIGINT, lifetime BIGINT,"
    " watermark_ms BIGINT"
)
GAP_MS = 10_000
DELAY_MS = 5_000
T0 = 1_700_000_000_000
SESSION_BATCHES = [
    # the old query: watermark T0 - 3s after batch 0, T0 + 25s after batch 1; its batch without input
    # then closes a (last T0 + 4s) and c (T0 + 2s); b's and d's sessions stay open
    [("a", T0), ("b", T0 + 1_000), ("c", T0 + 2_000)],
    [("a", T0 + 4_000), ("b", T0 + 30_000), ("d", T0 + 20_000)],
    # after the move: a at T0 + 5s and d at T0 + 25s, the old watermark itself, are late; e at T0 + 26s
    # is not; the watermark moves to T0 + 26s
    [("a", T0 + 5_000), ("d", T0 + 25_000), ("e", T0 + 26_000), ("b", T0 + 31_000)],
    # c at T0 + 24s is late; f moves the watermark to T0 + 45s: the batch after closes b, d and e
    [("c", T0 + 24_000), ("f", T0 + 50_000)],
]
LATE = [("a", T0 + 5_000), ("d", T0 + 25_000), ("c", T0 + 24_000)]
"""The rows after the move that the old query drops as late."""
OLD_WATERMARK_MS = T0 + 25_000


def epoch_ms(values: pd.Series) -> list[int]:
    """Epoch ms of the timestamps a processor gets (naive times of the session time zone, UTC here)."""
    stamps = pd.to_datetime(values)
    if stamps.dt.tz is None:
        stamps = stamps.dt.tz_localize("UTC")
    return [int(t.value // 1_000_000) for t in stamps]


class UserSessions(StatefulProcessor):
    """Event-time sessions per user (pyspark's own classes; time mode EventTime): ``session`` (value:
    start, last event, events) closed by a timer at last event + :data:`GAP_MS`, and ``lifetime``
    (value: every event ever seen). Emits an ``input`` row per key per batch and a ``closed`` row, each
    with the watermark the handler saw. ``handleInitialState`` takes a moved key's row (:func:`moved`)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the two state variables."""
        self.handle = handle
        self.session = handle.getValueState("session", "start_ms BIGINT, last_ms BIGINT, events BIGINT")
        self.lifetime = handle.getValueState("lifetime", "n BIGINT")

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """The moved key's session (if open), lifetime count and timers."""
        for row in initialState.to_dict("records"):
            self.lifetime.update((int(row["lifetime"]),))
            if not pd.isna(row["start_ms"]):
                self.session.update((int(row["start_ms"]), int(row["last_ms"]), int(row["events"])))
            for ts in row["timers"] if row["timers"] is not None else []:
                self.handle.registerTimer(int(ts))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Extend the key's session, move its timer, count the events."""
        times = [t for pdf in rows for t in epoch_ms(pdf["ts"])]
        old = self.session.get()
        start, last, events = min(times), max(times), len(times)
        if old is not None:
            self.handle.deleteTimer(int(old[1]) + GAP_MS)
            start, last, events = min(start, int(old[0])), max(last, int(old[1])), events + int(old[2])
        self.session.update((start, last, events))
        self.handle.registerTimer(last + GAP_MS)
        seen = self.lifetime.get()
        lifetime = len(times) + (int(seen[0]) if seen is not None else 0)
        self.lifetime.update((lifetime,))
        yield self._row(key, "input", (start, last, events), lifetime, timerValues)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """The watermark passed the session's last event + gap: emit it and forget it."""
        session = tuple(int(v) for v in self.session.get())
        self.session.clear()
        yield self._row(key, "closed", session, int(self.lifetime.get()[0]), timerValues)

    def _row(self, key: Any, kind: str, session: tuple, lifetime: int, timerValues: Any) -> pd.DataFrame:
        row = (key[0], kind, *session, lifetime, timerValues.getCurrentWatermarkInMs())
        return pd.DataFrame([row], columns=SESSION_COLUMNS)


SESSION_COLUMNS = ["key", "kind", "start_ms", "last_ms", "events", "lifetime", "watermark_ms"]


def moved(state: MovedState) -> DataFrame:
    """One row per key from what :func:`blobstate.read_moved_state` read: ``lifetime``, the open
    session's columns (null when none is open) and the key's timers."""
    keyed = {name: frame.withColumn("key", F.col("key.key")) for name, frame in state.variables.items()}
    lifetime = keyed["lifetime"].select("key", F.col("value.n").alias("lifetime"))
    session = keyed["session"].select("key", "value.start_ms", "value.last_ms", "value.events")
    timers = state.timers.groupBy(F.col("key.key").alias("key")).agg(
        F.collect_list("expiration_timestamp_ms").alias("timers")
    )
    return lifetime.join(session, "key", "left").join(timers, "key", "left")


def session_state(spark: Any, checkpoint: Path) -> tuple[dict[str, tuple], int]:
    """A checkpoint's final state, either engine's, read as a move reads it: per key ``(lifetime, start,
    last, events, timers)``, and the watermark."""
    state = blobstate.read_moved_state(spark, str(checkpoint), ["session", "lifetime"])
    rows = moved(state).collect()
    by_key = {
        r["key"]: (r["lifetime"], r["start_ms"], r["last_ms"], r["events"], sorted(r["timers"] or []))
        for r in rows
    }
    return by_key, state.watermark_ms


def run_spark_sessions(
    spark: Any,
    input_dir: Path,
    checkpoint: Path,
    initial: DataFrame | None = None,
    later_than_ms: int | None = None,
) -> BatchRecorder:
    """Run :class:`UserSessions` with Spark's own ``transformWithStateInPandas``; a moved query keeps
    only the rows after the old query's watermark (``later_than_ms``)."""
    recorder = BatchRecorder()
    events = file_stream(spark, input_dir, EVENT_DDL)
    if later_than_ms is not None:  # Spark's rule: an event at or before the watermark is late
        events = events.where(F.col("ts") > F.timestamp_millis(F.lit(later_than_ms)))
    with spark_conf(spark, {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB_PROVIDER}):
        query = (
            events.withWatermark("ts", f"{DELAY_MS} milliseconds")
            .groupBy("key")
            .transformWithStateInPandas(
                statefulProcessor=UserSessions(),
                outputStructType=SESSION_OUTPUT,
                outputMode="Update",
                timeMode="EventTime",
                initialState=initial.groupBy("key") if initial is not None else None,
            )
            .writeStream.foreachBatch(recorder)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        run_to_end(query)
    return recorder


def run_blobstate_sessions(spark: Any, input_dir: Path, checkpoint: Path, **options: Any) -> BatchRecorder:
    """Run :class:`UserSessions` with blobstate."""
    recorder, _ = run_blobstate(
        spark,
        input_dir,
        checkpoint,
        UserSessions(),
        input_schema=EVENT_DDL,
        output_schema=SESSION_OUTPUT,
        num_partitions=3,
        local_dir=checkpoint.parent / "local",
        time_mode="EventTime",
        event_time_column="ts",
        watermark_delay_ms=DELAY_MS,
        **options,
    )
    return recorder


def write_session_input(tmp_path: Path) -> tuple[Path, Path]:
    """The batches before the move in ``old/``; those after it in ``new/``, for the moved query."""
    tables = [event_table(b) for b in SESSION_BATCHES]
    write_batch_files(tmp_path / "old", tables[:MOVE_AFTER])
    write_batch_files(tmp_path / "new", tables[MOVE_AFTER:], first=MOVE_AFTER)
    return tmp_path / "old", tmp_path / "new"


def continue_unmoved(tmp_path: Path) -> Path:
    """The later batches added to the old query's input: the job that never moved reads them next."""
    write_batch_files(
        tmp_path / "old", [event_table(b) for b in SESSION_BATCHES[MOVE_AFTER:]], first=MOVE_AFTER
    )
    return tmp_path / "old"


def in_order(recorder: BatchRecorder, without_watermark: bool = False) -> list[list[tuple]]:
    """The batches that emitted rows, in order (a moved query numbers its batches from 0 again)."""
    batches = list(recorder.nonempty().values())
    return [[row[:-1] for row in rows] for rows in batches] if without_watermark else batches


def assert_unmoved_dropped_the_late_rows(unmoved: list[list[tuple]]) -> None:
    """The never-moved run dropped :data:`LATE`: neither a nor c has input after the move, and d's
    session closed with its one event before the move."""
    rows = [row for batch in unmoved for row in batch]
    assert not [r for r in rows if r[0] in ("a", "c")]
    assert [r[:6] for r in rows if r[0] == "d"] == [("d", "closed", T0 + 20_000, T0 + 20_000, 1, 1)]
    assert unmoved[0][0][-1] == OLD_WATERMARK_MS  # the first batch's watermark: the old one


def test_an_event_time_job_moves_to_blobstate_with_its_watermark(spark: Any, tmp_path: Path) -> None:
    old_input, new_input = write_session_input(tmp_path)
    with spark_conf(spark, {"spark.sql.session.timeZone": "UTC"}):
        run_spark_sessions(spark, old_input, tmp_path / "spark-ckpt")
        assert blobstate.last_watermark_ms(str(tmp_path / "spark-ckpt")) == OLD_WATERMARK_MS
        with pytest.raises(MissingStateVariableError, match="declares state variable 'lifetime', which"):
            blobstate.read_moved_state(spark, str(tmp_path / "spark-ckpt"), ["session"])

        state = blobstate.read_moved_state(spark, str(tmp_path / "spark-ckpt"), ["session", "lifetime"])
        assert (state.engine, state.watermark_ms) == ("spark", OLD_WATERMARK_MS)
        on_blobstate = run_blobstate_sessions(
            spark,
            new_input,
            tmp_path / "ckpt",
            initial_state=moved(state).groupBy("key"),
            initial_watermark_ms=state.watermark_ms,
        )
        unmoved = run_spark_sessions(spark, continue_unmoved(tmp_path), tmp_path / "spark-ckpt")
        assert_unmoved_dropped_the_late_rows(in_order(unmoved))
        assert in_order(on_blobstate) == in_order(unmoved)
        assert session_state(spark, tmp_path / "ckpt") == session_state(spark, tmp_path / "spark-ckpt")


def test_an_event_time_job_moves_to_spark_keeping_the_rows_after_its_watermark(
    spark: Any, tmp_path: Path
) -> None:
    old_input, new_input = write_session_input(tmp_path)
    with spark_conf(spark, {"spark.sql.session.timeZone": "UTC"}):
        run_blobstate_sessions(spark, old_input, tmp_path / "ckpt")
        with pytest.raises(MissingStateVariableError, match="declares state variable 'session', which"):
            blobstate.read_moved_state(spark, str(tmp_path / "ckpt"), ["lifetime"])

        state = blobstate.read_moved_state(spark, str(tmp_path / "ckpt"), ["session", "lifetime"])
        assert (state.engine, state.watermark_ms) == ("blobstate", OLD_WATERMARK_MS)
        on_spark = run_spark_sessions(
            spark, new_input, tmp_path / "spark-ckpt", moved(state), later_than_ms=state.watermark_ms
        )
        unmoved = run_blobstate_sessions(spark, continue_unmoved(tmp_path), tmp_path / "ckpt")
        assert_unmoved_dropped_the_late_rows(in_order(unmoved))
        # Spark's watermark starts at 0 in any new query: only the handlers' view of it differs, in the
        # first batch (the late rows were dropped before, and timers due by the old watermark had fired)
        assert in_order(on_spark, without_watermark=True) == in_order(unmoved, without_watermark=True)
        assert {row[-1] for row in in_order(on_spark)[0]} == {0}
        assert in_order(on_spark)[1:] == in_order(unmoved)[1:]
        assert session_state(spark, tmp_path / "spark-ckpt") == session_state(spark, tmp_path / "ckpt")
