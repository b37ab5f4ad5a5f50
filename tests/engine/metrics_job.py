"""A running-count query with Spark's Prometheus servlet on, run as a script by ``test_spark_metrics.py``.

Its own SparkSession (the metrics sinks and the UI port are fixed when the SparkContext starts). After
two batches, while the query still runs, it reads the driver's ``/metrics/prometheus/`` endpoint and
prints one JSON line: the endpoint's lines that name blobstate, and the query's last progress.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle


class RunningCount(StatefulProcessor):
    """The count of rows per key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """One value state."""
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Add the rows to the key's count and emit it."""
        n = (self.count.get() or (0,))[0] + sum(len(frame) for frame in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        """Nothing to release."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    """Run two batches, then read the endpoint and the progress while the query runs."""
    from pyspark.sql import SparkSession

    import blobstate

    os.environ["PYSPARK_PYTHON"] = sys.executable
    work = Path(tempfile.mkdtemp(prefix="blobstate-metrics-"))
    (work / "in").mkdir()
    port = free_port()
    sink = "spark.metrics.conf.*.sink.prometheusServlet"
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", str(port))
        .config("spark.ui.showConsoleProgress", "false")
        .config(f"{sink}.class", "org.apache.spark.metrics.sink.PrometheusServlet")
        .config(f"{sink}.path", "/metrics/prometheus")
        .config("spark.metrics.namespace", "metricsjob")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    frames = spark.readStream.schema("k string, v long").parquet(str(work / "in"))
    query = blobstate.transform_with_state(
        frames,
        key="k",
        processor=RunningCount(),
        output_schema="k string, n long",
        checkpoint=str(work / "ckpt"),
        sink=lambda frame, batch_id: None,
        num_partitions=2,
        local_dir=str(work / "local"),
        query_name="counts",
    )
    for i, rows in enumerate([[("a", 1), ("b", 2), ("a", 3)], [("a", 4), ("c", 5)]]):
        table = pa.table({"k": [k for k, _ in rows], "v": [v for _, v in rows]})
        pq.write_table(table, work / "in" / f"{i}.parquet")
        query.processAllAvailable()
    url = f"http://127.0.0.1:{spark.sparkContext.uiWebUrl.rsplit(':', 1)[1]}/metrics/prometheus/"
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode("utf-8")
    progress = blobstate.progress_metrics(query.lastProgress)
    query.stop()
    after_stop = urllib.request.urlopen(url, timeout=30).read().decode("utf-8")
    spark.stop()
    print(
        json.dumps(
            {
                "lines": [line for line in text.splitlines() if "blobstate" in line],
                "after_stop": [line for line in after_stop.splitlines() if "blobstate" in line],
                "progress": progress,
            }
        )
    )


if __name__ == "__main__":
    main()
