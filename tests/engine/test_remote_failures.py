"""A failure blobstate knows, raised in a Spark Connect server's foreachBatch Python, reaches the client
as text inside Spark's ``StreamingQueryException``: ``surfaced_from_text`` puts its cause first, by class
name and message, and leaves any other failure as Spark raised it. The texts below have the shape a
PySpark 4 Connect client receives (taken from a real run, ids and paths shortened)."""

from __future__ import annotations

from pyspark.errors import StreamingQueryException

from blobstate.engine.handle import BlobstateQueryError, ProcessorQueryError, surfaced_from_text

HEAD = (
    "[STREAM_FAILED] Query [id = bebff9db, runId = 8b4c822f] terminated with exception: [PYTHON_EXCEPTION]"
    " [session: 3660e2ef] [userId: ] Found error inside foreachBatch Python process: Traceback (most recent"
    " call last):"
)


def _spark_text(last_line: str) -> str:
    return "\n".join(
        [
            HEAD,
            '  File "/site-packages/pyspark/sql/connect/streaming/worker/foreach_batch_worker.py", line 72',
            '  File "/src/blobstate/engine/remote.py", line 77, in __call__',
            "    self._driver(batch_df, batch_id)",
            '  File "/src/blobstate/engine/driver.py", line 319, in __call__',
            "    raise error.with_traceback(None) from None",
            last_line,
            " SQLSTATE: 38000 SQLSTATE: XXKST",
            "=== Streaming Query ===",
            "JVM stacktrace:",
            "org.apache.spark.sql.streaming.StreamingQueryException",
            f"Caused by: org.apache.spark.api.python.PythonException: {HEAD}",
            last_line,
        ]
    )


def test_a_processor_failure_in_the_server_comes_first() -> None:
    error = StreamingQueryException(
        message=_spark_text(
            "blobstate.engine.stage.ProcessorFailedError: batch 0: a task of the processing stage failed:"
            " ValueError: boom in the processor (in handleInputRows for grouping key ('a',)) (partition 0"
            " of operator 0, batch 0)"
        )
    )
    surfaced = surfaced_from_text(error)
    assert isinstance(surfaced, ProcessorQueryError)
    first = str(surfaced).splitlines()[0]
    assert first.startswith(
        "batch 0: a task of the processing stage failed: ValueError: boom in the processor"
    )
    assert "(partition 0 of operator 0, batch 0)" in first
    assert str(surfaced).splitlines()[1].startswith("(the query stopped: [STREAM_FAILED]")


def test_another_blobstate_failure_is_named_by_its_class() -> None:
    error = StreamingQueryException(
        message=_spark_text(
            "blobstate.engine.replay.SparkCheckpointMismatchError: Spark's checkpoint /c/_spark does not"
            " match the checkpoint's commit log"
        )
    )
    surfaced = surfaced_from_text(error)
    assert type(surfaced) is BlobstateQueryError
    assert str(surfaced).startswith("SparkCheckpointMismatchError: Spark's checkpoint /c/_spark does not")


def test_a_failure_that_is_not_blobstate_stays_sparks() -> None:
    error = StreamingQueryException(message=_spark_text("ValueError: the sink's own failure"))
    assert surfaced_from_text(error) is error
