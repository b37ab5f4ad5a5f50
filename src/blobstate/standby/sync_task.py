"""The executor side of a standby sync job: one Spark task per (partition, replica executor).

The driver ships a :class:`SyncSpec` in the job's closure; task ``i`` handles ``spec.tasks[i]``. A task
that Spark ran on another executor than the one it was placed on (its preferred executor was busy for
longer than the locality wait, or is gone) does nothing and says so: a replica is only ever written on
the executor, and so the host, the driver chose.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

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


def run_sync_task(spec: SyncSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of a sync job: sync one replica, yield one JSON report row."""
    from pyspark import TaskContext

    from blobstate.batch.executor import blob_store_for, current_executor, resolve_local_dir
    from blobstate.ids import CheckpointId
    from blobstate.layout import LocalPartitionLayout
    from blobstate.standby.replica import SyncReport, sync_replica
    from blobstate.state.local_copy import partition_history

    for _ in batches:  # the task's one input row only says which task this is
        pass
    task = spec.tasks[TaskContext.get().partitionId()]
    executor = current_executor()
    report = SyncReport(task.partition, "misplaced", 0, None, task.version)
    if (executor.executor_id, executor.host) == (task.executor_id, task.host):
        layout = LocalPartitionLayout(
            Path(resolve_local_dir(spec.local_dir)), spec.query_id, spec.operator, task.partition
        )
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
    out = {**report.to_json(), "executor_id": executor.executor_id, "host": executor.host}
    out["planned"] = {"executor_id": task.executor_id, "host": task.host}
    yield pa.RecordBatch.from_arrays([pa.array([json.dumps(out)], pa.string())], schema=SYNC_SCHEMA)
