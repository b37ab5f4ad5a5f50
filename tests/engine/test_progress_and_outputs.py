"""What a Spark user sees of blobstate: progress, initial state, outputs that never mix attempts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from engine_helpers import (
    RUNNING_COUNT_OUTPUT,
    SPARK_ROCKSDB_PROVIDER,
    BatchRecorder,
    RunningCount,
    file_stream,
    kv_table,
    reference_running_count,
    run_blobstate,
    run_to_end,
    spark_conf,
    write_batch_files,
)
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle, StreamingQueryListener

import blobstate
from blobstate.blobstore import open_blob_store
from blobstate.layout import state_prefix
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark

BATCHES = [
    [("a", 1), ("b", 2), ("a", 3)],
    [("a", 10), ("c", 7), ("d", -1)],
]


def _blobstate_source(progress: Any) -> dict[str, str]:
    sources = [s for s in progress["sources"] if s["description"] == "blobstate"]
    assert len(sources) == 1, progress["sources"]
    return sources[0]["metrics"]


class _Listener(StreamingQueryListener):
    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, str]] = {}

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        for source in event.progress.sources:
            if source.description == "blobstate":
                self.metrics[event.progress.batchId] = dict(source.metrics)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def test_query_progress_and_listeners_carry_the_batch_metrics(spark: Any, tmp_path: Path) -> None:
    import json

    write_batch_files(tmp_path / "in", [kv_table(b) for b in BATCHES])
    listener = _Listener()
    spark.streams.addListener(listener)
    try:
        query = blobstate.transform_with_state(
            file_stream(spark, tmp_path / "in", "key STRING, value BIGINT"),
            key="key",
            processor=RunningCount(),
            output_schema=RUNNING_COUNT_OUTPUT,
            checkpoint=str(tmp_path / "ckpt"),
            sink=BatchRecorder(),
            num_partitions=2,
            local_dir=str(tmp_path / "local"),
        )
        run_to_end(query)
        deadline = time.monotonic() + 30  # listener events are delivered asynchronously
        while len(listener.metrics) < len(BATCHES) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    reports = blobstate.batch_reports(query)
    assert [r.batch_id for r in reports] == [0, 1]

    last = _blobstate_source(query.lastProgress)
    assert query.lastProgress["batchId"] == 1
    assert int(last["batchId"]) == 1 and int(last["version"]) == 2
    assert int(last["inputRows"]) == 3 and int(last["outputRows"]) == 3  # a, c and d
    assert int(last["bytesUploaded"]) == reports[1].bytes_uploaded > 0
    assert int(last["stateKeys"]) > 0
    partitions = json.loads(last["partitions"])
    assert sorted(partitions) == ["0", "1"]
    assert sum(p["input_rows"] for p in partitions.values()) == 3
    assert all(p["load_rule"] and p["commit_seconds"] >= 0 for p in partitions.values())

    parsed = blobstate.progress_metrics(query.lastProgress)
    assert parsed["inputRows"] == 3 and parsed["partitions"] == partitions
    assert parsed["writeThrough"] is False and isinstance(parsed["loadRules"], dict)
    # nothing failed: no recovery, though Spark spent time beyond the slowest task (input, shuffle)
    assert parsed["sparkRecoverySeconds"] == 0 and parsed["sparkOverheadSeconds"] > 0
    assert all(r.spark_recovery_seconds == 0 for r in reports)
    assert [blobstate.progress_metrics(p)["batchId"] for p in query.recentProgress] == [0, 1]

    by_batch = {p["batchId"]: _blobstate_source(p) for p in query.recentProgress}
    assert {b: int(m["inputRows"]) for b, m in by_batch.items()} == {0: 3, 1: 3}
    assert {b: m["inputRows"] for b, m in listener.metrics.items()} == {0: "3", 1: "3"}


class SeededCount(StatefulProcessor):
    """A running count whose keys may start from an initial state (Spark's ``initialState``)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """The count per key."""
        self.count = handle.getValueState("count", "n BIGINT")

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """Start the key's count at the initial state's value."""
        self.count.update((int(initialState["start"].iloc[0]),))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Add the rows to the count and emit it."""
        old = self.count.get()
        count = (old[0] if old else 0) + sum(len(pdf) for pdf in rows)
        self.count.update((count,))
        yield pd.DataFrame({"key": [key[0]], "n": [count]})


def test_initial_state_is_delivered_in_the_first_batch_as_spark_does(spark: Any, tmp_path: Path) -> None:
    write_batch_files(tmp_path / "in", [kv_table(b) for b in BATCHES])
    initial = spark.createDataFrame([("a", 100), ("z", 5), ("c", 1000)], "id STRING, start BIGINT")
    theirs = BatchRecorder()
    with spark_conf(spark, {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB_PROVIDER}):
        spark_query = (
            file_stream(spark, tmp_path / "in", "key STRING, value BIGINT")
            .groupBy("key")
            .transformWithStateInPandas(
                statefulProcessor=SeededCount(),
                outputStructType="key STRING, n BIGINT",
                outputMode="Update",
                timeMode="None",
                initialState=initial.groupBy("id"),
            )
            .writeStream.foreachBatch(theirs)
            .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
            .start()
        )
        run_to_end(spark_query)
    ours, _ = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        SeededCount(),
        output_schema="key STRING, n BIGINT",
        local_dir=tmp_path / "local",
        initial_state=initial.groupBy("id"),
    )
    assert ours.rows == theirs.rows
    assert ("a", 102) in ours.rows[0] and ("c", 1001) in ours.rows[1]


def test_outputs_lost_before_the_sink_read_them_rerun_the_stage_never_mix_attempts(
    spark: Any, tmp_path: Path
) -> None:
    """The sink's first read finds the persisted outputs gone (as after a lost executor): the partition's
    recomputation is another attempt, so the read fails, the driver runs the stage again, and the sink
    gets exactly the outputs of the attempts whose uids are committed. (Outputs persisted on the
    executors, ``inline_output_bytes=0``: small ones would reach the driver with the metadata.)"""
    write_batch_files(tmp_path / "in", [kv_table(b) for b in BATCHES])
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
        RunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local",
        sink=sink,  # type: ignore[arg-type]
        inline_output_bytes=0,
    )
    assert evicted == [1], "the fault was not injected"
    assert recorder.rows == reference_running_count(BATCHES)
    assert recorder.calls[1] == 1, "the sink saw rows of the failed read"
    assert [r.stage_attempts for r in reports] == [1, 2]

    store = open_blob_store(str(tmp_path / "ckpt"))
    uids = CommitLog(store).read_commit(2).checkpoints["0"]
    for partition, uid in uids.items():
        deltas = [n for n in store.list(state_prefix("0", partition)) if n.rsplit("/", 1)[1].startswith("2_")]
        # the first stage's attempt and the recomputation the sink's read started lost; never committed
        assert f"{state_prefix('0', partition)}2_{uid}.delta" in deltas and len(deltas) >= 2
