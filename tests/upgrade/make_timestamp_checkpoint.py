"""Write the upgrade fixture of checkpoints keyed by a TIMESTAMP in a zone other than UTC, as a release
stores them: ``timestamp-checkpoints/<api>/`` and ``timestamp-expected.json``.

Releases before keys were instants stored a TIMESTAMP key as the session zone's wall-clock reading
(``api="pandas"``) or with the zone's name (``api="arrow"``); ``test_timestamp_upgrade.py`` continues
both under this release. Run from the repository root with the release to record on the path::

    PYTHONPATH=src python tests/upgrade/make_timestamp_checkpoint.py

Each checkpoint has :data:`NUM_PARTITIONS` partitions and was written with
``spark.sql.session.timeZone`` = :data:`ZONE`; input files get fixed modification times as in
``make_checkpoint.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from make_checkpoint import MTIME_BASE, session, store_fixture

HERE = Path(__file__).resolve().parent
ZONE = "America/Los_Angeles"
NUM_PARTITIONS = 2
APIS = ("pandas", "arrow")
_BASE = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def instant(hours: float) -> dt.datetime:
    """The instant ``hours`` after 2026-03-01T12:00Z (aware, UTC)."""
    return _BASE + dt.timedelta(hours=hours)


BATCHES: list[list[tuple[float, int]]] = [
    [(0, 1), (1, 2), (2.5, 3), (0, 4)],
    [(1, 5), (30, 6), (700, 7)],
    [(0, 8), (2.5, 9), (-40, 10)],
]
"""Rows of (hours after the base instant, value) per batch: keys repeat across batches."""


def write_inputs(directory: Path, batches: list[list[tuple[Any, int]]], first: int = 0) -> None:
    """Write ``batches`` as ``batch-<i>.parquet`` (``ts`` as UTC instants) with modification time
    ``MTIME_BASE + i``; a row's time is hours after the base instant or an aware datetime."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("value", pa.int64())])
    directory.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(batches, start=first):
        times = [t if isinstance(t, dt.datetime) else instant(t) for t, _ in rows]
        table = pa.table({"ts": times, "value": [v for _, v in rows]}, schema=schema)
        tmp = directory / f".batch-{i:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.utime(tmp, (MTIME_BASE + i, MTIME_BASE + i))
        os.replace(tmp, directory / f"batch-{i:05d}.parquet")


def run_query(
    spark: Any, root: Path, local_dir: Path, api: str, num_partitions: int | None = NUM_PARTITIONS
) -> dict[int, list[list[Any]]]:
    """Count per ``ts`` over every file of ``root/input`` into ``root/checkpoint``; each batch id's
    outputs as sorted ``[epoch microseconds, count, total]`` rows (independent of the session zone)."""
    from ts_count import TS_COUNT_OUTPUT, ArrowTsCount, TsCount

    import blobstate

    outputs: dict[int, list[list[Any]]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = frame.select(F.unix_micros("ts").alias("us"), "count", "total").collect()
        outputs[batch_id] = sorted([list(r) for r in rows])

    df = spark.readStream.schema("ts TIMESTAMP, value BIGINT").option("maxFilesPerTrigger", 1)
    query = blobstate.transform_with_state(
        df.parquet(str(root / "input")),
        key="ts",
        processor=ArrowTsCount() if api == "arrow" else TsCount(),
        output_schema=TS_COUNT_OUTPUT,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        num_partitions=num_partitions,
        local_dir=str(local_dir),
        api=api,
        snapshot_every=2,
        async_cleanup=False,
        restart_executor_wait_seconds=0.0,
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return outputs


def main() -> None:
    """Write ``tests/upgrade/timestamp-checkpoints/`` and ``tests/upgrade/timestamp-expected.json``."""
    import blobstate

    outputs: dict[str, Any] = {}
    spark = session()
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    try:
        for api in APIS:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp).resolve() / "upgrade"
                write_inputs(root / "input", BATCHES)
                out = run_query(spark, root, Path(tmp) / "local", api)
                store_fixture(root, HERE / "timestamp-checkpoints" / api)
            outputs[api] = {str(b): rows for b, rows in sorted(out.items())}
    finally:
        spark.stop()
    expected = {
        "written_by": getattr(blobstate, "__version__", "unknown"),
        "zone": ZONE,
        "num_partitions": NUM_PARTITIONS,
        "batches": BATCHES,
        "outputs": outputs,
    }
    (HERE / "timestamp-expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
