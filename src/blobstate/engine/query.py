"""``transform_with_state``: start a stateful streaming query whose state blobstate keeps.

The start-up sequence is ``startup.py``, one function per step; this module runs them in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from blobstate.adjunct.spec import Adjunct
from blobstate.adjunct.step import adjunct_start
from blobstate.adjunct.union import with_side_streams
from blobstate.blobstore import open_blob_store
from blobstate.blobstore.expiry import warn_unless_pending_objects_expire
from blobstate.engine.config import QueryConfigError
from blobstate.engine.driver import BatchReport, Sink
from blobstate.engine.executor_python import check_executors_python, processor_modules
from blobstate.engine.jvm import seam_for
from blobstate.engine.jvm.connect import ConnectJvm
from blobstate.engine.remote import ServerBatchFunction, ServerStart, connect_plan, share_initial_state
from blobstate.engine.spark_checkpoint import SparkCheckpoint
from blobstate.engine.startup import (
    SPARK_DEFAULT_SHUFFLE_PARTITIONS,
    DriverParts,
    PartitionCountMismatchError,
    QueryAlreadyRunningError,
    _check_initial_watermark,
    _ensure_metadata,
    build_driver,
    build_steps,
    check_arguments,
    check_partition_count,
    claim_checkpoint,
    default_num_partitions,
    initial_state_of,
    instant_keys,
    load_jvm_helper,
    log_new_checkpoint_partitions,
    normalize_checkpoint,
    open_checkpoint,
    partition_spec,
    plan_query,
    spark_checkpoint_location,
    start_stream,
)
from blobstate.engine.ticks import owes_a_batch
from blobstate.state.retention import cleanup_latest

__all__ = [
    "SPARK_DEFAULT_SHUFFLE_PARTITIONS",
    "PartitionCountMismatchError",
    "QueryAlreadyRunningError",
    "_check_initial_watermark",
    "_ensure_metadata",
    "batch_reports",
    "check_partition_count",
    "default_num_partitions",
    "instant_keys",
    "log_new_checkpoint_partitions",
    "normalize_checkpoint",
    "spark_checkpoint_location",
    "transform_with_state",
]


def transform_with_state(
    df: DataFrame,
    *,
    key: str | Sequence[str],
    processor: Any,
    output_schema: StructType | str,
    checkpoint: str,
    sink: Sink,
    num_partitions: int | None = None,
    on_batch: Callable[[BatchReport], None] | None = None,
    initial_state: Any = None,
    initial_state_key: str | Sequence[str] | None = None,
    initial_watermark_ms: int | None = None,
    adjuncts: Sequence[Adjunct] = (),
    allow_rescale: bool = False,
    **options: Any,
) -> StreamingQuery:
    """Start a streaming query that runs ``processor`` per key with state kept by blobstate.

    ``df`` is a streaming DataFrame; ``key`` the grouping column(s); ``processor`` a
    :class:`blobstate.StatefulProcessor` (the same class you would pass to Spark's
    ``transformWithStateInPandas``); ``output_schema`` the schema of the rows it emits; ``checkpoint``
    the one location of the query's state (a path, ``file://``, or ``s3://``; Spark's offsets go to
    ``<checkpoint>/_spark``); ``sink(batch_df, batch_id)`` receives each batch's output, as
    ``foreachBatch`` would, and must be idempotent per batch id for end-to-end exactly-once;
    ``num_partitions`` the number of state partitions; by default, as with Spark's own stateful
    operators, a new checkpoint takes ``spark.sql.shuffle.partitions`` and an existing one keeps the
    count of its newest commit. Another count on an existing checkpoint is refused unless
    ``allow_rescale=True``: then the checkpoint is rescaled to ``num_partitions`` before the first batch
    (one Spark job on this session, as ``blobstate rescale``; docs/RESCALE.md).
    ``api="row"`` runs a processor written for Spark's row-based ``transformWithState`` (Rows in and
    out) instead of one for ``transformWithStateInPandas`` (the default, ``api="pandas"``);
    ``api="arrow"`` runs a :class:`blobstate.ArrowStatefulProcessor` (vectorized: one call per
    partition and batch with every key's rows, state read and written in bulk as Arrow columns).
    Further options are :class:`~blobstate.engine.config.QueryConfig` fields (also settable as Spark
    conf ``spark.blobstate.<name>``); ``blob_store_options={...}`` (or Spark conf
    ``spark.blobstate.s3.<option>``) sets an S3 checkpoint's timeouts, retries and endpoint, for the
    driver and the tasks. ``on_batch(report)`` is called after each committed batch.
    ``initial_state`` is Spark's ``initialState``: a DataFrame (or ``df.groupBy(...)``) whose rows are
    handed to the processor's ``handleInitialState`` in the query's first batch (ignored when the query
    resumes from a checkpoint), grouped by ``initial_state_key`` (default: its ``groupBy`` columns, else
    ``key``). ``initial_watermark_ms`` (time mode ``EventTime``) is the event-time watermark the query
    starts from instead of Spark's 0, in epoch ms, ignored too when it resumes: a query moved from
    another one starts from the old one's (:func:`blobstate.last_watermark_ms`), so its first batch fires
    the timers due by then and drops the input rows at or before it as late, and its watermark never
    goes below it.
    ``adjuncts`` declares side streams (:class:`blobstate.Adjunct`): each is materialized into a
    read-only store the processor reads with ``handle.getAdjunct(name)``; its rows are never handed to
    ``handleInputRows``. Side streams join the main stream in one query, so Spark's offset log records
    their offsets with the main one's, every task of a batch sees the same adjunct version, and a
    replayed batch sees the version its first run saw.
    Returns the running :class:`~pyspark.sql.streaming.StreamingQuery`.
    """
    check_arguments(df, num_partitions, allow_rescale)
    spark = df.sparkSession
    jvm = seam_for(spark)
    remote = isinstance(jvm, ConnectJvm)
    if isinstance(jvm, ConnectJvm):  # refused in one line before anything is read or written
        jvm.require_plugin()
    plan = plan_query(df, jvm, key, processor, output_schema, options, initial_watermark_ms)
    if remote:
        plan = connect_plan(plan)
    config, key_columns = plan.config, plan.key_columns
    store_url, checkpoint_url = claim_checkpoint(checkpoint, config)
    if config.check_executor_python:  # before anything is written or any other job runs
        check_executors_python(jvm, job_modules=processor_modules(processor))
    combined, adjunct_specs = with_side_streams(df, key_columns, list(adjuncts), jvm)
    store = open_blob_store(store_url)
    opened = open_checkpoint(spark, store, store_url, df, plan, num_partitions, adjunct_specs, allow_rescale)
    warn_unless_pending_objects_expire(store)  # one line at the query's start, never an error
    ticks = load_jvm_helper(jvm, spark, config, opened.metadata.query_id)
    initial_frame, initial_keys = initial_state_of(jvm, initial_state, key_columns, initial_state_key)
    started_cleanup = cleanup_latest(store, opened.scan)
    location = spark_checkpoint_location(checkpoint_url, config)
    partition = partition_spec(store_url, opened.metadata.query_id, config, opened.num_partitions)
    latest = opened.scan.newest
    needed_from = started_cleanup.needed_from if started_cleanup is not None else 0
    side = adjunct_start(jvm, df, adjuncts, adjunct_specs)
    if remote:
        # Spark's initialState is read only by a query's first batch: shared only when nothing is
        # committed yet.
        view = None
        if initial_frame is not None and latest is None:
            view = share_initial_state(initial_frame, opened.metadata.query_id)
        start = ServerStart(
            plan,
            processor,
            sink,
            store_url,
            partition,
            location,
            latest,
            needed_from,
            ticks.token,
            ticks.enabled,
            ticks.metrics_name,
            on_batch,
            initial_watermark_ms,
            adjuncts=side,
            initial_state_view=view,
            initial_state_keys=initial_keys,
        )
        # A batch the last run owed Spark's semantics (timers on an idle stream); the driver asks for it
        # on a classic session (request_tick), here it is built only at the first batch; so is a batch
        # a bootstrap side stream still loading its backlog wants.
        if latest is not None and (
            owes_a_batch(config.time_mode, latest) or (side is not None and side.holds_main_rows(latest))
        ):
            ticks.request(latest.batch_id + 1)
        return start_stream(
            spark, combined, ServerBatchFunction(start), ticks, config, location, checkpoint_url
        )
    spark_files = SparkCheckpoint(jvm, location)
    steps = build_steps(spark, jvm, store, partition, config, key_columns, side, spark_files, latest)
    parts = DriverParts(partition, store, steps, spark_files, ticks, needed_from)
    driver = build_driver(
        spark,
        jvm,
        df,
        plan,
        processor,
        sink,
        parts,
        initial_frame,
        initial_keys,
        on_batch,
        initial_watermark_ms,
    )
    if latest is not None:  # a batch the last run owed Spark's semantics (timers on an idle stream)
        driver.request_tick(latest)
    return start_stream(spark, combined, driver, ticks, config, location, checkpoint_url)


def batch_reports(query: StreamingQuery) -> list[BatchReport]:
    """The per-batch reports of a query started by :func:`transform_with_state` in this process, oldest
    first: the most recent 1,000 batches' (``engine.driver.RECENT_REPORTS``). Refused, naming where to
    look instead, for another query (one started over Spark Connect keeps its reports in the server)."""
    driver = getattr(query, "blobstate_driver", None)
    if driver is None:
        raise QueryConfigError(
            f"batch_reports: query {query.id} was not started by blobstate.transform_with_state in this"
            " process (over Spark Connect its batch driver runs in the server): read blobstate's figures"
            " with blobstate.progress_metrics(query.lastProgress) or from the commit log (blobstate report)"
        )
    return list(driver.reports)
