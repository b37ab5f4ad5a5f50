"""A Python worker without blobstate, or without the module of the job's processor: the query is refused
at start, in one line naming the executors' Python and the fix (install blobstate there, or ship the
job's code); a batch's missing-module error names them too."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
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
    processor_modules,
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


def test_a_missing_module_of_the_job_is_told_to_be_shipped_not_installed_with_blobstate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3.11")
    message = worker_error(WORKER_TRACEBACK.replace("'blobstate'", "'fraud'"))
    assert message == (
        "ModuleNotFoundError: No module named 'fraud' (the executors' Python /usr/bin/python3.11 cannot"
        " import 'fraud', which the job imports: ship it with spark-submit --py-files fraud.py (or"
        " spark.submit.pyFiles / SparkContext.addPyFile), inside the packed environment, or as a wheel of"
        " the job; see the README's \"Shipping the job's own code\")"
    )
    # blobstate's dependencies, and theirs (dateutil comes with pandas), are installed with blobstate
    for module in ("rocksdict", "pyarrow.lib", "dateutil"):
        explained = explain_missing_module(f"ModuleNotFoundError: No module named '{module}'")
        assert "install blobstate for that interpreter" in explained and "--py-files" not in explained


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


def test_the_probe_finds_the_job_s_modules_without_importing_them(bare_python: Path, tmp_path: Path) -> None:
    # A package whose __init__ would fail if run: found by its search path, not imported.
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "jobs" / "scoring.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "fraud.py").write_text("raise RuntimeError('imported')\n")
    wanted = ("fraud", "jobs.scoring", "jobs.missing", "absent", "absent.scoring", "fraud.scoring")
    # As check_executors_python ships it: the by-value probe with the job's modules bound.
    shipped = cloudpickle.dumps(functools.partial(by_value(probe_worker), job_modules=wanted))
    run = (
        f"import pickle, sys; sys.path.insert(1, {str(tmp_path)!r});"
        " (r,) = pickle.loads(sys.stdin.buffer.read())(iter([]));"
        " print(repr(r)); print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('blobstate', 'fraud', 'jobs')))"
    )
    done = subprocess.run(
        [bare_python, "-c", run],
        input=shipped,
        capture_output=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    report_line, imported = done.stdout.decode().splitlines()
    assert imported == "[]"
    assert ast.literal_eval(report_line)["job_modules"] == {
        "fraud": True,
        "jobs.scoring": True,
        "jobs.missing": False,
        "absent": False,
        "absent.scoring": False,
        "fraud.scoring": False,  # fraud is a module, not a package
    }


def test_a_missing_module_of_the_processor_is_named_with_its_class_and_how_to_ship_it() -> None:
    report = {
        "executable": "/x/python",
        "python": "3.11.9",
        "found": dict.fromkeys(WORKER_MODULES, True),
        "job_modules": {"fraud": False},
        "blobstate": "0.1.0",
    }
    needed = {"fraud": "the module of the processor class fraud.FraudScorer"}
    assert worker_problem(report, "0.1.0", job_modules=needed) == (
        "the query did not start: the executors' Python /x/python (3.11.9) cannot import 'fraud', the module"
        " of the processor class fraud.FraudScorer: ship it with spark-submit --py-files fraud.py (or"
        " spark.submit.pyFiles / SparkContext.addPyFile), inside the packed environment, or as a wheel of"
        " the job; see the README's \"Shipping the job's own code\""
    )
    assert worker_problem({**report, "job_modules": {"fraud": True}}, "0.1.0", job_modules=needed) is None
    # Without blobstate too: both fixes, in one line.
    both = worker_problem(
        {**report, "found": {**report["found"], "blobstate": False}}, "0.1.0", job_modules=needed
    )
    assert both is not None and "\n" not in both
    assert "cannot import 'blobstate': install blobstate for that interpreter" in both
    assert both.endswith(
        "ship it with spark-submit --py-files fraud.py (or spark.submit.pyFiles /"
        " SparkContext.addPyFile), inside the packed environment, or as a wheel of the job;"
        " see the README's \"Shipping the job's own code\""
    )
    # A module of a package is shipped as the package's zip; several modules in one line.
    several = worker_problem(
        {**report, "job_modules": {"jobs.scoring": False, "rules": False}},
        None,
        job_modules={"jobs.scoring": "the module of the processor class jobs.scoring.Scorer"},
    )
    assert (
        several is not None
        and (
            "cannot import 'jobs.scoring' (the module of the processor class jobs.scoring.Scorer), 'rules'"
            " (which the job imports): ship them with spark-submit --py-files jobs.zip,rules.py"
        )
        in several
    )


JOB_MODULES = {
    "fraud_base": """
from blobstate.demo.running_count import RunningCount


class ScorerBase(RunningCount):
    pass
""",
    "fraud": """
from fraud_base import ScorerBase


class FraudScorer(ScorerBase):
    pass


def local_scorer():
    class LocalScorer(FraudScorer):
        pass

    return LocalScorer()
""",
}


@pytest.fixture
def job_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The module ``fraud`` of a job (its processor class subclasses ``fraud_base.ScorerBase``), importable
    here from a directory of its own; forgotten again after the test."""
    for name, source in JOB_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield importlib.import_module("fraud")
    finally:
        for name in JOB_MODULES:
            sys.modules.pop(name, None)


def test_the_modules_a_processor_needs_are_those_cloudpickle_pickles_it_by_reference_to(
    job_modules: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = "the module of fraud_base.ScorerBase, a base class of the processor class"
    assert processor_modules(job_modules.FraudScorer()) == {
        "fraud": "the module of the processor class fraud.FraudScorer",
        "fraud_base": f"{base} fraud.FraudScorer",
    }
    # A class defined in a function travels by value; its bases by reference.
    local = job_modules.local_scorer()
    assert set(processor_modules(local)) == {"fraud", "fraud_base"}
    # The driver's script's classes travel by value (as do a registered module's), blobstate's need nothing.
    with monkeypatch.context() as patch:
        patch.setattr(job_modules.FraudScorer, "__module__", "__main__")
        assert processor_modules(job_modules.FraudScorer()) == {"fraud_base": f"{base} __main__.FraudScorer"}
        cloudpickle.register_pickle_by_value(sys.modules["fraud_base"])
        try:
            assert processor_modules(job_modules.FraudScorer()) == {}
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules["fraud_base"])
    assert processor_modules(RunningCount()) == {}
    # What the probe is told to look for is what unpickling the processor imports.
    shipped = cloudpickle.dumps(job_modules.FraudScorer())
    for name in JOB_MODULES:
        del sys.modules[name]
    cloudpickle.loads(shipped)
    assert set(JOB_MODULES) <= set(sys.modules)


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


@pytest.mark.spark
def test_a_processor_whose_module_the_executors_lack_is_refused_at_start_then_runs_once_shipped(
    spark: Any, job_modules: Any, tmp_path: Path
) -> None:
    # The job's module is importable here (the driver), not by the session's workers (their PYTHONPATH
    # was fixed when it started): a processor of that module is pickled by reference, so the workers
    # would fail at the first batch with No module named 'fraud'.
    write_batch_files(tmp_path / "in", [kv_table([("a", 1), ("b", 2)])])

    sink = BatchRecorder()

    def start() -> Any:
        return blobstate.transform_with_state(
            file_stream(spark, tmp_path / "in", KV_DDL),
            key="key",
            processor=job_modules.FraudScorer(),
            output_schema=RUNNING_COUNT_OUTPUT,
            checkpoint=str(tmp_path / "ckpt"),
            sink=sink,
            local_dir=str(tmp_path / "local"),
        )

    active = len(spark.streams.active)
    with pytest.raises(ExecutorPythonError) as raised:
        start().stop()  # stop() reached only when the start was not refused
    worker = f"{spark.sparkContext.pythonExec} ({platform.python_version()})"
    assert str(raised.value) == (
        f"the query did not start: the executors' Python {worker} cannot import 'fraud' (the module of the"
        " processor class fraud.FraudScorer), 'fraud_base' (the module of fraud_base.ScorerBase, a base class"
        " of the processor class fraud.FraudScorer): ship them with spark-submit --py-files"
        " fraud.py,fraud_base.py (or spark.submit.pyFiles / SparkContext.addPyFile), inside the packed"
        " environment, or as a wheel of the job; see the README's \"Shipping the job's own code\""
    )
    assert len(spark.streams.active) == active and not (tmp_path / "ckpt").exists()

    # Shipped as the message says, the same query starts and runs its batch.
    for name in JOB_MODULES:
        spark.sparkContext.addPyFile(str(tmp_path / f"{name}.py"))
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sink.nonempty() == {0: [("a", 1, 1), ("b", 1, 2)]}
