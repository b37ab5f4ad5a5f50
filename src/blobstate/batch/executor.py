"""Where the current Python task runs: its Spark executor, its local directory, its blob store client.

The JVM helper (``java/PreferredLocations.java``, loaded by the classic JVM seam) records the executor's id
and block-manager host in the task's local properties before the Python worker starts, so a task in
the processing stage reads them from ``TaskContext``. Without the helper, a fallback identity is built
from this machine's host name and the process id of the executor JVM that started the Python worker;
it is stable for the life of that executor but does not match Spark's executor ids.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blobstate.blobstore import BlobStore

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
    ``JvmSeam.executors()`` lists on the driver). Elsewhere (no helper, or not in a task) it
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


def default_local_dir() -> str:
    """Where executors keep working stores, local checkpoints and standby replicas by default: the
    executor's own temporary directory (evaluated in the task, on the executor, never on the driver)."""
    return os.path.join(tempfile.gettempdir(), f"blobstate-{os.getuid()}")


def resolve_local_dir(configured: str) -> str:
    """The local directory a task uses: ``configured``, or the executor's default when empty."""
    return configured or default_local_dir()


_STORES: dict[str, BlobStore] = {}


def blob_store_for(url: str) -> BlobStore:
    """One blob store client per Python worker process and checkpoint URL (workers are reused); the URL
    carries the store's options as its query (``engine.config.checkpoint_store_url``)."""
    from blobstate.blobstore import open_blob_store

    store = _STORES.get(url)
    if store is None:
        store = _STORES[url] = open_blob_store(url)
    return store


def location_string(identity: ExecutorIdentity) -> str:
    """Spark's preferred-location string for an executor: ``executor_<host>_<executor id>``."""
    if "_" in identity.host:
        # Spark's TaskLocation parser splits host and executor id at the first "_".
        raise ValueError(f"executor host {identity.host!r} contains '_' and cannot be a preferred location")
    return f"executor_{identity.host}_{identity.executor_id}"


def wait_for_hosts(
    hosts: Collection[str],
    executors: Callable[[], list[ExecutorIdentity]],
    timeout_seconds: float,
    *,
    poll_seconds: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[ExecutorIdentity]:
    """The executors alive once one runs on each of ``hosts``, or when ``timeout_seconds`` have passed.

    A restarted driver's executors register some seconds after the application starts; planning before
    those on the hosts the last commit placed its partitions would move the partitions away from their
    working stores for nothing. ``executors`` lists the executors alive now.
    """
    alive = executors()
    deadline = clock() + timeout_seconds
    while not set(hosts) <= {e.host for e in alive} and clock() < deadline:
        sleep(poll_seconds)
        alive = executors()
    return alive
