"""Memory sources as the main and the side streams of an adjunct query (real Spark, Spark's JVM
``MemoryStream`` driven through py4j: PySpark has no Python one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from adjunct_jobs import (
    CLICKS,
    DISCOUNTS,
    OUTPUT,
    PROFILES,
    Enrich,
    clicks,
    discounts,
    profiles,
    reference,
    rows_of,
    run_to_end,
)

import blobstate
from blobstate import Adjunct
from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark

Batch = tuple[pa.Table, pa.Table, pa.Table]
"""One micro-batch's rows: profiles, discounts, clicks."""

BATCHES: list[Batch] = [
    (
        profiles([("a", "gold"), ("b", "silver")]),
        discounts([("gold", 10), ("silver", 5)]),
        clicks([("a", 1), ("b", 2), ("c", 3)]),
    ),
    (  # a changes twice in one batch (the later row wins); silver's discount is deleted
        profiles([("a", "silver"), ("c", "gold"), (None, "gold"), ("a", "bronze")]),
        discounts([("silver", None), ("bronze", 2)]),
        clicks([("a", 4), ("b", 5), ("c", 6)]),
    ),
    (  # b's profile is deleted, gold's discount changes
        profiles([("b", None)]),
        discounts([("gold", 20)]),
        clicks([("a", 7), ("b", 8), ("c", 9)]),
    ),
    # after the restart
    (profiles([("c", "bronze")]), discounts([("bronze", 3)]), clicks([])),  # side rows only
    (profiles([("b", "gold")]), discounts([]), clicks([("b", 10), ("c", 11)])),  # b set again
]
RESTART_AT = 3
"""The first batch of the second run (the query stopped and started again on its checkpoint)."""


class MemoryStreams:
    """The query's three memory streams: STRING rows holding JSON, parsed into the streams' columns."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        jvm = spark._jvm
        self._to_seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq
        self.sources: list[Any] = []
        self.frames: list[Any] = []
        for schema in (PROFILES, DISCOUNTS, CLICKS):
            # Spark 4's companion (package ...streaming.runtime); Scala's implicit Encoder is an
            # ordinary parameter from Python
            memory_stream = jvm.org.apache.spark.sql.execution.streaming.runtime.MemoryStream
            source = memory_stream.apply(jvm.org.apache.spark.sql.Encoders.STRING(), spark._jsparkSession)
            raw = DataFrame(source.toDF(), spark)
            self.sources.append(source)
            self.frames.append(raw.select(F.from_json("value", schema).alias("r")).select("r.*"))

    def add(self, batch: Batch) -> None:
        """Add one micro-batch's rows, one block per stream (a non-empty one: a block is a read partition,
        and its rows are read in the order they were added)."""
        for source, table in zip(self.sources, batch, strict=True):
            if table.num_rows:
                source.addData(self._to_seq([json.dumps(row) for row in table.to_pylist()]))


class FeedingSink:
    """Records every batch, then adds the next batch's rows up to ``last``: the sink runs inside the
    micro-batch, before Spark plans the next one, so all three streams' rows land in one batch (added
    while the query runs, Spark could plan a batch between two streams' ``addData``)."""

    def __init__(self, streams: MemoryStreams, last: int) -> None:
        self.streams = streams
        self.last = last
        self.calls: list[tuple[int, list[tuple[Any, ...]]]] = []

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.calls.append((batch_id, rows_of(frame)))
        if batch_id < self.last:
            self.streams.add(BATCHES[batch_id + 1])


def start(streams: MemoryStreams, base: Path, sink: FeedingSink) -> Any:
    profiles_df, discounts_df, clicks_df = streams.frames
    return blobstate.transform_with_state(
        clicks_df,
        key="user",
        processor=Enrich(),
        output_schema=OUTPUT,
        checkpoint=str(base / "ckpt"),
        sink=sink,
        num_partitions=2,
        adjuncts=[
            Adjunct("profiles", profiles_df, key="user", value="tier", bootstrap=False),
            Adjunct("discounts", discounts_df, key="tier", value="pct", mode="broadcast", bootstrap=False),
        ],
        local_dir=str(base / "local"),
    )


def expected(first: int, last: int) -> list[tuple[int, list[tuple[Any, ...]]]]:
    """The sink calls of batches ``first..last`` by the plain-Python reference."""
    side_profiles, side_discounts, main = (list(t) for t in zip(*BATCHES, strict=True))
    out = reference(main, side_profiles, side_discounts)
    return [(b, out.get(b, [])) for b in range(first, last + 1)]


def test_memory_side_streams_apply_each_batch_s_rows_before_its_main_rows_across_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    streams = MemoryStreams(spark)
    streams.add(BATCHES[0])
    first = FeedingSink(streams, last=RESTART_AT - 1)
    run_to_end(start(streams, tmp_path, first))
    assert first.calls == expected(0, RESTART_AT - 1)

    # The same memory streams (a memory source's data and offsets live in this driver only) on the same
    # checkpoint: the stores come back from the checkpoint and Spark resumes each source after its offset.
    streams.add(BATCHES[RESTART_AT])
    second = FeedingSink(streams, last=len(BATCHES) - 1)
    run_to_end(start(streams, tmp_path, second))
    assert second.calls == expected(RESTART_AT, len(BATCHES) - 1)

    log = CommitLog(open_blob_store(str(tmp_path / "ckpt")))
    commits = [log.read_commit(v) for v in range(1, len(BATCHES) + 1)]
    taken = {
        name: [sum(c.metrics["adjuncts"][name][f] for c in commits) for f in ("rows", "deletes", "null_keys")]
        for name in ("profiles", "discounts")
    }
    assert taken == {"profiles": [9, 1, 1], "discounts": [6, 1, 0]}
    # Each commit records the side streams' offsets as Spark wrote them (a memory source's: its last
    # block); batch 4 added no discounts.
    assert [c.adjunct_offsets for c in commits] == [
        {"profiles": [b], "discounts": [min(b, 3)]} for b in range(len(BATCHES))
    ]
