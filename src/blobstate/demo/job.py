"""The demo's streaming job, run as its own process so the demo can kill it mid-stream.

``python -m blobstate.demo.job --input DIR --profiles DIR --checkpoint DIR --output DIR`` processes
every click file (one per micro-batch) with the user-profile side stream (one file per micro-batch, kept
in the ``profiles`` adjunct store), prints one JSON line per batch on stdout, and exits when all are
processed.

With ``--remote sc://host:port`` the query runs on that Spark Connect server: its batch driver, and so
``on_batch``, runs in the server's Python, so the job reads each batch's line from the query's progress
instead (:func:`follow_progress`). Killing this process would leave the query running in the server, so
``--stop-after N`` stops the query (``query.stop()``, interrupting the batch it runs) once N batches
committed and prints ``{"stopped_after": N}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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


STOPPED_KEY = "stopped_after"
"""The key of the job's last line when ``--stop-after`` stopped the query: ``{"stopped_after": N}``."""

REPORT_KEYS = {
    "batch_id": "batchId",
    "skipped": "skipped",
    "input_rows": "inputRows",
    "output_rows": "outputRows",
    "seconds": "seconds",
    "max_load_seconds": "maxRestoreSeconds",
    "bytes_uploaded": "bytesUploaded",
    "snapshots": "snapshots",
    "partitions": "partitions",
}
"""The fields of a batch's line that ``blobstate.demo.run`` reads (:class:`BatchReport`'s names), each
with the key of blobstate's progress metrics that carries it (:meth:`BatchReport.progress_metrics`)."""


def report_from_progress(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The batch's line as the demo prints it locally (the :data:`REPORT_KEYS` of ``asdict`` of its
    :class:`BatchReport`, JSON-ready), from blobstate's metrics of one query progress
    (:func:`blobstate.engine.progress.progress_metrics`: camelCase keys, partitions keyed by strings)."""
    return {field: metrics[key] for field, key in REPORT_KEYS.items()}


class ProgressFollower:
    """Turns a query's progress into the demo's batch lines, each batch once: every poll of
    ``recentProgress`` lists the batches an earlier one saw, and a progress whose batch did not reach
    blobstate's report carries the last batch's metrics again (the source reports the last published)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        """``emit`` receives each line (without a newline)."""
        self._emit = emit
        self._seen: set[int] = set()
        self.committed = 0
        """Batches emitted that were not skipped (as ``blobstate.demo.run`` counts them)."""

    def poll(self, progress: Iterable[Mapping[str, Any] | str]) -> None:
        """Emit the line of every blobstate batch of ``progress`` (``query.recentProgress``, oldest first)
        not emitted yet."""
        from blobstate.engine.progress import progress_metrics

        for entry in progress:
            metrics = progress_metrics(entry)
            if not metrics or metrics["batchId"] in self._seen:
                continue
            report = report_from_progress(metrics)
            self._seen.add(report["batch_id"])
            self.committed += 0 if report["skipped"] else 1
            self._emit(json.dumps(report))


class FollowedQuery(Protocol):
    """What :func:`follow_progress` uses of a streaming query (a classic or a Spark Connect one)."""

    @property
    def recentProgress(self) -> Sequence[Mapping[str, Any]]:
        """The query's recent progress, oldest first."""

    def processAllAvailable(self) -> None:
        """Block until the query has processed all available input."""

    def stop(self) -> None:
        """Stop the query, interrupting the batch it runs."""


STOP_JOIN_SECONDS = 30.0
"""How long :func:`follow_progress` waits for ``processAllAvailable`` to return after stopping the query
(Spark checks whether the query is still active every 10 s)."""


def _print_line(line: str) -> None:
    print(line, flush=True)


def follow_progress(
    query: FollowedQuery,
    stop_after: int | None = None,
    emit: Callable[[str], None] = _print_line,
    *,
    poll_seconds: float = 0.1,
    stop_delay_seconds: float = 0.5,
) -> None:
    """Run ``query`` until it has processed all available input (``processAllAvailable``, on a thread of
    its own), emitting each batch's line from ``query.recentProgress`` meanwhile (:class:`ProgressFollower`).

    With ``stop_after``, once that many batches committed, wait ``stop_delay_seconds`` (the next batch is
    running by then), stop the query, emit the lines of batches that committed before the stop, then
    ``{"stopped_after": <batches>}``. A query that fails raises its error, after the lines of the batches
    it committed.
    """
    follower = ProgressFollower(emit)
    failed: list[BaseException] = []

    def process_all() -> None:
        try:
            query.processAllAvailable()
        except BaseException as error:  # handed to the main thread
            failed.append(error)

    worker = threading.Thread(target=process_all, name="blobstate-demo-process-all", daemon=True)
    worker.start()
    while worker.is_alive():
        follower.poll(query.recentProgress)
        if stop_after is not None and follower.committed >= stop_after:
            time.sleep(stop_delay_seconds)
            query.stop()
            worker.join(STOP_JOIN_SECONDS)
            follower.poll(query.recentProgress)
            emit(json.dumps({STOPPED_KEY: follower.committed}))
            return
        worker.join(poll_seconds)
    follower.poll(query.recentProgress)
    if failed:
        raise failed[0]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--profiles", type=Path, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--locality-wait", default="3s", help="spark.locality.wait")
    parser.add_argument("--remote", help="a Spark Connect server (sc://host:port) to run the query on")
    parser.add_argument(
        "--stop-after", type=int, help="with --remote: stop the query once this many batches committed"
    )
    args = parser.parse_args(argv)
    if args.stop_after is not None and args.remote is None:
        parser.error("--stop-after needs --remote (the demo kills a local job instead)")
    return args


def _start(
    spark: SparkSession, args: argparse.Namespace, on_batch: Callable[[BatchReport], None] | None = None
) -> StreamingQuery:
    """The demo's query on ``spark`` with the command line's directories and partition count."""
    return start_query(
        spark,
        args.input,
        args.checkpoint,
        args.output,
        args.local_dir,
        args.partitions,
        on_batch=on_batch,
        profiles_dir=args.profiles,
    )


def _main_remote(args: argparse.Namespace) -> int:
    """The job on a Spark Connect server: lines from the query's progress, stopped by ``--stop-after``."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    query = _start(spark, args)
    try:
        follow_progress(query, args.stop_after)
    finally:
        query.stop()
        spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the job until every input file is processed (with ``--remote``, or ``--stop-after`` batches)."""
    args = _arguments(argv)
    if args.remote is not None:
        return _main_remote(args)

    spark = build_spark("blobstate-demo", args.master, args.locality_wait)

    def report(batch: BatchReport) -> None:
        print(json.dumps(asdict(batch)), flush=True)

    query = _start(spark, args, on_batch=report)
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
