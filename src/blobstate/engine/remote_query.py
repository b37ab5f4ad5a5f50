"""The ``StreamingQuery`` a query started from a Spark Connect client returns.

Over Spark Connect the batch driver runs in the server's Python, so a failure blobstate knows reaches
the client only as text inside Spark's ``StreamingQueryException`` (the foreachBatch worker's traceback,
the query's plan, the JVM's stack). :class:`RemoteStreamingQuery` is Spark's Connect query with the one
difference :class:`~blobstate.engine.handle.BlobstateStreamingQuery` makes on a classic session:
``awaitTermination`` and ``processAllAvailable`` raise a :class:`~blobstate.engine.handle.BlobstateQueryError`
whose first line is the cause. The cause is read from the text by class name and message only; nothing
from the server is executed or unpickled.
"""

from __future__ import annotations

from pyspark.errors import StreamingQueryException
from pyspark.sql.connect.streaming.query import StreamingQuery as ConnectStreamingQuery

from blobstate.engine.handle import drained_after, newest_batch, surfaced_from_text
from blobstate.engine.progress import progress_metrics


class RemoteStreamingQuery(ConnectStreamingQuery):
    """Spark's Connect ``StreamingQuery`` for one blobstate query (see the module docstring)."""

    _time_mode: str = "None"

    @classmethod
    def of(cls, query: ConnectStreamingQuery, time_mode: str) -> RemoteStreamingQuery:
        """The same query (session, id, run id, name) with blobstate's failures surfaced; ``time_mode``
        is the query's (for :meth:`awaitInputDrained`)."""
        remote = cls(query._session, query._query_id, query._run_id, query._name)
        remote._time_mode = time_mode
        return remote

    def awaitInputDrained(self) -> None:
        """As :meth:`BlobstateStreamingQuery.awaitInputDrained
        <blobstate.engine.handle.BlobstateStreamingQuery.awaitInputDrained>`, from the batches blobstate
        reported into the query's progress (``recentProgress``)."""
        if self._time_mode != "ProcessingTime":
            self.processAllAvailable()
            return
        seen = newest_batch(self._batches())
        while not drained_after(seen, self._batches()):
            if self.awaitTermination(0.1):
                return

    def _batches(self) -> list[tuple[int, int, bool]]:
        out = []
        for progress in self.recentProgress:
            metrics = progress_metrics(progress)
            if metrics:
                out.append((int(metrics["batchId"]), int(metrics["inputRows"]), bool(metrics["skipped"])))
        return out

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """As Spark's, raising blobstate's failure first."""
        try:
            return super().awaitTermination(timeout)  # type: ignore[arg-type]  # seconds as a float too
        except StreamingQueryException as error:
            raise surfaced_from_text(error) from error

    def processAllAvailable(self) -> None:
        """As Spark's, raising blobstate's failure first."""
        try:
            super().processAllAvailable()
        except StreamingQueryException as error:
            raise surfaced_from_text(error) from error


__all__ = ["RemoteStreamingQuery"]
