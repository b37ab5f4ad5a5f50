"""The driver side of one micro-batch (docs/DESIGN.md, "One micro-batch", steps 1, 2, 4 and 5)."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blobstate.adjunct.union import numbered
from blobstate.blobstore import BlobStore
from blobstate.engine.config import QueryConfig
from blobstate.engine.executor_python import explain_missing_module
from blobstate.engine.outputs import (
    AttemptMismatchError,
    StageFailedError,
    StageResult,
    is_attempt_mismatch,
    run_stage,
)
from blobstate.engine.placement import wait_for_hosts
from blobstate.engine.recovery import spark_recovery_seconds, stage_resubmitted_at
from blobstate.engine.replay import SourceProgress, check_batch
from blobstate.engine.sinks import WriterSink
from blobstate.engine.task import INITIAL_COLUMN, INITIAL_PREFIX, PARTITION_COLUMN, TaskSpec, run_task
from blobstate.engine.ticks import Ticks, wants_another_batch
from blobstate.engine.write_through import write_through
from blobstate.errors import BlobstateError, QueryError, first_line
from blobstate.standby.assignment import (
    PartitionAssignment,
    Plan,
    committed_assignment,
    parse_placement,
    placement_json,
    plan_assignment,
    replica_versions_of,
    standby_lag,
)
from blobstate.standby.syncer import StandbySyncer
from blobstate.state.retention import declared_horizon, retained_from

log = logging.getLogger("blobstate")

Sink = Callable[[DataFrame, int], None]

PostCommitStep = Callable[[Any], None]
"""One piece of post-commit work, given the new commit; idempotent (it may run again)."""

PARTITION_METRICS = (
    "input_rows",
    "output_rows",
    "bytes_uploaded",
    "load_seconds",
    "load_rule",
    "restore_bytes",
    "process_seconds",
    "commit_seconds",
    "task_seconds",
    "snapshot_repairs",
    "snapshot_upload",
    "state_keys",
    "snapshot_restore_bytes",
    "executor_id",
    "host",
    "started_at",
    "opened_at",
)
"""Per-partition entries of a commit's ``metrics.partitions``: from the task's metadata row (``task.py``)."""


class BatchError(QueryError, RuntimeError):
    """A micro-batch could not be completed; nothing of it was committed."""


class ProcessorFailedError(BatchError):
    """The processor (or blobstate in a task) raised in the processing stage; nothing was committed.

    The message is the task's own exception and its notes (which name the handler and the grouping
    key), not the Python worker's traceback wrapped in Spark's; ``processor_traceback`` the processor's
    own frames, when the task reported them.
    """

    def __init__(self, message: str, processor_traceback: str = "") -> None:
        super().__init__(message)
        self.processor_traceback = processor_traceback


class SinkFailedError(BatchError):
    """The user's sink raised; the batch was not committed and is handed to the sink again on restart."""


def worker_error(text: str) -> str:
    """The exception lines of a Python worker's traceback text (the last exception and its notes)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    tail: list[str] = []
    for line in reversed(lines):
        if line.startswith((" ", "\t")) or line.startswith("Traceback"):
            break
        tail.append(line)
    return explain_missing_module(" ".join(reversed(tail)) or (lines[-1] if lines else text))


@dataclass
class BatchReport:
    """What one committed micro-batch did, as printed by the demo and recorded in the commit."""

    batch_id: int
    version: int
    input_rows: int
    output_rows: int
    seconds: float
    max_load_seconds: float
    restore_bytes: int
    bytes_uploaded: int
    snapshots: int
    stage_seconds: float = 0.0
    sink_seconds: float = 0.0
    commit_seconds: float = 0.0
    max_task_seconds: float = 0.0
    skipped: bool = False
    executors: dict[int, str] = field(default_factory=dict)
    state_keys: int = 0
    """RocksDB's estimate of the state's keys after the batch, over all partitions."""
    stage_attempts: int = 1
    """How many times the stage ran (more than once when persisted outputs were lost before the sink)."""
    write_through: bool = False
    """Whether the stage ran inside the sink's write (a :class:`WriterSink`): one Spark job."""
    shuffle_seconds: float = 0.0
    """Part of ``stage_seconds`` spent before the processing tasks: planning the shuffle and placing its
    partitions (with placement and adaptive execution, Spark runs the shuffle's map stage here)."""
    inlined_partitions: int = 0
    """Partitions whose outputs came to the driver with their metadata (``engine/inline.py``); when all
    did, the sink read a local DataFrame and no persisted row."""
    partitions: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per-partition metrics, as in the commit (``PARTITION_METRICS``)."""
    spark_recovery_seconds: float = 0.0
    """Time the processing stage spent on retries after a failure (a lost executor, a fetch failure, a
    failed task attempt, outputs lost before the sink): 0 in a batch without one (``recovery.py``)."""
    spark_overhead_seconds: float = 0.0
    """Stage time beyond its slowest processing task: reading and shuffling the input, Spark's
    scheduling and locality waits, and any recovery. Most of an ordinary batch when the tasks are short."""
    standby: dict[str, Any] = field(default_factory=dict)
    """Standby and failover metrics of the batch, as in the commit (``metrics.standby``)."""

    def progress_metrics(self) -> dict[str, Any]:
        """The metrics put in Spark's query progress (the ``blobstate`` source's ``metrics``)."""
        rules: dict[str, int] = {}
        for metrics in self.partitions.values():
            rule = str(metrics.get("load_rule"))
            rules[rule] = rules.get(rule, 0) + 1
        return {
            "batchId": self.batch_id,
            "version": self.version,
            "skipped": self.skipped,
            "inputRows": self.input_rows,
            "outputRows": self.output_rows,
            "stateKeys": self.state_keys,
            "bytesUploaded": self.bytes_uploaded,
            "snapshots": self.snapshots,
            "restoreBytes": self.restore_bytes,
            "maxRestoreSeconds": self.max_load_seconds,
            "loadRules": rules,
            "seconds": self.seconds,
            "stageSeconds": self.stage_seconds,
            "sinkSeconds": self.sink_seconds,
            "commitSeconds": self.commit_seconds,
            "stageAttempts": self.stage_attempts,
            "writeThrough": self.write_through,
            "inlinedPartitions": self.inlined_partitions,
            "sparkRecoverySeconds": self.spark_recovery_seconds,
            "sparkOverheadSeconds": self.spark_overhead_seconds,
            "standby": self.standby,
            "partitions": {str(p): m for p, m in sorted(self.partitions.items())},
        }

    def log_line(self) -> str:
        """One line about the batch for the ``blobstate`` logger."""
        if self.skipped:
            return f"batch {self.batch_id}: already committed as version {self.version}, replay skipped"
        return (
            f"batch {self.batch_id} committed as version {self.version}: {self.input_rows:,} rows in,"
            f" {self.output_rows:,} out, ~{self.state_keys:,} state keys, {self.seconds:.2f} s (stage"
            f" {self.stage_seconds:.2f}, sink {self.sink_seconds:.2f}, commit {self.commit_seconds:.2f}),"
            f" uploaded {self.bytes_uploaded:,} bytes, {self.snapshots} snapshot(s), restored"
            f" {self.restore_bytes:,} bytes in at most {self.max_load_seconds:.2f} s"
        )


@dataclass
class BatchDriver:
    """Runs each micro-batch handed over by ``foreachBatch`` and writes the commit log."""

    spark: SparkSession
    config: QueryConfig
    store: BlobStore
    checkpoint_url: str
    query_id: str
    num_partitions: int
    key_columns: tuple[str, ...]
    processor: Any
    output_schema: pa.Schema
    sink: Sink
    writer_id: str
    placement_helper: Any = None
    """The JVM helper (``placement.PlacementHelper``): preferred locations, committed outputs, ticks."""
    ticks: Ticks | None = None
    """The query's ticks source: batches without input, and metrics in Spark's progress."""
    initial_state: DataFrame | None = None
    """Spark's ``initialState``: delivered to ``handleInitialState`` in the query's first batch."""
    initial_state_key_columns: tuple[str, ...] = ()
    use_preferred_locations: bool = True
    max_stage_attempts: int = 3
    """How often a batch's stage runs when its persisted outputs are lost before the sink read them."""
    spark_checkpoint: str = ""
    """Spark's own checkpoint location (offsets, commits): read to tell replays from a reset."""
    on_batch: Callable[[BatchReport], None] | None = None
    reports: list[BatchReport] = field(default_factory=list)
    failure: BlobstateError | None = None
    """Why the last batch failed, when blobstate knows (the processor or the sink raised, or a blobstate
    check refused to go on), else None: the query's handle raises it first."""
    post_commit_steps: list[tuple[str, PostCommitStep]] = field(default_factory=list)
    """What runs after each commit, in order (default: cleanup; standby sync comes next)."""
    _post_commit_thread: threading.Thread | None = None
    _spark_metadata: bytes | None = None
    syncer: StandbySyncer | None = None
    """Keeps standby (and warm-up) replicas at the latest commit; None without the JVM helper."""
    assignment: dict[int, PartitionAssignment] = field(default_factory=dict)
    """Where each partition ran in the last committed batch and where its replicas are kept."""
    adjuncts: list[Any] = field(default_factory=list)
    """The query's adjunct stores (:class:`blobstate.adjunct.spec.AdjunctSpec`), in declaration order."""
    adjunct_sources: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each adjunct's sources in Spark's offset log: (index of the first, how many)."""
    start_decisions: dict[str, Any] = field(default_factory=dict)
    """What each adjunct store does at this start (``adjunct.decision``): applied by the run's first batch."""
    reload_sources: dict[str, Any] = field(default_factory=dict)
    """The file source of each adjunct whose history the first batch reads again."""
    reload_files: dict[str, list[str]] = field(default_factory=dict)
    """The files of that history the source still has, in the order it read them (listed at start)."""
    main_types: dict[str, Any] = field(default_factory=dict)
    """The main stream's column types (reloaded side rows are keyed like it)."""
    waiting: set[str] = field(default_factory=set)
    """Bootstrap adjuncts still loading a rate-limited side stream's backlog: main rows are held."""
    needed_from: int = 0
    """The oldest version whose commit a cleanup of this run (or the start-up's) found still needed:
    the next commit's ``horizon`` (0: none ran yet)."""
    _start_applied: bool = False
    _offsets: bytes | None = None

    def __post_init__(self) -> None:
        from blobstate.lineage.commitlog import CommitLog

        if not self.post_commit_steps:
            self.post_commit_steps = [("cleanup", self._cleanup)]
        self.commit_log = CommitLog(self.store)
        if self.syncer is None and self.placement_helper is not None:
            self.syncer = StandbySyncer(
                self.spark,
                self.placement_helper,
                checkpoint_url=self.checkpoint_url,
                query_id=self.query_id,
                operator=self.config.operator,
                local_dir=self.config.local_dir,
                budget_seconds=self.config.standby_sync_seconds,
            )

    # ------------------------------------------------------------------ one batch
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function; a blobstate failure is kept for the query's handle to raise."""
        self.failure = None
        try:
            self._run_batch(batch_df, batch_id)
        except BlobstateError as error:
            if self.failure is None:
                self.failure = error
            if isinstance(error, ProcessorFailedError):  # Spark logs it: the message, not our frames
                raise error.with_traceback(None) from None
            raise

    def _run_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        version = batch_id + 1
        source = self._source(batch_id)
        if self.commit_log.commit_exists(version):
            committed = self.commit_log.read_commit(version)
            if source is not None:
                self._check_source(batch_id, committed, None, source)
            self._report(BatchReport(batch_id, version, 0, 0, 0.0, 0.0, 0, 0, 0, skipped=True))
            self._request_tick(committed)
            return
        started = time.monotonic()
        self._wait_for_post_commit()
        if batch_id > 0 and not self.commit_log.commit_exists(batch_id):
            raise BatchError(
                f"batch {batch_id} starts from version {batch_id}, but commits/{batch_id}.json does not exist"
                f" in {self.store.url}: the blobstate checkpoint does not match Spark's checkpoint"
            )
        previous = self.commit_log.read_commit(batch_id) if batch_id > 0 else None
        if source is not None:
            self._check_source(batch_id, None, previous, source)
        decisions = {} if self._start_applied else self.start_decisions
        reload = self._reload_frames(decisions)
        if self.adjuncts:
            batch_df = numbered(batch_df)
        defer_main = self._still_waiting(previous)
        files = self._batch_side_files(previous) if self.adjuncts else {}
        broadcast = self._write_broadcast(batch_df, previous, decisions, reload, files)
        spec = self._plan(batch_df, batch_id, previous, source, broadcast)
        if self.adjuncts:
            recreate = tuple(n for n, d in decisions.items() if d.recreate and n not in broadcast)
            files = {n: f for n, f in files.items() if n not in broadcast}
            spec = dataclasses.replace(
                spec, adjunct_recreate=recreate, defer_main=defer_main, side_files=files
            )
            batch_df = self._with_reloaded(batch_df, reload, broadcast)
        plan = self._assign(previous)
        stage_started = time.monotonic()
        stage, sink_started, attempts = self._stage_and_sink(batch_df, spec, plan)
        try:
            commit_started = time.monotonic()
            metas = stage.metas
            standby = self._standby_metrics(plan, metas)
            max_task = max((m["task_seconds"] for m in metas.values()), default=0.0)
            overhead = round(max(0.0, sink_started - stage_started - max_task), 3)
            recovery = self._recovery_seconds(stage)
            # Where partitions really ran (Spark may have moved a task to a replica during the batch).
            ran = committed_assignment(plan.assignment, metas) if plan is not None else None
            commit = self._commit(
                version,
                metas,
                spec.watermark_ms,
                started,
                previous,
                source,
                standby,
                recovery,
                overhead,
                ran,
                broadcast,
                decisions,
                {
                    "stage_seconds": round(sink_started - stage_started, 3),
                    "sink_seconds": round(commit_started - sink_started, 3),
                    "stage_attempts": attempts,
                    "inlined_partitions": stage.inlined,
                    "write_through": self._writes_through(),
                },
            )
        finally:
            stage.release()
        self._start_applied = True
        self._after_commit(commit, ran)
        finished = time.monotonic()
        report = BatchReport(
            batch_id=batch_id,
            version=version,
            input_rows=sum(m["input_rows"] for m in metas.values()),
            output_rows=stage.output_rows,
            seconds=round(finished - started, 3),
            stage_seconds=round(sink_started - stage_started, 3),
            sink_seconds=round(commit_started - sink_started, 3),
            commit_seconds=round(finished - commit_started, 3),
            max_task_seconds=max((m["task_seconds"] for m in metas.values()), default=0.0),
            max_load_seconds=max((m["load_seconds"] for m in metas.values()), default=0.0),
            restore_bytes=sum(m.get("restore_bytes") or 0 for m in metas.values()),
            bytes_uploaded=sum(m["bytes_uploaded"] for m in metas.values()),
            snapshots=sum(1 for m in metas.values() if m["snapshot"]),
            executors={p: m["executor_id"] for p, m in metas.items()},
            state_keys=sum(int(m.get("state_keys") or 0) for m in metas.values()),
            stage_attempts=attempts,
            write_through=self._writes_through(),
            shuffle_seconds=round(stage.shuffle_seconds, 3),
            inlined_partitions=stage.inlined,
            partitions=_partition_metrics(metas),
            spark_recovery_seconds=recovery,
            spark_overhead_seconds=overhead,
            standby=standby,
        )
        self._report(report)
        self._request_tick(commit)
        self._start_post_commit(commit)

    def _plan(
        self,
        batch_df: DataFrame,
        batch_id: int,
        previous: Any,
        source: SourceProgress | None,
        broadcast: dict[str, Any] | None = None,
    ) -> TaskSpec:
        """The batch's plan, shipped to every task of its stage."""
        uids = previous.checkpoints[self.config.operator] if previous else {}
        watermark, late_watermark = self._watermarks(previous)
        # Spark's own batch timestamp when its offset log has one: the same when the batch is replayed.
        timestamp = source.batch_timestamp_ms if source and source.batch_timestamp_ms else None
        first_batch = previous is None and self.initial_state is not None
        return TaskSpec(
            checkpoint_url=self.checkpoint_url,
            query_id=self.query_id,
            operator=self.config.operator,
            num_partitions=self.num_partitions,
            version=batch_id,
            uids={int(p): u for p, u in uids.items()},
            key_columns=self.key_columns,
            processor=self.processor,
            output_schema=self.output_schema,
            output_mode=self.config.output_mode,
            time_mode=self.config.time_mode,
            batch_timestamp_ms=timestamp if timestamp is not None else int(time.time() * 1000),
            watermark_ms=watermark,
            late_watermark_ms=late_watermark,
            event_time_column=self.config.event_time_column,
            local_dir=self.config.local_dir,
            local_dir_grace_seconds=self.config.local_dir_grace_seconds,
            snapshot_every=self.config.snapshot_every,
            snapshot_delta_bytes=self.config.snapshot_delta_bytes,
            snapshot_upload=self.config.snapshot_upload,
            timezone=batch_df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC",
            pandas_object_strings=self.config.pandas_object_strings,
            api=self.config.api,
            initial_state_key_columns=self.initial_state_key_columns if first_batch else None,
            adjuncts=tuple(self.adjuncts),
            broadcast={name: w.pending for name, w in (broadcast or {}).items()},
            # a writer sink must see a failing task fail: its job then commits nothing
            report_failures=not self._writes_through(),
            # a writer sink gets every output row from the tasks themselves: none held in metadata rows
            inline_output_bytes=0
            if self._writes_through()
            else self.config.inline_output_bytes // self.num_partitions,
        )

    def _write_broadcast(
        self,
        batch_df: DataFrame,
        previous: Any,
        decisions: dict[str, Any],
        reload: dict[str, DataFrame],
        files: dict[str, tuple[str, ...]],
    ) -> dict[str, Any]:
        """Write this batch's version of every broadcast adjunct store (the driver is its one writer):
        emptied first when the start decided to re-create it, its reloaded history, then the batch's
        own side rows (``files``: their files in the source's order)."""
        import pyarrow as pa

        from blobstate.adjunct.broadcast import write_version
        from blobstate.adjunct.records import in_order
        from blobstate.adjunct.spec import BROADCAST, TAG_COLUMN
        from blobstate.engine.config import resolve_local_dir
        from blobstate.ids import CheckpointId, new_uid

        written: dict[str, Any] = {}
        for adjunct in self.adjuncts:
            if adjunct.mode != BROADCAST:
                continue
            rows = batch_df.filter(F.col(TAG_COLUMN) == adjunct.name).toArrow()
            if adjunct.name in reload:
                history = reload[adjunct.name].toArrow()
                rows = pa.concat_tables(
                    [history, rows.select(history.column_names)], promote_options="permissive"
                )
            rows = in_order(rows, files.get(adjunct.name))
            committed = None
            if previous is not None:
                committed = CheckpointId(previous.version, previous.checkpoints[adjunct.operator][0])
            written[adjunct.name] = write_version(
                self.store,
                resolve_local_dir(self.config.local_dir),
                self.query_id,
                adjunct,
                committed,
                rows,
                uid=new_uid(),
                snapshot_every=self.config.snapshot_every,
                snapshot_delta_bytes=self.config.snapshot_delta_bytes,
                recreate=adjunct.name in decisions and decisions[adjunct.name].recreate,
            )
        return written

    def _reload_frames(self, decisions: dict[str, Any]) -> dict[str, DataFrame]:
        """The side stream history each re-created bootstrap store reads again: the files listed at start
        (up to the offset of the last commit, those the source still has), in the layout of the query's
        input (applied before the batch's side rows)."""
        from blobstate.adjunct.history import history_frame
        from blobstate.adjunct.union import side_rows

        frames: dict[str, DataFrame] = {}
        for name, decision in decisions.items():
            files = self.reload_files.get(name) if decision.reload else None
            if not files:
                continue
            history = history_frame(self.spark, self.reload_sources[name], files)
            order = (F.lit(0), F.col("__rank"), F.col("__row"))
            frames[name] = side_rows(self._adjunct(name), history, self.key_columns, self.main_types, order)
        return frames

    def side_files(self, name: str, commit: Any) -> list[str]:
        """The files adjunct ``name``'s file source read up to ``commit``'s recorded offset, in order (from
        the source's log in Spark's checkpoint; empty when nothing is recorded)."""
        from blobstate.adjunct.history import files_up_to

        recorded = ((commit.adjunct_offsets or {}).get(name) if commit is not None else None) or []
        if not recorded or not isinstance(recorded[0], dict) or "logOffset" not in recorded[0]:
            return []
        first, _ = self.adjunct_sources[name]
        log_dir = f"sources/{first}"
        logs = {n: self._read_spark_file(f"{log_dir}/{n}") for n in self._list_spark_dir(log_dir)}
        return files_up_to(logs, int(recorded[0]["logOffset"]))

    def _batch_side_files(self, previous: Any) -> dict[str, tuple[str, ...]]:
        """Each file-source side stream's files in this batch in its source's order, when it read more
        than one (``adjunct.order.batch_files``)."""
        from blobstate.adjunct.order import batch_files

        if self._offsets is None:
            return {}
        before = (previous.adjunct_offsets or {}) if previous is not None else {}
        return batch_files(
            self.adjunct_sources,
            self._adjunct_offsets(),
            before,
            self._list_spark_dir,
            self._read_spark_file,
        )

    def spark_path_exists(self, uri: str) -> bool:
        """Whether a file Spark's checkpoint names still exists (through Hadoop's FileSystem)."""
        fs, path = self._hadoop_path(uri)
        return bool(fs.exists(path))

    def _with_reloaded(
        self, batch_df: DataFrame, reload: dict[str, DataFrame], broadcast: dict[str, Any]
    ) -> DataFrame:
        """The batch's input with the reloaded history of partitioned stores (tagged like side rows)."""
        for name, frame in reload.items():
            if name not in broadcast:
                batch_df = batch_df.unionByName(frame, allowMissingColumns=True)
        return batch_df

    def _still_waiting(self, previous: Any) -> bool:
        """Whether this batch holds its main rows back: a bootstrap adjunct of a new store is still
        loading a rate-limited side stream's backlog. It is loaded once a batch finds no new side
        rows (its side offsets are those of the batch before)."""
        if not self.waiting:
            return False
        if self._offsets is None:
            log.warning("cannot read Spark's offset log: held main rows are processed now")
            self.waiting.clear()
            return False
        current = self._adjunct_offsets()
        before = (previous.adjunct_offsets or {}) if previous is not None else {}
        for name in sorted(self.waiting):
            if previous is not None and name in before and before[name] == current.get(name):
                self.waiting.discard(name)
                log.info(
                    "adjunct %s: the side stream's backlog is loaded; held main rows are processed", name
                )
        return bool(self.waiting)

    def _list_spark_dir(self, relative: str) -> list[str]:
        """The names in a directory of Spark's checkpoint (through Hadoop's FileSystem)."""
        fs, path = self._hadoop_path(f"{self.spark_checkpoint.rstrip('/')}/{relative}")
        if not fs.exists(path):
            return []
        return sorted(
            str(s.getPath().getName())
            for s in fs.listStatus(path)
            if not s.getPath().getName().startswith(".")
        )

    def _stage_and_sink(
        self, batch_df: DataFrame, spec: TaskSpec, plan: Plan | None
    ) -> tuple[StageResult, float, int]:
        """Run the stage and hand its outputs to the sink; run both again if the outputs were lost."""
        if self._writes_through():
            return self._write_through(batch_df, spec, plan), time.monotonic(), 1
        first_submitted: float | None = None
        for attempt in range(1, self.max_stage_attempts + 1):
            if attempt > 1:
                plan = self._assign_again(plan)
            stage = self._run_stage(batch_df, spec, plan)
            first_submitted = stage.submitted_at if first_submitted is None else first_submitted
            stage.earlier_runs_seconds = stage.submitted_at - first_submitted
            sink_started = time.monotonic()
            try:
                self._hand_to_sink(stage.frame, spec.version)
                return stage, sink_started, attempt
            except BaseException as error:
                stage.release()
                if not is_attempt_mismatch(error):
                    raise
                self.failure = None
                log.warning(
                    "batch %d: outputs of the processing stage were lost before the sink read them (%s);"
                    " running the stage again (attempt %d of %d)",
                    spec.version,
                    first_line(error),
                    attempt + 1,
                    self.max_stage_attempts,
                )
        self.failure = BatchError(
            f"batch {spec.version}: the outputs of the processing stage were lost before the sink read them"
            f" in each of {self.max_stage_attempts} attempts (executors lost or cache evicted); nothing was"
            " committed"
        )
        raise AttemptMismatchError(str(self.failure))

    def _assign_again(self, plan: Plan | None) -> Plan | None:
        """Before a rerun of the stage: the same plan, without executors lost meanwhile."""
        if plan is None or self.placement_helper is None:
            return plan
        alive = set(self.placement_helper.executors())
        if all(a.active in alive for a in plan.assignment.values()):
            return plan
        versions = self._replica_versions()
        return plan_assignment(
            self.num_partitions,
            self.config.standby_replicas,
            plan.assignment,
            sorted(alive),
            versions,
            0,
            max_warmups=0,
        )

    # ------------------------------------------------------------------ steps
    def _source(self, batch_id: int) -> SourceProgress | None:
        """What Spark's checkpoint says about this batch (None: no Spark checkpoint to read)."""
        if not self.spark_checkpoint:
            return None
        try:
            self.spark.sparkContext._jvm  # noqa: B018
        except Exception:  # Spark Connect: Python cannot reach the JVM's filesystem
            log.warning("cannot read Spark's checkpoint here: replays are taken on trust, as before")
            return None
        if self._spark_metadata is None:  # written once when Spark's checkpoint is created
            self._spark_metadata = self._read_spark_file("metadata")
        self._offsets = self._read_spark_file(f"offsets/{batch_id}")
        return SourceProgress.read(self._spark_metadata, self._offsets)

    def _hadoop_path(self, uri: str) -> tuple[Any, Any]:
        """``(FileSystem, Path)`` of ``uri`` through Hadoop (any filesystem Spark can use)."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration()), path

    def _read_spark_file(self, relative: str) -> bytes:
        """A file of Spark's checkpoint, through Hadoop's FileSystem (any filesystem Spark can use)."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        try:
            fs, path = self._hadoop_path(f"{self.spark_checkpoint.rstrip('/')}/{relative}")
            stream = fs.open(path)
            try:
                return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
            finally:
                stream.close()
        except Exception as error:
            raise BatchError(
                f"cannot read {relative} of Spark's checkpoint {self.spark_checkpoint}: {error}"
            ) from error

    def _check_source(self, batch_id: int, committed: Any, latest: Any, source: SourceProgress) -> None:
        check_batch(
            batch_id,
            committed,
            latest,
            source,
            checkpoint=self.store.url,  # without the URL's query: it may hold S3 secret options
            spark_checkpoint=self.spark_checkpoint,
        )

    def _watermarks(self, previous: Any) -> tuple[int | None, int | None]:
        """The event-time watermarks of this batch: for timers and eviction, and for late rows.

        As in Spark, the watermark starts at 0, and late rows are dropped by the previous batch's
        eviction watermark (one step behind the one that fires timers).
        """
        if self.config.time_mode != "EventTime":
            return None, None
        if previous is None:
            return 0, 0
        eviction = previous.watermark_ms if previous.watermark_ms is not None else 0
        late = (previous.metrics or {}).get("eviction_watermark_ms")
        return eviction, late if late is not None else 0

    def _assign(self, previous: Any) -> Plan | None:
        """This batch's assignment: actives, standbys and warm-ups over the executors alive now."""
        if self.placement_helper is None:
            return None
        before = self.assignment or parse_placement((previous.placement or {}) if previous else {})
        if not self.assignment and before:  # a restarted driver: wait for the recorded actives' hosts
            hosts = {a.active.host for a in before.values()}
            alive = wait_for_hosts(
                hosts, self.placement_helper.executors, self.config.restart_executor_wait_seconds
            )
            missing = sorted(hosts - {e.host for e in alive})
            if missing:
                log.warning(
                    "no executor on host(s) %s after %.0f s (restart_executor_wait_seconds): their"
                    " partitions move",
                    ", ".join(missing),
                    self.config.restart_executor_wait_seconds,
                )
        else:
            alive = self.placement_helper.executors()
        if not self.assignment and previous is not None and self.syncer is not None:
            # A restarted driver: the replica versions the last commit recorded.
            self.syncer.seed_versions(replica_versions_of(previous.placement or {}))
        versions = self._replica_versions()
        plan = plan_assignment(
            self.num_partitions,
            self.config.standby_replicas,
            before,
            alive,
            versions,
            previous.version if previous else 0,
            max_warmups=self.config.max_warmup_replicas,
            acceptable_lag=self.config.acceptable_recovery_lag,
        )
        if plan.short_of_standbys and self.config.standby_replicas > 0:
            log.warning(
                "standby_replicas=%d but only %d executor(s) on %d host(s) are alive: %d partition(s) have"
                " fewer standbys",
                self.config.standby_replicas,
                len(alive),
                len({e.host for e in alive}),
                len(plan.short_of_standbys),
            )
        for move in plan.moves:
            log.info(
                "partition %d moves from executor %s (%s) to %s (%s): %s",
                move.partition,
                move.source.executor_id,
                move.source.host,
                move.target.executor_id,
                move.target.host,
                move.reason,
            )
        return plan

    def _replica_versions(self) -> dict[tuple[int, str], int]:
        """The last reported version of each replica, by (partition, host)."""
        return self.syncer.replica_versions() if self.syncer is not None else {}

    def _locations(self, plan: Plan | None) -> list[str | None]:
        """Each partition's candidates for the processing task: its active, then its replicas freshest
        first (the JVM helper picks the first one alive when the stage is submitted)."""
        from blobstate.engine.placement import location_string

        if plan is None or not plan.assignment:
            return [None] * self.num_partitions
        versions = self._replica_versions()
        out: list[str | None] = []
        for p in range(self.num_partitions):
            a = plan.assignment.get(p)
            if a is None:
                out.append(None)
                continue
            replicas = sorted(a.replicas(), key=lambda r: -versions.get((p, r.host), -1))
            out.append(",".join(location_string(e) for e in (a.active, *replicas)))
        return out

    def _standby_metrics(self, plan: Plan | None, metas: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Failures, failovers, replica lag and the sync rounds finished since the last commit."""
        if plan is None:
            return {}
        failovers, cold = plan.failovers, plan.failovers_without_standby
        moved_in_stage = []
        for p, m in sorted(metas.items()):
            a = plan.assignment.get(p)
            if a is None or (m["executor_id"], m["host"]) == (a.active.executor_id, a.active.host):
                continue
            # Spark ran the task elsewhere: the planned executor was lost during the batch.
            to_replica = any((m["executor_id"], m["host"]) == (r.executor_id, r.host) for r in a.replicas())
            moved_in_stage.append(
                {
                    "partition": p,
                    "from": a.active.executor_id,
                    "to": m["executor_id"],
                    "from_host": a.active.host,
                    "to_host": m["host"],
                    "standby": to_replica,
                }
            )
            if to_replica:
                failovers += 1
            else:
                cold += 1
        versions = self._replica_versions()
        rounds = self.syncer.take_rounds() if self.syncer is not None else []
        committing = max((m["version"] for m in metas.values()), default=0)
        lag = standby_lag(plan.assignment, versions, committing)
        return {
            "replicas": self.config.standby_replicas,
            "active_failures": plan.active_failures + len(moved_in_stage),
            "standby_failures": plan.standby_failures,
            "failovers": failovers,
            "failovers_without_standby": cold,
            "moves": [
                {
                    "partition": m.partition,
                    "from": m.source.executor_id,
                    "to": m.target.executor_id,
                    "reason": m.reason,
                    "from_host": m.source.host,
                    "to_host": m.target.host,
                }
                for m in plan.moves
            ]
            + [
                {**{k: v for k, v in m.items() if k != "standby"}, "reason": "during-batch"}
                for m in moved_in_stage
            ],
            "short_of_standbys": {str(p): n for p, n in plan.short_of_standbys.items()},
            "lag_versions": lag,
            "sync": [r.totals() for r in rounds],
        }

    def _after_commit(self, commit: Any, ran: dict[int, PartitionAssignment] | None) -> None:
        """Remember where partitions ran, and start bringing their replicas to this commit."""
        if ran is None:
            return
        self.assignment = ran
        if self.syncer is not None:
            self.syncer.start(commit.version, commit.checkpoints[self.config.operator], self.assignment)

    def _writes_through(self) -> bool:
        """Whether the stage and the sink run as one job: a :class:`WriterSink` (and the JVM helper)."""
        return (
            self.config.write_through
            and isinstance(self.sink, WriterSink)
            and self.placement_helper is not None
        )

    def _write_through(self, batch_df: DataFrame, spec: TaskSpec, plan: Plan | None) -> StageResult:
        """The stage inside the sink's write (``write_through.py``): no persisted outputs, one job."""
        stage, _ = self._stage_frame(batch_df, spec, plan)
        what = f"batch {spec.version}"
        submitted_at = time.time()
        try:
            result = write_through(
                stage,
                self.placement_helper,
                lambda frame: self._hand_to_sink(frame, spec.version - 1),
                what,
                worker_error,
            )
        except StageFailedError as error:
            self.failure = ProcessorFailedError(str(error))
            raise self.failure from None
        self._check_metas(result.metas, spec.version)
        result.submitted_at = submitted_at
        return result

    def _run_stage(self, batch_df: DataFrame, spec: TaskSpec, plan: Plan | None) -> StageResult:
        started = time.monotonic()
        stage, schema = self._stage_frame(batch_df, spec, plan)
        shuffle_seconds = time.monotonic() - started
        what = f"batch {spec.version}"
        submitted_at = time.time()
        try:
            result = run_stage(stage, self.placement_helper, self.num_partitions, what, worker_error, schema)
        except StageFailedError as error:
            # Spark wraps the task's exception in pages of worker and JVM traceback: keep what the
            # processor raised (its notes name the handler and the key) at the top.
            self.failure = ProcessorFailedError(str(error), error.processor_traceback)
            raise self.failure from None
        self._check_metas(result.metas, spec.version)
        result.shuffle_seconds = shuffle_seconds
        result.submitted_at = submitted_at
        return result

    def _recovery_seconds(self, stage: StageResult) -> float:
        """The committed run's ``spark_recovery_seconds`` (``recovery.py``)."""
        stage_ids = {m.get("stage_id") for m in stage.metas.values()}
        stage_id = stage_ids.pop() if len(stage_ids) == 1 else None
        return spark_recovery_seconds(
            stage.metas,
            submitted_at=stage.submitted_at,
            resubmitted_at=stage_resubmitted_at(self.spark, stage_id),
            earlier_runs_seconds=stage.earlier_runs_seconds,
        )

    def _stage_frame(self, batch_df: DataFrame, spec: TaskSpec, plan: Plan | None) -> tuple[DataFrame, Any]:
        """The processing stage (the batch shuffled by key into the state partitions, then ``run_task``)
        and its Spark schema."""
        keys = [F.col(k) for k in self.key_columns]
        frame = batch_df
        if spec.initial_state_key_columns is not None and self.initial_state is not None:
            frame = self._with_initial_state(batch_df)
        if spec.broadcast:  # the driver applied the broadcast side rows: they are not shuffled
            from blobstate.adjunct.spec import TAG_COLUMN

            partitioned = [a.name for a in self.adjuncts if a.name not in spec.broadcast]
            tag = F.col(TAG_COLUMN)
            frame = frame.filter(tag.isNull() | tag.isin(partitioned) if partitioned else tag.isNull())
        shuffled = frame.withColumn(
            PARTITION_COLUMN, F.pmod(F.hash(*keys), F.lit(self.num_partitions))
        ).repartition(self.num_partitions, *keys)
        helper = self.placement_helper
        if helper is not None and plan is not None and plan.assignment and self.use_preferred_locations:
            shuffled = helper.with_preferred_locations(shuffled, self._locations(plan))
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(spec.stage_schema)
        return shuffled.mapInArrow(lambda it: run_task(spec, it), schema), schema

    def _with_initial_state(self, batch_df: DataFrame) -> DataFrame:
        """The first batch's input with the initial state's rows, keyed like the input, marked."""
        assert self.initial_state is not None
        input_types = {f.name: f.dataType for f in batch_df.schema.fields}
        init = self.initial_state
        columns = [
            F.col(init_key).cast(input_types[key]).alias(key)
            for key, init_key in zip(self.key_columns, self.initial_state_key_columns, strict=True)
        ]
        columns += [F.col(f"`{name}`").alias(INITIAL_PREFIX + name) for name in init.columns]
        marked_init = init.select(*columns, F.lit(True).alias(INITIAL_COLUMN))
        marked_input = batch_df.withColumn(INITIAL_COLUMN, F.lit(False))
        return marked_input.unionByName(marked_init, allowMissingColumns=True)

    def _check_metas(self, metas: dict[int, dict[str, Any]], batch_id: int) -> None:
        missing = sorted(set(range(self.num_partitions)) - set(metas))
        if missing:
            raise BatchError(f"batch {batch_id}: no commit metadata from partition(s) {missing}")
        stale = sorted(p for p, m in metas.items() if m["version"] != batch_id + 1)
        if stale:
            raise BatchError(f"batch {batch_id}: partition(s) {stale} committed another version")

    def _hand_to_sink(self, frame: DataFrame, batch_id: int) -> None:
        try:
            self.sink(frame, batch_id)
        except Exception as error:
            if is_attempt_mismatch(error):
                raise
            self.failure = SinkFailedError(
                f"batch {batch_id}: the sink raised {type(error).__name__}: {first_line(error)} (the batch"
                " was not committed; a restart hands it to the sink again)"
            )
            raise

    def _commit(
        self,
        version: int,
        metas: dict[int, dict[str, Any]],
        watermark: int | None,
        started: float,
        previous: Any,
        source: SourceProgress | None,
        standby: dict[str, Any] | None = None,
        spark_recovery_seconds: float = 0.0,
        spark_overhead_seconds: float = 0.0,
        ran: dict[int, PartitionAssignment] | None = None,
        broadcast: dict[str, Any] | None = None,
        decisions: dict[str, Any] | None = None,
        timings: dict[str, Any] | None = None,
    ) -> Any:
        from blobstate.lineage.commitlog import Commit
        from blobstate.lineage.refs import PartitionObjects

        new_watermark = watermark
        if self.config.time_mode == "EventTime":
            seen = [m["max_event_time_ms"] for m in metas.values() if m.get("max_event_time_ms") is not None]
            if seen:
                candidate = max(seen) - self.config.watermark_delay_ms
                new_watermark = candidate if watermark is None else max(watermark, candidate)
        checkpoints = {self.config.operator: {p: m["uid"] for p, m in sorted(metas.items())}}
        objects = {
            self.config.operator: {
                p: PartitionObjects.from_json(m["objects"]) for p, m in sorted(metas.items())
            }
        }
        for name, written in (broadcast or {}).items():
            operator = self._adjunct(name).operator
            checkpoints[operator] = {0: written.pending.uid}
            objects[operator] = {0: written.objects}
        retained = retained_from(previous, version, self.config.min_versions_to_retain)
        commit = Commit(
            version=version,
            batch_id=version - 1,
            checkpoints=checkpoints,
            objects=objects,
            retained_from=retained,
            horizon=declared_horizon(previous, self.needed_from, retained),
            placement=self._placement_record(metas, ran),
            watermark_ms=new_watermark,
            metrics={
                "eviction_watermark_ms": watermark,
                "seconds": round(time.monotonic() - started, 3),
                "partitions": _partition_metrics(metas),
                "objects": {p: m["objects_written"] for p, m in metas.items()},
                "spark_recovery_seconds": spark_recovery_seconds,
                "spark_overhead_seconds": spark_overhead_seconds,
                **(timings or {}),
                "standby": standby or {},
                **(
                    {"adjuncts": self._adjunct_metrics(metas, previous, broadcast, decisions or {})}
                    if self.adjuncts
                    else {}
                ),
            },
            adjunct_offsets=self._adjunct_offsets() if self.adjuncts else None,
            source=None if source is None else source.to_json(),
            writer=self.writer_id,
        )
        self.commit_log.write_commit(commit)
        return commit

    def _adjunct(self, name: str) -> Any:
        return next(a for a in self.adjuncts if a.name == name)

    def _adjunct_metrics(
        self,
        metas: dict[int, dict[str, Any]],
        previous: Any,
        broadcast: dict[str, Any] | None,
        decisions: dict[str, Any],
    ) -> dict[str, Any]:
        """What each adjunct store took in this batch, and when it last changed (for its validity)."""
        from blobstate.adjunct.records import ApplyStats

        before = ((previous.metrics or {}).get("adjuncts") or {}) if previous is not None else {}
        now_ms = int(time.time() * 1000)
        out: dict[str, Any] = {}
        for adjunct in self.adjuncts:
            totals = ApplyStats()
            if adjunct.name in (broadcast or {}):
                totals.add(broadcast[adjunct.name].stats)  # type: ignore[index]
            else:
                for m in metas.values():
                    applied = (m.get("adjuncts") or {}).get(adjunct.name)
                    if applied:
                        totals.add(ApplyStats(**applied))
            last = before.get(adjunct.name) or {}
            decision = decisions.get(adjunct.name)
            recreated = decision is not None and decision.recreate
            out[adjunct.name] = {
                "mode": adjunct.mode,
                **totals.to_json(),
                "total_rows": (0 if recreated else int(last.get("total_rows", 0))) + totals.rows,
                "created_ms": now_ms if recreated else last.get("created_ms", now_ms),
                "updated_ms": now_ms if totals.rows or recreated else last.get("updated_ms", now_ms),
                "waiting_for_backlog": adjunct.name in self.waiting,
                **({"start": decision.to_json()} if decision is not None else {}),
            }
        held = [m.get("adjuncts") or {} for m in metas.values()]
        out["$held_rows"] = {
            "deferred": sum(int(h.get("$deferred", 0)) for h in held),
            "released": sum(int(h.get("$released", 0)) for h in held),
        }
        return out

    def _adjunct_offsets(self) -> dict[str, Any]:
        """Each side stream's offsets for this batch, from Spark's offset log entry (None: unknown)."""
        if self._offsets is None:
            return {}
        lines = self._offsets.decode("utf-8", errors="replace").splitlines()[2:]
        out: dict[str, Any] = {}
        for name, (first, count) in self.adjunct_sources.items():
            parsed = []
            for line in lines[first : first + count]:
                try:
                    parsed.append(json.loads(line))
                except ValueError:
                    parsed.append(line)
            out[name] = parsed
        return out

    def _placement_record(
        self, metas: dict[int, dict[str, Any]], ran: dict[int, PartitionAssignment] | None
    ) -> dict[int, Any]:
        """Each partition's executor and its replicas with their versions, so a restart resumes them."""
        if ran is None:
            return {p: {"executor_id": m["executor_id"], "host": m["host"]} for p, m in sorted(metas.items())}
        return placement_json(ran, self._replica_versions())

    # ------------------------------------------------------------------ post-commit
    def _cleanup(self, commit: Any) -> None:
        """Post-commit cleanup: make what the retained versions need permanent, delete the rest."""
        from blobstate.state.retention import after_commit

        stats = after_commit(self.store, commit, commit_log=self.commit_log)
        self.needed_from = max(self.needed_from, stats.needed_from)

    def _start_post_commit(self, commit: Any) -> None:
        """Run the post-commit steps in order (on a background thread with ``async_cleanup``).

        A failing step is logged and the next one still runs; every step is idempotent and is run
        again after the next commit (cleanup also at start-up).
        """

        def run() -> None:
            for name, step in self.post_commit_steps:
                try:
                    step(commit)
                except Exception:
                    log.exception(
                        "post-commit %s of version %d failed; it is retried later", name, commit.version
                    )

        if self.config.async_cleanup:
            self._post_commit_thread = threading.Thread(target=run, name="blobstate-post-commit", daemon=True)
            self._post_commit_thread.start()
        else:
            run()

    def _wait_for_post_commit(self) -> None:
        if self._post_commit_thread is not None:
            self._post_commit_thread.join()
            self._post_commit_thread = None

    def _report(self, report: BatchReport) -> None:
        self.reports.append(report)
        log.info("%s", report.log_line())
        if self.ticks is not None:
            self.ticks.publish(report.progress_metrics())
        if self.on_batch is not None:
            self.on_batch(report)

    def _request_tick(self, commit: Any) -> None:
        """Ask Spark for the next batch without new input when Spark's own operator would."""
        if self.ticks is None:
            return
        eviction = (commit.metrics or {}).get("eviction_watermark_ms")
        # While main rows are held for a bootstrap, the next batch must come even without new input.
        if self.waiting or wants_another_batch(self.config.time_mode, eviction, commit.watermark_ms):
            self.ticks.request(commit.batch_id + 1)


def _partition_metrics(metas: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each partition's ``PARTITION_METRICS`` from its metadata row, for the commit and the progress
    (with side streams also ``adjuncts``: what it applied, and the broadcast versions it read)."""
    out = {}
    for p, m in sorted(metas.items()):
        out[p] = {k: m[k] for k in PARTITION_METRICS}
        if "adjuncts" in m:
            out[p]["adjuncts"] = m["adjuncts"]
    return out
