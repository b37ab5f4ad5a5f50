"""A Python worker that cannot import a module: the error names the executors' Python and the fix.

On a cluster the executors run their own Python (``PYSPARK_PYTHON`` when the SparkContext was created,
else ``python3``), not the driver's. When blobstate, one of its dependencies or the job's own module is
missing there, a task fails with ``No module named '...'``; :func:`explain_missing_module` appends
which interpreter that was and how to give it the package (README, "Deploying to a cluster").

:func:`check_executors_python` finds the common case before a query starts: one Spark task, which
imports nothing of blobstate's, reports the worker's interpreter and which of :data:`WORKER_MODULES` it
finds, so a missing package is one line at ``transform_with_state`` instead of a failed first batch.
"""

from __future__ import annotations

import builtins
import os
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from blobstate.errors import ConfigurationError, first_line

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")

MISSING_MODULE = re.compile(r"No module named '([^']+)'")
"""The text of a ``ModuleNotFoundError`` and the module it names."""

WORKER_MODULES = ("blobstate", "rocksdict", "pyarrow", "pandas", "numpy", "zstandard", "isal")
"""The top-level modules blobstate's tasks import in a Python worker (pyspark is Spark's own)."""


class ExecutorPythonError(ConfigurationError, ImportError):
    """The executors' Python cannot run blobstate's tasks: it misses a module they import, holds another
    blobstate version than the driver, or could not run a task at all. Raised before the query starts."""


def executors_python() -> str:
    """The interpreter the executors' Python workers run: the active SparkContext's ``pythonExec``, else
    ``$PYSPARK_PYTHON``, else ``python3`` (PySpark's default)."""
    try:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
    except Exception:  # no pyspark, or no classic SparkContext (Spark Connect)
        context = None
    if context is not None and getattr(context, "pythonExec", None):
        return str(context.pythonExec)
    return os.environ.get("PYSPARK_PYTHON") or "python3"


def cannot_import(python: str, modules: Sequence[str]) -> str:
    """Which Python the executors run, that it cannot import ``modules``, and the ways to fix it."""
    names = ", ".join(repr(m) for m in modules)
    return (
        f"the executors run the Python {python}, which cannot import {names}: install blobstate for that"
        " interpreter, set PYSPARK_PYTHON (spark.pyspark.python) to a Python that has it, or ship an"
        " environment with blobstate installed through spark.archives and set PYSPARK_PYTHON to its"
        ' python, see the README\'s "Deploying to a cluster"'
    )


def explain_missing_module(message: str) -> str:
    """``message`` (a Python worker's error line), with the executors' Python and the fix appended when
    it is a missing module; otherwise unchanged."""
    missing = MISSING_MODULE.search(message)
    if missing is None:
        return message
    return f"{message} ({cannot_import(executors_python(), [missing.group(1)])})"


def worker_error(text: str) -> str:
    """The exception lines of a Python worker's traceback text (the last exception and its notes)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    tail: list[str] = []
    for line in reversed(lines):
        if line.startswith((" ", "\t")) or line.startswith("Traceback"):
            break
        tail.append(line)
    return explain_missing_module(" ".join(reversed(tail)) or (lines[-1] if lines else text))


def probe_worker(_: Iterable[object], modules: Sequence[str] = WORKER_MODULES) -> Iterator[dict[str, Any]]:
    """Run in a Python worker: its interpreter and Python version, which of ``modules`` it finds and
    blobstate's installed version (None when not installed as a distribution).

    Imports only the standard library and cannot fail; Spark ships it by value (:func:`by_value`), so the
    worker never imports blobstate to run it.
    """
    import importlib.metadata
    import importlib.util
    import platform
    import sys

    found = {}
    for name in modules:
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found[name] = False
    try:
        version: str | None = importlib.metadata.version("blobstate")
    except Exception:  # not installed as a distribution, or unreadable metadata
        version = None
    yield {
        "executable": sys.executable,
        "python": platform.python_version(),
        "found": found,
        "blobstate": version,
    }


def by_value(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` rebuilt outside its module (same code and defaults, globals of its own).

    cloudpickle pickles a function of an importable module by reference, so a worker would import that
    module, blobstate, to run it; a function no module holds is pickled with its code. ``function`` may
    use builtins and its arguments only.
    """
    assert isinstance(function, types.FunctionType), function
    return types.FunctionType(
        function.__code__, {"__builtins__": builtins}, function.__name__, function.__defaults__
    )


def driver_blobstate_version() -> str | None:
    """The driver's installed blobstate version (distribution metadata, as the probe reads it)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("blobstate")
    except importlib.metadata.PackageNotFoundError:
        return None


def worker_problem(
    report: Mapping[str, Any], driver_version: str | None, refused: str = "the query did not start"
) -> str | None:
    """What keeps the worker of ``report`` (:func:`probe_worker`'s) from running blobstate's tasks, as one
    line starting with ``refused``, or None: modules it cannot import, or a blobstate version other than
    ``driver_version`` (when both are known)."""
    python = f"{report['executable']} ({report['python']})"
    missing = [name for name, found in report["found"].items() if not found]
    if missing:
        return f"{refused}: {cannot_import(python, missing)}"
    worker_version = report.get("blobstate")
    if driver_version and worker_version and worker_version != driver_version:
        return (
            f"{refused}: the driver runs blobstate {driver_version} and the executors' Python"
            f" {python} has blobstate {worker_version}: install the same version on both, see the README's"
            ' "Upgrading"'
        )
    return None


_CHECKED: set[tuple[str, str, str | None]] = set()
"""The (application, worker Python, driver's blobstate version) whose check passed in this process."""


def check_executors_python(spark: SparkSession, refused: str = "the query did not start") -> None:
    """Run :func:`probe_worker` as one Spark task; raise :class:`ExecutorPythonError` (one line) when the
    worker's Python misses a module of :data:`WORKER_MODULES`, holds another blobstate version than the
    driver, or cannot run the task; the message starts with ``refused`` (what did not start).

    A check that passed is not repeated for the same SparkContext and worker Python (both fixed when
    the context was created); one that failed is, so a query started again after the fix runs. Nothing
    to check on a Spark Connect session (no SparkContext here).
    """
    if getattr(spark, "_jsparkSession", None) is None:
        return
    from py4j.protocol import Py4JJavaError

    context = spark.sparkContext
    driver_version = driver_blobstate_version()
    checked = (context.applicationId, str(context.pythonExec), driver_version)
    if checked in _CHECKED:
        return
    description = context.getLocalProperty("spark.job.description")
    context.setJobDescription("blobstate: check the executors' Python")
    try:
        (report,) = context.parallelize([0], 1).mapPartitions(by_value(probe_worker)).collect()
    except Py4JJavaError as error:
        raise ExecutorPythonError(
            f"{refused}: the executors could not run a task in the Python {executors_python()}:"
            f" {_task_failure(error)}"
        ) from None
    finally:
        context.setLocalProperty("spark.job.description", description)  # type: ignore[arg-type]
    problem = worker_problem(report, driver_version, refused)
    if problem is not None:
        raise ExecutorPythonError(problem)
    _CHECKED.add(checked)


def _task_failure(error: Exception) -> str:
    """The failed task's own error of a failed Spark job, in one line."""
    java = getattr(error, "java_exception", None)
    cause = java.getCause() if java is not None else None
    if cause is None:
        return first_line(error)
    return worker_error(str(cause.getMessage()))
