"""The ``StreamingQuery`` that :func:`blobstate.transform_with_state` returns.

It is Spark's own query object (same JVM query, same methods). The one difference: when a batch failed
for a reason blobstate knows, ``awaitTermination`` and ``processAllAvailable`` raise
:class:`BlobstateQueryError`, a ``StreamingQueryException`` whose first line is the cause, not Spark's
foreachBatch wrapper around pages of traceback: for :class:`ProcessorQueryError` the processor's own
exception with its handler, grouping key, partition and batch (then the processor's own frames, when
the task reported them); otherwise the blobstate error (a commit
by another driver, a checkpoint that does not match Spark's, a bad side row, ...) by class and message.
Spark's exception is its ``__cause__``.
"""

from __future__ import annotations

import re
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from blobstate.engine.driver import ProcessorFailedError, SinkFailedError
from blobstate.errors import QueryError


class BlobstateQueryError(QueryError, StreamingQueryException):
    """The query stopped because of a failure blobstate knows; the message starts with the cause."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


class ProcessorQueryError(BlobstateQueryError):
    """The query stopped because the processor (or the sink) raised; the message starts with what it
    raised."""


class BlobstateStreamingQuery(StreamingQuery):
    """Spark's ``StreamingQuery`` for one blobstate query (see the module docstring)."""

    def __init__(self, query: StreamingQuery, driver: Any) -> None:
        super().__init__(query._jsq)
        self.blobstate_driver = driver

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """As Spark's, raising the processor's failure first."""
        try:
            return super().awaitTermination(timeout)  # type: ignore[arg-type]  # Spark takes seconds as a float too
        except StreamingQueryException as error:
            raise self._surfaced(error) from error

    def processAllAvailable(self) -> None:
        """As Spark's, raising the processor's failure first."""
        try:
            super().processAllAvailable()
        except StreamingQueryException as error:
            raise self._surfaced(error) from error

    def awaitInputDrained(self) -> None:
        """Wait until every input row available now has been processed and committed (or the query
        stopped); raises the query's failure, cause first.

        Unlike Spark's ``processAllAvailable`` this returns also while no-data batches keep running: time
        mode ``ProcessingTime`` runs one per trigger for its timers, so Spark's wait never ends there.
        In that mode the input is drained once a batch that started after this call found no input
        rows; in time modes ``None`` and ``EventTime``, where no batch runs without a reason, it is
        Spark's own wait.
        """
        config = getattr(self.blobstate_driver, "config", None)
        if getattr(config, "time_mode", None) != "ProcessingTime":
            self.processAllAvailable()
            return
        reports = self.blobstate_driver.reports

        def batches() -> list[tuple[int, int, bool]]:
            return [(r.batch_id, r.input_rows, r.skipped) for r in list(reports)]

        seen = newest_batch(batches())
        while not drained_after(seen, batches()):
            if self.awaitTermination(0.1):
                return

    def stop(self) -> None:
        """As Spark's; also stops standby syncs (waiting for a running round) and forgets the query's
        ticks channel in the driver JVM."""
        super().stop()
        self.blobstate_driver.stop()

    def _surfaced(self, error: StreamingQueryException) -> StreamingQueryException:
        failure = getattr(self.blobstate_driver, "failure", None)
        if failure is None or isinstance(error, BlobstateQueryError):
            return error
        stopped = f"(the query stopped: {str(error).splitlines()[0]})"
        if isinstance(failure, ProcessorFailedError | SinkFailedError):
            frames = getattr(failure, "processor_traceback", "")
            where = f"The processor's traceback (most recent call last):\n{frames}" if frames else ""
            return ProcessorQueryError(f"{failure}\n{where}{stopped}")
        return BlobstateQueryError(f"{type(failure).__name__}: {failure}\n{stopped}")


def newest_batch(batches: list[tuple[int, int, bool]]) -> int:
    """The newest batch id among ``(batch id, input rows, skipped)`` entries (-1: none)."""
    return max((b for b, _, _ in batches), default=-1)


def drained_after(seen: int, batches: list[tuple[int, int, bool]]) -> bool:
    """Whether a batch that started after the newest one seen (``seen``) found no input rows: the input
    available then is processed. The first batch to finish after that moment may have started before
    it; every later one after."""
    return any(b > seen + 1 and rows == 0 and not skipped for b, rows, skipped in batches)


_REMOTE_FAILURE = re.compile(r"^blobstate(?:\.\w+)+\.(?P<cls>\w+): (?P<message>.+)$", re.MULTILINE)
"""The line a blobstate error ends a Python traceback with: ``blobstate.<module>.<Class>: <message>``."""

_PROCESSOR_FAILURES = {ProcessorFailedError.__name__, SinkFailedError.__name__}


def surfaced_from_text(error: StreamingQueryException) -> StreamingQueryException:
    """``error`` with blobstate's failure first when its text carries one (a query whose driver ran in
    a Spark Connect server): the error's first line from the failure's class name and message, found in
    the traceback Spark quotes; ``error`` itself when it carries none."""
    if isinstance(error, BlobstateQueryError):
        return error
    text = str(error)
    found = _REMOTE_FAILURE.search(text)
    if found is None:
        return error
    stopped = f"(the query stopped: {text.splitlines()[0]})"
    name, message = found.group("cls"), found.group("message").strip()
    if name in _PROCESSOR_FAILURES:
        return ProcessorQueryError(f"{message}\n{stopped}")
    return BlobstateQueryError(f"{name}: {message}\n{stopped}")


__all__ = [
    "BlobstateQueryError",
    "BlobstateStreamingQuery",
    "ProcessorQueryError",
    "drained_after",
    "newest_batch",
    "surfaced_from_text",
]
