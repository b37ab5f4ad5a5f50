"""The processing stage and a :class:`~blobstate.engine.sinks.WriterSink` as one Spark job.

The sink writes the stage's output rows as the tasks produce them (header and metadata rows dropped by
``java/WriteThrough.java``), and each task's metadata row reaches the driver through a collection
accumulator, which Spark merges for successful tasks only, once per task: the metadata the driver
commits is that of the attempts whose rows the writer committed. Nothing is persisted and no output
row is read twice.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.errors import PythonException
from pyspark.sql import DataFrame

from blobstate.batch.jvm import JvmSeam
from blobstate.engine.outputs import StageFailedError, StageResult, parse_metas
from blobstate.engine.task import MARKER_COLUMNS, META_COLUMN, UID_COLUMN


def write_through(
    stage: DataFrame,
    jvm: JvmSeam,
    sink: Callable[[DataFrame], None],
    what: str,
    worker_error: Callable[[str], str],
) -> StageResult:
    """Run ``stage`` inside ``sink``'s write; return the tasks' metadata and the frame the sink wrote.

    A Python worker's failure (the processor, or blobstate's task around it) raises
    :class:`StageFailedError` with the worker's last exception line; anything else the sink raises
    propagates. ``jvm`` taps the stage (``java/WriteThrough.java`` through the JVM seam).
    """
    tapped = jvm.write_through(stage, UID_COLUMN, META_COLUMN, what)
    frame = tapped.frame.drop(*MARKER_COLUMNS)
    try:
        sink(frame)
    except PythonException as error:
        raise StageFailedError(
            f"{what}: a task of the processing stage failed: {worker_error(str(error))}"
        ) from None
    return StageResult(parse_metas(tapped.metadata(), what), frame)
