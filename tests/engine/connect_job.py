"""The README's running count as a Spark Connect client runs it: its own process, whose only session is
a Connect one (``python connect_job.py <sc://url> <work dir> <api> [flag...]``). The input is
``<work>/in``, one file per batch; each batch's outputs go to ``<work>/out/batch=<id>``. A refusal is
printed as one line ``refused: <type>: <message>`` with exit status 3.

Flags: ``persisted`` (outputs stay on the executors), ``read`` (print the state as the reader gives it),
``side`` (a side stream ``<work>/tiers`` kept in the adjunct store ``tiers``; the output gains each key's
tier), ``initial`` (Spark's ``initialState``: :data:`INITIAL_STATE`), ``partitions=<n>`` (with
``allow_rescale``: an existing checkpoint is rescaled to ``n`` first), ``fail`` (the processor raises on
key ``c``: the failure is printed as one JSON line, exit status 4), ``drain`` (time mode
``ProcessingTime``, a 1-second trigger, and ``awaitInputDrained`` instead of ``processAllAvailable``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from blobstate.demo.running_count import RunningCount

INITIAL_STATE = [("a", 100, 1000), ("z", 1, 1)]
"""Spark's ``initialState`` of the ``initial`` flag: key, count, total."""

TIERED_OUTPUT = "key STRING, count BIGINT, total BIGINT, tier STRING"


class TieredRunningCount(RunningCount):
    """The running count with each key's tier from the ``tiers`` adjunct store, as of the batch."""

    def init(self, handle: Any) -> None:
        """The counters and the side store."""
        super().init(handle)
        self.tiers = handle.getAdjunct("tiers")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        """The counters, with the key's tier (None: no tier yet)."""
        tier = self.tiers.get(key[0])
        for frame in super().handleInputRows(key, rows, timerValues):
            yield frame.assign(tier=[None if tier is None else tier[0]])


class FailingRunningCount(RunningCount):
    """The running count, raising on key ``c`` (its second batch)."""

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        """As the parent's; raises on key ``c``."""
        if key[0] == "c":
            raise ValueError("the processor refuses key c")
        yield from super().handleInputRows(key, rows, timerValues)


def start_running_count(
    spark: Any,
    work: Path,
    api: str,
    persisted: bool = False,
    *,
    side: bool = False,
    initial: bool = False,
    partitions: int = 2,
    fail: bool = False,
    processing_time: bool = False,
) -> Any:
    """The README's running count on ``spark`` (classic or Connect), one input file per batch from
    ``work/in``, each batch's outputs to ``work/out``; ``persisted`` keeps the outputs on the executors
    (the sink reads the committed-only view); ``side``, ``initial``, ``partitions``: as the flags."""
    import blobstate
    from blobstate.demo.running_count import (
        RUNNING_COUNT_OUTPUT,
        ArrowRunningCount,
        RowRunningCount,
        RunningCount,
    )

    processors = {"pandas": RunningCount, "row": RowRunningCount, "arrow": ArrowRunningCount}
    out = str(work / "out")
    extra: dict[str, Any] = {"inline_output_bytes": 0} if persisted else {}
    processor: Any = processors[api]()
    schema = RUNNING_COUNT_OUTPUT
    if side:
        tiers = (
            spark.readStream.schema("key STRING, tier STRING")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(work / "tiers"))
        )
        extra["adjuncts"] = [blobstate.Adjunct("tiers", tiers, key="key", value="tier", bootstrap=False)]
        processor, schema = TieredRunningCount(), TIERED_OUTPUT
    if fail:
        processor = FailingRunningCount()
    if processing_time:
        extra.update(time_mode="ProcessingTime", trigger_interval="1 second")
    if initial:
        extra["initial_state"] = spark.createDataFrame(
            INITIAL_STATE, "key STRING, count BIGINT, total BIGINT"
        )
    return blobstate.transform_with_state(
        spark.readStream.schema("key STRING, value BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in")),
        key="key",
        processor=processor,
        output_schema=schema,
        checkpoint=str(work / "checkpoint"),
        sink=lambda frame, batch_id: frame.write.mode("overwrite").parquet(f"{out}/batch={batch_id}"),
        num_partitions=partitions,
        allow_rescale=True,
        api=api,
        **extra,
    )


def main(url: str, work: Path, api: str, flags: list[str]) -> int:
    """Run the query until its input is processed; print what refused it, if anything. ``read``: then
    print the checkpoint's state as the state reader gives it over Connect (one JSON line); and, always,
    the global temporary views the server holds (one JSON line)."""
    import json

    from pyspark.sql import SparkSession

    import blobstate
    from blobstate.errors import BlobstateError

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        partitions = [int(f.split("=")[1]) for f in flags if f.startswith("partitions=")]
        query = start_running_count(
            spark,
            work,
            api,
            "persisted" in flags,
            side="side" in flags,
            initial="initial" in flags,
            partitions=partitions[0] if partitions else 2,
            fail="fail" in flags,
            processing_time="drain" in flags,
        )
    except BlobstateError as error:
        print(f"refused: {type(error).__name__}: {error}", flush=True)
        return 3
    try:
        try:
            if "drain" in flags:  # time mode ProcessingTime: Spark's processAllAvailable never returns
                query.awaitInputDrained()
            else:
                query.processAllAvailable()
        except Exception as error:  # what the client sees first of a failure in the server
            print(
                json.dumps({"failed": type(error).__name__, "first": str(error).splitlines()[0]}), flush=True
            )
            return 4
        query.stop()
        try:
            blobstate.batch_reports(query)
        except BlobstateError as error:  # the reports are in the server: refused, saying where to look
            print(json.dumps({"batch_reports": str(error)}), flush=True)
        views = [t.name for t in spark.catalog.listTables(spark.conf.get("spark.sql.globalTempDatabase"))]
        print(json.dumps({"global_views": views}), flush=True)
        if "read" in flags:
            # Spark's reader API first, before anything registered the format in this session: the
            # server's Python knows it from the installed package.
            direct = spark.read.format("blobstate").load(str((work / "checkpoint").absolute())).collect()
            print(json.dumps({"format_state": sorted(repr(r) for r in direct)}), flush=True)
            rows = blobstate.read_state(spark, str(work / "checkpoint")).collect()
            print(json.dumps({"state": sorted(repr(r) for r in rows)}), flush=True)
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4:]))
