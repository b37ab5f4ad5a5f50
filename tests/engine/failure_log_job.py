"""A query whose processor fails, run as a script by ``test_failure_log.py`` to count what it prints.

Its own SparkSession (``local[2,2]``: a failed task would be retried once) with Spark's default logging;
the processor raises for one key and emits a value that does not fit the output schema for another.
The query's exception and the batches its sink got go to stdout as one JSON line; what Spark logs goes
to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle


class Fails(StatefulProcessor):
    """Raises for key ``boom``; yields a string for the long column ``n`` for key ``misfit``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """No state."""

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Fail as the key says."""
        if key[0] == "boom":
            raise ValueError("the processor cannot take key boom")
        yield pd.DataFrame({"k": [key[0]], "n": ["not a number"]})

    def close(self) -> None:
        """Nothing to release."""


def main(key: str) -> None:
    """Run the query over one row with ``key``; print how it ended."""
    from pyspark.sql import SparkSession

    import blobstate

    os.environ["PYSPARK_PYTHON"] = sys.executable
    work = Path(tempfile.mkdtemp(prefix="blobstate-failure-log-"))
    (work / "in").mkdir()
    pq.write_table(pa.table({"k": [key], "v": [1]}), work / "in" / "0.parquet")
    spark = (
        SparkSession.builder.master("local[2,2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    calls: list[int] = []
    frames = spark.readStream.schema("k string, v long").parquet(str(work / "in"))
    query = blobstate.transform_with_state(
        frames,
        key="k",
        processor=Fails(),
        output_schema="k string, n long",
        checkpoint=str(work / "ckpt"),
        sink=lambda frame, batch_id: calls.append(batch_id),
        num_partitions=2,
        local_dir=str(work / "local"),
    )
    try:
        query.processAllAvailable()
        outcome: dict[str, Any] = {"raised": None}
    except Exception as error:
        outcome = {"raised": type(error).__name__, "message": str(error)}
    outcome["sink_calls"] = calls
    query.stop()
    spark.stop()
    print(json.dumps(outcome))


if __name__ == "__main__":
    main(sys.argv[1])
