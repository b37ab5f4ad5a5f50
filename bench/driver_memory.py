"""Driver memory and batch time against the number of output rows of one micro-batch.

For each size N (default 10^5, 10^6, 5x10^6) and each implementation, a fresh process runs a streaming
query over one parquet file of N events with N distinct keys, so the batch emits N rows, and the sink
writes them to parquet with Spark (``frame.write.parquet``):

- ``blobstate``: ``RowRunningCount`` (the row API) on blobstate;
- ``native``: Spark's JVM-native ``groupBy(key).agg(count, sum)`` in update mode, through foreachBatch.

Spark runs as ``local-cluster[2,1,2048]`` so the driver is its own JVM, apart from the executors. The
numbers are the driver's peak resident memory (``VmHWM``): the Python driver process and the driver JVM.
Prints one JSON object; run by hand:

    .venv/bin/python bench/driver_memory.py [--sizes 100000,1000000,5000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MASTER = "local-cluster[2,1,2048]"


def _write_input(directory: Path, rows: int) -> None:
    directory.mkdir(parents=True)
    keys = pa.array([f"k{i:08d}" for i in range(rows)])
    values = pa.array(range(rows), pa.int64())
    pq.write_table(pa.table({"key": keys, "value": values}), directory / "part-0.parquet")


def _peak_kb(pid: int | str) -> int:
    """A process's peak resident memory (``VmHWM``; unlike ``ru_maxrss`` it does not survive ``exec``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


def run_one(kind: str, input_dir: Path, work: Path) -> dict[str, object]:
    """One measurement in this process (a child process: its peak memory is the query's alone)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import blobstate
    from blobstate.demo.running_count import RowRunningCount

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(MASTER)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    stream = spark.readStream.schema("key STRING, value BIGINT").parquet(str(input_dir))
    timings: dict[str, float] = {}

    def sink(frame: object, batch_id: int) -> None:
        started = time.monotonic()
        frame.write.mode("overwrite").parquet(str(work / "out" / str(batch_id)))  # type: ignore[attr-defined]
        timings["sink_seconds"] = time.monotonic() - started

    started = time.monotonic()
    if kind == "blobstate":
        query = blobstate.transform_with_state(
            stream,
            key="key",
            processor=RowRunningCount(),
            output_schema="key STRING, count BIGINT, total BIGINT",
            checkpoint=str(work / "ckpt"),
            sink=sink,
            num_partitions=2,
            api="row",
            local_dir=str(work / "local"),
        )
    else:
        query = (
            stream.groupBy("key")
            .agg(F.count("*").alias("count"), F.sum("value").alias("total"))
            .writeStream.outputMode("update")
            .foreachBatch(sink)
            .option("checkpointLocation", str(work / "spark-ckpt"))
            .start()
        )
    query.processAllAvailable()
    seconds = time.monotonic() - started
    query.stop()
    written = spark.read.parquet(str(work / "out" / "0")).count()
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # a running session has its JVM gateway
    result = {
        "kind": kind,
        "output_rows": written,
        "batch_seconds": round(seconds, 2),
        "sink_seconds": round(timings.get("sink_seconds", -1.0), 2),
        "driver_python_peak_mb": round(_peak_kb("self") / 1024, 1),
        "driver_jvm_peak_mb": round(_peak_kb(gateway.proc.pid) / 1024, 1),
    }
    spark.stop()
    return result


def main() -> None:
    """Run every size and kind in its own process; print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,5000000")
    parser.add_argument("--kinds", default="blobstate,native")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "INPUT", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, input_dir, work = args.child
        print(json.dumps(run_one(kind, Path(input_dir), Path(work))))
        return
    results = []
    for rows in (int(s) for s in args.sizes.split(",")):
        inputs = tempfile.TemporaryDirectory(prefix="blobstate-mem-in-")
        _write_input(Path(inputs.name) / "in", rows)
        for kind in args.kinds.split(","):
            with tempfile.TemporaryDirectory(prefix="blobstate-mem-") as work:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", kind, str(Path(inputs.name) / "in"), work],
                    capture_output=True,
                    text=True,
                    check=False,
                )
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                results.append({"kind": kind, "rows": rows, "error": done.stderr.strip()[-2000:]})
            else:
                results.append({"rows": rows, **json.loads(lines[-1])})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        inputs.cleanup()
    summary: dict[str, object] = {"master": MASTER, "runs": results}
    for kind in args.kinds.split(","):
        ok = [r for r in results if r.get("kind") == kind and "error" not in r]
        if len(ok) >= 2:
            for metric in ("driver_python_peak_mb", "driver_jvm_peak_mb"):
                summary[f"{kind}_{metric}_largest_over_smallest"] = round(
                    float(ok[-1][metric]) / float(ok[0][metric]), 2
                )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
