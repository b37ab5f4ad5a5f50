"""A Python worker without blobstate: the query is refused at start, in one line naming the executors'
Python and the fix; a batch's missing-module error names them too."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    KV_DDL,
    RUNNING_COUNT_OUTPUT,
    BatchRecorder,
    RunningCount,
    file_stream,
    kv_table,
    write_batch_files,
)
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyspark import SparkContext, cloudpickle

import blobstate
from blobstate.engine.driver import worker_error
from blobstate.engine.executor_python import (
    WORKER_MODULES,
    ExecutorPythonError,
    by_value,
    executors_python,
    explain_missing_module,
    probe_worker,
    worker_problem,
)

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


# ---------------------------------------------------------------------------------------------- at start
def _venv_python(wrapper: Path) -> Path:
    return wrapper.parent / "venv" / "bin" / "python"


def test_the_probe_runs_in_a_python_without_blobstate_and_names_what_it_misses(bare_python: Path) -> None:
    # Pickled as Spark ships it; a probe pickled by reference would make the worker import blobstate.
    shipped = cloudpickle.dumps(by_value(probe_worker))
    run = (
        "import pickle, sys; (r,) = pickle.loads(sys.stdin.buffer.read())(iter([]));"
        " print(repr(r)); print('blobstate' in sys.modules)"
    )
    done = subprocess.run(
        [bare_python, "-c", run],
        input=shipped,
        capture_output=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    report_line, imported = done.stdout.decode().splitlines()
    report = ast.literal_eval(report_line)
    assert imported == "False"
    assert (
        report["executable"] == str(_venv_python(bare_python))
        and report["python"] == platform.python_version()
    )
    assert not any(report["found"].values()) and report["blobstate"] is None, report
    problem = worker_problem(report, "0.1.0")
    assert problem is not None and "\n" not in problem
    assert (
        f"the executors run the Python {_venv_python(bare_python)} ({platform.python_version()})" in problem
    )
    assert "cannot import 'blobstate', 'rocksdict', 'pyarrow'" in problem and "PYSPARK_PYTHON" in problem


def test_another_blobstate_version_on_the_executors_is_named_with_both_versions() -> None:
    report = {
        "executable": "/opt/py/bin/python3.11",
        "python": "3.11.9",
        "found": dict.fromkeys(WORKER_MODULES, True),
    }
    problem = worker_problem({**report, "blobstate": "0.0.9"}, "0.1.0")
    assert problem is not None and "\n" not in problem
    assert (
        "driver runs blobstate 0.1.0" in problem
        and "/opt/py/bin/python3.11 (3.11.9) has blobstate 0.0.9" in problem
    )
    assert worker_problem({**report, "blobstate": "0.1.0"}, "0.1.0") is None
    assert worker_problem({**report, "blobstate": None}, "0.1.0") is None  # a source checkout: not compared


def test_the_probe_looks_for_every_installed_module_a_task_imports() -> None:
    # Every dependency of blobstate that importing a task's code loads is one the probe looks for.
    imports = (
        "import sys, blobstate.engine.task; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", imports], capture_output=True, text=True, check=True
    ).stdout.split()
    owners = importlib.metadata.packages_distributions()
    required = {
        canonicalize_name(Requirement(r).name)
        for r in importlib.metadata.requires("blobstate") or []
        if Requirement(r).marker is None
    }
    imported_deps = {canonicalize_name(d) for m in loaded for d in owners.get(m, [])} & required
    checked = {canonicalize_name(d) for m in WORKER_MODULES for d in owners.get(m, [])}
    assert imported_deps - {"pyspark"} <= checked, imported_deps - checked


@pytest.mark.spark
def test_a_query_whose_executors_lack_blobstate_is_refused_at_start_in_one_line(
    spark: Any, bare_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SparkContext's functions carry its pythonExec: set here, this session's workers run the bare Python.
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(bare_python))
    write_batch_files(tmp_path / "in", [kv_table([("a", 1)])])
    active = len(spark.streams.active)
    with pytest.raises(ExecutorPythonError) as raised:
        query = blobstate.transform_with_state(
            file_stream(spark, tmp_path / "in", KV_DDL),
            key="key",
            processor=RunningCount(),
            output_schema=RUNNING_COUNT_OUTPUT,
            checkpoint=str(tmp_path / "ckpt"),
            sink=BatchRecorder(),
            local_dir=str(tmp_path / "local"),
        )
        query.stop()  # reached only when the start was not refused
    message = str(raised.value)
    assert "\n" not in message and message.startswith("the query did not start: the executors run the Python")
    assert str(_venv_python(bare_python)) in message and "cannot import 'blobstate'" in message
    assert (
        len(spark.streams.active) == active and not (tmp_path / "ckpt").exists()
    )  # no batch, nothing written
