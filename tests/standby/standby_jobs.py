"""A streaming job for the multi-host standby tests, run as a driver subprocess against the cluster.

It runs ``failure_jobs.TotalsProcessor`` (running count and sum per key, with a plain-Python reference)
with ``standby_replicas`` over parquet input files, one file per batch, and prints one JSON line per
committed batch: the batch report, where each partition ran and its replicas (with hosts), and the
executors alive. It coordinates with the test through a control directory:

* ``--pause-after B``: after batch B commits (and its standby sync round finished), print
  ``{"paused": B, ...}`` and wait until the file ``resume-B`` exists (the test kills hosts meanwhile),
  then until ``--executors`` executors are registered again;
* ``--slow-sync-from B``: the sync rounds started from batch B's commit on read deltas slowly (fault
  injection around the real blob store, ``standby_faults.py``) and the job stops waiting for them, so a
  failover meets a sync that is still running (Invariant 2).
* the first task that handles key ``SLOW_KEY`` (the test puts it in one batch's input) writes
  ``in-stage.json`` (its executor, host and partition) and sleeps, so the test can kill its host while
  the batch runs; the retried task does not sleep again;
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from failure_jobs import TotalsProcessor

SLOW_KEY = "k-slow"
SLOW_SECONDS = 20.0


class SlowKeyTotals(TotalsProcessor):
    """``TotalsProcessor`` whose first task to see ``SLOW_KEY`` records where it runs and sleeps."""

    def __init__(self, control: str) -> None:
        self.marker = str(Path(control) / "in-stage.json")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        """As the parent; sleeps once on ``SLOW_KEY`` (the test kills this task's host meanwhile)."""
        from pyspark import TaskContext

        from blobstate.batch.executor import current_executor

        if key[0] == SLOW_KEY and not os.path.exists(self.marker):
            e = current_executor()
            Path(self.marker).write_text(
                json.dumps(
                    {
                        "executor_id": e.executor_id,
                        "host": e.host,
                        "partition": TaskContext.get().partitionId(),
                    }
                )
            )
            time.sleep(SLOW_SECONDS)
        yield from super().handleInputRows(key, rows, timerValues)


def build_spark(conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("blobstate-standby-job")
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def main(argv: list[str] | None = None) -> int:
    """Run the query over every input file; one JSON line per committed batch."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conf", action="append", default=[], help="Spark conf key=value")
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--standby-replicas", type=int, default=1)
    parser.add_argument("--executors", type=int, default=2, help="wait for this many executors first")
    parser.add_argument("--pause-after", type=int, action="append", default=[])
    parser.add_argument("--slow-sync-from", type=int, default=None)
    parser.add_argument("--stop-after", type=int, default=None, help="exit after this batch commits")
    args = parser.parse_args(argv)

    from failure_jobs import INPUT_SCHEMA, OUTPUT_SCHEMA, overwrite_by_batch_sink

    import blobstate
    from blobstate.engine.driver import BatchReport
    from blobstate.engine.jvm.classic import PlacementHelper
    from blobstate.standby.step import StandbyStep

    conf = dict(item.split("=", 1) for item in args.conf)
    spark = build_spark(conf)
    helper = PlacementHelper.get(spark)
    assert helper is not None, "placement helper unavailable"

    def wait_for_executors() -> None:
        deadline = time.monotonic() + 180
        while len(helper.executors()) < args.executors:
            assert time.monotonic() < deadline, f"fewer than {args.executors} executors registered"
            time.sleep(0.3)

    wait_for_executors()
    print(json.dumps({"started": spark.sparkContext.applicationId}), flush=True)
    from pyspark.sql.pandas.types import from_arrow_schema

    frames = (
        spark.readStream.schema(from_arrow_schema(INPUT_SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(args.input))
    )
    state: dict[str, Any] = {}

    def on_batch(report: BatchReport) -> None:
        standby = state["query"].blobstate_driver.step(StandbyStep)
        slow = args.slow_sync_from is not None and report.batch_id >= args.slow_sync_from
        if standby.syncer is not None and not slow:
            standby.syncer.wait(120)  # the replicas of this commit are in place before anything else
        if args.slow_sync_from is not None and report.batch_id + 1 == args.slow_sync_from:
            from standby_faults import slow_sync_task

            import blobstate.standby.syncer as syncer_module

            syncer_module.run_sync_task = slow_sync_task  # type: ignore[assignment]
        line = asdict(report)
        line["assignment"] = {str(p): a.to_json() for p, a in sorted(standby.assignment.items())}
        line["replica_versions"] = (
            [[p, host, v] for (p, host), v in sorted(standby.syncer.replica_versions().items())]
            if standby.syncer is not None
            else []
        )
        line["alive"] = [[e.executor_id, e.host] for e in helper.executors()]
        print(json.dumps(line), flush=True)
        if report.batch_id in args.pause_after and not report.skipped:
            print(json.dumps({"paused": report.batch_id}), flush=True)
            resume = Path(args.control) / f"resume-{report.batch_id}"
            while not resume.exists():
                time.sleep(0.1)
            wait_for_executors()
        if args.stop_after is not None and report.batch_id >= args.stop_after:
            print(json.dumps({"stopping": report.batch_id}), flush=True)
            os._exit(0)

    processor = SlowKeyTotals(args.control)
    query = blobstate.transform_with_state(
        frames,
        key="k",
        processor=processor,
        output_schema=OUTPUT_SCHEMA,
        checkpoint=args.checkpoint,
        sink=overwrite_by_batch_sink(args.output),
        num_partitions=args.partitions,
        local_dir=args.local_dir,
        snapshot_every=3,
        standby_replicas=args.standby_replicas,
        on_batch=on_batch,
    )
    state["query"] = query
    query.processAllAvailable()
    query.stop()
    print(json.dumps({"done": True}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    import standby_jobs  # the importable module, so workers unpickle its classes by name

    sys.exit(standby_jobs.main())
