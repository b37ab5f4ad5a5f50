"""A Python worker without blobstate: the batch's error names the executors' Python and the fix."""

from __future__ import annotations

import pytest
from pyspark import SparkContext

from blobstate.engine.driver import worker_error
from blobstate.engine.executor_python import executors_python, explain_missing_module

WORKER_TRACEBACK = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/opt/spark/python/lib/pyspark.zip/pyspark/worker.py", line 2206, in main
    func, profiler, deserializer, serializer = read_udfs(pickleSer, infile, eval_type)
  File "/opt/spark/python/lib/pyspark.zip/pyspark/serializers.py", line 174, in _read_with_length
    return self.loads(obj)
ModuleNotFoundError: No module named 'blobstate'
"""


def test_a_missing_module_on_the_executors_names_their_python_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3.11")
    message = worker_error(WORKER_TRACEBACK)
    assert message.startswith("ModuleNotFoundError: No module named 'blobstate' (the executors run")
    assert "/usr/bin/python3.11" in message and "spark.archives" in message and "\n" not in message


def test_without_pyspark_python_the_executors_run_python3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert executors_python() == "python3"


def test_other_worker_errors_are_unchanged() -> None:
    line = "ValueError: negative count for key 'a'"
    assert explain_missing_module(line) == line
