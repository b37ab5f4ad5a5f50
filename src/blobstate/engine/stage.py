"""The processing stage of one micro-batch and the hand-over of its outputs to the user's sink.

:class:`Stage` builds the stage (the batch shuffled by key into the state partitions, then
``task.run_task`` on each), runs it, and hands its outputs to the sink: inside the sink's write for a
:class:`~blobstate.engine.sinks.WriterSink` (``write_through.py``, one Spark job), else persisted on
the executors (``outputs.py``) and run again when they were lost before the sink read them. What went
wrong, when blobstate knows, is kept in :attr:`Stage.failure` for the query's handle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from blobstate.batch.contracts import TaskResult
from blobstate.batch.jvm import JvmSeam, by_state_partition
from blobstate.batch.steps import Placement
from blobstate.engine.executor_python import worker_error
from blobstate.engine.groups import partitions_per_task, plan_groups
from blobstate.engine.outputs import (
    AttemptMismatchError,
    StageFailedError,
    StageResult,
    is_attempt_mismatch,
    run_stage,
)
from blobstate.engine.recovery import spark_recovery_seconds
from blobstate.engine.sinks import WriterSink
from blobstate.engine.task import INITIAL_COLUMN, INITIAL_PREFIX, PARTITION_COLUMN, TaskSpec, run_task
from blobstate.engine.write_through import write_through
from blobstate.errors import BlobstateError, QueryError, first_line

log = logging.getLogger("blobstate")

Sink = Callable[[DataFrame, int], object]


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


@dataclass
class StageRun:
    """The stage's committed run and the sink's hand-over: what the commit and the report need."""

    result: StageResult
    sink_started: float
    """Monotonic time the sink got the outputs (for a write-through sink: when the job ended)."""
    attempts: int

    @property
    def results(self) -> dict[int, TaskResult]:
        """Each partition's task result."""
        return self.result.results


@dataclass
class Stage:
    """Runs a batch's processing stage and hands its outputs to the sink."""

    spark: SparkSession
    sink: Sink
    key_columns: tuple[str, ...]
    num_partitions: int
    jvm: JvmSeam | None = None
    """The JVM seam: preferred locations, committed outputs, write-through, Spark's stage attempts."""
    initial_state: DataFrame | None = None
    """Spark's ``initialState``: unioned with the first batch's input (``INITIAL_COLUMN``)."""
    initial_state_key_columns: tuple[str, ...] = ()
    preferred_locations: bool = True
    """Give each partition's task the executors its placement names (``QueryConfig.placement``)."""
    partitions_per_task: int = 0
    """State partitions per task of the stage (``QueryConfig.partitions_per_task``; 0: automatic from
    the cluster's cores, ``groups.partitions_per_task``)."""
    writes_through: bool = False
    """Whether the stage runs inside the sink's write (a :class:`WriterSink` and the JVM helper)."""
    max_attempts: int = 3
    """How often a batch's stage runs when its persisted outputs are lost before the sink read them."""
    failure: BlobstateError | None = None
    """Why the last run failed, when blobstate knows (the processor or the sink raised)."""

    @staticmethod
    def write_through_for(sink: Sink, enabled: bool, jvm: JvmSeam | None) -> bool:
        """Whether a stage with this sink runs inside its write (``QueryConfig.write_through``)."""
        return enabled and isinstance(sink, WriterSink) and jvm is not None

    def run(self, frame: DataFrame, spec: TaskSpec, placement: Placement | None) -> StageRun:
        """Run the stage and hand its outputs to the sink; run both again if the outputs were lost."""
        if self.writes_through:
            result = self._write_through(frame, spec, placement)
            return StageRun(result, time.monotonic(), 1)
        first_submitted: float | None = None
        batch_id = spec.plan.batch
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1 and placement is not None:
                placement.replan()
            result = self._run_stage(frame, spec, placement)
            first_submitted = result.submitted_at if first_submitted is None else first_submitted
            result.earlier_runs_seconds = result.submitted_at - first_submitted
            sink_started = time.monotonic()
            try:
                self._hand_to_sink(result.frame, batch_id)
                return StageRun(result, sink_started, attempt)
            except BaseException as error:
                result.release()
                if not is_attempt_mismatch(error):
                    raise
                self.failure = None
                log.warning(
                    "batch %d: outputs of the processing stage were lost before the sink read them (%s);"
                    " running the stage again (attempt %d of %d)",
                    batch_id,
                    first_line(error),
                    attempt + 1,
                    self.max_attempts,
                )
        self.failure = BatchError(
            f"batch {batch_id}: the outputs of the processing stage were lost before the sink read them"
            f" in each of {self.max_attempts} attempts (executors lost or cache evicted); nothing was"
            " committed"
        )
        raise AttemptMismatchError(str(self.failure))

    def _write_through(self, frame: DataFrame, spec: TaskSpec, placement: Placement | None) -> StageResult:
        """The stage inside the sink's write (``write_through.py``): no persisted outputs, one job."""
        assert self.jvm is not None
        stage, _, groups = self._stage_frame(frame, spec, placement)
        batch_id = spec.plan.batch
        submitted_at = time.time()
        try:
            result = write_through(
                stage,
                self.jvm,
                lambda out: self._hand_to_sink(out, batch_id),
                f"batch {batch_id}",
                worker_error,
            )
        except StageFailedError as error:
            self.failure = ProcessorFailedError(str(error))
            raise self.failure from None
        self._check_results(result.results, batch_id, spec.plan.committing)
        result.submitted_at = submitted_at
        result.tasks = len(groups) or self.num_partitions
        return result

    def _run_stage(self, frame: DataFrame, spec: TaskSpec, placement: Placement | None) -> StageResult:
        started = time.monotonic()
        stage, schema, groups = self._stage_frame(frame, spec, placement)
        shuffle_seconds = time.monotonic() - started
        batch_id = spec.plan.batch
        submitted_at = time.time()
        assert self.jvm is not None
        try:
            result = run_stage(
                stage, self.jvm, self.num_partitions, f"batch {batch_id}", worker_error, schema, groups
            )
        except StageFailedError as error:
            # Spark wraps the task's exception in pages of worker and JVM traceback: keep what the
            # processor raised (its notes name the handler and the key) at the top.
            self.failure = ProcessorFailedError(str(error), error.processor_traceback)
            raise self.failure from None
        self._check_results(result.results, batch_id, spec.plan.committing)
        result.shuffle_seconds = shuffle_seconds
        result.submitted_at = submitted_at
        return result

    def recovery_seconds(self, stage: StageResult) -> float:
        """Time the committed run spent on Spark's retries (``spark_recovery_seconds``, ``recovery.py``;
        asks Spark's status tracker, so the driver calls it once the sink's time is taken)."""
        stage_ids = {r.stage_id for r in stage.results.values()}
        stage_id = stage_ids.pop() if len(stage_ids) == 1 else None
        return spark_recovery_seconds(
            {p: {"attempt": r.attempt, "started_at": r.started_at} for p, r in stage.results.items()},
            submitted_at=stage.submitted_at,
            resubmitted_at=None
            if stage_id is None or self.jvm is None
            else self.jvm.stage_resubmitted_at(stage_id),
            earlier_runs_seconds=stage.earlier_runs_seconds,
        )

    def _stage_frame(
        self, frame: DataFrame, spec: TaskSpec, placement: Placement | None
    ) -> tuple[DataFrame, StructType, tuple[tuple[int, ...], ...]]:
        """The processing stage (the batch shuffled by key into the state partitions, then ``run_task``
        on each partition or group of partitions), its Spark schema and its groups (empty: a task per
        partition)."""
        if spec.plan.run.initial_state_key_columns is not None and self.initial_state is not None:
            frame = self._with_initial_state(frame)
        if self.jvm is not None:
            shuffled = self.jvm.by_state_partition(
                frame, self.key_columns, PARTITION_COLUMN, self.num_partitions
            )
        else:
            shuffled = by_state_partition(frame, self.key_columns, PARTITION_COLUMN, self.num_partitions)
        locations = placement.locations() if placement is not None and self.preferred_locations else None
        per_task = partitions_per_task(self.num_partitions, self._cores(), self.partitions_per_task)
        groups: tuple[tuple[int, ...], ...] = ()
        if self.jvm is not None and per_task > 1:
            planned = plan_groups(self.num_partitions, locations, per_task)
            groups = tuple(g.partitions for g in planned)
            shuffled = self.jvm.with_partition_groups(shuffled, groups, [g.location for g in planned])
            spec = replace(spec, groups=groups)
        elif self.jvm is not None and locations is not None:
            shuffled = self.jvm.with_preferred_locations(shuffled, locations)
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(spec.stage_schema)
        return shuffled.mapInArrow(lambda it: run_task(spec, it), schema), schema, groups

    def _cores(self) -> int:
        """The cores Spark's scheduler counts now (its default parallelism), for automatic groups."""
        if self.partitions_per_task > 0:
            return 1
        try:
            return int(self.spark.sparkContext.defaultParallelism)
        except Exception:  # a session without a SparkContext: a task per partition
            return self.num_partitions

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

    def _check_results(self, results: dict[int, TaskResult], batch_id: int, committing: int) -> None:
        missing = sorted(set(range(self.num_partitions)) - set(results))
        if missing:
            raise BatchError(f"batch {batch_id}: no commit metadata from partition(s) {missing}")
        stale = sorted(p for p, r in results.items() if r.version != committing)
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
