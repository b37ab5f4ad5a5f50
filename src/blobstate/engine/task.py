"""The executor side of one micro-batch: load a partition, run the processor, commit, report.

Each task of the processing stage handles one partition. It emits the processor's output rows and, last,
exactly one metadata row (the new uid, the executor, what it wrote, metrics). Spark keeps the result of
one successful attempt per task, so outputs and metadata always come from the same execution.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

META_COLUMN = "__blobstate_meta"
PARTITION_COLUMN = "__blobstate_partition"


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, shipped to executors inside the stage's closure."""

    checkpoint_url: str
    query_id: str
    operator: str
    num_partitions: int
    version: int
    uids: dict[int, str]
    key_columns: tuple[str, ...]
    processor: Any
    output_schema: pa.Schema
    output_mode: str
    time_mode: str
    batch_timestamp_ms: int
    watermark_ms: int | None
    late_watermark_ms: int | None
    event_time_column: str | None
    local_dir: str
    snapshot_every: int
    snapshot_delta_bytes: int
    pandas_object_strings: bool = True
    api: str = "pandas"
    """``pandas`` or ``row``: what the processor's handlers receive and yield (QueryConfig.api)."""
    timezone: str = "UTC"
    """The session time zone: naive pandas timestamps in and out are wall-clock times of this zone."""
    blob_store_options: dict[str, Any] = field(default_factory=dict)

    @property
    def stage_schema(self) -> pa.Schema:
        """The processing stage's Arrow schema: the output columns (all nullable) plus the metadata column."""
        fields = [f.with_nullable(True) for f in self.output_schema]
        return pa.schema([*fields, pa.field(META_COLUMN, pa.string())])


_STORES: dict[str, Any] = {}


def _blob_store(spec: TaskSpec) -> Any:
    """One blob store client per Python worker process and checkpoint URL (workers are reused)."""
    from blobstate.blobstore import open_blob_store

    store = _STORES.get(spec.checkpoint_url)
    if store is None:
        store = _STORES[spec.checkpoint_url] = open_blob_store(spec.checkpoint_url, **spec.blob_store_options)
    return store


def _use_object_strings() -> None:
    """Make pandas build string columns as object dtype in this worker process (see QueryConfig)."""
    import warnings

    import pandas as pd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if pd.get_option("future.infer_string"):
            pd.set_option("future.infer_string", False)


def _checked_input(
    batches: Iterator[pa.RecordBatch], partition: int, stats: dict[str, Any]
) -> Iterator[pa.RecordBatch]:
    """Drop the partition column after checking every row was hashed to this task's partition."""
    import pyarrow.compute as pc

    for batch in batches:
        if batch.num_rows == 0:
            continue
        column = batch.column(PARTITION_COLUMN)
        if pc.any(pc.not_equal(column, partition)).as_py():
            raise RuntimeError(
                f"rows of another partition reached task of partition {partition}: the shuffle did not"
                " keep Spark's hash partitioning (is adaptive execution coalescing partitions?)"
            )
        stats["input_rows"] += batch.num_rows
        yield batch.drop_columns([PARTITION_COLUMN])


def run_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of the processing stage."""
    from pyspark import TaskContext

    from blobstate.engine.executor_identity import current_executor
    from blobstate.ids import CheckpointId
    from blobstate.processor.runner import run_partition
    from blobstate.state.partition import open_partition

    if spec.pandas_object_strings:
        _use_object_strings()
    context = TaskContext.get()
    partition = context.partitionId()
    executor = current_executor()
    started = time.monotonic()
    committed = CheckpointId(spec.version, spec.uids[partition]) if spec.version > 0 else None
    stats: dict[str, Any] = {"input_rows": 0, "output_rows": 0}
    stage_schema = spec.stage_schema
    state = open_partition(
        _blob_store(spec),
        spec.local_dir,
        spec.query_id,
        spec.operator,
        partition,
        committed,
        snapshot_every=spec.snapshot_every,
        snapshot_delta_bytes=spec.snapshot_delta_bytes,
    )
    try:
        load_seconds = time.monotonic() - started
        max_event_time: list[int | None] = [None]
        outputs = run_partition(
            spec.processor,
            state.store,
            _checked_input(batches, partition, stats),
            key_columns=list(spec.key_columns),
            output_schema=spec.output_schema,
            time_mode=spec.time_mode,
            output_mode=spec.output_mode,
            batch_timestamp_ms=spec.batch_timestamp_ms,
            watermark_ms=spec.watermark_ms,
            late_watermark_ms=spec.late_watermark_ms,
            event_time_column=spec.event_time_column,
            max_event_time=max_event_time,
            timezone=spec.timezone,
            api=spec.api,
        )
        for out in outputs:
            stats["output_rows"] += out.num_rows
            yield _with_null_meta(out, stage_schema)
        commit_started = time.monotonic()
        result = state.commit()
        stats["commit_seconds"] = round(time.monotonic() - commit_started, 4)
        stats["process_seconds"] = round(commit_started - started - load_seconds, 4)
    except BaseException as error:
        state.abort()
        if isinstance(error, Exception):
            error.add_note(f"(partition {partition} of operator {spec.operator}, batch {spec.version})")
        raise
    finally:
        state.close()
    meta = {
        "partition": partition,
        "version": result.checkpoint_id.version,
        "uid": result.checkpoint_id.uid,
        "executor_id": executor.executor_id,
        "host": executor.host,
        "attempt": context.attemptNumber(),
        "objects_written": list(result.objects_written),
        "objects": result.objects.to_json(),
        "snapshot_repairs": list(state.load_report.snapshot_repairs),
        "bytes_uploaded": result.bytes_uploaded,
        "changelog_bytes": result.changelog_bytes,
        "snapshot": result.snapshot_name is not None,
        "load_seconds": round(load_seconds, 4),
        "restore_bytes": state.load_report.bytes_downloaded,
        "load_rule": state.load_report.rule,
        "task_seconds": round(time.monotonic() - started, 4),
        "max_event_time_ms": max_event_time[0],
        **stats,
    }
    yield _meta_batch(stage_schema, meta)


def _with_null_meta(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = [batch.column(f.name) for f in schema if f.name != META_COLUMN]
    columns.append(pa.nulls(batch.num_rows, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _meta_batch(schema: pa.Schema, meta: dict[str, Any]) -> pa.RecordBatch:
    columns = [pa.nulls(1, f.type) for f in schema if f.name != META_COLUMN]
    columns.append(pa.array([json.dumps(meta)], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
