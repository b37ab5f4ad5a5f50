"""An adjunct query's side row order across files, its key types, and its first batch (real Spark)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from adjunct_jobs import (
    CLICKS,
    DISCOUNTS,
    OUTPUT,
    PROFILES,
    Enrich,
    clicks,
    profiles,
    rows_of,
    run_to_end,
    start_query,
)

import blobstate
from blobstate import Adjunct
from blobstate.adjunct.spec import AdjunctError
from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark

LARGE = 20_000
"""Rows of the large side files (the key the test reads is their last row)."""


class AllBatches:
    """A sink keeping every call: batch id and rows (an empty batch too)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[tuple[Any, ...]]]] = []

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.calls.append((batch_id, rows_of(frame)))


def write(path: Path, table: pa.Table, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    os.utime(path, (mtime, mtime))


def start(spark: Any, base: Path, sink: Any, persistent: bool) -> Any:
    """Enrichment whose side streams read every new file in one batch (no per-trigger limit)."""

    def stream(name: str, schema: str) -> Any:
        return spark.readStream.schema(schema).parquet(str(base / name))

    adjuncts = [
        Adjunct("profiles", stream("profiles", PROFILES), key="user", value="tier", persistent=persistent),
        Adjunct(
            "discounts",
            stream("discounts", DISCOUNTS),
            key="tier",
            value="pct",
            mode="broadcast",
            persistent=persistent,
        ),
    ]
    return blobstate.transform_with_state(
        stream("clicks", CLICKS),
        key="user",
        processor=Enrich(),
        output_schema=OUTPUT,
        checkpoint=str(base / "ckpt"),
        sink=sink,
        num_partitions=2,
        adjuncts=adjuncts,
        local_dir=str(base / "local"),
    )


def test_a_small_older_and_a_large_newer_file_of_one_batch_apply_in_the_source_s_order(
    spark: Any, tmp_path: Path
) -> None:
    # Spark reads a batch's files largest first; the file source's log lists them oldest first. The
    # older file's name sorts last, so neither size nor name order gives the source's order.
    base = time.time() - 3600
    filler = [(f"u{i:05d}", "bronze") for i in range(LARGE)]
    write(tmp_path / "profiles" / "z-small.parquet", profiles([("k", "silver")]), base + 1)
    write(
        tmp_path / "profiles" / "a-large.parquet",
        profiles([("k", "bronze"), *filler, ("k", "gold")]),
        base + 2,
    )
    tiers = pa.table({"tier": [f"t{i:05d}" for i in range(LARGE)] + ["gold"], "pct": [0] * LARGE + [20]})
    write(tmp_path / "discounts" / "z-small.parquet", pa.table({"tier": ["gold"], "pct": [10]}), base + 1)
    write(tmp_path / "discounts" / "a-large.parquet", tiers, base + 2)
    write(tmp_path / "clicks" / "c0.parquet", clicks([("k", 1)]), base + 3)

    steady = AllBatches()
    run_to_end(start(spark, tmp_path, steady, persistent=True))
    assert steady.calls == [(0, [("k", 1, 1, "gold", 20)])]

    # A non-persistent store is re-created at the restart and reloaded from the side streams' history:
    # the same files give the same values.
    write(tmp_path / "clicks" / "c1.parquet", clicks([("k", 2)]), base + 4)
    reloaded = AllBatches()
    run_to_end(start(spark, tmp_path, reloaded, persistent=False))
    assert reloaded.calls == [(1, [("k", 2, 2, "gold", 20)])]
    commit = CommitLog(open_blob_store(str(tmp_path / "ckpt"))).read_commit(2)
    for name in ("profiles", "discounts"):
        assert commit.metrics["adjuncts"][name]["start"]["reload"] is True


def test_a_side_key_of_another_type_than_the_main_key_is_refused_before_any_batch(
    spark: Any, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()

    def stream(schema: str) -> Any:
        return spark.readStream.schema(schema).parquet(str(tmp_path / "in"))

    cases = [
        ("user STRING, n BIGINT", "user BIGINT, tier STRING", "BIGINT", "STRING", "string"),
        ("user BIGINT, n BIGINT", "user STRING, tier STRING", "STRING", "BIGINT", "bigint"),
    ]
    try:
        for main, side, side_type, main_type, cast in cases:
            with pytest.raises(AdjunctError) as error:
                blobstate.transform_with_state(
                    stream(main),
                    key="user",
                    processor=Enrich(),
                    output_schema=OUTPUT,
                    checkpoint=str(tmp_path / "ckpt"),
                    sink=AllBatches(),
                    num_partitions=2,
                    adjuncts=[Adjunct("profiles", stream(side), key="user", value="tier")],
                )
            message = str(error.value)
            assert "\n" not in message and "__bsadj" not in message
            assert f"adjunct 'profiles': its key column 'user' is {side_type}" in message
            assert f"main key column 'user' is {main_type}" in message
            assert f'.withColumn("user", col("user").cast("{cast}"))' in message
        assert not (tmp_path / "ckpt").exists()
    finally:
        for query in spark.streams.active:  # started by this test only where the check is missing
            query.stop()


def test_a_new_query_without_input_runs_no_batch_until_input_arrives(spark: Any, tmp_path: Path) -> None:
    for name in ("clicks", "profiles", "discounts"):
        (tmp_path / name).mkdir()
    sink = AllBatches()
    query = start_query(spark, tmp_path, str(tmp_path / "ckpt"), sink, local_dir=str(tmp_path / "local"))
    log = CommitLog(open_blob_store(str(tmp_path / "ckpt")))
    try:
        query.processAllAvailable()  # returns once a trigger found no input
        assert sink.calls == [] and log.latest_commit() is None  # as Spark's own stateful operators
        write(tmp_path / "profiles" / "p0.parquet", profiles([("a", "gold")]), time.time() - 10)
        write(tmp_path / "clicks" / "c0.parquet", clicks([("a", 1)]), time.time() - 10)
        query.processAllAvailable()
    finally:
        query.stop()
    assert sink.calls == [(0, [("a", 1, 1, "gold", None)])]
    assert log.latest_commit().version == 1


def test_a_rate_side_stream_never_holds_main_rows_back(spark: Any, tmp_path: Path) -> None:
    """A generated side stream (``rate``) has no backlog to load before main rows: it produces rows for
    as long as the query runs, so a bootstrap that waited for a batch without new side rows would hold
    every main row forever. Main rows are processed in the batch that reads them, as with a file side
    stream that reads its backlog in one batch."""
    from pyspark.sql import functions as F

    from blobstate.adjunct.history import is_rate_limited
    from blobstate.engine.jvm import seam_for

    (tmp_path / "discounts").mkdir()
    write(tmp_path / "clicks" / "c0.parquet", clicks([("u0", 1), ("u1", 2)]), time.time() - 10)
    rate = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    profiles_stream = rate.select(
        F.concat(F.lit("u"), (F.col("value") % 3).cast("string")).alias("user"), F.lit("gold").alias("tier")
    )
    jvm = seam_for(spark)
    assert not is_rate_limited(jvm.streaming_leaves(profiles_stream))
    limited = (
        spark.readStream.schema(CLICKS).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "clicks"))
    )
    assert is_rate_limited(jvm.streaming_leaves(limited))
    sink = AllBatches()
    query = blobstate.transform_with_state(
        spark.readStream.schema(CLICKS).parquet(str(tmp_path / "clicks")),
        key="user",
        processor=Enrich(),
        output_schema=OUTPUT,
        checkpoint=str(tmp_path / "ckpt"),
        sink=sink,
        num_partitions=2,
        adjuncts=[
            Adjunct("profiles", profiles_stream, key="user", value="tier", bootstrap=True),
            Adjunct(
                "discounts",
                spark.readStream.schema(DISCOUNTS).parquet(str(tmp_path / "discounts")),
                key="tier",
                value="pct",
                mode="broadcast",
            ),
        ],
        local_dir=str(tmp_path / "local"),
    )
    try:
        deadline = time.monotonic() + 120  # a wait for the query, not a measure of its speed
        while time.monotonic() < deadline and not any(rows for _, rows in sink.calls):
            time.sleep(0.5)
    finally:
        query.stop()
    first = next(((batch, rows) for batch, rows in sink.calls if rows), None)
    assert first is not None, f"main rows were held back: {len(sink.calls)} batches emitted nothing"
    batch, rows = first
    assert batch == 0  # the batch that read the clicks
    assert sorted((user, n, count) for user, n, count, _, _ in rows) == [("u0", 1, 1), ("u1", 2, 1)]
