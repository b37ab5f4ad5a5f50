"""Which Spark executor the current Python task runs on.

The placement helper (``placement.py`` and ``java/PreferredLocations.java``) records the executor's id
and block-manager host in the task's local properties before the Python worker starts, so a task in
the processing stage reads them from ``TaskContext``. Without the helper, a fallback identity is built
from this machine's host name and the process id of the executor JVM that started the Python worker;
it is stable for the life of that executor but does not match Spark's executor ids.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

EXECUTOR_ID_PROPERTY = "blobstate.executor.id"
"""Task-local property set by the JVM helper: the executor id (``"driver"`` in local mode)."""

EXECUTOR_HOST_PROPERTY = "blobstate.executor.host"
"""Task-local property set by the JVM helper: the executor's block-manager host."""

FALLBACK_ID_PREFIX = "pid-"
"""Prefix of fallback executor ids (``pid-<executor JVM pid>``), which Spark never uses."""


@dataclass(frozen=True, order=True)
class ExecutorIdentity:
    """A Spark executor, as the scheduler knows it: its executor id and its host."""

    executor_id: str
    host: str

    @property
    def is_fallback(self) -> bool:
        """True when this identity was guessed in Python rather than reported by Spark."""
        return self.executor_id.startswith(FALLBACK_ID_PREFIX)


def current_executor() -> ExecutorIdentity:
    """The executor running the current Spark task.

    Inside a task of a stage placed by the helper, this is the identity Spark itself uses (the one
    ``PlacementHelper.executors()`` lists on the driver). Elsewhere (no helper, or not in a task) it
    is the fallback identity from ``fallback_executor()``.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None:
        try:
            executor_id = context.getLocalProperty(EXECUTOR_ID_PROPERTY)
            host = context.getLocalProperty(EXECUTOR_HOST_PROPERTY)
        except AttributeError:  # a TaskContext built without local properties
            executor_id = host = None
        if executor_id and host:
            return ExecutorIdentity(executor_id, host)
    return fallback_executor()


def fallback_executor() -> ExecutorIdentity:
    """This host's name and ``pid-<pid of the executor JVM>``: stable per executor process."""
    return ExecutorIdentity(f"{FALLBACK_ID_PREFIX}{_executor_process_pid()}", socket.gethostname())


def _executor_process_pid() -> int:
    """The pid of the process that started this Python worker, skipping PySpark's fork daemon."""
    parent = os.getppid()
    # Workers are normally forked by `python -m pyspark.daemon`, itself started by the executor JVM.
    if b"pyspark.daemon" in _read_proc(parent, "cmdline"):
        stat = _read_proc(parent, "stat").decode(errors="replace")
        # Fields after the ")" closing the command name: state, ppid, ...
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 2 and fields[1].isdigit():
            return int(fields[1])
    return parent


def _read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # not Linux, or the process is gone
        return b""
