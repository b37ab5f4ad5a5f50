"""A real query checkpoint built without Spark: :class:`EveryState` run by the processor runner over each
partition's rows, committed through the real partition commit, commit log and retention code, as the
engine's driver and tasks do (the driver's scheduling aside)."""

from __future__ import annotations

import uuid
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
from reader_jobs import OUTPUT, EveryState, reference

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.processor import RunSpec, run_partition
from blobstate.state.partition import open_partition
from blobstate.state.retention import after_commit, retained_from

QUERY_ID = "0e6c2a55-3b1d-4f0e-8a9b-1c2d3e4f5a6b"
T0_MS = 1_763_000_000_000


def partition_of(key: str, num_partitions: int) -> int:
    """The partition a key goes to here (any fixed rule will do)."""
    return zlib.crc32(key.encode()) % num_partitions


def build_checkpoint(
    url: str, batches: list[list[tuple[str, int]]], local: Path, *, num_partitions: int = 2, retain: int = 3
) -> list[dict[str, Any]]:
    """Run :class:`EveryState` over every batch into the checkpoint at ``url``; return the reference
    state per version."""
    write_checkpoint(url, batches, local, EveryState, OUTPUT, num_partitions=num_partitions, retain=retain)
    return reference(batches)


def write_checkpoint(
    url: str,
    batches: list[list[tuple[str, int]]],
    local: Path,
    processor: Any,
    output_schema: str,
    *,
    num_partitions: int = 2,
    retain: int = 3,
    operator_spec: dict[str, Any] | None = None,
    watermarks: list[int] | None = None,
) -> None:
    """Run ``processor()`` (time mode ProcessingTime) over every batch into the checkpoint at ``url``;
    ``operator_spec`` adds entries to the operator's ``metadata.json`` record; ``watermarks`` are the
    commits' ``watermark_ms`` (one per batch; default none).

    Batch ``i`` runs at batch timestamp ``T0_MS + i * 1000``; a snapshot every 2 versions.
    """
    with open_blob_store(url) as store:
        log = CommitLog(store)
        spec = {"key_columns": ["key"], **(operator_spec or {})}
        log.write_metadata(QueryMetadata(QUERY_ID, num_partitions, {"0": spec}))
        previous = None
        for i, rows in enumerate(batches):
            version = i + 1
            results = {}
            for p in range(num_partitions):
                mine = [(k, v) for k, v in rows if partition_of(k, num_partitions) == p]
                table = pa.table({"key": [k for k, _ in mine], "value": [v for _, v in mine]},
                                 schema=pa.schema([("key", pa.string()), ("value", pa.int64())]))  # fmt: skip
                committed = None if previous is None else previous.checkpoint_id("0", p)
                with open_partition(
                    store, local, QUERY_ID, "0", p, committed, snapshot_every=2, lock_timeout=5.0
                ) as state:
                    run = RunSpec(
                        key_columns=("key",),
                        output_schema=output_schema,
                        time_mode="ProcessingTime",
                        batch_timestamp_ms=T0_MS + i * 1000,
                    )
                    for _ in run_partition(processor(), state.store, table, run):
                        pass
                    results[p] = state.commit()
            commit = Commit(
                version=version,
                checkpoints={"0": {p: r.checkpoint_id.uid for p, r in results.items()}},
                objects={"0": {p: r.objects for p, r in results.items()}},
                retained_from=retained_from(previous, version, retain),
                watermark_ms=None if watermarks is None else watermarks[i],
                writer=f"test-{uuid.uuid4().hex[:8]}",
            )
            log.write_commit(commit)
            after_commit(store, commit, commit_log=log)
            previous = commit
