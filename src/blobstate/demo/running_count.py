"""The running count and sum per key used by the tests and benchmarks, written exactly as one would for
Spark's ``transformWithStateInPandas`` (blobstate's StatefulProcessor subclasses PySpark's, so the class
runs under both)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Row

# PySpark's handle type: the class runs under Spark, which passes PySpark's handle, and under blobstate.
from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle

from blobstate.processor import StatefulProcessor, TimerValues
from blobstate.processor.arrow_api import ArrowHandle, ArrowStatefulProcessor, KeyedBatch

RUNNING_COUNT_OUTPUT = "key STRING, count BIGINT, total BIGINT"


class RunningCount(StatefulProcessor):
    """Running count and sum of ``value`` per key (time mode None).

    Input columns ``key: string, value: bigint``; output :data:`RUNNING_COUNT_OUTPUT`, one row per
    key per batch. Initial state rows ``key, count, total`` seed the counters.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the per-key counters."""
        self.state = handle.getValueState("agg", "count BIGINT, total BIGINT")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        """Add this batch's rows to the key's counters and emit them."""
        count = 0
        total = 0
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["value"].sum())
        old = self.state.get()
        if old is not None:
            count += old[0]
            total += old[1]
        self.state.update((count, total))
        yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:
        """Seed the counters from initial-state rows."""
        count = int(initialState["count"].sum())
        total = int(initialState["total"].sum())
        self.state.update((count, total))


class RowRunningCount(StatefulProcessor):
    """:class:`RunningCount` written for Spark's row-based ``transformWithState``: the same state and
    output, with ``pyspark.sql.Row`` objects in and out instead of pandas DataFrames."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the per-key counters."""
        self.state = handle.getValueState("agg", "count BIGINT, total BIGINT")

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        """Add this batch's rows to the key's counters and emit them."""
        count = 0
        total = 0
        for row in rows:
            count += 1
            total += row.value
        old = self.state.get()
        if old is not None:
            count += old[0]
            total += old[1]
        self.state.update((count, total))
        yield Row(key=key[0], count=count, total=total)

    def handleInitialState(self, key: Any, initialState: Row, timerValues: TimerValues) -> None:
        """Seed the counters from one initial-state row."""
        old = self.state.get() or (0, 0)
        self.state.update((old[0] + initialState["count"], old[1] + initialState["total"]))


class ArrowRunningCount(ArrowStatefulProcessor):
    """:class:`RunningCount` for the vectorized API (``api="arrow"``): the same state and output, one
    call per partition and batch with every key's rows, state read and written for all keys at once."""

    def init(self, handle: ArrowHandle) -> None:
        """Declare the per-key counters."""
        self.state = handle.getValueState("agg", "count BIGINT, total BIGINT")

    def handleInputBatch(self, batch: KeyedBatch, timerValues: TimerValues) -> Iterator[pa.Table]:
        """Add this batch's rows to every key's counters and emit them."""
        old = self.state.get_many()
        new = batch.aggregate([("value", "count"), ("value", "sum")])
        count = pc.add(pc.fill_null(old["count"], 0), new["value_count"])
        total = pc.add(pc.fill_null(old["total"], 0), pc.fill_null(new["value_sum"], 0))
        self.state.update_many({"count": count, "total": total})
        yield pa.table({"key": batch.keys["key"], "count": count, "total": total})

    def handleInitialState(self, batch: KeyedBatch, timerValues: TimerValues) -> None:
        """Seed the counters from initial-state rows (summed per key)."""
        seed = batch.aggregate([("count", "sum"), ("total", "sum")])
        self.state.update_many({"count": seed["count_sum"], "total": seed["total_sum"]})
