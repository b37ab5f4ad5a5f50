"""The executor side of a standby sync job: one Spark task per (partition, replica executor).

The driver ships a :class:`SyncSpec` in the job's closure; task ``i`` handles ``spec.tasks[i]``. A task
that Spark ran on another executor than the one it was placed on (its preferred executor was busy for
longer than the locality wait, or is gone) does nothing and says so: a replica is only ever written on
the executor, and so the host, the driver chose.

Every sync task then sweeps its executor's local directory (:func:`~blobstate.state.sweep.sweep_idle`,
with the query's ``local_dir_grace_seconds``), as processing tasks do: an executor that holds only
standby replicas runs no processing task, and without this its replicas of partitions it no longer
holds would stay on its disk for its lifetime. The sweep's own rules keep what is in use or recent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from blobstate import defaults
from blobstate.batch.executor import ExecutorIdentity

REPORT_COLUMN = "report"
SYNC_SCHEMA = pa.schema([pa.field(REPORT_COLUMN, pa.string())])


@dataclass(frozen=True)
class SyncTask:
    """Bring the replica of ``partition`` on ``executor_id`` (on ``host``) to ``(version, uid)``."""

    partition: int
    executor_id: str
    host: str
    version: int
    uid: str


@dataclass(frozen=True)
class SyncSpec:
    """One sync round: the checkpoint, the local directory setting and the tasks."""

    checkpoint_url: str
    query_id: str
    operator: str
    local_dir: str
    budget_seconds: float
    tasks: tuple[SyncTask, ...]
    local_dir_grace_seconds: float = defaults.LOCAL_DIR_GRACE_SECONDS
    """The query's ``local_dir_grace_seconds``: the sweep after each sync removes partition directories
    of this executor unused for longer."""


def run_sync_task(spec: SyncSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of a sync job: sync one replica, yield one JSON report row."""
    from pyspark import TaskContext

    from blobstate.batch.executor import current_executor

    for _ in batches:  # the task's one input row only says which task this is
        pass
    context = TaskContext.get()
    assert context is not None, "run_sync_task runs in a Spark task"
    out = sync_here(spec, spec.tasks[context.partitionId()], current_executor())
    yield pa.RecordBatch.from_arrays([pa.array([json.dumps(out)], pa.string())], schema=SYNC_SCHEMA)


def sync_here(spec: SyncSpec, task: SyncTask, executor: ExecutorIdentity) -> dict[str, Any]:
    """The work of one sync task on ``executor``: sync the replica ``task`` names if this is the executor
    it was placed on (else report ``misplaced``), then sweep this executor's local directory of idle
    partition directories. Returns the task's report as a JSON-ready dict."""
    from blobstate.batch.executor import blob_store_for, resolve_local_dir
    from blobstate.ids import CheckpointId
    from blobstate.layout import LocalPartitionLayout
    from blobstate.standby.replica import SyncReport, sync_replica
    from blobstate.state.local_copy import partition_history
    from blobstate.state.sweep import sweep_idle

    report = SyncReport(task.partition, "misplaced", 0, None, task.version)
    local_dir = resolve_local_dir(spec.local_dir)
    layout = LocalPartitionLayout(Path(local_dir), spec.query_id, spec.operator, task.partition)
    if (executor.executor_id, executor.host) == (task.executor_id, task.host):
        store = blob_store_for(spec.checkpoint_url)
        history = partition_history(store, spec.operator, task.partition)
        started = time.monotonic()
        try:
            report = sync_replica(
                store,
                layout,
                CheckpointId(task.version, task.uid),
                history,
                budget_seconds=spec.budget_seconds,
            )
        except Exception as error:  # reported to the driver; the replica stays dirty, never wrong
            report.outcome = "error"
            report.error = f"{type(error).__name__}: {error}"
            report.seconds = round(time.monotonic() - started, 4)
    # After the sync, which released the partition's lock: never logs an error, never raises.
    sweep_idle(local_dir, spec.local_dir_grace_seconds, keep=(layout.root,))
    out = {**report.to_json(), "executor_id": executor.executor_id, "host": executor.host}
    out["planned"] = {"executor_id": task.executor_id, "host": task.host}
    return out
