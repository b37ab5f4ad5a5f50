"""Write the upgrade fixture: a small checkpoint of the vectorized running count, as this release stores it.

Run once per release whose formats the upgrade test must keep opening, from the repository root::

    PYTHONPATH=src python tests/upgrade/make_checkpoint.py

It runs :class:`~blobstate.demo.running_count.ArrowRunningCount` (``api="arrow"``, 2 partitions, a
snapshot every 2 versions, uploaded inline) over :data:`BATCHES` with a local Spark session into a
temporary directory, then copies the checkpoint (blobstate's objects and Spark's ``_spark`` offsets)
to ``tests/upgrade/checkpoint/`` with every absolute path of the temporary directory replaced by
:data:`ROOT_PLACEHOLDER`, and writes each batch's output rows to ``tests/upgrade/expected.json``.
Input files get fixed modification times (:data:`MTIME_BASE` + batch index), so a test can recreate
them, and add newer ones, where Spark's file source log expects them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT_PLACEHOLDER = "@UPGRADE_ROOT@"
"""Stands for the directory holding ``checkpoint/`` and ``input/`` in the stored fixture's text files."""
MTIME_BASE = 1_767_225_600  # 2026-01-01T00:00:00Z
BATCHES: list[list[tuple[str, int]]] = [
    [("a", 1), ("b", 2), ("c", 3), ("a", 4)],
    [("b", 5), ("d", 6), ("e", 7)],
    [("a", 8), ("c", 9), ("f", 10), ("f", 11)],
    [("g", 12), ("b", 13)],
    [("h", 14), ("a", 15), ("e", 16)],
]
OPTIONS: dict[str, Any] = {
    "api": "arrow",
    "snapshot_every": 2,
    "snapshot_upload": "inline",
    "min_versions_to_retain": 3,
    "async_cleanup": False,
    "restart_executor_wait_seconds": 0.0,
}
NUM_PARTITIONS = 2


def write_inputs(directory: Path, batches: list[list[tuple[str, int]]], first: int = 0) -> None:
    """Write ``batches`` as ``batch-<i>.parquet`` with modification time ``MTIME_BASE + i``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("key", pa.string()), ("value", pa.int64())])
    directory.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(batches, start=first):
        table = pa.table({"key": [k for k, _ in rows], "value": [v for _, v in rows]}, schema=schema)
        tmp = directory / f".batch-{i:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.utime(tmp, (MTIME_BASE + i, MTIME_BASE + i))
        os.replace(tmp, directory / f"batch-{i:05d}.parquet")


def run_query(spark: Any, root: Path, local_dir: Path) -> dict[int, list[list[Any]]]:
    """Run the running count over every file of ``root/input`` into ``root/checkpoint``; returns each
    batch id's output rows, sorted."""
    import blobstate
    from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, ArrowRunningCount

    outputs: dict[int, list[list[Any]]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        outputs[batch_id] = sorted([list(r) for r in frame.collect()])

    df = spark.readStream.schema("key STRING, value BIGINT").option("maxFilesPerTrigger", 1)
    query = blobstate.transform_with_state(
        df.parquet(str(root / "input")),
        key="key",
        processor=ArrowRunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        num_partitions=NUM_PARTITIONS,
        local_dir=str(local_dir),
        **OPTIONS,
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return outputs


def session() -> Any:
    """A local Spark session configured as the tests' ``spark`` fixture."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return (
        SparkSession.builder.master("local[2,2]")
        .appName("blobstate-upgrade-fixture")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )


def store_fixture(root: Path, target: Path) -> None:
    """Copy ``root/checkpoint`` to ``target``, replacing ``root`` in text files by the placeholder.

    Hadoop's ``.crc`` side files are left out (a rewritten file's would no longer match; Hadoop reads
    a file without one unchecked).
    """
    if target.exists():
        shutil.rmtree(target)
    for path in sorted((root / "checkpoint").rglob("*")):
        if path.is_dir() or path.name.endswith(".crc"):
            continue
        rel = path.relative_to(root / "checkpoint")
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        data = data.replace(str(root).encode(), ROOT_PLACEHOLDER.encode())
        out.write_bytes(data)


def main() -> None:
    """Write ``tests/upgrade/checkpoint/`` and ``tests/upgrade/expected.json``."""
    import blobstate

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve() / "upgrade"
        write_inputs(root / "input", BATCHES)
        spark = session()
        try:
            outputs = run_query(spark, root, Path(tmp) / "local")
        finally:
            spark.stop()
        store_fixture(root, HERE / "checkpoint")
    expected = {
        "written_by": getattr(blobstate, "__version__", "unknown"),
        "options": OPTIONS,
        "num_partitions": NUM_PARTITIONS,
        "mtime_base": MTIME_BASE,
        "batches": BATCHES,
        "outputs": {str(b): rows for b, rows in sorted(outputs.items())},
    }
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
