"""How often a partition's next task runs in the same Python worker process; prints JSON.

A state store kept open between batches in a Python worker (instead of opened and closed by every task)
pays only when the partition's next task lands in the process that holds it; otherwise the holder must
hand the store over (close it, release the partition lock) and the new process opens it as today. PySpark
hands a task to whichever idle worker of the executor comes first, so this measures the chance, on the
processing stage's own shape: a hash shuffle into ``--partitions`` partitions, then ``mapInArrow`` (as
``run_task``), ``--batches`` times on ``local[--cores]`` (adaptive execution off: each batch one job of
two stages), with a sleep in each task standing in for its work. For each partition and each batch after
the first it records whether the task ran in the same worker process (``os.getpid()``) as the
partition's task of the batch before. Run by hand:

    .venv/bin/python bench/worker_affinity.py [--cores 2] [--partitions 2,20] [--batches 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any


def task_pid(batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` body: drains the partition's rows, then reports its partition and process."""
    import time

    import pyarrow as pa
    from pyspark import TaskContext

    for _ in batches:
        pass
    time.sleep(0.01)
    context = TaskContext.get()
    assert context is not None
    yield pa.RecordBatch.from_pydict({"p": [context.partitionId()], "pid": [os.getpid()]})


def measure(spark: Any, partitions: int, batches: int) -> dict[str, Any]:
    """Run ``batches`` shuffles into ``partitions`` partitions; how often each partition stayed."""
    previous: dict[int, int] = {}
    stayed = moved = 0
    workers: set[int] = set()
    for _ in range(batches):
        frame = spark.range(0, 1000, numPartitions=4).repartition(partitions, "id")
        for row in frame.mapInArrow(task_pid, "p long, pid long").collect():
            workers.add(row.pid)
            if row.p in previous:
                if previous[row.p] == row.pid:
                    stayed += 1
                else:
                    moved += 1
            previous[row.p] = row.pid
    return {
        "partitions": partitions,
        "batches": batches,
        "python_workers": len(workers),
        "same_worker": stayed,
        "other_worker": moved,
        "same_worker_fraction": round(stayed / (stayed + moved), 3) if stayed + moved else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--partitions", default="2,20", help="comma-separated partition counts")
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        runs = [measure(spark, int(n), args.batches) for n in args.partitions.split(",")]
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "benchmark": "worker_affinity",
                "master": f"local[{args.cores}]",
                "python_worker_reuse": True,
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
