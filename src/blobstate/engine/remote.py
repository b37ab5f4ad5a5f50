"""A query started from a Spark Connect client: its batch driver lives in the server's Python.

With Spark Connect, ``foreachBatch``'s function is pickled by the client and runs in a Python process the
server starts for the query, where each batch's DataFrame belongs to a Connect session of the server's
own. blobstate's batch driver (its commit log, standby syncer, steps and post-commit work) cannot be
pickled with its open blob store and threads, so the client ships a :class:`ServerStart`: what the
client's start-up decided (the query's plan, the partition spec, the checkpoint's newest commit, the
ticks token), and :class:`ServerBatchFunction` builds the driver from it at the first batch, reaching
the server's JVM through blobstate's plugin (:class:`~blobstate.engine.jvm.connect.ConnectJvm`). A server
Python process that dies takes the driver with it; the next one rebuilds it from the checkpoint, as a
restarted query does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from blobstate.adjunct.step import AdjunctStart
    from blobstate.batch.contracts import PartitionSpec
    from blobstate.engine.driver import BatchDriver, BatchReport, Sink
    from blobstate.engine.startup import QueryPlan
    from blobstate.lineage.commitlog import Commit


@dataclass(frozen=True)
class ServerStart:
    """What the client's start-up decided, for the server's Python to build the batch driver from."""

    plan: QueryPlan
    processor: Any
    sink: Sink
    store_url: str
    partition: PartitionSpec
    spark_checkpoint: str
    """Spark's own checkpoint location (``<checkpoint>/_spark``)."""
    latest: Commit | None
    needed_from: int
    ticks_token: str
    ticks_enabled: bool
    metrics_name: str
    on_batch: Callable[[BatchReport], None] | None
    initial_watermark_ms: int | None
    adjuncts: AdjunctStart | None = None
    """The side streams' start inputs, read of the client's DataFrames (None: no side streams)."""
    initial_state_view: str | None = None
    """The global temporary view of Spark's ``initialState`` (:func:`share_initial_state`; None: none,
    or the query resumes from a checkpoint)."""
    initial_state_keys: tuple[str, ...] = ()


class ServerBatchFunction:
    """The ``foreachBatch`` function of a query started over Spark Connect: builds the batch driver in
    the server's Python at the first batch (see the module) and runs every batch through it."""

    def __init__(self, start: ServerStart) -> None:
        """Ship ``start``; the driver is built where the function runs."""
        self.start = start
        self._driver: BatchDriver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"start": self.start}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.start = state["start"]
        self._driver = None

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Run batch ``batch_id`` (building the driver first, in this process, if needed)."""
        if self._driver is None:
            self._driver = build_server_driver(batch_df.sparkSession, batch_df, self.start)
        self._driver(batch_df, batch_id)
        view = self.start.initial_state_view
        if view is not None and self._driver.reports:
            # A batch committed: the query never reads its initial state again (a restart resumes from
            # the checkpoint), so the server need not hold it.
            batch_df.sparkSession.catalog.dropGlobalTempView(view)
            self.start = dataclasses.replace(self.start, initial_state_view=None)


def build_server_driver(spark: SparkSession, frame: DataFrame, start: ServerStart) -> BatchDriver:
    """The batch driver of ``start`` on the server's session ``spark`` (``frame``: a batch of the input,
    whose columns are the input's)."""
    from blobstate.blobstore import open_blob_store
    from blobstate.engine.jvm.connect import ConnectJvm
    from blobstate.engine.spark_checkpoint import SparkCheckpoint
    from blobstate.engine.startup import DriverParts, build_driver, build_steps
    from blobstate.engine.ticks import Ticks

    jvm = ConnectJvm(spark)
    jvm.require_plugin()
    store = open_blob_store(start.store_url)
    ticks = Ticks(
        jvm.ticks_channel(),
        enabled=start.ticks_enabled,
        metrics=jvm.metrics_channel(),
        metrics_name=start.metrics_name,
        token=start.ticks_token,
    )
    spark_files = SparkCheckpoint(jvm, start.spark_checkpoint)
    config = start.plan.config
    steps = build_steps(
        spark,
        jvm,
        store,
        start.partition,
        config,
        start.plan.key_columns,
        start.adjuncts,
        spark_files,
        start.latest,
    )
    parts = DriverParts(start.partition, store, steps, spark_files, ticks, start.needed_from)
    initial = None
    if start.initial_state_view is not None:
        initial = spark.table(f"{global_temp_database(spark)}.{start.initial_state_view}")
    return build_driver(
        spark,
        jvm,
        frame,
        start.plan,
        start.processor,
        start.sink,
        parts,
        initial,
        start.initial_state_keys,
        start.on_batch,
        start.initial_watermark_ms,
    )


def global_temp_database(spark: SparkSession) -> str:
    """The database of global temporary views (``spark.sql.globalTempDatabase``)."""
    return str(spark.conf.get("spark.sql.globalTempDatabase", "global_temp"))


def share_initial_state(initial_state: DataFrame, query_id: str) -> str:
    """Spark's ``initialState`` of a query started over Spark Connect, as a global temporary view the
    server's driver reads (a batch of the query runs in a session of the server's own, which sees the
    client's global views, not its DataFrames); returns the view's name. The server drops it once a
    batch committed."""
    import uuid

    name = f"blobstate_initial_state_{query_id.replace('-', '')}_{uuid.uuid4().hex[:8]}"
    initial_state.createOrReplaceGlobalTempView(name)
    return name


def connect_plan(plan: QueryPlan) -> QueryPlan:
    """``plan`` as a Connect query runs it: without a write-through sink (not over Connect yet)."""
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, write_through=False))
