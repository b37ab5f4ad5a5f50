"""A WriterSink: the processing stage runs inside the sink's write (one Spark job, nothing persisted)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from engine_helpers import (
    RUNNING_COUNT_OUTPUT,
    ArrowRunningCount,
    file_stream,
    kv_table,
    reference_running_count,
    run_to_end,
    write_batch_files,
)

import blobstate
from blobstate.engine.handle import BlobstateQueryError, ProcessorQueryError

pytestmark = pytest.mark.spark

BATCHES = [
    [("a", 1), ("b", 2), ("a", 3), ("c", -4)],
    [("a", 10), ("d", 7), ("d", -1), ("boom", 1)],
    [("b", 6), ("d", 4), ("e", 0)],
]


class FailsOnBoom(ArrowRunningCount):
    """The running count, raising while it handles a batch with the key ``boom``."""

    def handleInputBatch(self, batch: Any, timerValues: Any) -> Any:
        if "boom" in batch.keys["key"].to_pylist():
            raise ValueError("boom is not a key")
        yield from super().handleInputBatch(batch, timerValues)


def start(spark: Any, tmp_path: Path, processor: Any, **options: Any) -> Any:
    return blobstate.transform_with_state(
        file_stream(spark, tmp_path / "in", "key STRING, value BIGINT"),
        key="key",
        processor=processor,
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=str(tmp_path / "ckpt"),
        sink=blobstate.WriterSink("parquet", str(tmp_path / "out")),
        num_partitions=2,
        local_dir=str(tmp_path / "local"),
        api="arrow",
        async_cleanup=False,
        **options,
    )


def written(spark: Any, tmp_path: Path) -> Counter:
    return Counter(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())


def test_a_failed_write_commits_nothing_and_the_restart_writes_each_batch_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    """Both partitions run in one task (``partitions_per_task=2``): the writer's job gets the metadata of
    a task's every partition, or of none."""
    write_batch_files(tmp_path / "in", [kv_table(b) for b in BATCHES])
    query = start(spark, tmp_path, FailsOnBoom(), partitions_per_task=2)
    with pytest.raises(ProcessorQueryError, match="boom is not a key"):
        run_to_end(query)
    reports = [r for r in blobstate.batch_reports(query) if not r.skipped]
    assert [r.batch_id for r in reports] == [0]
    assert reports[0].write_through and reports[0].sink_seconds == 0.0 and reports[0].stage_tasks == 1
    assert not (tmp_path / "ckpt" / "commits" / "2.json").exists()

    query = start(spark, tmp_path, ArrowRunningCount(), partitions_per_task=2)
    run_to_end(query)
    reports = [r for r in blobstate.batch_reports(query) if not r.skipped]
    assert [r.batch_id for r in reports] == [1, 2] and all(r.write_through for r in reports)
    assert {r.stage_tasks for r in reports} == {1} and all(len(r.partitions) == 2 for r in reports)
    # The failed job wrote nothing (Spark's commit protocol); the restart wrote batches 1 and 2 once.
    expected = Counter(tuple(r) for rows in reference_running_count(BATCHES).values() for r in rows)
    assert written(spark, tmp_path) == expected


class FailsOnSecondWrite(blobstate.WriterSink):
    """A parquet WriterSink whose second write (batch 1) fails as a full disk would."""

    calls = 0

    def __call__(self, frame: Any, batch_id: int) -> None:
        FailsOnSecondWrite.calls += 1
        if FailsOnSecondWrite.calls == 2:
            raise OSError("no space left on device")
        super().__call__(frame, batch_id)


def test_a_failed_sink_write_names_its_batch_and_commits_nothing(spark: Any, tmp_path: Path) -> None:
    write_batch_files(tmp_path / "in", [kv_table(b) for b in BATCHES[:1] + BATCHES[2:]])
    query = blobstate.transform_with_state(
        file_stream(spark, tmp_path / "in", "key STRING, value BIGINT"),
        key="key",
        processor=ArrowRunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=str(tmp_path / "ckpt"),
        sink=FailsOnSecondWrite("parquet", str(tmp_path / "out")),
        num_partitions=2,
        local_dir=str(tmp_path / "local"),
        api="arrow",
    )
    with pytest.raises(BlobstateQueryError, match=r"batch 1: the sink raised OSError: no space left"):
        run_to_end(query)
    assert [r.batch_id for r in blobstate.batch_reports(query) if not r.skipped] == [0]
    assert (tmp_path / "ckpt" / "commits" / "1.json").exists()
    assert not (tmp_path / "ckpt" / "commits" / "2.json").exists()


def test_a_writer_sink_is_also_a_plain_sink_function(spark: Any, tmp_path: Path) -> None:
    frame = spark.createDataFrame(pa.table({"key": ["x"], "count": [1], "total": [2]}).to_pandas())
    blobstate.WriterSink("parquet", str(tmp_path / "out"), mode="overwrite")(frame, 0)
    assert written(spark, tmp_path) == Counter({("x", 1, 2): 1})
