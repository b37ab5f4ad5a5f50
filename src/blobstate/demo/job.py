"""The demo's streaming job, run as its own process so the demo can kill it mid-stream.

``python -m blobstate.demo.job --input DIR --profiles DIR --checkpoint DIR --output DIR`` processes
every click file (one per micro-batch) with the user-profile side stream (one file per micro-batch, kept
in the ``profiles`` adjunct store), prints one JSON line per batch on stdout, and exits when all are
processed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from blobstate.engine.driver import BatchReport
    from blobstate.processor import StatefulProcessor


def build_spark(app_name: str, master: str = "local[2]", locality_wait: str = "3s") -> SparkSession:
    """A SparkSession sized for this machine (``local[2]`` or ``local-cluster[2,1,1024]``)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.locality.wait", locality_wait)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def idempotent_parquet_sink(output_dir: Path) -> Callable[[DataFrame, int], None]:
    """A sink that writes each batch to ``batch-<id>.parquet``, replacing it on replay (exactly-once)."""

    def sink(frame: DataFrame, batch_id: int) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        table = frame.toArrow()
        tmp = output_dir / f".batch-{batch_id}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, output_dir / f"batch-{batch_id:05d}.parquet")

    return sink


def start_query(
    spark: SparkSession,
    input_dir: Path,
    checkpoint: str,
    output_dir: Path,
    local_dir: str,
    partitions: int = 4,
    on_batch: Callable[[BatchReport], None] | None = None,
    *,
    profiles_dir: Path,
    processor: StatefulProcessor | None = None,
) -> StreamingQuery:
    """Start the demo's streaming query on ``spark`` (one click file and one profile file per
    micro-batch); returns it. The job's process runs it with its own session; tests run it with theirs.
    ``processor`` replaces the demo's :class:`~blobstate.demo.sessions.SessionProcessor` (a subclass of
    it, say, defined in a job's own module).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    from blobstate.adjunct import Adjunct
    from blobstate.demo.clickstream import PROFILE_SCHEMA, SCHEMA
    from blobstate.demo.sessions import OUTPUT_SCHEMA, WATERMARK_DELAY_MS, SessionProcessor
    from blobstate.engine.query import transform_with_state

    clicks = (
        spark.readStream.schema(from_arrow_schema(SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    # The profile side stream: applied to the "profiles" adjunct store before each batch's clicks. One
    # file per batch, like the clicks, so profiles change while the job runs; the first file holds every
    # user, so the store is filled before any click is processed.
    profiles = (
        spark.readStream.schema(from_arrow_schema(PROFILE_SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(profiles_dir))
    )
    side = Adjunct("profiles", profiles, key="user", value="tier", bootstrap=False)
    return transform_with_state(
        clicks,
        key="user",
        processor=processor if processor is not None else SessionProcessor(),
        output_schema=OUTPUT_SCHEMA,
        checkpoint=checkpoint,
        sink=idempotent_parquet_sink(output_dir),
        num_partitions=partitions,
        time_mode="EventTime",
        event_time_column="event_time",
        watermark_delay_ms=WATERMARK_DELAY_MS,
        output_mode="Append",
        local_dir=local_dir,
        snapshot_every=5,
        on_batch=on_batch,
        adjuncts=[side],
    )


def main(argv: list[str] | None = None) -> int:
    """Run the job until every input file is processed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--profiles", type=Path, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--locality-wait", default="3s", help="spark.locality.wait")
    args = parser.parse_args(argv)

    spark = build_spark("blobstate-demo", args.master, args.locality_wait)

    def report(batch: BatchReport) -> None:
        print(json.dumps(asdict(batch)), flush=True)

    query = start_query(
        spark,
        args.input,
        args.checkpoint,
        args.output,
        args.local_dir,
        args.partitions,
        on_batch=report,
        profiles_dir=args.profiles,
    )
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
