"""A query checkpoint's commit log written through the real commit log API, with driver-like metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blobstate.blobstore import BlobStore
from blobstate.ids import new_uid
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.lineage.refs import ObjectRef, PartitionObjects

N = 3
T0 = 1_763_816_742_000


def partition_metrics(version: int, p: int) -> dict[str, Any]:
    """What the driver records per partition (``PARTITION_METRICS``), with figures derived from v and p."""
    return {
        "input_rows": 100 * version + p,
        "output_rows": 10 * version + p,
        "bytes_uploaded": 1000 * version + 10 * p,
        "load_seconds": 0.01 * version + 0.1 * p,
        "load_rule": "working" if version > 1 else "empty",
        "restore_bytes": 50 * p,
        "process_seconds": 0.2,
        "commit_seconds": 0.03,
        "task_seconds": 0.5 + p,
        "snapshot_repairs": [],
        "state_keys": 1000 * version + p,
        "snapshot_restore_bytes": 0,
        "executor_id": f"exec-{p}",
        "host": "10.0.0.1",
        "started_at": 1.0,
        "opened_at": 1.1,
    }


def standby_metrics(version: int) -> dict[str, Any]:
    """``metrics.standby`` with one failover at version 3 and lags that grow with the version."""
    return {
        "replicas": 1,
        "active_failures": 1 if version == 3 else 0,
        "standby_failures": 0,
        "failovers": 1 if version == 3 else 0,
        "failovers_without_standby": 0,
        "moves": [{"partition": 1, "from": "exec-1", "to": "exec-9", "reason": "standby"}]
        if version == 3
        else [],
        "short_of_standbys": {},
        "lag_versions": {str(p): {"10.0.0.2": version % 2 + p, "10.0.0.3": 0} for p in range(N)},
        "sync": [{"seconds": 0.1, "bytes": 4096}],
    }


def write_checkpoint(
    store: BlobStore, versions: int = 4, *, no_metrics: tuple[int, ...] = (1,)
) -> QueryMetadata:
    """Commits 1..versions; those in ``no_metrics`` carry none (as written before metrics existed).

    Partition ``p`` has a snapshot at version ``v`` when ``(v + p) % 3 == 0``; deltas are ``100 * v + p``
    bytes; versions from 2 carry standby metrics and version 3 the driver's stage/sink/commit split;
    version 2 records Spark's overhead as ``spark_recovery_seconds`` (as commits did before the overhead
    had its own name), later versions both figures.
    """
    log = CommitLog(store)
    meta = log.write_metadata(QueryMetadata.new(N, {"0": {"key_columns": ["user"]}}))
    for v in range(1, versions + 1):
        objects = {
            p: PartitionObjects(
                ObjectRef.of(b"d" * (100 * v + p)), ObjectRef.of(b"index") if (v + p) % 3 == 0 else None
            )
            for p in range(N)
        }
        metrics = None
        if v not in no_metrics:
            metrics = {
                "eviction_watermark_ms": None,
                "seconds": 1.5 * v,
                "partitions": {p: partition_metrics(v, p) for p in range(N)},
                "objects": {p: [] for p in range(N)},
                "spark_recovery_seconds": 0.25,  # version 2 as written before the overhead had its name
                "standby": standby_metrics(v),
            }
            if v >= 3:
                metrics["spark_overhead_seconds"] = 0.25
                metrics["spark_recovery_seconds"] = 1.5 if v == 3 else 0.0  # the failover batch retried
            if v == 3:
                metrics.update({"stage_seconds": 2.0, "sink_seconds": 1.0, "commit_seconds": 0.5})
        log.write_commit(
            Commit(
                version=v,
                checkpoints={"0": {p: new_uid() for p in range(N)}},
                writer="driver-a" if v < 3 else "driver-b",
                objects={"0": objects},
                retained_from=1,
                metrics=metrics,
                created_time_ms=T0 + 1000 * v,
            )
        )
    return meta


BACKGROUND_QUERY_ID = "5f0c3f3e-9d7e-4c55-a1a4-0a0b0c0d0e0f"


def write_background_checkpoint(url: str, local: Path, versions: int = 5, every: int = 2) -> list[Commit]:
    """Versions ``1..versions`` of one real RocksDB partition, committed as the engine commits them, with
    snapshots uploaded in the background (the engine's default): the snapshot due at version ``v`` (every
    ``every`` versions) is named late by the commit of ``v + 1``."""
    from blobstate.blobstore import open_blob_store
    from blobstate.state.partition import open_partition
    from blobstate.state.retention import after_commit, retained_from
    from blobstate.state.uploads import wait_for_uploads

    commits: list[Commit] = []
    with open_blob_store(url) as store:
        log = CommitLog(store)
        log.write_metadata(QueryMetadata(BACKGROUND_QUERY_ID, 1, {"0": {"key_columns": ["k"]}}))
        committed = None
        for v in range(1, versions + 1):
            with open_partition(
                store,
                local,
                BACKGROUND_QUERY_ID,
                "0",
                0,
                committed,
                snapshot_every=every,
                snapshot_upload="background",
            ) as state:
                state.store.put("a", b"k%d" % v, b"x" * 1000)
                result = state.commit()
            assert wait_for_uploads(60)
            committed = result.checkpoint_id
            commit = Commit(
                version=v,
                checkpoints={"0": {0: committed.uid}},
                objects={"0": {0: result.objects}},
                retained_from=retained_from(commits[-1] if commits else None, v, 1000),
                metrics={"seconds": 1.0, "partitions": {0: {**partition_metrics(v, 0), "host": "h"}}},
                writer="test-driver",
                created_time_ms=T0 + 60_000 * v,
            )
            log.write_commit(commit)
            after_commit(store, commit, commit_log=log)
            commits.append(commit)
    return commits
