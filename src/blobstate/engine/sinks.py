"""Writer sinks: a batch's output written with ``DataFrameWriter`` in the same Spark job as its processing.

A sink given as a function (``sink(frame, batch_id)``, as ``foreachBatch``) may read its DataFrame any
number of times, so blobstate first runs the processing stage and keeps its outputs on the executors
(or brings small ones to the driver), then hands the sink a view of them: a second Spark job that
re-reads every output row. A :class:`WriterSink` says what the sink does instead (one
``frame.write.format(...).save()``), so the processing stage and the write run as one job: each task
writes its output rows as it produces them, and its metadata row (what the partition committed) comes
back to the driver through an accumulator, which Spark merges for successful tasks only. The driver
commits exactly the attempts whose rows the writer committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WriterSink:
    """Write each batch's output with ``frame.write.format(format).mode(mode).options(**options)``, then
    ``.partitionBy(*partition_by)`` if given, ``.save(path)`` (or ``.save()`` without a path).

    Pass it as ``transform_with_state(..., sink=WriterSink("parquet", "s3a://bucket/out"))``. It is also
    an ordinary sink function, so the result is the same with or without the single-job path. As with
    any sink, a batch replayed after a crash is written again: use a format and mode that make that
    harmless (or that you deduplicate downstream), as with ``foreachBatch``.
    """

    format: str
    path: str | None = None
    mode: str = "append"
    options: dict[str, str] = field(default_factory=dict)
    partition_by: Sequence[str] = ()

    def __call__(self, frame: Any, batch_id: int) -> None:
        """Write ``frame`` (one batch's output)."""
        writer = frame.write.format(self.format).mode(self.mode)
        if self.options:
            writer = writer.options(**{k: str(v) for k, v in self.options.items()})
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        if self.path is None:
            writer.save()
        else:
            writer.save(self.path)
