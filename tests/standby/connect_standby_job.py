"""The standby job as a Spark Connect client runs it: its own process, whose only session is a Connect
one, against a Connect server whose master is the tests' multi-host cluster
(``python connect_standby_job.py <sc://url> <work dir> <local dir> <pause after batch>``).

It runs ``failure_jobs.TotalsProcessor`` over ``<work>/in`` (one file per batch) with one standby replica
per partition. Its ``on_batch`` (:class:`ReportAndPause`) runs in the server's Python: it writes each
batch's report to ``<work>/control/batch-<id>.json`` and, after the pause batch, waits for the file
``resume-<id>`` (the test kills a host meanwhile).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


class ReportAndPause:
    """``on_batch`` of the job: each report to a file; a wait for ``resume-<pause>`` after that batch."""

    def __init__(self, control: str, pause: int) -> None:
        self.control = control
        self.pause = pause

    def __call__(self, report: Any) -> None:
        """Write the report; hold the query after the pause batch until the test resumes it."""
        control = Path(self.control)
        tmp = control / f".batch-{report.batch_id}.tmp"
        tmp.write_text(json.dumps(asdict(report)))
        tmp.replace(control / f"batch-{report.batch_id}.json")
        if report.batch_id == self.pause and not report.skipped:
            while not (control / f"resume-{self.pause}").exists():
                time.sleep(0.1)


def main(url: str, work: Path, local_dir: str, pause: int) -> int:
    """Run the query over every input file."""
    from failure_jobs import INPUT_SCHEMA, OUTPUT_SCHEMA, TotalsProcessor, overwrite_by_batch_sink
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.types import from_arrow_schema

    import blobstate

    spark = SparkSession.builder.remote(url).getOrCreate()
    control = work / "control"
    control.mkdir(parents=True, exist_ok=True)
    query = blobstate.transform_with_state(
        spark.readStream.schema(from_arrow_schema(INPUT_SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in")),
        key="k",
        processor=TotalsProcessor(),
        output_schema=OUTPUT_SCHEMA,
        checkpoint=str(work / "ckpt"),
        sink=overwrite_by_batch_sink(work / "out"),
        num_partitions=4,
        local_dir=local_dir,
        snapshot_every=3,
        standby_replicas=1,
        on_batch=ReportAndPause(str(control), pause),
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    import connect_standby_job  # the importable module, so the server unpickles its classes by name

    sys.exit(connect_standby_job.main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
