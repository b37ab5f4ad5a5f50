"""The processing stage's result: metadata to the driver, outputs to the sink without passing the driver.

The stage (``task.py``) emits per partition a header row with the attempt's uid, the output rows and
one metadata row. :func:`run_stage` persists that result on the executors and collects only the
metadata rows (one per partition) to the driver. The sink gets :attr:`StageResult.frame`, a view of the
persisted rows that checks, in each task and before passing any row on, that the partition's header
names the attempt the driver commits (``java/CommittedOutputs.java``). If a partition was recomputed by
another execution (its executor was lost, its cache evicted), the sink's job fails with
:class:`AttemptMismatchError`'s marker instead of handing rows of an uncommitted attempt to the sink, and
the driver runs the stage again (``BatchDriver``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.errors import PythonException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from blobstate.engine.task import META_COLUMN, UID_COLUMN
from blobstate.errors import BlobstateError

MISMATCH_MARKER = "blobstate-attempt-mismatch"
"""Text of the JVM error raised when persisted outputs come from another attempt (CommittedOutputs)."""


class StageFailedError(BlobstateError, RuntimeError):
    """A task of the processing stage failed; the message is the task's own exception."""


class AttemptMismatchError(BlobstateError, RuntimeError):
    """Persisted outputs of a partition came from another attempt than the committed one."""


def is_attempt_mismatch(error: BaseException) -> bool:
    """Whether ``error`` (from a sink's Spark job) is the committed-outputs check failing."""
    return MISMATCH_MARKER in str(error)


@dataclass
class StageResult:
    """One run of the processing stage: per-partition metadata and the sink's view of the outputs."""

    metas: dict[int, dict[str, Any]]
    frame: DataFrame
    persisted: DataFrame | None = None

    @property
    def output_rows(self) -> int:
        """Output rows of the batch, as the tasks counted them."""
        return sum(int(m.get("output_rows") or 0) for m in self.metas.values())

    def release(self) -> None:
        """Drop the persisted outputs (after the commit, or before running the stage again)."""
        if self.persisted is not None:
            self.persisted.unpersist(blocking=False)
            self.persisted = None


def run_stage(
    stage: DataFrame, helper: Any, num_partitions: int, what: str, worker_error: Any
) -> StageResult:
    """Run ``stage`` once, keeping its outputs on the executors; return its metadata and the sink's view.

    ``helper`` is the JVM helper (``placement.PlacementHelper``); ``what`` names the batch in errors;
    ``worker_error`` turns a Python worker's traceback into its last exception line.
    """
    stage.persist()
    result = StageResult({}, stage, persisted=stage)
    try:
        try:
            rows = stage.filter(F.col(META_COLUMN).isNotNull()).select(META_COLUMN).collect()
        except PythonException as error:
            raise StageFailedError(
                f"{what}: a task of the processing stage failed: {worker_error(str(error))}"
            ) from None
        result.metas = parse_metas([r[0] for r in rows], what)
        uids = [result.metas[p]["uid"] if p in result.metas else "" for p in range(num_partitions)]
        view = helper.committed_only(stage, UID_COLUMN, META_COLUMN, uids, what)
        result.frame = view.drop(UID_COLUMN, META_COLUMN)
        return result
    except BaseException:
        result.release()
        raise


def parse_metas(texts: list[str], what: str) -> dict[int, dict[str, Any]]:
    """The metadata rows of one execution of the stage, by partition."""
    metas: dict[int, dict[str, Any]] = {}
    for text in texts:
        meta = json.loads(text)
        if meta["partition"] in metas:
            raise BlobstateError(
                f"{what}: two metadata rows for partition {meta['partition']} in one execution"
            )
        metas[meta["partition"]] = meta
    return metas
