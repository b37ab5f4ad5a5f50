"""Click enrichment with two side streams, a plain-Python reference, and a driver job for crash tests.

Main stream: clicks ``(user STRING, n BIGINT)``. Side streams: user profiles ``(user STRING, tier
STRING)`` (a partitioned adjunct, keyed like the clicks) and tier discounts ``(tier STRING, pct BIGINT)``
(a broadcast adjunct). Every stream is a directory of parquet files read one file per micro-batch, so
batch ``i`` takes file ``i`` of each stream that has one. The processor counts clicks per user and emits
``(user, n, clicks, tier, pct)`` per click with the profile and discount it saw.

Run as a script, this module is a driver process: it runs the query over the files present and stops,
or exits abruptly in the sink of ``--die-in-sink-of`` (after the stage, before the commit) having
written what the sink got to ``<output>/died-<batch>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

CLICKS = "user STRING, n BIGINT"
PROFILES = "user STRING, tier STRING"
DISCOUNTS = "tier STRING, pct BIGINT"
OUTPUT = "user STRING, n BIGINT, clicks BIGINT, tier STRING, pct BIGINT"

Row = tuple[Any, ...]


class Enrich(StatefulProcessor):
    """Counts clicks per user; enriches each click from the ``profiles`` and ``discounts`` adjuncts."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        self.count = handle.getValueState("count", StructType([StructField("c", LongType())]))
        self.profiles = handle.getAdjunct("profiles")
        self.discounts = handle.getAdjunct("discounts")
        self.handle = handle

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        (user,) = key
        count = (self.count.get() or (0,))[0]
        profile = self.profiles.get(user)
        tier = None if profile is None else profile[0]
        discount = None if tier is None else self.discounts.get(tier)
        pct = None if discount is None else discount[0]
        out = []
        for frame in rows:
            for n in frame["n"]:
                count += 1
                out.append((user, int(n), count, tier, pct))
        self.count.update((count,))
        yield pd.DataFrame(out, columns=["user", "n", "clicks", "tier", "pct"])


# ---------------------------------------------------------------------------------------------- data
def write_files(directory: Path, tables: Sequence[pa.Table | None], first: int = 0) -> None:
    """``batch-<i>.parquet`` per table (None: no file), mtimes increasing, each file appearing atomically.

    A stream's k-th file is read by batch k: leave files out only at the end (an empty table is a file).
    """
    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 3600
    for i, table in enumerate(tables, start=first):
        if table is None:
            continue
        path = directory / f"batch-{i:05d}.parquet"
        tmp = directory / f".batch-{i:05d}.tmp"
        pq.write_table(table, tmp)
        os.utime(tmp, (base + i, base + i))
        os.replace(tmp, path)


def clicks(rows: Sequence[tuple[str, int]]) -> pa.Table:
    return pa.table(
        {"user": [u for u, _ in rows], "n": [n for _, n in rows]},
        schema=pa.schema([("user", pa.string()), ("n", pa.int64())]),
    )


def profiles(rows: Sequence[tuple[str | None, str | None]]) -> pa.Table:
    return pa.table(
        {"user": [u for u, _ in rows], "tier": [t for _, t in rows]},
        schema=pa.schema([("user", pa.string()), ("tier", pa.string())]),
    )


def discounts(rows: Sequence[tuple[str, int | None]]) -> pa.Table:
    return pa.table(
        {"tier": [t for t, _ in rows], "pct": [p for _, p in rows]},
        schema=pa.schema([("tier", pa.string()), ("pct", pa.int64())]),
    )


def reference(
    click_batches: Sequence[pa.Table | None],
    profile_batches: Sequence[pa.Table | None],
    discount_batches: Sequence[pa.Table | None],
) -> dict[int, list[Row]]:
    """Each batch's outputs, computed in plain Python: side rows of a batch before its clicks."""
    counts: dict[str, int] = {}
    profile: dict[str, str] = {}
    discount: dict[str, int] = {}
    out: dict[int, list[Row]] = {}
    batches = max(len(click_batches), len(profile_batches), len(discount_batches))
    for b in range(batches):
        for table, store, value in (
            (_at(profile_batches, b), profile, "tier"),
            (_at(discount_batches, b), discount, "pct"),
        ):
            if table is None:
                continue
            key = table.column_names[0]
            for row in table.to_pylist():
                if row[key] is None:
                    continue
                if row[value] is None:
                    store.pop(row[key], None)
                else:
                    store[row[key]] = row[value]
        rows: list[Row] = []
        table = _at(click_batches, b)
        for row in [] if table is None else table.to_pylist():
            counts[row["user"]] = counts.get(row["user"], 0) + 1
            tier = profile.get(row["user"])
            rows.append(
                (
                    row["user"],
                    row["n"],
                    counts[row["user"]],
                    tier,
                    None if tier is None else discount.get(tier),
                )
            )
        if rows:
            out[b] = sorted(rows, key=repr)
    return out


class Model:
    """The enrichment in plain Python, step by step: side files and click files applied in the order a
    test says, stores emptied when a start re-creates them."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.profile: dict[str, str] = {}
        self.discount: dict[str, int] = {}

    def side(self, profile: pa.Table | None = None, discount: pa.Table | None = None) -> None:
        """Apply side files (a null key is skipped, a null value deletes)."""
        for table, store, value in ((profile, self.profile, "tier"), (discount, self.discount, "pct")):
            for row in [] if table is None else table.to_pylist():
                key = row[table.column_names[0]]
                if key is None:
                    continue
                if row[value] is None:
                    store.pop(key, None)
                else:
                    store[key] = row[value]

    def clicks(self, *tables: pa.Table) -> list[Row]:
        """Process click files; the rows the processor emits, sorted."""
        rows: list[Row] = []
        for table in tables:
            for row in table.to_pylist():
                user = row["user"]
                self.counts[user] = self.counts.get(user, 0) + 1
                tier = self.profile.get(user)
                rows.append(
                    (
                        user,
                        row["n"],
                        self.counts[user],
                        tier,
                        None if tier is None else self.discount.get(tier),
                    )
                )
        return sorted(rows, key=repr)

    def reset_sides(self) -> None:
        """Both adjunct stores re-created empty."""
        self.profile.clear()
        self.discount.clear()


def _at(tables: Sequence[pa.Table | None], i: int) -> pa.Table | None:
    return tables[i] if i < len(tables) else None


# ---------------------------------------------------------------------------------------------- the query
def start_query(spark: Any, base: Path, checkpoint: str, sink: Any, **options: Any) -> Any:
    """The enrichment query over ``base/{clicks,profiles,discounts}``, one file per stream per batch.

    ``bootstrap``, ``persistent`` and ``max_age_seconds`` options apply to both adjuncts (default: no
    bootstrap, so batch ``i`` applies side file ``i`` before click file ``i``)."""
    import blobstate
    from blobstate import Adjunct

    def stream(name: str, schema: str) -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(base / name))

    bootstrap = options.pop("bootstrap", False)
    persistent = options.pop("persistent", True)
    max_age = options.pop("max_age_seconds", None)
    common = {"bootstrap": bootstrap, "persistent": persistent, "max_age_seconds": max_age}
    adjuncts = [
        Adjunct("profiles", stream("profiles", PROFILES), key="user", value="tier", **common),
        Adjunct(
            "discounts", stream("discounts", DISCOUNTS), key="tier", value="pct", mode="broadcast", **common
        ),
    ]
    for directory in ("clicks", "profiles", "discounts"):
        (base / directory).mkdir(parents=True, exist_ok=True)
    return blobstate.transform_with_state(
        stream("clicks", CLICKS),
        key="user",
        processor=Enrich(),
        output_schema=OUTPUT,
        checkpoint=checkpoint,
        sink=sink,
        num_partitions=options.pop("num_partitions", 2),
        adjuncts=adjuncts,
        **options,
    )


class RecordingSink:
    """A sink keeping each batch's rows (sorted tuples), for batches with output."""

    def __init__(self) -> None:
        self.rows: dict[int, list[Row]] = {}

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = rows_of(frame)
        if rows:
            self.rows[batch_id] = rows


def rows_of(frame: Any) -> list[Row]:
    """A sink frame's rows as sorted tuples."""
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def run_to_end(query: Any) -> None:
    """Process every available input, then stop the query (re-raising its failure, if any)."""
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the query as a driver process (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--die-in-sink-of", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--local-dir", default=None)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--executors", type=int, default=0, help="wait for this many executors first")
    parser.add_argument("--conf", action="append", default=[], help="k=v Spark conf")
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(args.master)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
    )
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    deadline = time.monotonic() + 120
    while (
        args.executors and spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < args.executors
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"fewer than {args.executors} executors registered")
        time.sleep(0.5)
    args.output.mkdir(parents=True, exist_ok=True)

    def sink(frame: Any, batch_id: int) -> None:
        rows = rows_of(frame)
        if batch_id == args.die_in_sink_of:
            (args.output / f"died-{batch_id}.json").write_text(json.dumps(rows))
            os._exit(17)
        (args.output / f"batch-{batch_id}.json").write_text(json.dumps(rows))

    local_dir = args.local_dir or str(args.base / "local")
    query = start_query(
        spark, args.base, args.checkpoint, sink, local_dir=local_dir, num_partitions=args.partitions
    )
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
