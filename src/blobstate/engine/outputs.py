"""The processing stage's result: metadata to the driver, and the outputs for the sink.

The stage (``task.py``) emits per partition a header row with the attempt's uid, the output rows and
one metadata row. :func:`run_stage` persists that result on the executors and collects only the
metadata rows (one per partition) to the driver, in one Spark job.

Small outputs (``inline.py``): a partition whose outputs total at most the task's limit sends them in
its metadata row instead of as rows. When every partition did, the outputs reached the driver in the
same task results as the metadata, so they are the committed attempt's by construction: the persisted
stage is dropped at once and the sink gets a DataFrame of that local Arrow data (no second read of the
stage, nothing an executor loss can take away).

Otherwise the sink gets :attr:`StageResult.frame`, a view of the persisted rows that checks, in each task
and before passing any row on, that the partition's header names the attempt the driver commits
(``java/CommittedOutputs.java``), plus the inlined partitions' local rows. If a partition was recomputed
by another execution (its executor was lost, its cache evicted), the sink's job fails with
:class:`AttemptMismatchError`'s marker instead of handing rows of an uncommitted attempt to the sink, and
the driver runs the stage again (``BatchDriver``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.errors import PythonException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from blobstate.batch.contracts import JsonObject, JsonValue, TaskResult
from blobstate.batch.jvm import JvmSeam
from blobstate.engine.inline import OUTPUTS_COLUMN, read_payloads
from blobstate.engine.task import MARKER_COLUMNS, META_COLUMN, UID_COLUMN
from blobstate.errors import BlobstateError, QueryError

MISMATCH_MARKER = "blobstate-attempt-mismatch"
"""Text of the JVM error raised when persisted outputs come from another attempt (CommittedOutputs)."""


class StageFailedError(QueryError, RuntimeError):
    """A task of the processing stage failed; the message is the task's own exception.

    ``processor_traceback`` holds the processor's frames of a ``failed`` metadata row (``task.py``), for
    the query's handle to show after the message; empty when there are none.
    """

    def __init__(self, message: str, processor_traceback: str = "") -> None:
        super().__init__(message)
        self.processor_traceback = processor_traceback


class AttemptMismatchError(QueryError, RuntimeError):
    """Persisted outputs of a partition came from another attempt than the committed one."""


def is_attempt_mismatch(error: BaseException) -> bool:
    """Whether ``error`` (from a sink's Spark job) is the committed-outputs check failing."""
    return MISMATCH_MARKER in str(error)


@dataclass
class StageResult:
    """One run of the processing stage: per-partition metadata and the sink's view of the outputs."""

    results: dict[int, TaskResult]
    frame: DataFrame
    persisted: DataFrame | None = None
    inlined: int = 0
    """Partitions whose outputs came with their metadata (all of them: the sink reads no persisted row)."""
    shuffle_seconds: float = 0.0
    """Time spent preparing the stage's input (``BatchReport.shuffle_seconds``)."""
    submitted_at: float = 0.0
    """Wall-clock time the driver submitted this run's job (``recovery.py``)."""
    earlier_runs_seconds: float = 0.0
    """Time of the runs of the stage discarded before this one (their outputs were lost)."""
    tasks: int = 0
    """The stage's tasks (a task per partition, or per group of partitions)."""

    @property
    def output_rows(self) -> int:
        """Output rows of the batch, as the tasks counted them."""
        return sum(r.output_rows for r in self.results.values())

    def release(self) -> None:
        """Drop the persisted outputs (after the commit, or before running the stage again)."""
        if self.persisted is not None:
            self.persisted.unpersist(blocking=False)
            self.persisted = None


def run_stage(
    stage: DataFrame,
    jvm: JvmSeam,
    num_partitions: int,
    what: str,
    worker_error: Any,
    schema: StructType | None = None,
    groups: Sequence[Sequence[int]] = (),
) -> StageResult:
    """Run ``stage`` once, keeping its outputs on the executors; return its metadata and the sink's view.

    ``jvm`` is the JVM seam (the checked view of committed outputs, the inlined outputs' frame);
    ``what`` names the batch in errors; ``worker_error`` turns a Python worker's traceback into its last
    exception line; ``schema`` is the stage's (as given to ``mapInArrow``; by default asked of Spark);
    ``groups`` the state partitions of each task, in order (``groups.py``; empty: a task per partition).
    """
    stage.persist()
    result = StageResult({}, stage, persisted=stage, tasks=len(groups) or num_partitions)
    try:
        try:
            rows = stage.filter(F.col(META_COLUMN).isNotNull()).select(META_COLUMN, OUTPUTS_COLUMN).collect()
        except PythonException as error:
            raise StageFailedError(
                f"{what}: a task of the processing stage failed: {worker_error(str(error))}"
            ) from None
        result.results = parse_metas([r[0] for r in rows], what)
        payloads = {json.loads(r[0])["partition"]: bytes(r[1]) for r in rows if r[1] is not None}
        result.inlined = len(payloads)
        schema = StructType([f for f in (schema or stage.schema).fields if f.name not in MARKER_COLUMNS])
        local = local_frame(jvm, [payloads[p] for p in sorted(payloads)], schema)
        if len(payloads) == num_partitions:
            result.release()  # every output is on the driver: nothing for the sink to read from the stage
            result.frame = local  # type: ignore[assignment]
            return result
        uid = {p: r.uid for p, r in result.results.items()}
        tasks = groups or [(p,) for p in range(num_partitions)]
        uids = [",".join(uid.get(p, "") for p in group) for group in tasks]
        view = jvm.committed_only(stage, UID_COLUMN, META_COLUMN, uids, what)
        result.frame = view.drop(*MARKER_COLUMNS)
        if local is not None:
            result.frame = result.frame.unionByName(local)
        return result
    except BaseException:
        result.release()
        raise


def local_frame(jvm: JvmSeam, payloads: list[bytes], schema: StructType) -> DataFrame | None:
    """A DataFrame of inlined outputs (Arrow IPC streams) with the persisted view's ``schema``; None
    without any.

    The JVM reads the tasks' Arrow data as it reads a ``mapInArrow`` stage's (``ArrowConverters``), so
    values and types are those of the persisted path; this is what ``createDataFrame`` does for an Arrow
    table without its Python-side conversions (which the tasks' data does not need: it already has the
    stage's Arrow types), at half its cost (``JvmSeam.frame_from_arrow``).
    """
    if not payloads:
        return None
    return jvm.frame_from_arrow(read_payloads(payloads), schema)


def raise_failed(metas: Mapping[int, Mapping[str, JsonValue]], what: str) -> None:
    """Raise :class:`StageFailedError` with the first partition's exception if any task reported that the
    processor raised (its outputs, persisted or inlined, are never used: the caller drops the stage)."""
    failed = sorted(p for p, m in metas.items() if m.get("failed"))
    if not failed:
        return
    first = metas[failed[0]]["failed"]
    assert isinstance(first, dict)
    others = f" ({len(failed) - 1} more partition(s) failed too)" if len(failed) > 1 else ""
    raise StageFailedError(
        f"{what}: a task of the processing stage failed: {first['error']}{others}",
        first.get("traceback") or "",
    )


def parse_metas(texts: list[str], what: str) -> dict[int, TaskResult]:
    """The tasks' results of one execution of the stage, by partition; raises :class:`StageFailedError`
    when a task reported that the processor raised (``raise_failed``)."""
    metas: dict[int, JsonObject] = {}
    for text in texts:
        meta = json.loads(text)
        if meta["partition"] in metas:
            raise BlobstateError(
                f"{what}: two metadata rows for partition {meta['partition']} in one execution"
            )
        metas[meta["partition"]] = meta
    raise_failed(metas, what)
    return {p: TaskResult.from_json(m) for p, m in metas.items()}
