"""The driver side of one micro-batch (docs/DESIGN.md, "One micro-batch", steps 1, 2, 4 and 5).

:class:`BatchDriver` is the ``foreachBatch`` function. Each batch reads: check the source against
Spark's checkpoint (``replay.py``), plan it and let each per-batch step prepare it
(``batch/steps.py``), run the stage and hand its outputs to the sink (``stage.py``), build and write
the commit (``commit.py``), let each step act on the commit, report, then start the post-commit work
(cleanup) in the background.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame

from blobstate.batch.contracts import BatchPlan, JsonObject, PartitionSpec, RunSpec, TaskResult
from blobstate.batch.steps import BatchStep, PreparedBatch
from blobstate.blobstore import BlobStore
from blobstate.engine.batch_versions import committed_batch, version_of_batch
from blobstate.engine.commit import CommitContext, build_commit
from blobstate.engine.config import QueryConfig
from blobstate.engine.executor_python import worker_error
from blobstate.engine.replay import SourceProgress, check_batch
from blobstate.engine.spark_checkpoint import SparkCheckpoint
from blobstate.engine.stage import (
    BatchError,
    ProcessorFailedError,
    Sink,
    SinkFailedError,
    Stage,
    StageRun,
)
from blobstate.engine.task import TaskSpec
from blobstate.engine.ticks import Ticks, owes_a_batch
from blobstate.errors import BlobstateError, process_ending
from blobstate.lineage.commitlog import Commit, CommitLog

log = logging.getLogger("blobstate")

PostCommitStep = Callable[[Commit], None]
"""One piece of post-commit work, given the new commit; idempotent (it may run again)."""

__all__ = [
    "BatchDriver",
    "BatchError",
    "BatchReport",
    "PostCommit",
    "ProcessorFailedError",
    "QueryTasks",
    "Sink",
    "SinkFailedError",
    "worker_error",
]

S = TypeVar("S")


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
    stage_tasks: int = 0
    """Tasks of the processing stage: one per partition, or fewer when tasks run groups of partitions
    (``QueryConfig.partitions_per_task``)."""
    write_through: bool = False
    """Whether the stage ran inside the sink's write (a :class:`WriterSink`): one Spark job."""
    shuffle_seconds: float = 0.0
    """Part of ``stage_seconds`` spent before the processing tasks: planning the shuffle and placing its
    partitions (with placement and adaptive execution, Spark runs the shuffle's map stage here)."""
    inlined_partitions: int = 0
    """Partitions whose outputs came to the driver with their metadata (``engine/inline.py``); when all
    did, the sink read a local DataFrame and no persisted row."""
    partitions: dict[int, JsonObject] = field(default_factory=dict)
    """Per-partition metrics, as in the commit (``PARTITION_METRICS``)."""
    spark_recovery_seconds: float = 0.0
    """Time the processing stage spent on retries after a failure (a lost executor, a fetch failure, a
    failed task attempt, outputs lost before the sink): 0 in a batch without one (``recovery.py``)."""
    spark_overhead_seconds: float = 0.0
    """Stage time beyond its slowest processing task: reading and shuffling the input, Spark's
    scheduling and locality waits, and any recovery. Most of an ordinary batch when the tasks are short."""
    standby: JsonObject = field(default_factory=dict)
    """Standby and failover metrics of the batch, as in the commit (``metrics.standby``)."""

    def progress_metrics(self) -> JsonObject:
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
            "stageTasks": self.stage_tasks,
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


@dataclass(frozen=True)
class QueryTasks:
    """What every batch's tasks share: where the state lives, the processor and its output, the keys."""

    partition: PartitionSpec
    processor: object
    output_schema: pa.Schema
    key_columns: tuple[str, ...]
    initial_state_key_columns: tuple[str, ...] | None = None
    """Set when the query started with an ``initial_state``: its key columns (first batch only)."""
    instant_keys: tuple[int, ...] = ()
    """The positions in ``key_columns`` of TIMESTAMP columns (``RunSpec.instant_keys``)."""


class PostCommit:
    """The work after each commit, in order (default: cleanup), on one background thread with
    ``async_cleanup``; a failing step is logged and the next one still runs (every step is idempotent
    and runs again after the next commit, cleanup also at start-up)."""

    def __init__(self, commit_log: CommitLog, in_background: bool, needed_from: int = 0) -> None:
        self.commit_log = commit_log
        self.in_background = in_background
        self.needed_from = needed_from
        """The oldest version whose commit a cleanup of this run (or the start-up's) found still needed:
        the next commit's ``horizon`` (0: none ran yet)."""
        self.steps: list[tuple[str, PostCommitStep]] = [("cleanup", self._cleanup)]
        self._pending: queue.SimpleQueue[tuple[Commit, threading.Event] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._done: threading.Event | None = None

    def _cleanup(self, commit: Commit) -> None:
        """Make what the retained versions need permanent, delete the rest."""
        from blobstate.state.retention import after_commit

        stats = after_commit(self.commit_log.store, commit, commit_log=self.commit_log)
        self.needed_from = max(self.needed_from, stats.needed_from)

    def start(self, commit: Commit) -> None:
        """Run the steps for ``commit``: now, or on the post-commit thread with ``in_background``."""
        if not self.in_background:
            self._run(commit)
            return
        done = threading.Event()
        self._done = done
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._serve, name="blobstate-post-commit", daemon=True)
            self._worker.start()
        self._pending.put((commit, done))

    def _serve(self) -> None:
        # One thread for the query's life, not one per batch. Once glibc has made its most malloc arenas
        # (8 per core, within the first batches in a Spark driver), each new thread is given the next
        # arena in turn, and a large block a cleanup allocates now and then (such as a rebuild of
        # Python's interned-string table, 1.9 MB) stays resident in that arena for reuse: with a thread
        # per batch those blocks were left in one arena after another (+1.6 MB per 1,000 batches). A
        # daemon thread rather than a ThreadPoolExecutor, whose worker would hold up the process's exit.
        while True:
            item = self._pending.get()
            if item is None:
                return
            commit, done = item
            try:
                self._run(commit)
            finally:
                done.set()

    def _run(self, commit: Commit) -> None:
        for name, step in self.steps:
            try:
                step(commit)
            except Exception as error:
                if process_ending(error):
                    log.info(
                        "post-commit %s of version %d stopped: the process is ending; the next run "
                        "finishes it",
                        name,
                        commit.version,
                    )
                    return
                log.exception(
                    "post-commit %s of version %d failed; it is retried later", name, commit.version
                )

    def wait(self) -> None:
        """Wait for the steps of the last commit."""
        if self._done is not None:
            self._done.wait()
            self._done = None

    def close(self) -> None:
        """Wait for the steps of the last commit and end the post-commit thread (``start`` makes a new
        one if it is called again)."""
        self.wait()
        if self._worker is not None:
            self._pending.put(None)
            self._worker.join()
            self._worker = None


RECENT_REPORTS = 1000
"""How many batch reports a driver keeps (``blobstate.batch_reports``): the most recent ones."""


@dataclass
class BatchDriver:
    """Runs each micro-batch handed over by ``foreachBatch`` and writes the commit log."""

    config: QueryConfig
    tasks: QueryTasks
    stage: Stage
    post_commit: PostCommit
    writer_id: str
    steps: Sequence[BatchStep] = ()
    """The per-batch features, in order (``batch/steps.py``)."""
    spark_checkpoint: SparkCheckpoint | None = None
    """Spark's own checkpoint (offsets, commits): read to tell replays from a reset."""
    ticks: Ticks | None = None
    """The query's ticks source: batches without input, and metrics in Spark's progress."""
    on_batch: Callable[[BatchReport], None] | None = None
    initial_watermark_ms: int = 0
    """The event-time watermark a new checkpoint's first batch starts from (``transform_with_state``'s
    ``initial_watermark_ms``, a moved query's old watermark; Spark's start is 0)."""
    reports: deque[BatchReport] = field(default_factory=lambda: deque(maxlen=RECENT_REPORTS))
    """The most recent batches' reports (``RECENT_REPORTS`` of them: a query that runs for years keeps a
    bounded number, as Spark keeps ``spark.sql.streaming.numRecentProgressUpdates`` progresses)."""
    latest: Commit | None = None
    """The newest commit (None: nothing committed yet): it maps Spark's batch ids to versions
    (``batch_versions.py``); read from the commit log before the first batch, replaced by each commit."""
    _latest_read: bool = field(default=False, repr=False)
    failure: BlobstateError | None = None
    """Why the last batch failed, when blobstate knows (the processor or the sink raised, or a blobstate
    check refused to go on), else None: the query's handle raises it first."""

    @property
    def commit_log(self) -> CommitLog:
        """The query's commit log."""
        return self.post_commit.commit_log

    @property
    def store(self) -> BlobStore:
        """The checkpoint's blob store."""
        return self.commit_log.store

    def step(self, kind: type[S]) -> S | None:
        """The step of type ``kind``, if the query has one."""
        return next((s for s in self.steps if isinstance(s, kind)), None)

    def stop(self) -> None:
        """Wait for the post-commit work of the last batch (Spark has stopped the query: no batch starts
        any more), stop what the steps run in the background and forget the ticks channel."""
        self.post_commit.close()
        for step in self.steps:
            step.stop()
        if self.ticks is not None:
            self.ticks.release()

    # ------------------------------------------------------------------ one batch
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function; a blobstate failure is kept for the query's handle to raise."""
        self.failure = self.stage.failure = None
        try:
            self._run_batch(batch_df, batch_id)
        except BaseException as error:
            self.failure = self.stage.failure
            if self.failure is None and isinstance(error, BlobstateError):
                self.failure = error
            if isinstance(error, ProcessorFailedError):  # Spark logs it: the message, not our frames
                raise error.with_traceback(None) from None
            raise

    def _run_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        if not self._latest_read:
            self.latest = self.commit_log.latest_commit()
            self._latest_read = True
        source = self.spark_checkpoint.source(batch_id) if self.spark_checkpoint is not None else None
        replayed = committed_batch(self.latest, batch_id, self._commit_or_none)
        if replayed is not None:
            version, committed = replayed
            if committed is None:
                raise BatchError(
                    f"batch {batch_id} was committed as version {version}, whose commit was pruned from"
                    f" {self.store.url}: Spark's checkpoint is behind the blobstate checkpoint"
                )
            if source is not None:
                self._check_source(batch_id, committed, None, source)
            self._report(BatchReport(batch_id, version, 0, 0, 0.0, 0.0, 0, 0, 0, skipped=True))
            self.request_tick(committed)
            return
        version = version_of_batch(self.latest, batch_id)
        if self.commit_log.commit_exists(version):  # its commit was written, then the batch failed
            committed = self.latest = self.commit_log.read_commit(version)
            if source is not None:
                self._check_source(batch_id, committed, None, source)
            self._report(BatchReport(batch_id, version, 0, 0, 0.0, 0.0, 0, 0, 0, skipped=True))
            self.request_tick(committed)
            return
        started = time.monotonic()
        self.post_commit.wait()
        previous = self._previous(batch_id, version)
        if source is not None:
            self._check_source(batch_id, None, previous, source)
        batch = PreparedBatch(
            batch_id,
            previous,
            batch_df,
            self._plan(batch_df, batch_id, previous, source),
            self.spark_checkpoint,
        )
        for step in self.steps:
            step.prepare(batch)
        spec = TaskSpec(self.tasks.partition, batch.plan, self.tasks.processor, tuple(batch.task_steps))
        stage_started = time.monotonic()
        run = self.stage.run(batch.frame, spec, batch.placement)
        try:
            commit_started = time.monotonic()
            commit = self._commit(batch, run, started, stage_started, commit_started, source)
        finally:
            run.result.release()
        self.latest = commit
        for step in self.steps:
            step.after_commit(commit, run.results)
        finished = time.monotonic()
        self._report(self._batch_report(commit, run, started, stage_started, commit_started, finished))
        self.request_tick(commit)
        self.post_commit.start(commit)

    def _commit_or_none(self, version: int) -> Commit | None:
        """The commit of ``version`` (None: it does not exist, or was pruned)."""
        if not self.commit_log.commit_exists(version):
            return None
        return self.commit_log.read_commit(version)

    def _previous(self, batch_id: int, version: int) -> Commit | None:
        """The commit the batch starts from (version ``version - 1``); refuses a batch whose starting
        commit does not exist."""
        if version == 1:
            return None
        if self.latest is not None and self.latest.version == version - 1:
            return self.latest
        if not self.commit_log.commit_exists(version - 1):
            raise BatchError(
                f"batch {batch_id} starts from version {version - 1}, but commits/{version - 1}.json does not"
                f" exist in {self.store.url}: the blobstate checkpoint does not match Spark's checkpoint"
            )
        return self.commit_log.read_commit(version - 1)

    def _plan(
        self, batch_df: DataFrame, batch_id: int, previous: Commit | None, source: SourceProgress | None
    ) -> BatchPlan:
        """The batch's plan before the steps prepare it."""
        config = self.config
        uids = previous.checkpoints[config.operator] if previous else {}
        watermark, late_watermark = self._watermarks(previous)
        # Spark's own batch timestamp when its offset log has one: the same when the batch is replayed.
        timestamp = source.batch_timestamp_ms if source and source.batch_timestamp_ms else None
        first_batch = previous is None and self.stage.initial_state is not None
        run = RunSpec(
            key_columns=self.tasks.key_columns,
            output_schema=self.tasks.output_schema,
            time_mode=config.time_mode,
            output_mode=config.output_mode,
            api=config.api,
            timezone=batch_df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC",
            event_time_column=config.event_time_column,
            batch_timestamp_ms=timestamp if timestamp is not None else int(time.time() * 1000),
            watermark_ms=watermark,
            late_watermark_ms=late_watermark,
            initial_state_key_columns=self.tasks.initial_state_key_columns if first_batch else None,
            instant_keys=self.tasks.instant_keys,
        )
        writes_through = self.stage.writes_through
        return BatchPlan(
            version=previous.version if previous is not None else 0,
            batch_id=batch_id,
            uids={int(p): u for p, u in uids.items()},
            run=run,
            # a writer sink gets every output row from the tasks themselves: none held in metadata rows
            inline_output_bytes=0
            if writes_through
            else config.inline_output_bytes // self.tasks.partition.num_partitions,
            # a writer sink must see a failing task fail: its job then commits nothing
            report_failures=not writes_through,
            pandas_object_strings=config.pandas_object_strings,
        )

    def _watermarks(self, previous: Commit | None) -> tuple[int | None, int | None]:
        """The event-time watermarks of this batch: for timers and eviction, and for late rows.

        As in Spark, the watermark starts at 0 (a moved query: at :attr:`initial_watermark_ms`, for both),
        and late rows are dropped by the previous batch's eviction watermark (one step behind the one that
        fires timers). It never goes back: each commit's is at least the one before (``commit.py``).
        """
        if self.config.time_mode != "EventTime":
            return None, None
        if previous is None:
            return self.initial_watermark_ms, self.initial_watermark_ms
        eviction = previous.watermark_ms if previous.watermark_ms is not None else 0
        late = (previous.metrics or {}).get("eviction_watermark_ms")
        return eviction, late if late is not None else 0

    def _commit(
        self,
        batch: PreparedBatch,
        run: StageRun,
        started: float,
        stage_started: float,
        commit_started: float,
        source: SourceProgress | None,
    ) -> Commit:
        """Build the batch's commit (``commit.py``) from the steps' parts and write it."""
        results = run.results
        max_task = max((r.task_seconds for r in results.values()), default=0.0)
        recovery = self.stage.recovery_seconds(run.result)
        parts = [step.contribute(batch, results) for step in self.steps]
        context = CommitContext(
            operator=self.config.operator,
            writer=self.writer_id,
            min_versions_to_retain=self.config.min_versions_to_retain,
            time_mode=self.config.time_mode,
            watermark_delay_ms=self.config.watermark_delay_ms,
            needed_from=self.post_commit.needed_from,
            seconds=time.monotonic() - started,
            source=None if source is None else source.to_json(),
            metrics={
                "spark_recovery_seconds": recovery,
                "spark_overhead_seconds": round(max(0.0, run.sink_started - stage_started - max_task), 3),
                "stage_seconds": round(run.sink_started - stage_started, 3),
                "sink_seconds": round(commit_started - run.sink_started, 3),
                "stage_attempts": run.attempts,
                "inlined_partitions": run.result.inlined,
                "write_through": self.stage.writes_through,
            },
            parts=parts,
        )
        commit = build_commit(batch.plan, results, batch.previous, context)
        self.commit_log.write_commit(commit)
        return commit

    def _batch_report(
        self,
        commit: Commit,
        run: StageRun,
        started: float,
        stage_started: float,
        commit_started: float,
        finished: float,
    ) -> BatchReport:
        results = run.results
        metrics = commit.metrics or {}
        return BatchReport(
            batch_id=commit.batch_id,
            version=commit.version,
            input_rows=sum(r.input_rows for r in results.values()),
            output_rows=run.result.output_rows,
            seconds=round(finished - started, 3),
            stage_seconds=round(run.sink_started - stage_started, 3),
            sink_seconds=round(commit_started - run.sink_started, 3),
            commit_seconds=round(finished - commit_started, 3),
            max_task_seconds=max((r.task_seconds for r in results.values()), default=0.0),
            max_load_seconds=max((r.load_seconds for r in results.values()), default=0.0),
            restore_bytes=sum(r.restore_bytes or 0 for r in results.values()),
            bytes_uploaded=sum(r.bytes_uploaded for r in results.values()),
            snapshots=sum(1 for r in results.values() if r.snapshot),
            executors={p: r.executor_id for p, r in results.items()},
            state_keys=sum(r.state_keys or 0 for r in results.values()),
            stage_attempts=run.attempts,
            stage_tasks=run.result.tasks,
            write_through=self.stage.writes_through,
            shuffle_seconds=round(run.result.shuffle_seconds, 3),
            inlined_partitions=run.result.inlined,
            partitions=_partition_metrics(results),
            spark_recovery_seconds=metrics["spark_recovery_seconds"],
            spark_overhead_seconds=metrics["spark_overhead_seconds"],
            standby=metrics.get("standby") or {},
        )

    def _check_source(
        self, batch_id: int, committed: Commit | None, latest: Commit | None, source: SourceProgress
    ) -> None:
        assert self.spark_checkpoint is not None
        check_batch(
            batch_id,
            committed,
            latest,
            source,
            checkpoint=self.store.url,  # without the URL's query: it may hold S3 secret options
            spark_checkpoint=self.spark_checkpoint.location,
        )

    def _report(self, report: BatchReport) -> None:
        self.reports.append(report)
        log.info("%s", report.log_line())
        if self.ticks is not None:
            self.ticks.publish(report.progress_metrics())
        if self.on_batch is not None:
            self.on_batch(report)

    def request_tick(self, commit: Commit) -> None:
        """Ask Spark for the next batch without new input when Spark's own operator would (or a step
        needs one)."""
        if self.ticks is None:
            return
        if any(step.wants_another_batch() for step in self.steps) or owes_a_batch(
            self.config.time_mode, commit
        ):
            self.ticks.request(commit.batch_id + 1)


def _partition_metrics(results: Mapping[int, TaskResult]) -> dict[int, JsonObject]:
    """Each partition's ``PARTITION_METRICS`` (with side streams also ``adjuncts``)."""
    return {p: r.metrics() for p, r in sorted(results.items())}
