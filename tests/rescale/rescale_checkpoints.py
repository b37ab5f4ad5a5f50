"""Query checkpoints for the rescale tests, built without Spark by the real partition, processor runner,
commit log and retention code (as the engine's tasks and driver do), with rows placed in the partition
Spark gives their key. Every state kind: value, list, map, a TTL'd value and timers (the reader tests'
:class:`EveryState`), a partitioned adjunct store (column family ``$adjunct:prices``, one value per key,
written as a task applies side rows), and a watermark in every commit."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reader"))

from reader_jobs import OUTPUT, EveryState, batches, reference

from blobstate.blobstore import open_blob_store
from blobstate.encoding.codec import encode_key
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.processor import RunSpec
from blobstate.processor.runner import run_partition
from blobstate.rescale.murmur3 import spark_partition
from blobstate.state.partition import open_partition
from blobstate.state.retention import after_commit, retained_from

QUERY_ID = "5d1f7a2e-0b9c-4c3d-9e8f-a1b2c3d4e5f6"
T0_MS = 1_763_000_000_000
KEY_SCHEMA = StructType([StructField("key", StringType())])
ADJUNCT_CF = "$adjunct:prices"
RETAIN = 3


def frozen(value: Any) -> Any:
    """A state reader's value (rows, lists, maps) as nested tuples, so rows can be counted as a multiset."""
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if hasattr(value, "asDict"):
        return frozen(tuple(value))
    return value


def watermark_of(version: int) -> int:
    """The watermark each test commit records."""
    return T0_MS + version * 500


def partition_of(key: str, n: int) -> int:
    """Spark's partition of a string key: ``pmod(hash(key), n)``."""
    return spark_partition((key,), KEY_SCHEMA, n)


def price_of(key: str, batch: int) -> bytes:
    """The adjunct store's value of ``key`` after ``batch`` (raw bytes: the store is copied, not decoded)."""
    return f"{key}@{batch}".encode()


def run_batches(url: str, batches: list[list[tuple[str, int]]], local: Path, num_partitions: int) -> None:
    """Run :class:`EveryState` over ``batches`` into the checkpoint at ``url``, continuing from its newest
    commit (a new checkpoint gets ``metadata.json`` with ``num_partitions``; a rescaled one keeps the
    newest commit's layout). Snapshots every 2 versions, 3 versions retained."""
    with open_blob_store(url) as store:
        log = CommitLog(store)
        spec = {"key_columns": ["key"], "key_schema": KEY_SCHEMA.jsonValue()}
        previous = log.latest_commit()
        if previous is None:
            log.write_metadata(QueryMetadata(QUERY_ID, num_partitions, {"0": spec}))
        for rows in batches:
            version = 1 if previous is None else previous.version + 1
            batch = 0 if previous is None else previous.batch_id + 1
            results = {}
            for p in range(num_partitions):
                mine = [(k, v) for k, v in rows if partition_of(k, num_partitions) == p]
                table = pa.table({"key": [k for k, _ in mine], "value": [v for _, v in mine]},
                                 schema=pa.schema([("key", pa.string()), ("value", pa.int64())]))  # fmt: skip
                committed = None if previous is None else previous.checkpoint_id("0", p)
                with open_partition(
                    store, local, QUERY_ID, "0", p, committed, snapshot_every=2, lock_timeout=5.0
                ) as state:
                    for k in sorted({k for k, _ in mine}):
                        state.store.put(ADJUNCT_CF, encode_key((k,)), price_of(k, batch))
                    run = RunSpec(
                        key_columns=("key",), output_schema=OUTPUT, time_mode="ProcessingTime",
                        batch_timestamp_ms=T0_MS + batch * 1000,
                    )  # fmt: skip
                    for _ in run_partition(EveryState(), state.store, table, run):
                        pass
                    results[p] = state.commit()
            layout: dict[str, Any] = {}
            if previous is not None and previous.layout_from > 1:
                layout = {"num_partitions": num_partitions, "layout_from": previous.layout_from}
            commit = Commit(
                version=version,
                checkpoints={"0": {p: r.checkpoint_id.uid for p, r in results.items()}},
                objects={"0": {p: r.objects for p, r in results.items()}},
                retained_from=retained_from(previous, version, RETAIN),
                writer=f"test-{uuid.uuid4().hex[:8]}",
                watermark_ms=watermark_of(version),
                batch_id=batch,
                horizon=previous.horizon if previous is not None else 1,
                **layout,
            )
            log.write_commit(commit)
            after_commit(store, commit, commit_log=log)
            previous = commit


def adjunct_reference(batches: list[list[tuple[str, int]]]) -> dict[str, bytes]:
    """The adjunct store's content after ``batches``."""
    out: dict[str, bytes] = {}
    for i, rows in enumerate(batches):
        for k, _ in rows:
            out[k] = price_of(k, i)
    return out


__all__ = ["batches", "reference"]
