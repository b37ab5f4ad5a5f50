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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from engine_helpers import (
    SPARK_ROCKSDB_PROVIDER,
    BatchRecorder,
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
