"""How the sink gets a batch's outputs (``engine/outputs.py``, ``engine/inline.py``): small outputs with
the tasks' metadata, as a local DataFrame; larger ones persisted on the executors and read there. The
sink must not be able to tell the two apart, and must get exactly the committed attempt's rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    RUNNING_COUNT_OUTPUT,
    BatchRecorder,
    RunningCount,
    kv_table,
    reference_running_count,
    run_blobstate,
    spark_conf,
    write_batch_files,
)
from pyspark.sql import Row

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog
from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

pytestmark = pytest.mark.spark

RICH_OUTPUT = (
    "key STRING, n BIGINT, at TIMESTAMP, wall TIMESTAMP_NTZ, day DATE, price DECIMAL(12,3), ratio DOUBLE,"
    " small FLOAT, flag BOOLEAN, raw BINARY, tags ARRAY<STRING>, attrs MAP<STRING,BIGINT>,"
    " nested STRUCT<label: STRING, points: ARRAY<STRUCT<x: INT, at: TIMESTAMP>>>"
)
BATCHES = [
    [("a", 1), ("b", 2), ("a", 3), ("c", 4)],
    [("a", -1), ("d", 7)],  # every output is dropped (value < 0 or a key seen for the first time at 7)
    [("b", 10), ("e", 5), ("f", 0)],
]


class RichTypes(StatefulProcessor):
    """One row per key per batch with a value of every kind of column (nulls on ``value == 0``); no
    output at all for a batch whose values are negative or 7."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """A counter per key."""
        self.seen = handle.getValueState("seen", "n BIGINT")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Row]:
        """Count the key's rows and emit one row of every type."""
        values = [r.value for r in rows]
        n = (self.seen.get() or (0,))[0] + len(values)
        self.seen.update((n,))
        if any(v < 0 or v == 7 for v in values):
            return
        v = values[0]
        if v == 0:
            yield Row(key=key[0], n=n, **dict.fromkeys(RICH_COLUMNS))
            return
        at = dt.datetime(2024, 3, 10, 1, 30, v, tzinfo=dt.UTC)  # around a DST change in New York
        yield Row(
            key=key[0],
            n=n,
            at=at,
            wall=dt.datetime(2024, 3, 10, 2, 30, v),
            day=dt.date(2024, 2, 29),
            price=Decimal(f"{v}123456.789"),
            ratio=v / 3,
            small=float(v) / 8,
            flag=v % 2 == 0,
            raw=bytes([v, 0, 255]),
            tags=[key[0], None, "ü"],
            attrs={"v": v, "none": None},
            nested=Row(label=f"l{v}", points=[Row(x=v, at=at), Row(x=None, at=None)]),
        )


RICH_COLUMNS = ("at", "wall", "day", "price", "ratio", "small", "flag", "raw", "tags", "attrs", "nested")


class Sink(BatchRecorder):
    """Records rows and the schema, and writes each batch the ways sinks do (noop write, count, foreach)."""

    def __init__(self) -> None:
        super().__init__()
        self.schemas: dict[int, Any] = {}
        self.counts: dict[int, int] = {}

    def __call__(self, frame: Any, batch_id: int) -> None:
        frame.write.format("noop").mode("overwrite").save()
        frame.foreach(lambda row: None)
        self.counts[batch_id] = frame.count()
        self.schemas[batch_id] = frame.schema
        super().__call__(frame, batch_id)


def test_local_and_persisted_outputs_reach_the_sink_identically(spark: Any, tmp_path: Path) -> None:
    """The same batches, once with small outputs sent with the metadata (the default) and once persisted
    (``inline_output_bytes=0``): the sink sees the same schema and the same values, timestamps in a
    session time zone with a DST change, decimals, binary and nested types, null values and an empty
    batch included; only the first way read no persisted row."""
    write_batch_files(tmp_path / "in", [kv_table(b) for b in BATCHES])
    runs = {}
    with spark_conf(spark, {"spark.sql.session.timeZone": "America/New_York"}):
        for name, options in (("local", {}), ("persisted", {"inline_output_bytes": 0})):
            sink = Sink()
            _, reports = run_blobstate(
                spark,
                tmp_path / "in",
                tmp_path / f"ckpt-{name}",
                RichTypes(),
                output_schema=RICH_OUTPUT,
                local_dir=tmp_path / f"local-{name}",
                sink=sink,  # type: ignore[arg-type]
                api="row",
                **options,
            )
            runs[name] = (sink, reports)
    local, persisted = runs["local"], runs["persisted"]
    assert [r.inlined_partitions for r in local[1]] == [2, 2, 2]
    assert [r.inlined_partitions for r in persisted[1]] == [0, 0, 0]
    assert local[0].schemas == persisted[0].schemas
    assert local[0].rows == persisted[0].rows
    assert local[0].counts == persisted[0].counts == {0: 3, 1: 0, 2: 3}
    by_key = {row[0]: row for row in local[0].rows[0]}
    assert by_key["a"][4] == dt.date(2024, 2, 29) and by_key["a"][5] == Decimal("1123456.789")
    # collect() gives the instant as a naive datetime in the Python process's zone
    assert by_key["a"][2].astimezone(dt.UTC) == dt.datetime(2024, 3, 10, 1, 30, 1, tzinfo=dt.UTC)
    assert by_key["a"][3] == dt.datetime(2024, 3, 10, 2, 30, 1)  # a wall-clock time, not shifted
    assert {row[0]: row for row in local[0].rows[2]}["f"][2:] == (None,) * len(RICH_COLUMNS)


def _big_key_count() -> Any:
    class PaddedCount(RunningCount):
        """The running count, with a long ``pad`` on key ``big``'s rows (its partition's outputs grow)."""

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            for frame in super().handleInputRows(key, rows, timerValues):
                yield frame.assign(pad="x" * (4000 if key[0] == "big" else 1))

    return PaddedCount()


def test_outputs_over_the_limit_go_the_persisted_way_and_are_checked(spark: Any, tmp_path: Path) -> None:
    """With a limit of 2 KB (1 KB per partition) the partition of key ``big`` sends its rows the
    persisted way while the other sends them with its metadata; the sink gets both, and when the
    persisted rows are gone before it reads them, the stage runs again rather than mix attempts."""
    batches = [[("big", 1), ("b", 2)], [("big", 3), ("a", 4), ("b", 5)]]  # big, a: partition 0; b: 1
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches])
    recorder = BatchRecorder()
    evicted: list[int] = []

    def sink(frame: Any, batch_id: int) -> None:
        if batch_id == 1 and not evicted:
            evicted.append(batch_id)
            spark.catalog.clearCache()  # the persisted stage is gone; reading recomputes it
        recorder(frame, batch_id)

    _, reports = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        _big_key_count(),
        output_schema=RUNNING_COUNT_OUTPUT + ", pad STRING",
        local_dir=tmp_path / "local",
        sink=sink,  # type: ignore[arg-type]
        inline_output_bytes=2048,
    )
    assert evicted == [1], "the fault was not injected"
    assert [r.inlined_partitions for r in reports] == [1, 1]
    assert [r.stage_attempts for r in reports] == [1, 2]
    # the discarded run is recovery; the first batch had nothing to recover from
    assert reports[0].spark_recovery_seconds == 0 and reports[1].spark_recovery_seconds > 0
    expected = reference_running_count(batches)
    assert {b: [r[:3] for r in rows] for b, rows in recorder.rows.items()} == expected
    assert all(len(r[3]) == (4000 if r[0] == "big" else 1) for rows in recorder.rows.values() for r in rows)
    commit = CommitLog(open_blob_store(str(tmp_path / "ckpt"))).read_commit(2)
    assert (commit.metrics or {})["inlined_partitions"] == 1


def test_local_outputs_do_not_depend_on_the_persisted_stage(spark: Any, tmp_path: Path) -> None:
    """Small outputs came with the metadata: the persisted stage is dropped before the sink runs, so
    losing Spark's cache in the sink changes nothing (no second run of the stage) and the sink gets the
    committed attempt's rows."""
    batches = [[("a", 1), ("b", 2), ("a", 3)], [("a", 10), ("c", 7), ("d", -1)]]
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches])
    recorder = BatchRecorder()

    def sink(frame: Any, batch_id: int) -> None:
        spark.catalog.clearCache()
        recorder(frame, batch_id)

    _, reports = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        RunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local",
        sink=sink,  # type: ignore[arg-type]
    )
    assert recorder.rows == reference_running_count(batches)
    assert [(r.inlined_partitions, r.stage_attempts) for r in reports] == [(2, 1), (2, 1)]
