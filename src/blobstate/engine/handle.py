"""The ``StreamingQuery`` that :func:`blobstate.transform_with_state` returns.

It is Spark's own query object (same JVM query, same methods). The one difference: when a batch failed
because the processor raised, ``awaitTermination`` and ``processAllAvailable`` raise
:class:`ProcessorQueryError`, a ``StreamingQueryException`` whose first line is the processor's own
exception with its handler, grouping key, partition and batch, not Spark's foreachBatch wrapper around
pages of worker traceback. The original exception is its ``__cause__``.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from blobstate.errors import BlobstateError


class ProcessorQueryError(BlobstateError, StreamingQueryException):
    """The query stopped because the processor raised; the message starts with what it raised."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


class BlobstateStreamingQuery(StreamingQuery):
    """Spark's ``StreamingQuery`` for one blobstate query (see the module docstring)."""

    def __init__(self, query: StreamingQuery, driver: Any) -> None:
        super().__init__(query._jsq)
        self.blobstate_driver = driver

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        """As Spark's, raising the processor's failure first."""
        try:
            return super().awaitTermination(timeout)
        except StreamingQueryException as error:
            raise self._surfaced(error) from error

    def processAllAvailable(self) -> None:
        """As Spark's, raising the processor's failure first."""
        try:
            super().processAllAvailable()
        except StreamingQueryException as error:
            raise self._surfaced(error) from error

    def stop(self) -> None:
        """As Spark's; also stops standby syncs (waiting for a running round) and forgets the query's
        ticks channel in the driver JVM."""
        super().stop()
        syncer = getattr(self.blobstate_driver, "syncer", None)
        if syncer is not None:
            syncer.stop()
            syncer.wait(60)
        ticks = getattr(self.blobstate_driver, "ticks", None)
        if ticks is not None:
            ticks.release()

    def _surfaced(self, error: StreamingQueryException) -> StreamingQueryException:
        failure = getattr(self.blobstate_driver, "failure", None)
        if failure is None or isinstance(error, ProcessorQueryError):
            return error
        return ProcessorQueryError(f"{failure}\n(the query stopped: {str(error).splitlines()[0]})")


__all__ = ["BlobstateStreamingQuery", "ProcessorQueryError"]
