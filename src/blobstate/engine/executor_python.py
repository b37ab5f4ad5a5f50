"""A Python worker that cannot import a module: the error names the executors' Python and the fix.

On a cluster the executors run their own Python (``PYSPARK_PYTHON`` when the SparkContext was created,
else ``python3``), not the driver's. When blobstate, one of its dependencies or the job's own module is
missing there, a task fails with ``No module named '...'``; :func:`explain_missing_module` appends
which interpreter that was and the fix: for blobstate or a module of its dependencies, how to give that
Python the package (README, "Deploying to a cluster"); for any other module, the job's own code, how to
ship it (README, "Shipping the job's own code").

:func:`check_executors_python` finds the common cases before a query starts: one Spark task, which
imports nothing of blobstate's, reports the worker's interpreter, which of :data:`WORKER_MODULES` it
finds and whether it finds the modules the processor's class needs (:func:`processor_modules`: cloudpickle
pickles a class of an importable module by reference, so the worker imports that module to unpickle the
processor), so a missing package or job module is one line at ``transform_with_state`` instead of a
failed first batch.
"""

from __future__ import annotations

import builtins
import functools
import os
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from blobstate.batch.jvm import JvmSeam, ProbeFailedError
from blobstate.errors import ConfigurationError

T = TypeVar("T")

MISSING_MODULE = re.compile(r"No module named '([^']+)'")
"""The text of a ``ModuleNotFoundError`` and the module it names."""

WORKER_MODULES = ("blobstate", "rocksdict", "pyarrow", "pandas", "numpy", "zstandard", "isal")
"""The top-level modules blobstate's tasks import in a Python worker (pyspark is Spark's own)."""

NOT_THE_JOBS = frozenset({*WORKER_MODULES, "__main__", "builtins", "pyspark", "py4j", "pyspark_blobstate"})
"""Top-level modules that are never the job's own code: blobstate's, its tasks' dependencies, Spark's,
and ``__main__`` (cloudpickle ships what the driver's script defines by value)."""

JOB_CODE_SECTION = "Shipping the job's own code"
"""The README section on how the job's modules reach the executors."""


class ExecutorPythonError(ConfigurationError, ImportError):
    """The executors' Python cannot run the query's tasks: it misses a module they import (blobstate's, a
    dependency's, or the job's own module of the processor's class), holds another blobstate version than
    the driver, or could not run a task at all. Raised before the query starts."""


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


def cannot_import_job_code(python: str, needed: Mapping[str, str]) -> str:
    """That the executors' Python cannot import the job's modules ``needed`` (module name: what needs it,
    e.g. "the module of the processor class fraud.FraudScorer") and the ways to ship them."""
    if len(needed) == 1:
        ((module, why),) = needed.items()
        names = f"{module!r}, {why}"
    else:
        names = ", ".join(f"{module!r} ({why})" for module, why in needed.items())
    files = ",".join(dict.fromkeys(_py_file(module) for module in needed))
    return (
        f"the executors' Python {python} cannot import {names}: ship {'it' if len(needed) == 1 else 'them'}"
        f" with spark-submit --py-files {files} (or spark.submit.pyFiles / SparkContext.addPyFile), inside"
        f' the packed environment, or as a wheel of the job; see the README\'s "{JOB_CODE_SECTION}"'
    )


def _py_file(module: str) -> str:
    """What ``--py-files`` takes for ``module`` as the driver sees it: ``fraud.py`` for a top-level module,
    ``jobs.zip`` (the package zipped) for a module of the package ``jobs``."""
    top = module.split(".")[0]
    if "." in module:
        return f"{top}.zip"
    try:
        import importlib.util

        spec = importlib.util.find_spec(top)  # top-level: finds, imports nothing
    except (ImportError, ValueError):
        spec = None
    return f"{top}.zip" if spec is not None and spec.submodule_search_locations is not None else f"{top}.py"


@functools.cache
def blobstate_modules() -> frozenset[str]:
    """The top-level modules of blobstate and of every distribution it depends on, directly or not, as
    installed here (extras left out), with :data:`NOT_THE_JOBS`: the modules whose absence on the
    executors is fixed by installing blobstate there, not by shipping the job's code."""
    import importlib.metadata

    wanted: set[str] = set()
    todo = ["blobstate"]
    while todo:
        name = _canonical(todo.pop())
        if name in wanted:
            continue
        wanted.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            _, _, marker = requirement.partition(";")
            named = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
            if named is not None and "extra" not in marker:
                todo.append(named.group(1))
    owners = importlib.metadata.packages_distributions()
    ours = {module for module, dists in owners.items() if any(_canonical(d) in wanted for d in dists)}
    return frozenset(ours | NOT_THE_JOBS)


def _canonical(distribution: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def explain_missing_module(message: str) -> str:
    """``message`` (a Python worker's error line), with the executors' Python and the fix appended when
    it is a missing module; otherwise unchanged. The fix for blobstate or a module of its dependencies
    (:func:`blobstate_modules`) is to install blobstate for that Python; for any other module, the job's
    own code, to ship it (:func:`cannot_import_job_code`)."""
    missing = MISSING_MODULE.search(message)
    if missing is None:
        return message
    module = missing.group(1)
    if module.split(".")[0] in blobstate_modules():
        return f"{message} ({cannot_import(executors_python(), [module])})"
    return f"{message} ({cannot_import_job_code(executors_python(), {module: 'which the job imports'})})"


def _is_job_module(module: str) -> bool:
    """Whether ``module`` may be the job's own code: not the standard library's, Spark's, blobstate's or
    its tasks' dependencies', not ``__main__``."""
    top = module.split(".")[0]
    return top not in NOT_THE_JOBS and top not in sys.stdlib_module_names


def _by_reference(cls: type) -> bool:
    """Whether Spark's cloudpickle pickles ``cls`` by reference (the unpickling worker imports its
    module): a class its module holds under its name, of a module neither ``__main__`` nor registered
    with ``cloudpickle.register_pickle_by_value``."""
    try:
        from pyspark.cloudpickle import cloudpickle
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return cls.__module__ != "__main__"
    should: Callable[[object], bool] | None = getattr(cloudpickle, "_should_pickle_by_reference", None)
    if should is None:  # pragma: no cover - another cloudpickle
        return cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__
    return bool(should(cls))


def processor_modules(processor: object) -> dict[str, str]:
    """The job's modules an executor imports to unpickle ``processor``, each with what needs it: the module
    of its class and of each base class that cloudpickle pickles by reference. A class the driver's script
    defines (``__main__``) travels by value and needs none; the standard library, Spark, blobstate and its
    tasks' dependencies are not the job's (:data:`WORKER_MODULES` covers those)."""
    cls = type(processor)
    shown = f"{cls.__module__}.{cls.__qualname__}"
    needed: dict[str, str] = {}
    for klass in cls.__mro__:
        module = klass.__module__
        if module in needed or not _is_job_module(module) or not _by_reference(klass):
            continue
        needed[module] = (
            f"the module of the processor class {shown}"
            if klass is cls
            else f"the module of {module}.{klass.__qualname__}, a base class of the processor class {shown}"
        )
    return needed


def worker_error(text: str) -> str:
    """The exception lines of a Python worker's traceback text (the last exception and its notes)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    tail: list[str] = []
    for line in reversed(lines):
        if line.startswith((" ", "\t")) or line.startswith("Traceback"):
            break
        tail.append(line)
    return explain_missing_module(" ".join(reversed(tail)) or (lines[-1] if lines else text))


def probe_worker(
    _: Iterable[object], modules: Sequence[str] = WORKER_MODULES, job_modules: Sequence[str] = ()
) -> Iterator[dict[str, Any]]:
    """Run in a Python worker: its interpreter and Python version, which of ``modules`` (top-level names)
    it finds, which of the job's ``job_modules`` (dotted names) it finds and blobstate's installed version
    (None when not installed as a distribution).

    Imports only the standard library and cannot fail; Spark ships it by value (:func:`by_value`), so the
    worker never imports blobstate to run it. A dotted name is looked for package by package in the
    package's search path, so none of the job's code runs either.
    """
    import importlib.machinery
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
    job = {}
    for name in job_modules:
        parts = name.split(".")
        try:
            spec = importlib.util.find_spec(parts[0])
            for depth in range(2, len(parts) + 1):
                if spec is None or spec.submodule_search_locations is None:
                    spec = None
                    break
                spec = importlib.machinery.PathFinder.find_spec(
                    ".".join(parts[:depth]), list(spec.submodule_search_locations)
                )
            job[name] = spec is not None
        except Exception:  # a finder that fails: the import would fail too
            job[name] = False
    try:
        version: str | None = importlib.metadata.version("blobstate")
    except Exception:  # not installed as a distribution, or unreadable metadata
        version = None
    yield {
        "executable": sys.executable,
        "python": platform.python_version(),
        "found": found,
        "job_modules": job,
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
    report: Mapping[str, Any],
    driver_version: str | None,
    refused: str = "the query did not start",
    job_modules: Mapping[str, str] | None = None,
) -> str | None:
    """What keeps the worker of ``report`` (:func:`probe_worker`'s) from running the query's tasks, as one
    line starting with ``refused``, or None: modules of blobstate's it cannot import, modules of the job
    it cannot import (``job_modules``: module name: what needs it, as :func:`processor_modules` gives),
    or a blobstate version other than ``driver_version`` (when both are known)."""
    python = f"{report['executable']} ({report['python']})"
    missing = [name for name, found in report["found"].items() if not found]
    described = job_modules or {}
    job_missing = {
        name: described.get(name, "which the job imports")
        for name, found in report.get("job_modules", {}).items()
        if not found
    }
    problems = []
    if missing:
        problems.append(cannot_import(python, missing))
    if job_missing:
        problems.append(cannot_import_job_code(python, job_missing))
    if problems:
        return f"{refused}: {'; '.join(problems)}"
    worker_version = report.get("blobstate")
    if driver_version and worker_version and worker_version != driver_version:
        return (
            f"{refused}: the driver runs blobstate {driver_version} and the executors' Python"
            f" {python} has blobstate {worker_version}: install the same version on both, see the README's"
            ' "Upgrading"'
        )
    return None


_CHECKED: dict[tuple[str, str, str | None], set[str]] = {}
"""The (application, worker Python, driver's blobstate version) whose check passed in this process, with
the job's modules it found."""


def check_executors_python(
    jvm: JvmSeam,
    refused: str = "the query did not start",
    job_modules: Mapping[str, str] | None = None,
) -> None:
    """Run :func:`probe_worker` as one Spark task (``JvmSeam.run_probe``); raise
    :class:`ExecutorPythonError` (one line) when the worker's Python misses a module of
    :data:`WORKER_MODULES` or of ``job_modules`` (module name: what needs it, :func:`processor_modules` of
    the query's processor), holds another blobstate version than the driver, or cannot run the task; the
    message starts with ``refused`` (what did not start).

    A check that passed is not repeated for the same SparkContext and worker Python (both fixed when
    the context was created) unless another job module is needed; one that failed is, so a query started
    again after the fix runs. Nothing to check on a Spark Connect session (no SparkContext here).
    """
    worker = jvm.python_worker()
    if worker is None:
        return
    driver_version = driver_blobstate_version()
    checked = (*worker, driver_version)
    needed = dict(job_modules or {})
    if checked in _CHECKED and _CHECKED[checked].issuperset(needed):
        return
    probe = functools.partial(by_value(probe_worker), job_modules=tuple(needed))
    try:
        report = jvm.run_probe(probe, "blobstate: check the executors' Python")
    except ProbeFailedError as error:
        raise ExecutorPythonError(
            f"{refused}: the executors could not run a task in the Python {executors_python()}: {error}"
        ) from None
    problem = worker_problem(report, driver_version, refused, needed)
    if problem is not None:
        raise ExecutorPythonError(problem)
    _CHECKED.setdefault(checked, set()).update(needed)
