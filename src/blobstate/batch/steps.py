"""Per-batch features as steps behind small interfaces, one for the driver and one for the tasks.

The driver runs every micro-batch as: check the source, **prepare** (each step in order may change the
batch's input and plan, one may place the partitions, and one may add a :class:`TaskStep` for the
tasks), run the stage and hand its outputs to the sink, build the commit from the plan, the tasks'
results and each step's **contribution**, write it, then **after the commit** (each step in order),
report. A step keeps its own state between batches; the driver knows none of its names. Adjunct stores
(``adjunct/step.py``) and standby replicas (``standby/step.py``) are steps; this module imports neither
them nor the engine.

In each task of the processing stage, every :class:`TaskStep` the batch's steps added runs **before
processing**, in order, once the partition's state is open: it may take rows out of the input (and
apply them to the state first), hand the processor read-only views by name, keep something open for
the task (``TaskBatch.scope``) and report entries of the task's result. The adjunct stores' executor
half is one (``adjunct/task_step.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from blobstate.batch.contracts import BatchPlan, JsonObject, PartitionSpec, TaskResult
from blobstate.lineage.commitlog import Commit
from blobstate.lineage.refs import PartitionObjects

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from blobstate.state.store import RocksStateStore


class SparkCheckpointFiles(Protocol):
    """Spark's own checkpoint of the query (offsets, source logs), as a step reads it."""

    @property
    def offsets(self) -> bytes | None:
        """This batch's entry of Spark's offset log (None: not readable here)."""
        ...

    def list_dir(self, relative: str) -> list[str]:
        """The names in a directory of Spark's checkpoint (empty when it does not exist)."""
        ...

    def read_file(self, relative: str) -> bytes:
        """A file of Spark's checkpoint."""
        ...

    def exists(self, uri: str) -> bool:
        """Whether a file Spark's checkpoint names still exists."""
        ...


class Placement(Protocol):
    """Where each partition's task should run (set by the step that places partitions)."""

    def locations(self) -> list[str | None] | None:
        """Each partition's candidate executors, as Spark's preferred-location strings (an entry None:
        any executor; None: no placement this batch)."""
        ...

    def replan(self) -> None:
        """Before the stage runs again: drop executors lost meanwhile from the candidates."""
        ...


@dataclass
class PreparedBatch:
    """One batch while the steps prepare it: the input frame and the plan, which a step may replace."""

    batch_id: int
    previous: Commit | None
    """The commit the batch starts from (None: the query's first batch)."""
    frame: DataFrame
    plan: BatchPlan
    spark_files: SparkCheckpointFiles | None
    """Spark's checkpoint (None: not readable here, as with Spark Connect)."""
    placement: Placement | None = None
    task_steps: list[TaskStep] = field(default_factory=list)
    """What the tasks of this batch run before processing, in order (shipped in their spec)."""


@dataclass
class CommitPart:
    """What a step adds to a batch's commit (``engine/commit.py`` merges the parts)."""

    checkpoints: dict[str, dict[int, str]] = field(default_factory=dict)
    """Further operators' ``{partition: uid}`` (a broadcast adjunct store is an operator)."""
    objects: dict[str, dict[int, PartitionObjects]] = field(default_factory=dict)
    metrics: JsonObject = field(default_factory=dict)
    """Entries of the commit's ``metrics`` (one key per step, such as ``standby``)."""
    placement: dict[int, JsonObject] | None = None
    """The commit's ``placement`` (default: each partition's executor and host)."""
    adjunct_offsets: JsonObject | None = None


class BatchStep(Protocol):
    """A per-batch feature: it prepares the batch, adds to its commit and acts once it is committed."""

    name: str
    """Names the step in logs and in the report."""

    def prepare(self, batch: PreparedBatch) -> None:
        """Before the stage: change ``batch.frame``/``batch.plan`` or set ``batch.placement``."""
        ...

    def contribute(self, batch: PreparedBatch, results: Mapping[int, TaskResult]) -> CommitPart:
        """After the stage and the sink: this step's part of the commit."""
        ...

    def after_commit(self, commit: Commit, results: Mapping[int, TaskResult]) -> None:
        """Once the commit is written (before the report and the post-commit work)."""
        ...

    def wants_another_batch(self) -> bool:
        """Whether the next batch must come even without new input."""
        ...

    def stop(self) -> None:
        """The query stops: end what the step runs in the background."""
        ...


@dataclass
class TaskBatch:
    """One task's input while its task steps prepare it (:meth:`TaskStep.before_processing`)."""

    partition: PartitionSpec
    plan: BatchPlan
    store: RocksStateStore
    """The partition's state, open for this batch (committed or aborted by the task)."""
    scope: contextlib.ExitStack
    """Closed by the task after its commit or abort: what a step opened for the task goes here."""
    batches: Iterator[pa.RecordBatch] | list[pa.RecordBatch]
    """The rows the processor will get (a step may replace them)."""
    views: dict[str, object] = field(default_factory=dict)
    """Read-only views the processor reads by name (``RunInputs``)."""
    taken_rows: int = 0
    """Input rows a step took out of the processor's input: not counted as the task's input rows."""
    result: JsonObject = field(default_factory=dict)
    """Entries of the task's :class:`TaskResult` the steps set (each step its own)."""


class TaskStep(Protocol):
    """The executor half of a per-batch feature: small and picklable, shipped in the task's spec."""

    @property
    def name(self) -> str:
        """Names the step in errors."""
        ...

    def before_processing(self, task: TaskBatch) -> None:
        """Once the partition's state is open and before the processor runs: change ``task``."""
        ...
