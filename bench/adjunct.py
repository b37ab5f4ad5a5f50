"""Adjunct stores: lookups against Spark's stream-static join, bootstrap of a large side table, and a new
executor's catch-up of a broadcast store; prints JSON.

1. ``lookups``: a click stream (``--events`` per batch over ``--users`` users, one parquet file per batch)
   enriched with each user's tier. blobstate: a row-API processor that looks the tier up in a partitioned
   adjunct store (one ``get`` per key and batch) and emits one row per click. Spark: the same stream
   joined (left) with the static profile table (``spark.read.parquet``; Spark broadcasts it), written
   by ``foreachBatch`` to the ``noop`` sink, as blobstate's sink does. Beside them, blobstate with the
   same processor emitting the same rows without a side stream or lookup (the cost of the adjunct is
   the difference). The first batch is warm-up; then
   the remaining batches are timed: events per second and per CPU-second (the whole process tree:
   driver JVM and Python workers), ratio blobstate / Spark.
2. ``bootstrap``: a new query whose partitioned adjunct's side stream holds ``--bootstrap-rows`` rows
   in one file, with one small click batch: the first batch's time and its side rows per second, beside
   the same first batch without the side stream.
3. ``catch_up``: a broadcast store of ``--broadcast-rows`` rows written over ``--versions`` versions
   (snapshots every 5) in a local-directory blob store; a new executor's copy built from the blob store
   (snapshot plus deltas, the standby catch-up) against re-reading the side stream's files into a new
   store. No Spark.

    .venv/bin/python bench/adjunct.py [--users 100000] [--events 200000] [--batches 4]
        [--bootstrap-rows 1000000] [--broadcast-rows 100000] [--versions 12] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from proctree import tree_cpu_seconds

from blobstate.processor import StatefulProcessor

TIERS = ["free", "plus", "pro"]
CLICKS = "user STRING, n BIGINT"
PROFILES = "user STRING, tier STRING"
OUTPUT = "user STRING, n BIGINT, tier STRING"


class EnrichRows(StatefulProcessor):
    """One tier lookup per key and batch; one output row per click."""

    def init(self, handle: Any) -> None:
        self.profiles = handle.getAdjunct("profiles")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        from pyspark.sql import Row

        (user,) = key
        found = self.profiles.get(user)
        tier = None if found is None else found[0]
        for row in rows:
            yield Row(user=user, n=row.n, tier=tier)


def write_file(directory: Path, index: int, table: pa.Table) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".part-{index:05d}.tmp"
    pq.write_table(table, tmp)
    stamp = 1_600_000_000 + index
    os.utime(tmp, (stamp, stamp))
    os.replace(tmp, directory / f"part-{index:05d}.parquet")


def profiles_table(users: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    tiers = [TIERS[i] for i in rng.integers(0, 3, users)]
    return pa.table({"user": [f"u{i:07d}" for i in range(users)], "tier": tiers})


def clicks_table(users: int, events: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, users, events)
    return pa.table({"user": [f"u{i:07d}" for i in ids], "n": np.arange(events, dtype=np.int64)})


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed_batches(start: Any, clicks_dir: Path, files: list[pa.Table]) -> dict[str, Any]:
    """Start a query on the first file (warm-up), then time the remaining files' batches."""
    write_file(clicks_dir, 0, files[0])
    query = start()
    query.processAllAvailable()
    wall, cpu = time.perf_counter(), tree_cpu_seconds()
    for i, table in enumerate(files[1:], start=1):
        write_file(clicks_dir, i, table)
    query.processAllAvailable()
    wall, cpu = time.perf_counter() - wall, tree_cpu_seconds() - cpu
    query.stop()
    events = sum(t.num_rows for t in files[1:])
    return {
        "events": events,
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "events_per_s": round(events / wall),
        "events_per_cpu_s": round(events / cpu),
    }


def noop_sink(frame: Any, _: int) -> None:
    frame.write.format("noop").mode("overwrite").save()


def start_enrichment(
    spark: Any, base: Path, *, with_side: bool, one_file_per_batch: bool = True, on_batch: Any = None
) -> Any:
    """blobstate's enrichment query over ``base/clicks`` (with the ``base/profiles`` side stream and a
    lookup per key, or the same output without either)."""
    import blobstate

    reader = spark.readStream.schema(CLICKS)
    if one_file_per_batch:
        reader = reader.option("maxFilesPerTrigger", 1)
    adjuncts = []
    if with_side:
        side = spark.readStream.schema(PROFILES).parquet(str(base / "profiles"))
        adjuncts = [blobstate.Adjunct("profiles", side, key="user", value="tier")]
    return blobstate.transform_with_state(
        reader.parquet(str(base / "clicks")),
        key="user",
        processor=EnrichRows() if with_side else NoLookup(),
        output_schema=OUTPUT,
        checkpoint=str(base / "ckpt"),
        sink=noop_sink,
        num_partitions=2,
        api="row",
        local_dir=str(base / "local"),
        adjuncts=adjuncts,
        on_batch=on_batch,
    )


def bench_lookups(spark: Any, work: Path, users: int, events: int, batches: int) -> dict[str, Any]:
    profiles = profiles_table(users)
    files = [clicks_table(users, events, seed=10 + b) for b in range(batches)]
    out: dict[str, Any] = {"users": users, "events_per_batch": events, "timed_batches": batches - 1}

    base = work / "lookups-blobstate"
    write_file(base / "profiles", 0, profiles)
    out["blobstate"] = timed_batches(
        lambda: start_enrichment(spark, base, with_side=True), base / "clicks", files
    )
    out["blobstate"]["lookups_per_batch"] = len(set(files[1].column("user").to_pylist()))

    plain = work / "lookups-blobstate-no-lookup"
    out["blobstate_same_processor_without_side_stream"] = timed_batches(
        lambda: start_enrichment(spark, plain, with_side=False), plain / "clicks", files
    )

    joined_base = work / "lookups-spark"
    write_file(joined_base / "profiles", 0, profiles)

    def start_spark() -> Any:
        clicks = (
            spark.readStream.schema(CLICKS)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(joined_base / "clicks"))
        )
        static = spark.read.schema(PROFILES).parquet(str(joined_base / "profiles"))
        return (
            clicks.join(static, "user", "left")
            .writeStream.foreachBatch(noop_sink)
            .option("checkpointLocation", str(joined_base / "ckpt"))
            .start()
        )

    out["spark_stream_static_join"] = timed_batches(start_spark, joined_base / "clicks", files)
    b, s = out["blobstate"], out["spark_stream_static_join"]
    out["ratio_events_per_s"] = round(b["events_per_s"] / s["events_per_s"], 2)
    out["ratio_events_per_cpu_s"] = round(b["events_per_cpu_s"] / s["events_per_cpu_s"], 2)
    return out


def bench_bootstrap(spark: Any, work: Path, rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {"side_rows": rows}
    for name, with_side in (("without_side_stream", False), ("with_side_stream", True)):
        base = work / f"bootstrap-{name}"
        write_file(base / "clicks", 0, clicks_table(rows, 1000, seed=3))
        if with_side:
            write_file(base / "profiles", 0, profiles_table(rows, seed=4))
        reports: list[Any] = []
        query = start_enrichment(
            spark, base, with_side=with_side, one_file_per_batch=False, on_batch=reports.append
        )
        query.processAllAvailable()
        query.stop()
        first = reports[0]
        out[name] = {"first_batch_seconds": first.seconds, "stage_seconds": first.stage_seconds}
    extra = out["with_side_stream"]["first_batch_seconds"] - out["without_side_stream"]["first_batch_seconds"]
    out["bootstrap_seconds"] = round(extra, 3)
    out["side_rows_per_s"] = round(rows / max(extra, 1e-9))
    return out


class NoLookup(StatefulProcessor):
    """The bootstrap baseline: the same output, no adjunct."""

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        from pyspark.sql import Row

        for row in rows:
            yield Row(user=key[0], n=row.n, tier=None)


def bench_catch_up(work: Path, rows: int, versions: int) -> dict[str, Any]:
    """Build a broadcast store over ``versions`` versions; time a new executor's copy two ways."""
    from blobstate.adjunct.broadcast import open_replica, write_version
    from blobstate.adjunct.records import apply_side_rows
    from blobstate.adjunct.spec import AdjunctSpec, column_name
    from blobstate.blobstore import open_blob_store
    from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
    from blobstate.lineage.refs import ObjectRef, PartitionObjects
    from blobstate.state.store import RocksStateStore

    spec = AdjunctSpec(
        name="profiles",
        mode="broadcast",
        key_in_union=(column_name("profiles", "user"),),
        side_key_columns=("user",),
        side_columns=("user", "tier"),
        value_columns=("tier",),
        schema_json=json.dumps(
            {
                "type": "struct",
                "fields": [{"name": "tier", "type": "string", "nullable": True, "metadata": {}}],
            }
        ),
        transform=None,
        on_bad_record="fail",
        bootstrap=True,
        persistent=True,
        max_age_seconds=None,
    )
    query_id = "ab" * 16
    store = open_blob_store(str(work / "catch-up-remote"))
    log = CommitLog(store)
    log.write_metadata(
        QueryMetadata.new(
            1, {"0": {"key_columns": ["user"]}, spec.operator: {"key_columns": ["user"], "partitions": 1}}
        )
    )
    source_dir = work / "catch-up-source"
    per_version = rows // versions
    committed = None
    dummy = PartitionObjects(ObjectRef.of(b"x"))
    pending = None
    for v in range(1, versions + 1):
        if v == 1:
            table = profiles_table(rows, seed=1)
        else:  # a slice of the users changes tier
            table = profiles_table(rows, seed=v).slice(((v - 2) * per_version) % rows, per_version)
        write_file(source_dir, v, table)
        side = pa.table(
            {
                column_name("profiles", "user"): table.column("user"),
                column_name("profiles", "tier"): table.column("tier"),
            }
        )
        written = write_version(
            store,
            str(work / "catch-up-driver"),
            query_id,
            spec,
            committed,
            side,
            uid=f"{v:032x}",
            snapshot_every=5,
            snapshot_delta_bytes=10**12,
        )
        log.write_commit(
            Commit(
                version=v,
                batch_id=v - 1,
                checkpoints={"0": {0: "f" * 32}, spec.operator: {0: written.pending.uid}},
                objects={"0": {0: dummy}, spec.operator: {0: written.objects}},
                retained_from=1,
                writer="bench",
            )
        )
        committed = written.pending.checkpoint_id
        pending = written.pending
    assert pending is not None
    remote_bytes = sum(store.list_sizes().values())

    started = time.perf_counter()
    with open_replica(store, str(work / "catch-up-executor"), query_id, spec, pending) as (_, _seconds):
        pass
    from_blob_store = time.perf_counter() - started

    started = time.perf_counter()
    with RocksStateStore.open(work / "catch-up-reread") as fresh:
        for path in sorted(source_dir.glob("part-*.parquet")):
            table = pq.read_table(path)
            side = pa.table(
                {
                    column_name("profiles", "user"): table.column("user"),
                    column_name("profiles", "tier"): table.column("tier"),
                }
            )
            apply_side_rows(fresh, spec, side)
    reread = time.perf_counter() - started
    return {
        "rows": rows,
        "versions": versions,
        "remote_bytes": remote_bytes,
        "new_executor_from_blob_store_seconds": round(from_blob_store, 3),
        "re_reading_the_side_files_seconds": round(reread, 3),
        "ratio": round(reread / from_blob_store, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--bootstrap-rows", type=int, default=1_000_000)
    parser.add_argument("--broadcast-rows", type=int, default=100_000)
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="blobstate-bench-adjunct-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result: dict[str, Any] = {"load_average": os.getloadavg()}
    result["catch_up"] = bench_catch_up(work, args.broadcast_rows, args.versions)
    spark = spark_session()
    result["lookups"] = bench_lookups(spark, work, args.users, args.events, args.batches)
    result["bootstrap"] = bench_bootstrap(spark, work, args.bootstrap_rows)
    spark.stop()
    print(json.dumps(result, indent=2))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
