"""A query that keeps running keeps its checkpoint and its local directory bounded: after 20 and after
60 tiny micro-batches (a rate source, the vectorized running count, ``min_versions_to_retain=2``,
a snapshot every 2 versions) the checkpoint's objects and the local directory's files stay below
bounds computed from the retention settings alone, never from the number of batches run."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blobstate.state.policy import DEFAULT_LOCAL_CHECKPOINTS_TO_KEEP

PARTITIONS = 2
RETAIN = 2
SNAPSHOT_EVERY = 2
STORE_FILES = 20
"""At most this many files in one partition's RocksDB store of this test (a few hundred keys): its SSTs
(one flush per commit, universal compaction from 4 sorted runs on), WALs, MANIFEST, CURRENT, OPTIONS,
IDENTITY, LOCK, two info logs, blobstate's identity and lineage files."""

RETAINED_VERSIONS = RETAIN + SNAPSHOT_EVERY + 2
"""Versions whose commit and deltas the checkpoint may hold: the retained ones, the snapshot interval
below them that they load from, the one being committed and the one the cleanup has not reached."""
RETAINED_SNAPSHOTS = RETAINED_VERSIONS // SNAPSHOT_EVERY + 2
"""Snapshots among them, plus a background upload not yet named by a commit."""
CHECKPOINT_BOUND = (
    1 + RETAINED_VERSIONS + PARTITIONS * (RETAINED_VERSIONS + RETAINED_SNAPSHOTS * (1 + STORE_FILES))
)
"""Objects of blobstate's own (Spark's offsets under ``_spark/`` are Spark's, bounded by its
``minBatchesToRetain``): ``metadata.json``, commits, and per partition deltas, snapshot indexes and
their files."""
LOCAL_BOUND = PARTITIONS * (
    2 + STORE_FILES * (2 + DEFAULT_LOCAL_CHECKPOINTS_TO_KEEP) + 2 * RETAINED_SNAPSHOTS
)
"""Per partition: its lock files, the working store, the local checkpoints kept and the one being
taken, and the upload records of the snapshots not yet named."""
BATCHES = (20, 40)
"""Batches of the two runs: the counts are taken after 20 and after 60, both far past the retention
window of the settings above (a few versions), so a count that grew with the batches would show."""


def _blobstate_objects(checkpoint: Path) -> dict[str, int]:
    from blobstate.blobstore import open_blob_store

    with open_blob_store(str(checkpoint)) as store:
        names = [n for n in store.list("") if not n.startswith("_spark/")]
    return {
        "objects": len(names),
        "commits": sum(n.startswith("commits/") for n in names),
        "deltas": sum(n.endswith(".delta") for n in names),
    }


def _local_files(local_dir: Path) -> int:
    return sum(1 for p in local_dir.rglob("*") if p.is_file())


def _run_until(spark: Any, checkpoint: Path, local_dir: Path, batches: int) -> int:
    """Run the query until this run has committed ``batches`` batches, then stop it; the batches
    committed."""
    from pyspark.sql import functions as F

    import blobstate
    from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, ArrowRunningCount

    committed = 0
    enough = threading.Event()

    def on_batch(_report: Any) -> None:
        nonlocal committed
        committed += 1
        if committed >= batches:
            enough.set()

    events = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 20)
        .load()
        .select(
            F.concat(F.lit("k"), (F.col("value") % 300).cast("string")).alias("key"),
            F.col("value").alias("value"),
        )
    )
    query = blobstate.transform_with_state(
        events,
        key="key",
        processor=ArrowRunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=str(checkpoint),
        sink=blobstate.WriterSink("noop", mode="overwrite"),
        num_partitions=PARTITIONS,
        api="arrow",
        local_dir=str(local_dir),
        on_batch=on_batch,
        min_versions_to_retain=RETAIN,
        snapshot_every=SNAPSHOT_EVERY,
    )
    try:
        deadline = time.monotonic() + 600
        while not enough.wait(0.2):
            assert query.isActive, f"the query stopped: {query.exception()}"
            assert time.monotonic() < deadline, f"only {committed} of {batches} batches in 600 s"
    finally:
        query.stop()
    return committed


@pytest.mark.spark
def test_checkpoint_objects_and_local_files_stay_bounded_as_batches_accumulate(
    spark: Any, tmp_path: Path
) -> None:
    checkpoint, local_dir = tmp_path / "checkpoint", tmp_path / "local"
    counts = []
    run = 0
    for more in BATCHES:
        run += _run_until(spark, checkpoint, local_dir, more)
        files = _local_files(local_dir)
        counts.append({"batches": run, **_blobstate_objects(checkpoint), "local_files": files})
    print(counts, {"checkpoint": CHECKPOINT_BOUND, "local": LOCAL_BOUND})
    assert counts[-1]["batches"] >= 3 * counts[0]["batches"], counts
    for count in counts:
        assert count["commits"] <= RETAINED_VERSIONS, counts
        assert count["deltas"] <= PARTITIONS * RETAINED_VERSIONS, counts
        assert count["objects"] <= CHECKPOINT_BOUND, (counts, CHECKPOINT_BOUND)
        assert count["local_files"] <= LOCAL_BOUND, (counts, LOCAL_BOUND)
