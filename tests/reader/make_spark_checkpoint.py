"""Write the Spark checkpoint fixture of the move tests: what Spark 4 writes for an event-time query.

Run from the repository root (a minute; it needs the JDK Spark needs)::

    PYTHONPATH=src python tests/reader/make_spark_checkpoint.py

It runs a ``transformWithStateInPandas`` query (time mode ``EventTime``, ``withWatermark("ts", "5
seconds")``, a value and a list state variable and an event-time timer per key) with Spark's RocksDB
state store over :data:`BATCHES`, one file per micro-batch, each batch moving the watermark, so its
newest commit is ``commits/11`` (batch 11 is the batch without input that Spark runs after the
watermark moved) and ``commits/9`` is the last one whose number sorts after the newest's as text. It
copies Spark's ``metadata``, ``commits/`` and ``offsets/`` (with Spark's ``.crc`` checksums, which a
reader must skip) into ``tests/reader/spark-checkpoint/`` and writes ``spark-checkpoint.json``: each
commit's ``nextBatchWatermarkMs`` and the operator properties Spark's ``state-metadata`` reader
shows.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000
BATCHES = [[("a", T0 + 1_000 * i), ("b", T0 + 500 * i)] for i in range(11)]
"""Eleven batches: batch ``i`` moves the watermark to ``T0 + 1000 i - 5000``."""


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StatefulProcessor

    class Sessions(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.session = handle.getValueState("session", "last_ms BIGINT, events BIGINT")
            self.times = handle.getListState("times", "ms BIGINT")

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:
            times = [int(t.timestamp() * 1000) for pdf in rows for t in pdf["ts"]]
            old = self.session.get()
            events = len(times) + (int(old[1]) if old is not None else 0)
            self.session.update((max(times), events))
            self.times.appendList([(t,) for t in times])
            self.handle.registerTimer(max(times) + 60_000)
            yield pd.DataFrame({"key": [key[0]], "events": [events]})

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )
    with tempfile.TemporaryDirectory() as tmp:
        inputs, checkpoint = Path(tmp, "in"), Path(tmp, "checkpoint")
        inputs.mkdir()
        for i, rows in enumerate(BATCHES):
            ts = pa.array([ms * 1000 for _, ms in rows], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
            pq.write_table(pa.table({"key": [k for k, _ in rows], "ts": ts}), inputs / f"b{i:02d}.parquet")
            os.utime(inputs / f"b{i:02d}.parquet", (time.time() - 3600 + i,) * 2)
        query = (
            spark.readStream.schema("key STRING, ts TIMESTAMP")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(inputs))
            .withWatermark("ts", "5 seconds")
            .groupBy("key")
            .transformWithStateInPandas(Sessions(), "key STRING, events BIGINT", "Update", "EventTime")
            .writeStream.foreachBatch(lambda df, batch_id: df.collect())
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        query.processAllAvailable()
        query.stop()
        target = HERE / "spark-checkpoint"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for name in ("metadata", ".metadata.crc"):
            shutil.copy(checkpoint / name, target / name)
        for log in ("commits", "offsets"):
            shutil.copytree(checkpoint / log, target / log)
        watermarks = {
            path.name: json.loads(path.read_text().split("\n", 1)[1])["nextBatchWatermarkMs"]
            for path in sorted((checkpoint / "commits").iterdir())
            if path.name.isdigit()
        }
        [operator] = spark.read.format("state-metadata").load(str(checkpoint)).collect()
        expected = {"watermarks": watermarks, "operator": operator.asDict()}
        (HERE / "spark-checkpoint.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
