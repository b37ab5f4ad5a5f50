"""A Python worker that cannot import a module: the error names the executors' Python and the fix.

On a cluster the executors run their own Python (``PYSPARK_PYTHON`` when the SparkContext was created,
else ``python3``), not the driver's. When blobstate, one of its dependencies or the job's own module is
missing there, the task fails with ``No module named '...'``; :func:`explain_missing_module` appends
which interpreter that was and how to give it the package (README, "Deploying to a cluster").
"""

from __future__ import annotations

import os
import re

MISSING_MODULE = re.compile(r"No module named '([^']+)'")
"""The text of a ``ModuleNotFoundError`` and the module it names."""


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


def explain_missing_module(message: str) -> str:
    """``message`` (a Python worker's error line), with the executors' Python and the fix appended when
    it is a missing module; otherwise unchanged."""
    missing = MISSING_MODULE.search(message)
    if missing is None:
        return message
    return (
        f"{message} (the executors run the Python {executors_python()}, which cannot import"
        f" {missing.group(1)!r}: install blobstate for that interpreter, or ship an environment with"
        " blobstate installed through spark.archives and set PYSPARK_PYTHON to its python, see the README's"
        ' "Deploying to a cluster")'
    )
