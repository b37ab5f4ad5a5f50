"""The driver side of one micro-batch (DESIGN.md, "One micro-batch", steps 1, 2, 4 and 5)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blobstate.blobstore import BlobStore
from blobstate.engine.assignment import assign_partitions
from blobstate.engine.config import QueryConfig
from blobstate.engine.replay import SourceProgress, check_batch
from blobstate.engine.task import META_COLUMN, PARTITION_COLUMN, TaskSpec, run_task
from blobstate.errors import BlobstateError
from blobstate.state.retention import retained_from

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
)
"""Per-partition entries of a commit's ``metrics.partitions``: from the task's metadata row (``task.py``)."""


class BatchError(BlobstateError, RuntimeError):
    """A micro-batch could not be completed; nothing of it was committed."""


class ProcessorFailedError(BatchError):
    """The processor (or blobstate in a task) raised in the processing stage; nothing was committed.

    The message is the task's own exception and its notes (which name the handler and the grouping
    key), not the Python worker's traceback wrapped in Spark's.
    """


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
    return " ".join(reversed(tail)) or (lines[-1] if lines else text)


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
    spark_output_schema: Any
    sink: Sink
    writer_id: str
    placement_helper: Any = None
    spark_checkpoint: str = ""
    """Spark's own checkpoint location (offsets, commits): read to tell replays from a reset."""
    on_batch: Callable[[BatchReport], None] | None = None
    reports: list[BatchReport] = field(default_factory=list)
    failure: BatchError | None = None
    """Why the processing stage of the last batch failed, when the processor raised (else None)."""
    post_commit_steps: list[tuple[str, PostCommitStep]] = field(default_factory=list)
    """What runs after each commit, in order (default: cleanup; standby sync comes next)."""
    _post_commit_thread: threading.Thread | None = None
    _spark_metadata: bytes | None = None

    def __post_init__(self) -> None:
        from blobstate.lineage.commitlog import CommitLog

        if not self.post_commit_steps:
            self.post_commit_steps = [("cleanup", self._cleanup)]
        self.commit_log = CommitLog(self.store)

    # ------------------------------------------------------------------ one batch
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function."""
        version = batch_id + 1
        self.failure = None
        source = self._source(batch_id)
        if self.commit_log.commit_exists(version):
            if source is not None:
                self._check_source(batch_id, self.commit_log.read_commit(version), None, source)
            log.info("batch %d is already committed as version %d: skipping its replay", batch_id, version)
            self._report(BatchReport(batch_id, version, 0, 0, 0.0, 0.0, 0, 0, 0, skipped=True))
            return
        started = time.monotonic()
        self._wait_for_post_commit()
        if batch_id > 0 and not self.commit_log.commit_exists(batch_id):
            raise BatchError(
                f"batch {batch_id} starts from version {batch_id}, but commits/{batch_id}.json does not exist"
                f" in {self.checkpoint_url}: the blobstate checkpoint does not match Spark's checkpoint"
            )
        previous = self.commit_log.read_commit(batch_id) if batch_id > 0 else None
        if source is not None:
            self._check_source(batch_id, None, previous, source)
        uids = previous.checkpoints[self.config.operator] if previous else {}
        watermark, late_watermark = self._watermarks(previous)
        spec = TaskSpec(
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
            batch_timestamp_ms=int(time.time() * 1000),
            watermark_ms=watermark,
            late_watermark_ms=late_watermark,
            event_time_column=self.config.event_time_column,
            local_dir=self.config.local_dir,
            snapshot_every=self.config.snapshot_every,
            snapshot_delta_bytes=self.config.snapshot_delta_bytes,
            timezone=batch_df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC",
            pandas_object_strings=self.config.pandas_object_strings,
            api=self.config.api,
        )
        placement = self._placement(previous)
        stage_started = time.monotonic()
        table = self._run_stage(batch_df, spec, placement)
        outputs, metas = _split(table)
        self._check_metas(metas, batch_id)
        sink_started = time.monotonic()
        self._hand_to_sink(outputs, batch_id)
        commit_started = time.monotonic()
        commit = self._commit(version, metas, watermark, started, previous, source)
        finished = time.monotonic()
        report = BatchReport(
            batch_id=batch_id,
            version=version,
            input_rows=sum(m["input_rows"] for m in metas.values()),
            output_rows=outputs.num_rows,
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
        )
        self._report(report)
        self._start_post_commit(commit)

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
        return SourceProgress.read(self._spark_metadata, self._read_spark_file(f"offsets/{batch_id}"))

    def _read_spark_file(self, relative: str) -> bytes:
        """A file of Spark's checkpoint, through Hadoop's FileSystem (any filesystem Spark can use)."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(f"{self.spark_checkpoint.rstrip('/')}/{relative}")
        try:
            fs = path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())
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
            checkpoint=self.checkpoint_url,
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

    def _placement(self, previous: Any) -> dict[int, dict[str, str]]:
        if self.placement_helper is None:
            return {}
        alive = {e.executor_id: e for e in self.placement_helper.executors()}
        before = {int(p): v["executor_id"] for p, v in (previous.placement if previous else {}).items()}
        chosen = assign_partitions(self.num_partitions, before, list(alive))
        return {p: {"executor_id": e, "host": alive[e].host} for p, e in chosen.items()}

    def _run_stage(
        self, batch_df: DataFrame, spec: TaskSpec, placement: dict[int, dict[str, str]]
    ) -> pa.Table:
        keys = [F.col(k) for k in self.key_columns]
        shuffled = batch_df.withColumn(
            PARTITION_COLUMN, F.pmod(F.hash(*keys), F.lit(self.num_partitions))
        ).repartition(self.num_partitions, *keys)
        if self.placement_helper is not None and placement:
            from blobstate.engine.executor_identity import ExecutorIdentity
            from blobstate.engine.placement import location_string

            locations = [
                location_string(ExecutorIdentity(placement[p]["executor_id"], placement[p]["host"]))
                if p in placement
                else None
                for p in range(self.num_partitions)
            ]
            shuffled = self.placement_helper.with_preferred_locations(shuffled, locations)
        stage_schema = spec.stage_schema
        from pyspark.sql.pandas.types import from_arrow_schema

        result = shuffled.mapInArrow(lambda it: run_task(spec, it), from_arrow_schema(stage_schema))
        try:
            return result.toArrow()
        except PythonException as error:
            # Spark wraps the task's exception in pages of worker and JVM traceback: keep what the
            # processor raised (its notes name the handler and the key) at the top.
            self.failure = ProcessorFailedError(
                f"batch {spec.version}: a task of the processing stage failed: {worker_error(str(error))}"
            )
            raise self.failure from None

    def _check_metas(self, metas: dict[int, dict[str, Any]], batch_id: int) -> None:
        missing = sorted(set(range(self.num_partitions)) - set(metas))
        if missing:
            raise BatchError(f"batch {batch_id}: no commit metadata from partition(s) {missing}")
        stale = sorted(p for p, m in metas.items() if m["version"] != batch_id + 1)
        if stale:
            raise BatchError(f"batch {batch_id}: partition(s) {stale} committed another version")

    def _hand_to_sink(self, outputs: pa.Table, batch_id: int) -> None:
        table = outputs.cast(self.output_schema) if outputs.num_rows else self.output_schema.empty_table()
        frame = self.spark.createDataFrame(table, schema=self.spark_output_schema)
        try:
            self.sink(frame, batch_id)
        except Exception as error:
            self.failure = SinkFailedError(
                f"batch {batch_id}: the sink raised {type(error).__name__}: {error} (the batch was not "
                "committed; a restart hands it to the sink again)"
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
    ) -> Any:
        from blobstate.lineage.commitlog import Commit
        from blobstate.lineage.refs import PartitionObjects

        new_watermark = watermark
        if self.config.time_mode == "EventTime":
            seen = [m["max_event_time_ms"] for m in metas.values() if m.get("max_event_time_ms") is not None]
            if seen:
                candidate = max(seen) - self.config.watermark_delay_ms
                new_watermark = candidate if watermark is None else max(watermark, candidate)
        commit = Commit(
            version=version,
            batch_id=version - 1,
            checkpoints={self.config.operator: {p: m["uid"] for p, m in sorted(metas.items())}},
            objects={
                self.config.operator: {
                    p: PartitionObjects.from_json(m["objects"]) for p, m in sorted(metas.items())
                }
            },
            retained_from=retained_from(previous, version, self.config.min_versions_to_retain),
            placement={p: {"executor_id": m["executor_id"], "host": m["host"]} for p, m in metas.items()},
            watermark_ms=new_watermark,
            metrics={
                "eviction_watermark_ms": watermark,
                "seconds": round(time.monotonic() - started, 3),
                "partitions": {p: {k: m[k] for k in PARTITION_METRICS} for p, m in metas.items()},
                "objects": {p: m["objects_written"] for p, m in metas.items()},
            },
            source=None if source is None else source.to_json(),
            writer=self.writer_id,
        )
        self.commit_log.write_commit(commit)
        return commit

    # ------------------------------------------------------------------ post-commit
    def _cleanup(self, commit: Any) -> None:
        """Post-commit cleanup: make what the retained versions need permanent, delete the rest."""
        from blobstate.state.retention import after_commit

        after_commit(self.store, commit, commit_log=self.commit_log)

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
        if self.on_batch is not None:
            self.on_batch(report)


def _split(table: pa.Table) -> tuple[pa.Table, dict[int, dict[str, Any]]]:
    """Separate output rows from the one metadata row per partition."""
    import pyarrow.compute as pc

    meta_column = table.column(META_COLUMN)
    is_meta = pc.is_valid(meta_column)
    metas: dict[int, dict[str, Any]] = {}
    for text in meta_column.filter(is_meta).to_pylist():
        meta = json.loads(text)
        if meta["partition"] in metas:
            raise BatchError(f"two commit metadata rows for partition {meta['partition']} in one execution")
        metas[meta["partition"]] = meta
    outputs = table.filter(pc.invert(is_meta)).drop_columns([META_COLUMN])
    return outputs, metas
