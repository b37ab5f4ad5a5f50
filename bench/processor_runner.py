"""Micro benchmark of blobstate.processor.run_partition: running count + sum per key, printed as JSON.

A keyspace of --keys keys, batches of --rows rows with uniformly random keys, one partition, the real
RocksStateStore in a temporary directory. The state is first filled so every key exists, then
--batches steady batches are timed for three processors:

* ``spark_style``: what one writes for Spark's transformWithStateInPandas: iterate the DataFrames,
  ValueState get/update, ``yield pd.DataFrame({...})`` per key;
* ``state_only``: the same state work without output (no per-key DataFrame built by the user);
* ``noop``: touches nothing: the runner's own cost of grouping, slicing and calling per key.

Per-key figures are batch seconds / distinct keys in the batch. ``calibration_us`` (a fixed pure
Python loop) tells how loaded the machine was; compare runs side by side. Spark's own
transformWithStateInPandas needs about 2,700 us per key on this kind of machine (ANCHORS).

    .venv/bin/python bench/processor_runner.py [--keys 100000] [--rows 20000] [--batches 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from blobstate.processor import StatefulProcessor, run_partition
from blobstate.state.store import RocksStateStore

OUTPUT = "key BIGINT, count BIGINT, total BIGINT"


class SparkStyleCount(StatefulProcessor):
    """Running count and sum, written as for Spark."""

    def init(self, handle):
        self.state = handle.getValueState("agg", "count BIGINT, total BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        count = 0
        total = 0
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["value"].sum())
        old = self.state.get()
        if old is not None:
            count += old[0]
            total += old[1]
        self.state.update((count, total))
        yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})


class StateOnlyCount(SparkStyleCount):
    """The same state work, no output."""

    def handleInputRows(self, key, rows, timerValues):
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

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
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
) -> tuple[float, int]:
    started = time.perf_counter()
    out_rows = 0
    for batch in run_partition(
        processor,
        store,
        table,
        key_columns=["key"],
        output_schema=OUTPUT,
        time_mode="None",
        output_mode="Update",
        batch_timestamp_ms=ts,
    ):
        out_rows += batch.num_rows
    seconds = time.perf_counter() - started
    store.take_changelog()  # what a commit would take; not timed
    return seconds, out_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    calibration_us = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, processor_class in (
            ("noop", Noop),
            ("state_only", StateOnlyCount),
            ("spark_style", SparkStyleCount),
        ):
            with RocksStateStore.open(Path(tmp) / name) as store:
                # fill: every key gets state once
                all_keys = np.arange(args.keys, dtype=np.int64)
                for start in range(0, args.keys, args.rows):
                    chunk = all_keys[start : start + args.rows]
                    fill = pa.table({"key": chunk, "value": np.ones(len(chunk), dtype=np.int64)})
                    run_batch(store, processor_class(), fill, 0)
                store.flush()
                per_key = []
                per_row = []
                batch_seconds = []
                distinct = []
                for b in range(args.batches):
                    table = make_batch(rng, args.keys, args.rows)
                    n_keys = len(np.unique(table.column("key").to_numpy()))
                    seconds, out_rows = run_batch(store, processor_class(), table, b + 1)
                    assert out_rows in (0, n_keys)
                    batch_seconds.append(seconds)
                    distinct.append(n_keys)
                    per_key.append(seconds / n_keys * 1e6)
                    per_row.append(seconds / args.rows * 1e6)
                results[name] = {
                    "median_batch_seconds": round(statistics.median(batch_seconds), 4),
                    "median_us_per_key": round(statistics.median(per_key), 1),
                    "median_us_per_row": round(statistics.median(per_row), 1),
                    "distinct_keys_per_batch": int(statistics.median(distinct)),
                    "keys_per_second": round(statistics.median(distinct) / statistics.median(batch_seconds)),
                }
    spark_us_per_key = 2700.0
    print(
        json.dumps(
            {
                "benchmark": "processor_runner",
                "keys": args.keys,
                "rows_per_batch": args.rows,
                "batches": args.batches,
                "calibration_us": round(calibration_us, 2),
                "results": results,
                "speedup_vs_spark_transformWithStateInPandas": round(
                    spark_us_per_key / results["spark_style"]["median_us_per_key"], 1
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
