"""The executor side of one micro-batch: load a partition, run the processor, commit, report.

Each task of the processing stage handles one state partition, or a group of them one after another
(``groups.py``). For each partition it emits, in this order: one header row that carries the uid of
this attempt (``UID_COLUMN``), the processor's output rows, and exactly one metadata row
(``META_COLUMN``: the uid again, the executor, what it wrote, metrics). The stage's result stays
distributed; the driver collects only the metadata rows, and the sink reads the outputs of a partition
only after its header names the attempt the driver commits (``outputs.py``), so outputs and metadata
always come from the same execution.

When the processor raises, the task does not fail: it aborts the partition's state and ends with a
metadata row that carries the exception instead (``failed``), and the driver raises it without using
any output of the stage. Spark then has no failed task to log (pages of worker and JVM traceback per
task) and does not retry it: a processor's exception is deterministic, its retries would fail alike.
Anything else failing in a task (loading or committing the state, the blob store) fails the task as
before, and Spark retries it. With ``report_failures`` off (a write-through sink, which must see the
task fail so that its job commits nothing) the processor's exception is raised with a traceback that
starts at the processor's own frames.
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import pyarrow as pa

from blobstate.batch.contracts import BatchPlan, JsonValue, PartitionSpec, TaskResult
from blobstate.batch.steps import TaskBatch, TaskStep
from blobstate.engine.inline import OUTPUTS_COLUMN, InlineOutputs
from blobstate.state.store import RocksStateStore

if TYPE_CHECKING:
    from pyspark import TaskContext

META_COLUMN = "__blobstate_meta"
UID_COLUMN = "__blobstate_uid"
PARTITION_COLUMN = "__blobstate_partition"
INITIAL_COLUMN = "__blobstate_initial"
"""True on rows of the initial state (first batch only); their columns carry ``INITIAL_PREFIX``."""
INITIAL_PREFIX = "__blobstate_init_"
MARKER_COLUMNS = (UID_COLUMN, META_COLUMN, OUTPUTS_COLUMN)
"""The stage's columns that are not outputs."""
PROCESSING_LOCK_TIMEOUT_SECONDS = 300.0
"""How long a processing task waits for its partition's lock: a standby sync holding it stops at its
next version once asked; a far-behind sync restoring a snapshot may take longer."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task of the processing stage needs, built once per batch by the driver and shipped
    inside the stage's closure: where the state lives (:class:`PartitionSpec`), what the driver decided
    for the batch (:class:`BatchPlan`), the processor and the batch's task steps."""

    partition: PartitionSpec
    plan: BatchPlan
    processor: object
    """The user's StatefulProcessor (or a factory of one)."""
    steps: tuple[TaskStep, ...] = ()
    """What the batch's steps run in each task before processing, in order (``batch.steps.TaskStep``)."""
    groups: tuple[tuple[int, ...], ...] = ()
    """The state partitions each task runs in turn, by the task's partition index (``groups.py``); empty:
    task ``i`` runs state partition ``i`` alone."""

    @property
    def stage_schema(self) -> pa.Schema:
        """The processing stage's Arrow schema: the output columns (all nullable), the uid, the metadata
        and the inlined outputs."""
        output_schema = self.plan.run.output_schema
        assert isinstance(output_schema, pa.Schema)
        fields = [f.with_nullable(True) for f in output_schema]
        markers = [
            pa.field(UID_COLUMN, pa.string()),
            pa.field(META_COLUMN, pa.string()),
            pa.field(OUTPUTS_COLUMN, pa.binary()),
        ]
        return pa.schema([*fields, *markers])


def _use_object_strings() -> None:
    """Make pandas build string columns as object dtype in this worker process (see QueryConfig)."""
    import warnings

    import pandas as pd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if pd.get_option("future.infer_string"):
            pd.set_option("future.infer_string", False)


def _dropped_partition_column(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's rows (``groups.split_input`` checked them) without the partition column."""
    for batch in batches:
        yield batch.drop_columns([PARTITION_COLUMN])


def _counted(batches: Iterator[pa.RecordBatch], stats: _TaskStats) -> Iterator[pa.RecordBatch]:
    """``batches``, their rows counted into ``stats.input_rows``."""
    for batch in batches:
        stats.input_rows += batch.num_rows
        yield batch


def _split_initial_state(
    batches: Iterable[pa.RecordBatch],
) -> tuple[list[pa.RecordBatch], pa.Table | None]:
    """The input rows and the initial state's rows (its own column names) of a first batch."""
    import pyarrow.compute as pc

    collected = list(batches)
    if not collected:
        return [], None
    table = pa.Table.from_batches(collected)
    if table.num_rows == 0:
        return [], None
    initial = table.column(INITIAL_COLUMN).fill_null(False)
    init_names = [n for n in table.column_names if n.startswith(INITIAL_PREFIX)]
    data_names = [n for n in table.column_names if n not in init_names and n != INITIAL_COLUMN]
    data = table.filter(pc.invert(initial)).select(data_names)
    init = table.filter(initial).select(init_names)
    init = init.rename_columns([n[len(INITIAL_PREFIX) :] for n in init_names])
    return data.to_batches(), init


def run_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of the processing stage: each state partition of the task's group in turn
    (``groups.split_input``), or the task's own partition. A partition whose processor raised (reported
    in its metadata row) ends the task: the driver fails the batch on it."""
    from pyspark import TaskContext

    from blobstate.engine.groups import split_input

    if spec.plan.pandas_object_strings:
        _use_object_strings()
    context = TaskContext.get()
    assert context is not None, "run_task runs in a Spark task"
    task = context.partitionId()
    group = spec.groups[task] if spec.groups else (task,)
    for partition, rows in split_input(batches, group, PARTITION_COLUMN):
        ran = _PartitionRun()
        yield from _run_partition(spec, partition, _dropped_partition_column(rows), context, ran)
        if ran.failed:
            return


@dataclass
class _PartitionRun:
    """How one partition's run in a task ended."""

    failed: bool = False


def _run_partition(
    spec: TaskSpec,
    partition: int,
    batches: Iterator[pa.RecordBatch],
    context: TaskContext,
    ran: _PartitionRun,
) -> Iterator[pa.RecordBatch]:
    """Load one state partition, run the processor on its rows, commit; emit its header, outputs and
    metadata rows."""
    from blobstate.batch.executor import blob_store_for, current_executor, resolve_local_dir
    from blobstate.ids import CheckpointId, new_uid
    from blobstate.layout import LocalPartitionLayout
    from blobstate.processor.runner import RunInputs, RunStats, run_partition
    from blobstate.state.partition import open_partition
    from blobstate.state.sweep import sweep_idle

    where, plan = spec.partition, spec.plan
    executor = current_executor()
    started = time.monotonic()
    started_at = time.time()
    committed = CheckpointId(plan.version, plan.uids[partition]) if plan.version > 0 else None
    stats = _TaskStats()
    stage_schema = spec.stage_schema
    uid = new_uid()
    yield _marker_batch(stage_schema, UID_COLUMN, uid)
    local_dir = resolve_local_dir(where.local_dir)
    layout = LocalPartitionLayout(Path(local_dir), where.query_id, where.operator, partition)
    # Invariant 2: open_partition asks a standby sync of this partition on this host to stop, and waits
    # for it, before it opens the state.
    state = open_partition(
        blob_store_for(where.checkpoint_url),
        local_dir,
        where.query_id,
        where.operator,
        partition,
        committed,
        snapshot_every=where.snapshot_every,
        snapshot_delta_bytes=where.snapshot_delta_bytes,
        snapshot_upload=where.snapshot_upload,
        lock_timeout=PROCESSING_LOCK_TIMEOUT_SECONDS,
    )
    opened_at = time.time()
    sweep_idle(local_dir, where.local_dir_grace_seconds, keep=(layout.root,))
    step_scope = contextlib.ExitStack()
    failed = False
    failure: dict[str, str] = {}
    where_noted = f"(partition {partition} of operator {where.operator}, batch {plan.batch})"
    run_stats = RunStats()
    try:
        load_seconds = time.monotonic() - started
        data: Iterator[pa.RecordBatch] | list[pa.RecordBatch] = _counted(batches, stats)
        initial_state = None
        if plan.run.initial_state_key_columns is not None:
            data, initial_state = _split_initial_state(data)
        views: dict[str, object] = {}
        if spec.steps:  # a step's rows go to the state before any row of the processor's
            prepared = TaskBatch(where, plan, state.store, step_scope, data)
            for step in spec.steps:
                step.before_processing(prepared)
            data, views, stats.steps = prepared.batches, prepared.views, prepared.result
            stats.input_rows -= prepared.taken_rows
        try:
            outputs = run_partition(
                spec.processor, state.store, data, plan.run, RunInputs(initial_state, views), run_stats
            )
            inline = InlineOutputs(
                plan.inline_output_bytes, pa.schema([f for f in stage_schema if f.name not in MARKER_COLUMNS])
            )
            for out in outputs:
                stats.output_rows += out.num_rows
                for batch in inline.add(out):
                    yield _with_null_meta(batch, stage_schema)
        except Exception as error:
            if isinstance(error, MemoryError):
                raise
            error.add_note(where_noted)
            if not plan.report_failures:
                raise error.with_traceback(processor_frames(error.__traceback__))  # noqa: B904
            state.abort()
            failure = failure_record(error)
            failed = True
        if not failed:
            commit_started = time.monotonic()
            stats.state_keys, stats.adjunct_keys = _estimated_keys(state.store)
            result = state.commit(uid)
            stats.commit_seconds = round(time.monotonic() - commit_started, 4)
            stats.process_seconds = round(commit_started - started - load_seconds, 4)
    except BaseException as error:
        state.abort()
        if isinstance(error, Exception) and not _noted(error):
            error.add_note(where_noted)
        raise
    finally:
        step_scope.close()
        state.close()
    if failed:
        ran.failed = True
        failed_meta = {**failure, "partition": partition, "uid": uid, "attempt": context.attemptNumber()}
        yield _marker_batch(
            stage_schema, META_COLUMN, json.dumps({"partition": partition, "failed": failed_meta})
        )
        return
    report = state.load_report
    task_result = TaskResult(
        partition=partition,
        version=result.checkpoint_id.version,
        uid=result.checkpoint_id.uid,
        executor_id=executor.executor_id,
        host=executor.host,
        attempt=context.attemptNumber(),
        stage_id=context.stageId(),
        objects_written=tuple(result.objects_written),
        objects=result.objects.to_json(),
        snapshot_repairs=tuple(report.snapshot_repairs),
        bytes_uploaded=result.bytes_uploaded,
        changelog_bytes=result.changelog_bytes,
        snapshot=result.snapshot_name is not None,
        snapshot_upload=result.snapshot_upload,
        load_seconds=round(load_seconds, 4),
        started_at=started_at,
        opened_at=opened_at,
        restore_bytes=report.bytes_downloaded,
        snapshot_restore_bytes=report.bytes_downloaded - report.delta_bytes,
        load_rule=report.rule,
        task_seconds=round(time.monotonic() - started, 4),
        max_event_time_ms=run_stats.max_event_time_ms,
        input_rows=stats.input_rows,
        output_rows=stats.output_rows,
        state_keys=stats.state_keys,
        commit_seconds=stats.commit_seconds,
        process_seconds=stats.process_seconds,
        adjunct_keys=stats.adjunct_keys,
    )
    if stats.steps:
        task_result = replace(task_result, **stats.steps)  # type: ignore[arg-type]
    yield _marker_batch(stage_schema, META_COLUMN, json.dumps(task_result.to_json()), inline.payload())


@dataclass
class _TaskStats:
    """What a task counts beside the processor's run (its :class:`TaskResult` entries)."""

    input_rows: int = 0
    output_rows: int = 0
    state_keys: int = 0
    adjunct_keys: int = 0
    commit_seconds: float = 0.0
    process_seconds: float = 0.0
    steps: dict[str, JsonValue] = field(default_factory=dict)
    """The :class:`TaskResult` entries the task steps set."""


def _estimated_keys(store: RocksStateStore) -> tuple[int, int]:
    """RocksDB's estimates of the partition's keys: the query's own state and its side stores', counted
    apart (``encoding.layout.own_and_side_keys``)."""
    from blobstate.encoding.layout import own_and_side_keys

    return own_and_side_keys(store.estimated_keys_by_family())


def failure_record(error: BaseException) -> dict[str, str]:
    """What a ``failed`` metadata row carries: the exception as one line (``module.Type: message`` and
    its notes, as a Python traceback ends) and the traceback of the processor's own frames."""
    lines = [line.strip() for part in traceback.format_exception_only(error) for line in part.splitlines()]
    return {
        "error": " ".join(line for line in lines if line),
        "traceback": "".join(traceback.format_tb(processor_frames(error.__traceback__))),
    }


def processor_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from its first frame outside blobstate's package (the processor's code, or what it called);
    None when every frame is blobstate's (an output that does not fit: the message says it all)."""
    package = str(Path(__file__).resolve().parent.parent)
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(package):
        tb = tb.tb_next
    return tb


def _noted(error: BaseException) -> bool:
    return any(note.startswith("(partition ") for note in getattr(error, "__notes__", ()))


def _with_null_meta(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = [
        pa.nulls(batch.num_rows, f.type) if f.name in MARKER_COLUMNS else batch.column(f.name) for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _marker_batch(schema: pa.Schema, column: str, text: str, outputs: bytes | None = None) -> pa.RecordBatch:
    """One row that is null everywhere but in ``column`` (the header's uid or the metadata) and, on the
    metadata row, ``OUTPUTS_COLUMN`` (the inlined outputs, if any)."""
    values = {column: pa.array([text], pa.string()), OUTPUTS_COLUMN: pa.array([outputs], pa.binary())}
    columns = [values.get(f.name, pa.nulls(1, f.type)) for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
