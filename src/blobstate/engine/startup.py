"""The start of a query (``transform_with_state``), one named function per step, in the order it runs.

1. :func:`check_arguments` and :func:`plan_query`: the arguments, the options (with the input's
   ``withWatermark``), the key and output schema, the processor.
2. :func:`claim_checkpoint`: the checkpoint's URL, refused while a query of this process runs on it.
3. ``executor_python.check_executors_python`` (when ``check_executor_python``): before anything is
   written or any other job runs.
4. ``adjunct.union.with_side_streams``: the side streams unioned into the one input.
5. :func:`open_checkpoint`: ``metadata.json`` created or checked, the one listing of ``commits/`` that
   refuses a lost newest commit, the partition count (a rescale first when asked and allowed, or to
   convert an earlier release's TIMESTAMP keys).
6. ``blobstore.expiry.warn_unless_pending_objects_expire``, then :func:`load_jvm_helper` (refused
   without it) and the query's ticks source.
7. :func:`initial_state_of`, the start-up cleanup (``state.retention.cleanup_latest``).
8. :func:`build_steps` (the adjunct step, whose start decisions it takes, and the standby step) and
   :func:`build_driver` (the ``foreachBatch`` function with its stage and post-commit work).
9. :func:`start_stream`: the query with the ticks source unioned in, started and remembered.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from blobstate.adjunct.spec import AdjunctSpec
from blobstate.adjunct.step import AdjunctStart, AdjunctStep
from blobstate.batch.contracts import JsonObject, PartitionSpec
from blobstate.batch.jvm import JvmSeam, is_connect
from blobstate.batch.steps import BatchStep
from blobstate.blobstore import BlobStore
from blobstate.blobstore.schemes import NoHadoopLocationError, hadoop_location, normalize_location
from blobstate.engine.config import (
    QueryConfig,
    QueryConfigError,
    checkpoint_location,
    checkpoint_store_url,
    spark_blobstate_conf,
)
from blobstate.engine.driver import BatchDriver, BatchReport, PostCommit, QueryTasks, Sink
from blobstate.engine.handle import BlobstateStreamingQuery
from blobstate.engine.spark_checkpoint import SparkCheckpoint
from blobstate.engine.stage import Stage
from blobstate.engine.ticks import Ticks, metrics_source_name
from blobstate.engine.watermark import input_watermark
from blobstate.errors import ArgumentTypeError, QueryError
from blobstate.layout import METADATA
from blobstate.lineage.commitlog import Commit, CommitLog, LogScan, MetadataConflictError, QueryMetadata
from blobstate.rescale.limits import MAX_PARTITIONS
from blobstate.standby.step import StandbySettings, StandbyStep
from blobstate.standby.syncer import StandbySyncer

log = logging.getLogger("blobstate")

_RUNNING: dict[str, StreamingQuery] = {}
"""Queries started by this process, by checkpoint location (a checkpoint has one owner at a time)."""


class QueryAlreadyRunningError(QueryError, RuntimeError):
    """A blobstate query of this process is already running on the checkpoint."""


def normalize_checkpoint(checkpoint: str) -> str:
    """An absolute location: plain paths and ``file://`` URLs become absolute paths."""
    return normalize_location(checkpoint)


def spark_checkpoint_location(checkpoint: str, config: QueryConfig) -> str:
    """Spark's own streaming checkpoint (source offsets), beside blobstate's objects."""
    if config.spark_checkpoint:
        return config.spark_checkpoint
    try:
        return os.path.join(hadoop_location(checkpoint), "_spark")
    except NoHadoopLocationError as error:
        raise QueryConfigError(
            f"Spark's own checkpoint cannot be placed beside the checkpoint: {error}; give spark_checkpoint"
            " (an abfss:// or other location Spark can write)"
        ) from None


# ---------------------------------------------------------------------------------- the steps, in order
def check_arguments(df: DataFrame, num_partitions: int | None, allow_rescale: bool) -> None:
    """Refuse a batch input, a partition count that is not a positive integer within
    ``MAX_PARTITIONS``, and an ``allow_rescale`` that is not a bool."""
    if not df.isStreaming:
        raise QueryConfigError("transform_with_state needs a streaming DataFrame (spark.readStream...)")
    if num_partitions is not None and (
        not isinstance(num_partitions, int) or isinstance(num_partitions, bool) or num_partitions < 1
    ):
        raise QueryConfigError(f"num_partitions must be a positive integer, not {num_partitions!r}")
    if num_partitions is not None and num_partitions > MAX_PARTITIONS:
        raise QueryConfigError(
            f"num_partitions is {num_partitions}, above blobstate's limit of {MAX_PARTITIONS} state"
            " partitions"
            " (each is a RocksDB store, a task and a delta in every batch)"
        )
    if not isinstance(allow_rescale, bool):
        raise ArgumentTypeError(f"allow_rescale must be True or False, not {allow_rescale!r}")


@dataclass(frozen=True)
class QueryPlan:
    """What the arguments make of the query before anything is read or written."""

    config: QueryConfig
    key_columns: tuple[str, ...]
    arrow_schema: pa.Schema
    """The output schema, as Arrow, TIMESTAMP columns in the session's time zone."""


def plan_query(
    df: DataFrame,
    jvm: JvmSeam,
    key: str | Sequence[str],
    processor: Any,
    output_schema: StructType | str,
    options: dict[str, Any],
    initial_watermark_ms: int | None,
) -> QueryPlan:
    """The query's options (Spark conf, keywords and the input's ``withWatermark``, read through
    ``jvm``), key columns and output schema; refuses what cannot work, the processor included."""
    spark = df.sparkSession
    config = QueryConfig.build(spark_blobstate_conf(spark), options, input_watermark(df, jvm))
    _check_initial_watermark(initial_watermark_ms, config)
    key_columns = (key,) if isinstance(key, str) else tuple(key)
    missing = [k for k in key_columns if k not in df.columns]
    if not key_columns or missing:
        raise QueryConfigError(
            f"key column(s) {missing or key_columns} not in the input columns {df.columns}"
        )
    spark_schema = _struct_type(spark, output_schema)
    from pyspark.sql.pandas.types import to_arrow_schema

    # TIMESTAMP columns need a zone; the session's, as Spark labels its own Arrow batches
    arrow_schema: pa.Schema = to_arrow_schema(spark_schema, timezone=_session_time_zone(spark))
    _validate_processor(processor, config)
    return QueryPlan(config, key_columns, arrow_schema)


def claim_checkpoint(checkpoint: str, config: QueryConfig) -> tuple[str, str]:
    """The checkpoint's store URL (with the S3 options as its query, so tasks open the store the way
    the driver does) and its location; refused while a query of this process runs on it."""
    store_url = checkpoint_store_url(normalize_checkpoint(checkpoint), config)
    checkpoint_url = checkpoint_location(store_url)
    running = _RUNNING.get(checkpoint_url)
    if running is not None and running.isActive:
        raise QueryAlreadyRunningError(
            f"a blobstate query (id {running.id}) is already running on {checkpoint_url} in this process;"
            " stop it before starting another on the same checkpoint"
        )
    return store_url, checkpoint_url


@dataclass(frozen=True)
class OpenedCheckpoint:
    """The checkpoint as the query starts on it."""

    metadata: QueryMetadata
    scan: LogScan
    """The listing of ``commits/`` the query starts from (after a rescale at start, the second one)."""
    num_partitions: int


def open_checkpoint(
    spark: SparkSession,
    store: BlobStore,
    store_url: str,
    df: DataFrame,
    plan: QueryPlan,
    num_partitions: int | None,
    adjunct_specs: Sequence[AdjunctSpec],
    allow_rescale: bool,
) -> OpenedCheckpoint:
    """Create or check ``metadata.json``, list ``commits/`` once (refusing a lost newest commit, and
    holes in the retained window) and settle the partition count, rescaling first when needed."""
    config = plan.config
    key_columns = plan.key_columns
    key_schema = df.select(*[f"`{k}`" for k in key_columns]).schema.jsonValue()
    metadata = _ensure_metadata(
        store,
        num_partitions if num_partitions is not None else default_num_partitions(store, spark),
        config,
        key_columns,
        adjunct_specs,
        key_schema,
        existing_layout=True,
    )
    # One listing of commits/ at start (another after a rescale): holes in the retained window refuse
    # the start, and the cleanup prunes whatever a crash left below the horizon.
    from blobstate.state.lost import scan_for_writing

    # A lost newest commit refuses first: read-only until an operator decides.
    scan, _ = scan_for_writing(store, action="start a query on")
    num_partitions, rescaled = _layout_at_start(
        spark, store_url, metadata, scan.newest, config.operator, num_partitions, allow_rescale
    )
    if rescaled:
        scan = CommitLog(store).scan()
    return OpenedCheckpoint(metadata, scan, num_partitions)


def load_jvm_helper(jvm: JvmSeam, spark: SparkSession, config: QueryConfig, query_id: str) -> Ticks:
    """Load blobstate's JVM helper (refused without it) and open the query's ticks source."""
    from blobstate.engine.placement import PlacementUnavailableError

    if not jvm.load_helper():
        raise PlacementUnavailableError(
            "blobstate needs its JVM helper (built with the JDK's javac at first use) to keep outputs off the"
            " driver and to run batches for timers on idle streams; see the warning above for why it is"
            " unavailable (a JDK 17+ with javac on PATH or JAVA_HOME, not Spark Connect)"
        )
    return Ticks(
        jvm.ticks_channel(),
        enabled=_no_data_batches_enabled(spark),
        metrics=jvm.metrics_channel(),
        metrics_name=metrics_source_name(config.query_name, query_id),
    )


def partition_spec(store_url: str, query_id: str, config: QueryConfig, num_partitions: int) -> PartitionSpec:
    """Where the query's partition state lives and how its tasks commit it."""
    return PartitionSpec(
        checkpoint_url=store_url,
        query_id=query_id,
        operator=config.operator,
        num_partitions=num_partitions,
        local_dir=config.local_dir,
        local_dir_grace_seconds=config.local_dir_grace_seconds,
        snapshot_every=config.snapshot_every,
        snapshot_delta_bytes=config.snapshot_delta_bytes,
        snapshot_upload=config.snapshot_upload,
    )


def build_steps(
    spark: SparkSession,
    jvm: JvmSeam,
    store: BlobStore,
    partition: PartitionSpec,
    config: QueryConfig,
    key_columns: tuple[str, ...],
    adjuncts: AdjunctStart | None,
    spark_files: SparkCheckpoint,
    latest: Commit | None,
) -> list[BatchStep]:
    """The per-batch steps, in order: the adjunct step when the query declares side streams (its start
    decisions taken now, from ``latest``), then the standby step."""
    steps: list[BatchStep] = []
    if adjuncts is not None:
        adjunct_step = AdjunctStep(
            spark,
            store,
            partition,
            adjuncts.specs,
            adjuncts.sources,
            adjuncts.main_types,
            key_columns,
            spark_files,
        )
        adjunct_step.decide_at_start(adjuncts.side_streams, latest)
        steps.append(adjunct_step)
    syncer = StandbySyncer(
        spark,
        jvm,
        checkpoint_url=partition.checkpoint_url,
        query_id=partition.query_id,
        operator=config.operator,
        local_dir=config.local_dir,
        budget_seconds=config.standby_sync_seconds,
        local_dir_grace_seconds=config.local_dir_grace_seconds,
    )
    settings = StandbySettings(
        num_partitions=partition.num_partitions,
        operator=config.operator,
        standby_replicas=config.standby_replicas,
        max_warmup_replicas=config.max_warmup_replicas,
        acceptable_recovery_lag=config.acceptable_recovery_lag,
        restart_executor_wait_seconds=config.restart_executor_wait_seconds,
    )
    steps.append(StandbyStep(settings, jvm, syncer))
    return steps


@dataclass(frozen=True)
class DriverParts:
    """What the batch driver is built from, besides the query's plan."""

    partition: PartitionSpec
    store: BlobStore
    steps: list[BatchStep]
    spark_files: SparkCheckpoint
    ticks: Ticks
    needed_from: int
    """The start-up cleanup's ``needed_from`` (0: none ran)."""


def build_driver(
    spark: SparkSession,
    jvm: JvmSeam,
    df: DataFrame,
    plan: QueryPlan,
    processor: Any,
    sink: Sink,
    parts: DriverParts,
    initial_frame: Any,
    initial_keys: tuple[str, ...],
    on_batch: Callable[[BatchReport], None] | None,
    initial_watermark_ms: int | None,
) -> BatchDriver:
    """The ``foreachBatch`` function: the tasks' shared spec, the stage, the post-commit work, the
    steps, Spark's checkpoint and the ticks source."""
    config, key_columns = plan.config, plan.key_columns
    return BatchDriver(
        config=config,
        tasks=QueryTasks(
            parts.partition,
            processor,
            plan.arrow_schema,
            key_columns,
            initial_keys if initial_frame is not None else None,
            instant_keys(df, key_columns),
        ),
        stage=Stage(
            spark,
            sink,
            key_columns,
            parts.partition.num_partitions,
            jvm=jvm,
            initial_state=initial_frame,
            initial_state_key_columns=initial_keys,
            preferred_locations=config.placement,
            partitions_per_task=config.partitions_per_task,
            writes_through=Stage.write_through_for(sink, config.write_through, jvm),
        ),
        post_commit=PostCommit(CommitLog(parts.store), config.async_cleanup, parts.needed_from),
        writer_id=uuid.uuid4().hex,
        steps=parts.steps,
        spark_checkpoint=parts.spark_files,
        ticks=parts.ticks,
        on_batch=on_batch,
        initial_watermark_ms=initial_watermark_ms or 0,
    )


def start_stream(
    spark: SparkSession,
    combined: DataFrame,
    driver: Callable[[DataFrame, int], None],
    ticks: Ticks,
    config: QueryConfig,
    location: str,
    checkpoint_url: str,
) -> StreamingQuery:
    """Start the streaming query over the input with the ticks source unioned in, ``driver`` as its
    ``foreachBatch`` function and Spark's checkpoint at ``location``; remembered as running on
    ``checkpoint_url``."""
    writer = (
        ticks.with_ticks(spark, combined)
        .writeStream.foreachBatch(driver)
        .option("checkpointLocation", location)
    )
    if config.trigger_interval:
        writer = writer.trigger(processingTime=config.trigger_interval)
    if config.query_name:
        writer = writer.queryName(config.query_name)
    started = writer.start()
    # Over Spark Connect the driver lives in the server's Python: the client keeps Spark's Connect
    # query, with blobstate's failures surfaced from its text.
    query: StreamingQuery
    if is_connect(spark):
        from blobstate.engine.remote_query import RemoteStreamingQuery

        # Spark types Connect's query apart from the classic one; callers use the methods both have.
        query = RemoteStreamingQuery.of(started, config.time_mode)  # type: ignore[arg-type,assignment]
    else:
        query = BlobstateStreamingQuery(started, driver)
    _RUNNING[checkpoint_url] = query
    return query


# ------------------------------------------------------------------------------------------ the helpers
def initial_state_of(
    jvm: JvmSeam,
    initial_state: Any,
    key_columns: tuple[str, ...],
    initial_state_key: str | Sequence[str] | None,
) -> tuple[Any, tuple[str, ...]]:
    """Spark's ``initialState`` as a DataFrame and its key columns (None when not given); ``jvm`` names
    a ``groupBy``'s grouping columns."""
    if initial_state is None:
        return None, ()
    from pyspark.sql import GroupedData

    explicit = [initial_state_key] if isinstance(initial_state_key, str) else initial_state_key
    if isinstance(initial_state, GroupedData):
        frame = initial_state._df
        names = list(explicit or jvm.grouping_columns(initial_state))
    elif isinstance(initial_state, DataFrame):
        frame, names = initial_state, list(explicit or key_columns)
    else:
        raise ArgumentTypeError(
            f"initial_state must be a DataFrame or df.groupBy(...), not {type(initial_state).__name__}"
        )
    if frame.isStreaming:
        raise QueryConfigError(
            "initial_state must be a batch DataFrame (spark.read...), as Spark's initialState"
        )
    missing = [k for k in names if k not in frame.columns]
    if len(names) != len(key_columns) or missing:
        raise QueryConfigError(
            f"initial_state must be grouped by {len(key_columns)} column(s) matching the key"
            f" {list(key_columns)}; its grouping columns are {names} (columns: {frame.columns})"
        )
    return frame, tuple(names)


def _check_initial_watermark(initial_watermark_ms: int | None, config: QueryConfig) -> None:
    """Refuse an ``initial_watermark_ms`` that is not a watermark, or that a query without event time
    would ignore."""
    if initial_watermark_ms is None:
        return
    if isinstance(initial_watermark_ms, bool) or not isinstance(initial_watermark_ms, int):
        raise ArgumentTypeError(
            f"initial_watermark_ms must be an int of epoch milliseconds, not {initial_watermark_ms!r}"
        )
    if initial_watermark_ms < 0:
        raise QueryConfigError(f"initial_watermark_ms must not be negative, not {initial_watermark_ms}")
    if config.time_mode != "EventTime":
        raise QueryConfigError(
            f"initial_watermark_ms needs time_mode 'EventTime' (this query's is {config.time_mode!r}):"
            " only an event-time query has a watermark"
        )


def _no_data_batches_enabled(spark: SparkSession) -> bool:
    """Spark's ``spark.sql.streaming.noDataMicroBatches.enabled`` (default true), which blobstate follows."""
    value = spark.conf.get("spark.sql.streaming.noDataMicroBatches.enabled", "true")
    return str(value).strip().lower() != "false"


def _struct_type(spark: SparkSession, schema: StructType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    parsed = StructType.fromDDL(schema) if hasattr(StructType, "fromDDL") else None
    if parsed is None:
        from pyspark.sql.types import _parse_datatype_string

        parsed = _parse_datatype_string(schema)
    if not isinstance(parsed, StructType):
        raise QueryConfigError(f"output_schema must describe a struct, got {schema!r}")
    return parsed


def instant_keys(df: DataFrame, key_columns: Sequence[str]) -> tuple[int, ...]:
    """The positions of ``df``'s key columns that are or hold a TIMESTAMP: instants, stored by their UTC
    reading."""
    from blobstate.rescale.keys import holds_instant

    types = {f.name: f.dataType for f in df.schema.fields}
    return tuple(i for i, k in enumerate(key_columns) if k in types and holds_instant(types[k]))


def _session_time_zone(spark: SparkSession) -> str:
    """``spark.sql.session.timeZone``: Spark hands processors timestamps as naive times of this zone."""
    return spark.conf.get("spark.sql.session.timeZone") or "UTC"


def _validate_processor(processor: object, config: QueryConfig) -> None:
    from blobstate.processor import StatefulProcessor
    from blobstate.processor.arrow_api import check_api

    check_api(processor, config.api)
    if config.api == "arrow":
        return
    if not isinstance(processor, StatefulProcessor):
        try:
            from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkProcessor
        except ImportError:  # pragma: no cover - pyspark always has it in 4.x
            SparkProcessor = ()  # type: ignore[assignment,misc]
        if not isinstance(processor, SparkProcessor):
            raise ArgumentTypeError(
                f"processor must be a blobstate.StatefulProcessor instance, not {type(processor).__name__}"
            )


SPARK_DEFAULT_SHUFFLE_PARTITIONS = 200
"""Spark's default ``spark.sql.shuffle.partitions``: too many state partitions for most small jobs."""


def default_num_partitions(store: BlobStore, spark: SparkSession) -> int:
    """The partition count of a query that names none, as Spark's stateful operators choose it: an
    existing checkpoint's (its newest commit's, which a rescale changes; else ``metadata.json``'s), else
    the session's ``spark.sql.shuffle.partitions``.

    A new checkpoint's count is logged once, on the driver, with where it came from and how to choose
    it (:func:`log_new_checkpoint_partitions`): it stays the checkpoint's until a rescale."""
    from blobstate.blobstore import BlobNotFoundError

    commits = CommitLog(store)
    try:
        metadata = commits.read_metadata()
    except BlobNotFoundError:
        default = str(SPARK_DEFAULT_SHUFFLE_PARTITIONS)
        count = int(spark.conf.get("spark.sql.shuffle.partitions", default) or default)  # Spark checks it
        log_new_checkpoint_partitions(store.url, count)
        return count
    newest = commits.latest_commit()
    if newest is not None and newest.num_partitions is not None:
        return newest.num_partitions
    return metadata.num_partitions


def log_new_checkpoint_partitions(url: str, count: int) -> None:
    """Say once, when a query creates the checkpoint at ``url`` without ``num_partitions``, that it took
    ``count`` state partitions from ``spark.sql.shuffle.partitions`` and how to choose: a warning at
    Spark's default of 200 (rarely what a job wants), else information."""
    level = logging.WARNING if count == SPARK_DEFAULT_SHUFFLE_PARTITIONS else logging.INFO
    default = " (Spark's default)" if count == SPARK_DEFAULT_SHUFFLE_PARTITIONS else ""
    log.log(
        level,
        "new checkpoint %s: %d state partitions, taken from spark.sql.shuffle.partitions%s because the"
        " query names no num_partitions; the checkpoint keeps this count until a rescale. To choose it,"
        " pass transform_with_state(..., num_partitions=N) or set spark.sql.shuffle.partitions before the"
        " first start (a few partitions per executor core; `blobstate rescale` changes it later)",
        url,
        count,
        default,
    )


class PartitionCountMismatchError(MetadataConflictError):
    """The query asks for another partition count than the checkpoint's newest commit has, without
    ``allow_rescale``."""


def check_partition_count(
    url: str, current: int, newest: Commit | None, requested: int, allow_rescale: bool
) -> bool:
    """Whether the query on a checkpoint of ``current`` partitions (those of its newest commit
    ``newest``; None: nothing committed, ``metadata.json``'s) must rescale it to ``requested`` first.

    Raises :class:`PartitionCountMismatchError` (one line naming both counts) when the counts differ and
    the query may not rescale: without ``allow_rescale``, or with nothing committed to rescale.
    """
    if requested == current:
        return False
    if newest is None:
        raise PartitionCountMismatchError(
            f"{url} records {current} partitions in metadata.json, the query asks for {requested}, and"
            f" nothing is committed yet to rescale: start it with num_partitions={current}, or use a new"
            " checkpoint location"
        )
    if not allow_rescale:
        raise PartitionCountMismatchError(
            f"{url} records {current} partitions (version {newest.version}, its newest commit), the query"
            f" asks for {requested}: pass allow_rescale=True to rescale the checkpoint to {requested}"
            f" partitions before the first batch (docs/RESCALE.md), or num_partitions={current}"
        )
    return True


def _layout_at_start(
    spark: SparkSession,
    store_url: str,
    metadata: QueryMetadata,
    newest: Commit | None,
    operator: str,
    requested: int | None,
    allow_rescale: bool,
) -> tuple[int, bool]:
    """The query's partition count and whether the checkpoint was rescaled to it now: the newest
    commit's count (which a rescale may have changed since ``metadata.json`` was written), or
    ``requested`` after rescaling to it when asked and allowed."""
    from blobstate.rescale import rescale_checkpoint
    from blobstate.rescale.job import needs_key_conversion

    current = newest.partitions_of(operator, metadata) if newest is not None else metadata.num_partitions
    if needs_key_conversion(metadata, newest, operator):
        # An earlier release stored the TIMESTAMP keys as wall-clock readings of its session's zone: take
        # them to instants now (a rescale's job, at the requested or the current count), reading them in
        # this session's zone, which the README asks to be the zone the query last ran in.
        zone = _session_time_zone(spark)
        wanted = current
        if requested is not None and check_partition_count(
            checkpoint_location(store_url), current, newest, requested, allow_rescale
        ):
            wanted = requested
        result = rescale_checkpoint(spark, store_url, wanted, legacy_zone=zone)
        log.warning(
            "converted the TIMESTAMP keys of %s, stored by an earlier blobstate release as wall-clock "
            "readings, to instants, reading them in the session time zone %s: version %d (%d records)",
            result.url,
            zone,
            result.version,
            result.records,
        )
        return wanted, True
    if requested is None:
        return current, False
    if not check_partition_count(checkpoint_location(store_url), current, newest, requested, allow_rescale):
        return requested, False

    result = rescale_checkpoint(spark, store_url, requested)
    log.info(
        "rescaled %s from %d to %d partitions before the first batch: version %d (%d records, %.1f s)",
        result.url,
        result.old_partitions,
        result.new_partitions,
        result.version,
        result.records,
        result.seconds,
    )
    return requested, True


def _ensure_metadata(
    store: BlobStore,
    num_partitions: int,
    config: QueryConfig,
    key_columns: tuple[str, ...],
    adjuncts: Sequence[AdjunctSpec] = (),
    key_schema: JsonObject | None = None,
    *,
    existing_layout: bool = False,
) -> QueryMetadata:
    """Create the checkpoint's metadata, or check the query still matches it (partitions, key, adjunct
    stores: a broadcast store is an operator of its own with one partition).

    ``metadata.json`` is never rewritten: with ``existing_layout`` an existing checkpoint's partition
    count is not compared here (the newest commit's count is the layout, checked at start)."""
    from blobstate.stored_schema import StoredSchemaError, parse_stored_schema

    main: JsonObject = {"key_columns": list(key_columns)}
    if key_schema is not None:  # the key's Spark types, for the state reader (not part of the identity)
        try:  # recorded only if it reads back (else the reader types the key from its stored values)
            parse_stored_schema(key_schema, where="key schema of the query")
            main["key_schema"] = key_schema
        except StoredSchemaError:
            pass
    if adjuncts:
        main["adjuncts"] = {a.name: a.mode for a in adjuncts}
    operators = {config.operator: main}
    for a in adjuncts:
        if a.mode == "broadcast":
            operators[a.operator] = {"key_columns": list(a.key_in_union), "partitions": 1}
    if existing_layout and store.exists(METADATA):
        num_partitions = CommitLog(store).read_metadata().num_partitions
    wanted = QueryMetadata.new(num_partitions, operators)
    metadata = CommitLog(store).write_metadata(wanted)
    recorded = metadata.operators.get(config.operator, {}).get("key_schema")
    if recorded is not None:  # a checkpoint whose metadata records a schema blobstate will not read
        parse_stored_schema(
            recorded, where=f"key_schema of operator {config.operator} in metadata.json of {store.url}"
        )
    return metadata
