"""Side streams from a source other than files: the union, the offsets a commit records and the replay
check do not depend on the source. A ``rate-micro-batch`` source (``rowsPerBatch`` rows per batch, the
values counting up) stands in for a Kafka topic, which cannot run here."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from adjunct_jobs import CLICKS, DISCOUNTS, OUTPUT, Enrich, RecordingSink, clicks, discounts, write_files

import blobstate
from blobstate.adjunct.history import is_rate_limited
from blobstate.adjunct.union import count_sources
from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark

USERS = ("u0", "u1", "u2")


def rate_profiles(spark: Any) -> Any:
    """``user, tier`` rows from a rate source: each batch sets u0, u1, u2 to the tiers t<value>."""
    from pyspark.sql import functions as F

    rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", len(USERS)).load()
    return rate.select(
        F.concat(F.lit("u"), (F.col("value") % len(USERS)).cast("string")).alias("user"),
        F.concat(F.lit("t"), F.col("value").cast("string")).alias("tier"),
    )


def start(spark: Any, base: Path, sink: Any) -> Any:
    from blobstate import Adjunct

    def files(name: str, schema: str) -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(base / name))

    return blobstate.transform_with_state(
        files("clicks", CLICKS),
        key="user",
        processor=Enrich(),
        output_schema=OUTPUT,
        checkpoint=str(base / "ckpt"),
        sink=sink,
        num_partitions=2,
        local_dir=str(base / "local"),
        adjuncts=[
            # bootstrap=False: a rate source has no backlog to wait for, it always has a next batch
            Adjunct("profiles", rate_profiles(spark), key="user", value="tier", bootstrap=False),
            Adjunct("discounts", files("discounts", DISCOUNTS), key="tier", value="pct", mode="broadcast"),
        ],
    )


def run_until(query: Any, committed: int) -> None:
    """Let ``query`` run until it has committed ``committed`` batches in this run, then stop it."""
    deadline = time.monotonic() + 300
    try:
        while sum(1 for r in blobstate.batch_reports(query) if not r.skipped) < committed:
            assert time.monotonic() < deadline, "the query did not commit its batches"
            query.awaitTermination(0.2)  # raises the query's failure, if any
    finally:
        query.stop()


def test_a_rate_side_stream_is_applied_per_batch_recorded_and_resumed(spark: Any, tmp_path: Path) -> None:
    assert count_sources(rate_profiles(spark)) == 1 and is_rate_limited(rate_profiles(spark))
    write_files(tmp_path / "clicks", [clicks([(u, i) for i, u in enumerate(USERS)])])
    write_files(tmp_path / "discounts", [discounts([("t0", 5)])])
    sink = RecordingSink()
    run_until(start(spark, tmp_path, sink), 2)

    # The batch's side rows come first: batch 0's clicks see the tiers of rate values 0, 1, 2.
    assert sink.rows[0] == [("u0", 0, 1, "t0", 5), ("u1", 1, 1, "t1", None), ("u2", 2, 1, "t2", None)]
    log = CommitLog(open_blob_store(str(tmp_path / "ckpt")))
    spark_log = tmp_path / "ckpt" / "_spark" / "offsets"
    for version in log.versions():
        commit = log.read_commit(version)
        entry = (spark_log / str(commit.batch_id)).read_text().splitlines()
        # sources in the offset log: clicks, the rate source, discounts, blobstate's ticks
        assert commit.adjunct_offsets["profiles"] == [json.loads(entry[3])], entry
    assert commit.metrics["adjuncts"]["profiles"]["rows"] == len(USERS)

    # A restart on the same checkpoints: Spark resumes every source from its offset log, the replay
    # check accepts it (the rate source's offsets are compared as Spark wrote them) and the store goes on.
    last = log.latest_commit().version
    write_files(tmp_path / "clicks", [clicks([("u1", 10)])], first=1)
    sink = RecordingSink()
    run_until(start(spark, tmp_path, sink), 2)
    later = [log.read_commit(v) for v in log.versions() if v > last]
    assert later and all(c.adjunct_offsets["profiles"] != [None] for c in later)
    (click,) = [r for rows in sink.rows.values() for r in rows]
    assert click[:3] == ("u1", 10, 2) and click[3].startswith("t"), click  # u1's second click
