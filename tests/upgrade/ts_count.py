"""A count per TIMESTAMP key, for the upgrade fixture of checkpoints keyed by instants
(``make_timestamp_checkpoint.py``): one processor per API, the same output."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle

from blobstate.processor import StatefulProcessor, TimerValues
from blobstate.processor.arrow_api import ArrowHandle, ArrowStatefulProcessor, KeyedBatch

TS_COUNT_OUTPUT = "ts TIMESTAMP, count BIGINT, total BIGINT"


class TsCount(StatefulProcessor):
    """Count and sum of ``value`` per ``ts`` key (pandas API)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the counters."""
        self.state = handle.getValueState("agg", "count BIGINT, total BIGINT")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Any:
        """Add the rows to the key's counters and emit them."""
        count, total = 0, 0
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["value"].sum())
        old = self.state.get()
        if old is not None:
            count, total = count + old[0], total + old[1]
        self.state.update((count, total))
        yield pd.DataFrame({"ts": [key[0]], "count": [count], "total": [total]})


class ArrowTsCount(ArrowStatefulProcessor):
    """:class:`TsCount` for the vectorized API."""

    def init(self, handle: ArrowHandle) -> None:
        """Declare the counters."""
        self.state = handle.getValueState("agg", "count BIGINT, total BIGINT")

    def handleInputBatch(self, batch: KeyedBatch, timerValues: TimerValues) -> Iterator[pa.Table]:
        """Add every key's rows to its counters and emit them."""
        old = self.state.get_many()
        new = batch.aggregate([("value", "count"), ("value", "sum")])
        count = pc.add(pc.fill_null(old["count"], 0), new["value_count"])
        total = pc.add(pc.fill_null(old["total"], 0), pc.fill_null(new["value_sum"], 0))
        self.state.update_many({"count": count, "total": total})
        yield pa.table({"ts": batch.keys["ts"], "count": count, "total": total})
