"""The one seam between blobstate and Spark's JVM: every operation the engine and its features ask of it.

blobstate runs its state in Python, but a few things only the JVM side of Spark knows or does: where
executors are and which are alive, preferring an executor for a partition's task, the checked view of a
persisted stage's committed outputs, a stage run inside a sink's write, the ticks source and the query's
metrics source, reading Spark's own checkpoint files through Hadoop, a DataFrame's analyzed plan
(its watermark, its streaming sources), Spark's stage attempts, running a probe task on an executor.
:class:`JvmSeam` names each by what it does. Its methods take and return Python values and PySpark
DataFrames, never py4j objects, so an implementation may reach the JVM any way: the classic one
(``blobstate.engine.jvm.classic``) drives the driver's JVM through py4j; one talking to a Spark Connect
server plugin could provide the same.

The interface lives here, below the engine, because the features (``adjunct/``, ``standby/``) take the
seam too and never import the engine; ``blobstate.engine.jvm.seam_for`` picks the implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from blobstate.batch.executor import ExecutorIdentity
from blobstate.errors import QueryError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, GroupedData
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class DeclaredWatermark:
    """One ``withWatermark`` of a DataFrame's analyzed plan (Spark's ``EventTimeWatermark`` node)."""

    event_time: str
    """The event-time column as the node names it."""
    delay: str
    """The delay as Spark prints it (``"10 minutes"``)."""
    months: int
    """The delay's months (a ``CalendarInterval``'s three parts)."""
    days: int
    microseconds: int


@dataclass(frozen=True)
class SourceLeaf:
    """A leaf of a DataFrame's analyzed plan, as far as blobstate looks at streaming sources."""

    node: str
    """The plan node's class name (``StreamingRelation``, ``StreamingRelationV2``, ``LocalRelation``...)."""
    format: str | None = None
    """A ``StreamingRelation``'s data source class name (``parquet``, ``json``, ...); None for others."""
    options: Mapping[str, str] = field(default_factory=dict)
    """A ``StreamingRelation``'s data source options, a ``StreamingRelationV2``'s extra options."""
    schema_json: str | None = None
    """A ``StreamingRelation``'s user-specified schema as Spark's JSON (None: none given)."""


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session: no SparkContext and no JVM in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def executors_from_block_managers(entries: Iterable[str], local: bool) -> list[ExecutorIdentity]:
    """The executors of Spark's block managers (``<executor id>\t<host>`` each, as the JVM helper's
    ``PreferredLocations.blockManagers`` lists them) in Spark's numeric id order; the driver's own block
    manager counts only in local mode, where the driver is the one executor."""
    found = []
    for entry in entries:
        executor_id, _, host = str(entry).partition("\t")
        if executor_id != "driver" or local:
            found.append(ExecutorIdentity(executor_id, host))

    def order(e: ExecutorIdentity) -> tuple[bool, int, ExecutorIdentity]:
        digits = e.executor_id.isdigit()
        return (not digits, int(e.executor_id) if digits else 0, e)

    return sorted(found, key=order)


def by_state_partition(
    df: DataFrame, key_columns: Sequence[str], partition_column: str, num_partitions: int
) -> DataFrame:
    """``df`` with ``partition_column`` holding each row's state partition, ``pmod(hash(keys),
    num_partitions)`` (Spark's ``hash``: the partition Spark's hash shuffle gives the row), repartitioned
    by the keys into ``num_partitions`` partitions, so partition ``p`` holds exactly the rows of state
    partition ``p``; built with DataFrame operations (a seam may build the same plan in fewer calls)."""
    from pyspark.sql import functions as F

    keys = [F.col(k) for k in key_columns]
    return df.withColumn(partition_column, F.pmod(F.hash(*keys), F.lit(num_partitions))).repartition(
        num_partitions, *keys
    )


class ProbeFailedError(QueryError, RuntimeError):
    """The probe task could not run on an executor; the message is the task's own error, in one line."""


class TappedStage(Protocol):
    """A stage run inside a sink's write (:meth:`JvmSeam.write_through`)."""

    @property
    def frame(self) -> DataFrame:
        """The stage's rows without its header and metadata rows, for the sink to write."""
        ...

    def metadata(self) -> list[str]:
        """The metadata rows of the tasks whose output the sink's job committed (after the write)."""
        ...


class TicksChannel(Protocol):
    """The driver's end of the ticks source (``java/TicksSource.java``), one channel per token."""

    def request(self, token: str, batch_id: int) -> None:
        """Have the source's offset move so that Spark runs batch ``batch_id`` without new input."""
        ...

    def publish(self, token: str, keys: list[str], values: list[str]) -> None:
        """Report the batch's metrics as the source's metrics in Spark's progress."""
        ...

    def release(self, token: str) -> None:
        """Forget the channel (the query stopped)."""
        ...


class MetricsChannel(Protocol):
    """The query's source in Spark's metrics system (``java/QueryMetrics.java``)."""

    def update(self, name: str, names: list[str], values: list[float]) -> None:
        """Set the gauges ``names`` of source ``name`` (registering it on first use)."""
        ...

    def remove(self, name: str) -> None:
        """Remove source ``name`` from Spark's metrics system."""
        ...


class JvmSeam(Protocol):
    """Everything blobstate asks of Spark's JVM, for one session (see the module).

    The first group needs only the session; the second needs blobstate's JVM helper, loaded by
    :meth:`load_helper` (the query's start refuses to run without it).
    """

    # ------------------------------------------------------------------ the session
    def watermarks(self, df: DataFrame) -> list[DeclaredWatermark]:
        """Every ``withWatermark`` of ``df``'s analyzed plan, outermost first."""
        ...

    def streaming_leaves(self, df: DataFrame) -> list[SourceLeaf]:
        """The leaves of ``df``'s analyzed plan, in Spark's order (its streaming sources among them)."""
        ...

    def plain_source(self, df: DataFrame) -> SourceLeaf | None:
        """The ``StreamingRelation`` ``df`` reads when its plan is that relation under nothing but aliases
        and projections of plain columns; None for any other plan."""
        ...

    def grouping_columns(self, grouped: GroupedData) -> list[str]:
        """The names of a ``df.groupBy(...)``'s grouping expressions."""
        ...

    def frame_from_arrow(self, batches: list[pa.RecordBatch], schema: StructType) -> DataFrame:
        """A DataFrame of local Arrow data with ``schema`` (the batches already have its Arrow types)."""
        ...

    def stage_resubmitted_at(self, stage_id: int) -> float | None:
        """When Spark submitted the last attempt of stage ``stage_id`` (seconds since the epoch) if it ran
        the stage more than once; else None (also when Spark no longer knows the stage)."""
        ...

    def reads_spark_files(self) -> bool:
        """Whether this seam reads files through Spark's Hadoop filesystems (:meth:`read_file` ...)."""
        ...

    def read_file(self, uri: str) -> bytes:
        """A whole file, through Hadoop's filesystem for ``uri`` (any filesystem Spark can use)."""
        ...

    def list_dir(self, uri: str) -> list[str]:
        """The names in a directory, sorted, without hidden ones (``.`` first); empty when it is absent."""
        ...

    def file_exists(self, uri: str) -> bool:
        """Whether a file exists, through Hadoop's filesystem for ``uri``."""
        ...

    def python_worker(self) -> tuple[str, str] | None:
        """The application id and the executors' Python of the session, which fix what
        :meth:`run_probe` finds; None when there is no probe to run here."""
        ...

    def run_probe(self, probe: Callable[[Iterable[Any]], Iterable[Any]], description: str) -> Any:
        """Run ``probe`` as the one task of a one-partition job (named ``description`` in Spark's UI)
        and return what it yields; :class:`ProbeFailedError` when the task could not run."""
        ...

    # ------------------------------------------------------------------ blobstate's JVM helper
    def load_helper(self) -> bool:
        """Load blobstate's JVM helper into the session (built on first use); False, after one warning
        per SparkContext, when it cannot be (no fitting jar and no JDK, loading failed)."""
        ...

    def executors(self) -> list[ExecutorIdentity]:
        """The executors alive now, by executor id; in local mode the single executor ``"driver"``."""
        ...

    def by_state_partition(
        self, df: DataFrame, key_columns: Sequence[str], partition_column: str, num_partitions: int
    ) -> DataFrame:
        """``df`` with ``partition_column`` holding each row's state partition (Spark's
        ``pmod(hash(keys), num_partitions)``), hash-partitioned by the keys into ``num_partitions``
        partitions (:func:`by_state_partition`'s result)."""
        ...

    def with_preferred_locations(self, df: DataFrame, locations: Sequence[str | None]) -> DataFrame:
        """``df`` with the same rows in the same partitions, partition ``i`` preferring ``locations[i]``
        (``batch.executor.location_string``s, several joined by commas, or None)."""
        ...

    def with_partition_groups(
        self, df: DataFrame, groups: Sequence[Sequence[int]], locations: Sequence[str | None]
    ) -> DataFrame:
        """``df``'s partitions regrouped without a shuffle, one task per group: partition ``g`` of the
        result reads the partitions ``groups[g]`` of ``df`` one after the other, in that order, and
        prefers ``locations[g]`` (an entry as :meth:`with_preferred_locations` takes it). Every
        partition of ``df`` is in exactly one group, no group is empty. The result keeps ``df``'s
        columns and claims no partitioning."""
        ...

    def committed_only(
        self, stage: DataFrame, uid_column: str, meta_column: str, uids: Sequence[str], what: str
    ) -> DataFrame:
        """The output rows of the persisted ``stage``: a task fails instead of passing partition ``i`` on
        when its header rows do not carry the uids of ``uids[i]`` in order: one uid, or several joined by
        commas when the partition holds several state partitions' outputs (one header row each)."""
        ...

    def write_through(self, stage: DataFrame, uid_column: str, meta_column: str, what: str) -> TappedStage:
        """``stage`` tapped for a sink's write: its output rows for the sink, its metadata rows collected
        for the successful tasks only."""
        ...

    def ticks_channel(self) -> TicksChannel:
        """The ticks source's driver end."""
        ...

    def metrics_channel(self) -> MetricsChannel:
        """The queries' sources in Spark's metrics system."""
        ...
