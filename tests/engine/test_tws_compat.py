"""The same processor classes under Spark's own transformWithStateInPandas and under blobstate.

Each test writes a few tiny input batches (one parquet file per micro-batch), runs the processor with
``groupBy(key).transformWithStateInPandas`` (RocksDB state store provider) and with
``blobstate.transform_with_state``, and compares the outputs per batch id as sorted lists of rows.
Tests parametrized by ``api`` also run a row-based processor under Spark's ``transformWithState`` and
blobstate's ``api="row"``. Both run at Spark's defaults (no-data batches on), except in ProcessingTime
mode: there Spark (and blobstate, which follows Spark's conf) runs a no-data batch at every trigger, so
``processAllAvailable`` would never return; those tests turn no-data batches off for both runs, and
``test_idle_stream.py`` compares the two on an idle stream with them on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from engine_helpers import (
    EVENT_BATCHES,
    EVENT_DDL,
    REMINDERS_OUTPUT,
    RUNNING_COUNT_OUTPUT,
    SESSION_OUTPUT,
    SESSION_WATERMARK_DELAY_MS,
    ArrowRunningCount,
    EventTimeSessions,
    Reminders,
    RowReminders,
    RowRunningCount,
    RunningCount,
    event_table,
    expected_event_time_sessions,
    kv_table,
    reference_running_count,
    run_blobstate,
    run_spark_tws,
    spark_conf,
    write_batch_files,
)
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

pytestmark = pytest.mark.spark

KV_BATCHES = [
    [("a", 1), ("b", 2), ("a", 3), ("c", -4), ("c", 5)],
    [("a", 10), ("d", 7), ("d", -1), ("d", 8), ("d", 9), ("d", 2)],
    [("b", 6), ("d", 4), ("e", 0), ("e", 11)],
]
"""Keys in several batches, in one, with negative values and with more than three rows in a batch."""


def run_both(
    spark: Any, tmp_path: Path, processor: Any, tables: list[Any], **kwargs: Any
) -> tuple[dict[int, list], dict[int, list]]:
    """Outputs per batch of ``processor`` under Spark and under blobstate, on the same input files."""
    time_mode = kwargs.pop("time_mode", "None")
    event_time_column = kwargs.pop("event_time_column", None)
    delay = kwargs.pop("watermark_delay_ms", 0)
    api = kwargs.pop("api", "pandas")
    write_batch_files(tmp_path / "in", tables)
    no_data = "false" if time_mode == "ProcessingTime" else "true"
    with spark_conf(spark, {"spark.sql.streaming.noDataMicroBatches.enabled": no_data}):
        return _run_both(spark, tmp_path, processor, tables, time_mode, event_time_column, delay, api, kwargs)


def _run_both(
    spark: Any,
    tmp_path: Path,
    processor: Any,
    tables: list[Any],
    time_mode: str,
    event_time_column: str | None,
    delay: int,
    api: str,
    kwargs: dict[str, Any],
) -> tuple[dict[int, list], dict[int, list]]:
    spark_out = run_spark_tws(
        spark,
        tmp_path / "in",
        tmp_path / "spark-ckpt",
        processor,
        time_mode=time_mode,
        event_time_column=event_time_column,
        watermark_delay_ms=delay,
        api=api,
        **kwargs,
    )
    options: dict[str, Any] = {"time_mode": time_mode, "api": api}
    if event_time_column is not None:
        options.update(event_time_column=event_time_column, watermark_delay_ms=delay)
    ours, _ = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        processor,
        local_dir=tmp_path / "local",
        **kwargs,
        **options,
    )
    assert sorted(spark_out.calls)[: len(tables)] == list(range(len(tables))), "Spark skipped a file"
    return spark_out.rows, ours.rows


@pytest.mark.parametrize(
    ("api", "processor"), [("pandas", RunningCount), ("row", RowRunningCount)], ids=["pandas", "row"]
)
def test_running_count_matches_spark(spark: Any, tmp_path: Path, api: str, processor: type) -> None:
    """``pandas``: transformWithStateInPandas; ``row``: the row-based transformWithState."""
    theirs, ours = run_both(
        spark,
        tmp_path,
        processor(),
        [kv_table(b) for b in KV_BATCHES],
        output_schema=RUNNING_COUNT_OUTPUT,
        api=api,
    )
    assert ours == theirs
    assert ours == reference_running_count(KV_BATCHES)


def test_arrow_running_count_matches_spark_transform_with_state_in_pandas(spark: Any, tmp_path: Path) -> None:
    """The vectorized processor under blobstate, Spark's per-key one under transformWithStateInPandas."""
    tables = [kv_table(b) for b in KV_BATCHES]
    write_batch_files(tmp_path / "in", tables)
    theirs = run_spark_tws(
        spark, tmp_path / "in", tmp_path / "spark-ckpt", RunningCount(), output_schema=RUNNING_COUNT_OUTPUT
    )
    ours, _ = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        ArrowRunningCount(),
        local_dir=tmp_path / "local",
        output_schema=RUNNING_COUNT_OUTPUT,
        api="arrow",
    )
    assert ours.rows == theirs.rows
    assert ours.rows == reference_running_count(KV_BATCHES)


@pytest.mark.parametrize(
    ("api", "processor"), [("pandas", Reminders), ("row", RowReminders)], ids=["pandas", "row"]
)
def test_processing_time_timers_and_ttl_match_spark(
    spark: Any, tmp_path: Path, api: str, processor: type
) -> None:
    theirs, ours = run_both(
        spark,
        tmp_path,
        processor(),
        [kv_table(b) for b in KV_BATCHES],
        output_schema=REMINDERS_OUTPUT,
        time_mode="ProcessingTime",
        api=api,
    )
    assert ours == theirs
    # timers fired: b and c (seen in batch 0 only) in batch 1, a in batch 2; TTL hid the old values
    fired = {b: sorted(r[0] for r in rows if r[1] == "timer") for b, rows in ours.items()}
    assert fired == {0: [], 1: ["b", "c"], 2: ["a"]}
    assert all(r[4] < 100 for rows in ours.values() for r in rows), "expired list or map values were read"


def test_event_time_timers_and_late_rows_match_spark(spark: Any, tmp_path: Path) -> None:
    # A session time zone other than the machine's: processors see timestamps in the session's zone.
    zone = "America/New_York"
    with spark_conf(spark, {"spark.sql.session.timeZone": zone}):
        theirs, ours = run_both(
            spark,
            tmp_path,
            EventTimeSessions(timezone=zone),
            [event_table(b) for b in EVENT_BATCHES],
            input_schema=EVENT_DDL,
            output_schema=SESSION_OUTPUT,
            time_mode="EventTime",
            event_time_column="ts",
            watermark_delay_ms=SESSION_WATERMARK_DELAY_MS,
        )
    assert theirs == expected_event_time_sessions()
    assert ours == theirs


TALLY_OUTPUT = "key STRING, items STRING, buckets STRING, has_odd BOOLEAN, last BIGINT"


class Tally(StatefulProcessor):
    """A plain Spark processor (pyspark's own classes, no blobstate import): ListState and MapState.

    Per key: ``items`` (ListState) collects non-negative values, a negative value clears it, and a batch
    of more than three values replaces it with that batch's maximum; ``buckets`` (MapState) counts and
    sums values by parity, a zero removes the ``odd`` entry; ``last`` (ValueState) is the largest value.
    Values are handled sorted, so the result does not depend on row order.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the three state variables."""
        self.items = handle.getListState("items", "value BIGINT")
        self.buckets = handle.getMapState("buckets", "bucket STRING", "count BIGINT, total BIGINT")
        self.last = handle.getValueState("last", "value BIGINT")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Update the list, the map and the value; emit them."""
        values = sorted(int(v) for pdf in rows for v in pdf["value"])
        for v in values:
            if v < 0:
                self.items.clear()
            else:
                self.items.appendValue((v,))
            bucket = "even" if v % 2 == 0 else "odd"
            old = self.buckets.getValue((bucket,))
            count, total = (old[0], old[1]) if old is not None else (0, 0)
            self.buckets.updateValue((bucket,), (count + 1, total + v))
            if v == 0 and self.buckets.containsKey(("odd",)):
                self.buckets.removeKey(("odd",))
        if len(values) > 3:
            self.items.put([(values[-1],)])
        elif values[-1] % 3 == 0 and self.items.exists():
            self.items.appendList([(values[-1],), (values[-1] + 1,)])
        previous = self.last.get()
        self.last.update((max(values[-1], previous[0]) if previous is not None else values[-1],))
        items = ",".join(str(v) for (v,) in self.items.get())
        buckets = ";".join(f"{k[0]}={v[0]}/{v[1]}" for k, v in sorted(self.buckets.iterator()))
        keys = sorted(k[0] for k in self.buckets.keys())  # noqa: SIM118 (MapState, not a dict)
        assert keys == sorted(k for k in ("even", "odd") if self.buckets.containsKey((k,)))
        assert len(list(self.buckets.values())) == len(keys)
        yield pd.DataFrame(
            [(key[0], items, buckets, self.buckets.containsKey(("odd",)), self.last.get()[0])],
            columns=["key", "items", "buckets", "has_odd", "last"],
        )


def test_plain_spark_processor_with_list_and_map_state_matches_spark(spark: Any, tmp_path: Path) -> None:
    theirs, ours = run_both(
        spark, tmp_path, Tally(), [kv_table(b) for b in KV_BATCHES], output_schema=TALLY_OUTPUT
    )
    assert ours == theirs
    assert ours[2] == [
        ("b", "2,6,6,7", "even=2/8", False, 6),
        ("d", "9,4", "even=3/14;odd=3/15", True, 9),
        ("e", "0,11", "even=1/0;odd=1/11", True, 11),
    ]
