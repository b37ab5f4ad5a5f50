"""The README's running count as a Spark Connect client runs it: its own process, whose only session is
a Connect one (``python connect_job.py <sc://url> <work dir> <api> [persisted] [read]``). The input is
``<work>/in``, one file per batch; each batch's outputs go to ``<work>/out/batch=<id>``. A refusal is
printed as one line ``refused: <type>: <message>`` with exit status 3."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def start_running_count(spark: Any, work: Path, api: str, persisted: bool = False) -> Any:
    """The README's running count on ``spark`` (classic or Connect), one input file per batch from
    ``work/in``, each batch's outputs to ``work/out``; ``persisted`` keeps the outputs on the executors
    (the sink reads the committed-only view)."""
    import blobstate
    from blobstate.demo.running_count import (
        RUNNING_COUNT_OUTPUT,
        ArrowRunningCount,
        RowRunningCount,
        RunningCount,
    )

    processors = {"pandas": RunningCount, "row": RowRunningCount, "arrow": ArrowRunningCount}
    out = str(work / "out")
    return blobstate.transform_with_state(
        spark.readStream.schema("key STRING, value BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in")),
        key="key",
        processor=processors[api](),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=str(work / "checkpoint"),
        sink=lambda frame, batch_id: frame.write.mode("overwrite").parquet(f"{out}/batch={batch_id}"),
        num_partitions=2,
        api=api,
        **({"inline_output_bytes": 0} if persisted else {}),
    )


def main(url: str, work: Path, api: str, persisted: bool = False, read: bool = False) -> int:
    """Run the query until its input is processed; print what refused it, if anything. ``read``: then
    print the checkpoint's state as the state reader gives it over Connect (one JSON line)."""
    import json

    from pyspark.sql import SparkSession

    import blobstate
    from blobstate.errors import BlobstateError

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        query = start_running_count(spark, work, api, persisted)
    except BlobstateError as error:
        print(f"refused: {type(error).__name__}: {error}", flush=True)
        return 3
    try:
        query.processAllAvailable()
        query.stop()
        if read:
            rows = blobstate.read_state(spark, str(work / "checkpoint")).collect()
            print(json.dumps({"state": sorted(repr(r) for r in rows)}), flush=True)
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    flags = sys.argv[4:]
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], "persisted" in flags, "read" in flags))
