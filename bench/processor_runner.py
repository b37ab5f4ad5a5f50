"""Micro benchmark of blobstate.processor.run_partition: running count + sum per key, printed as JSON.

A keyspace of --keys keys, batches of --rows rows with uniformly random keys, one partition, the real
RocksStateStore in a temporary directory. The state is first filled so every key exists, then
--batches steady batches are timed for three processors:

* ``spark_style``: what one writes for Spark's transformWithStateInPandas: iterate the DataFrames,
  ValueState get/update, ``yield pd.DataFrame({...})`` per key;
* ``state_only``: the same state work without output (no per-key DataFrame built by the user);
* ``noop``: touches nothing: the runner's own cost of grouping and calling per key.

Per-key figures are batch seconds (wall and CPU) / distinct keys in the batch. ``calibration_us``
(a fixed pure-Python loop, about 10 us on an idle machine) tells how loaded the machine was; on a
shared machine compare the CPU figures. Spark's own transformWithStateInPandas needs about
2,700 us per key (ANCHORS); ``--spark-rows N`` measures it side by side: the same ``spark_style``
processor class on the same N rows, Spark (local[2], batch mode, so its state starts empty) against
blobstate on an empty store, wall and CPU time of the whole process tree (driver, JVM, workers).

    .venv/bin/python bench/processor_runner.py [--keys 100000] [--rows 20000] [--batches 5]
        [--spark-rows 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from blobstate.demo.running_count import RunningCount
from blobstate.processor import (
    RunSpec,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    run_partition,
)
from blobstate.state.store import RocksStateStore

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proctree import tree_cpu_seconds

OUTPUT = "key BIGINT, count BIGINT, total BIGINT"


SparkStyleCount = RunningCount
"""Running count and sum, written as for Spark."""


class StateOnlyCount(SparkStyleCount):
    """The same state work, no output."""

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        count = 0
        total = 0
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["value"].to_numpy().sum())
        old = self.state.get()
        if old is not None:
            count += old[0]
            total += old[1]
        self.state.update((count, total))
        return iter(())


class Noop(StatefulProcessor):
    """Does nothing per key."""

    # blobstate passes its own handle; PySpark types init with PySpark's.
    def init(self, handle: StatefulProcessorHandle) -> None:  # type: ignore[override]
        pass

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        return iter(())


def make_batch(rng: np.random.Generator, keys: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "key": rng.integers(0, keys, rows, dtype=np.int64),
            "value": rng.integers(0, 1000, rows, dtype=np.int64),
        }
    )


def run_batch(
    store: RocksStateStore, processor: StatefulProcessor, table: pa.Table, ts: int
) -> tuple[float, float, int]:
    """One batch through run_partition: (wall seconds, CPU seconds, output rows)."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    out_rows = 0
    for batch in run_partition(
        processor,
        store,
        table,
        RunSpec(
            key_columns=("key",),
            output_schema=OUTPUT,
            time_mode="None",
            output_mode="Update",
            batch_timestamp_ms=ts,
        ),
    ):
        out_rows += batch.num_rows
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    store.take_changelog()  # what a commit would take; not timed
    return seconds, cpu, out_rows


def steady_state(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(7)
    results: dict[str, dict[str, float]] = {}
    for name, processor_class in (
        ("noop", Noop),
        ("state_only", StateOnlyCount),
        ("spark_style", SparkStyleCount),
    ):
        with RocksStateStore.open(tmp / name) as store:
            all_keys = np.arange(args.keys, dtype=np.int64)
            for start in range(0, args.keys, args.rows):  # fill: every key gets state once
                chunk = all_keys[start : start + args.rows]
                fill = pa.table({"key": chunk, "value": np.ones(len(chunk), dtype=np.int64)})
                run_batch(store, processor_class(), fill, 0)
            store.flush()
            wall, cpu, distinct = [], [], []
            for b in range(args.batches):
                table = make_batch(rng, args.keys, args.rows)
                n_keys = len(np.unique(table.column("key").to_numpy()))
                seconds, cpu_seconds, out_rows = run_batch(store, processor_class(), table, b + 1)
                assert out_rows in (0, n_keys)
                wall.append(seconds / n_keys * 1e6)
                cpu.append(cpu_seconds / n_keys * 1e6)
                distinct.append(n_keys)
        results[name] = {
            "distinct_keys_per_batch": int(statistics.median(distinct)),
            "median_us_per_key": round(statistics.median(wall), 1),
            "median_cpu_us_per_key": round(statistics.median(cpu), 1),
            "keys_per_cpu_second": round(1e6 / statistics.median(cpu)),
        }
    return results


def spark_side_by_side(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """Spark's transformWithStateInPandas and run_partition on the same rows with the same processor."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
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
    spark.sparkContext.setLogLevel("ERROR")
    rng = np.random.default_rng(11)

    def spark_run(table: pa.Table) -> tuple[float, float, int]:
        df = spark.createDataFrame(table.to_pandas())
        cpu = tree_cpu_seconds()
        started = time.perf_counter()
        out = df.groupBy("key").transformWithStateInPandas(SparkStyleCount(), OUTPUT, "Update", "None")
        n = len(out.collect())
        return time.perf_counter() - started, tree_cpu_seconds() - cpu, n

    spark_run(make_batch(rng, args.keys, 200))  # warm up the JVM and the Python workers
    table = make_batch(rng, args.keys, args.spark_rows)
    n_keys = len(np.unique(table.column("key").to_numpy()))
    spark_wall, spark_cpu, n = spark_run(table)
    assert n == n_keys
    spark.stop()
    with RocksStateStore.open(tmp / "side_by_side") as store:
        cpu = tree_cpu_seconds()
        ours_wall, _, _ = run_batch(store, SparkStyleCount(), table, 1)
        ours_cpu = tree_cpu_seconds() - cpu
    return {
        "rows": args.spark_rows,
        "keys": n_keys,
        "spark_us_per_key": round(spark_wall / n_keys * 1e6, 1),
        "spark_cpu_us_per_key": round(spark_cpu / n_keys * 1e6, 1),
        "blobstate_us_per_key": round(ours_wall / n_keys * 1e6, 1),
        "blobstate_cpu_us_per_key": round(ours_cpu / n_keys * 1e6, 1),
        "speedup_wall": round(spark_wall / ours_wall, 1),
        "speedup_cpu": round(spark_cpu / ours_cpu, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument(
        "--spark-rows", type=int, default=0, help="also run Spark side by side on this many rows"
    )
    args = parser.parse_args()
    calibration_us = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        results = steady_state(args, Path(tmp))
        side_by_side = spark_side_by_side(args, Path(tmp)) if args.spark_rows else None
    report: dict[str, object] = {
        "benchmark": "processor_runner",
        "keys": args.keys,
        "rows_per_batch": args.rows,
        "batches": args.batches,
        "calibration_us": round(calibration_us, 2),
        "results": results,
        "spark_style_cpu_speedup_vs_anchor_2700us_per_key": round(
            2700.0 / results["spark_style"]["median_cpu_us_per_key"], 1
        ),
    }
    if side_by_side:
        report["side_by_side_with_spark"] = side_by_side
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
