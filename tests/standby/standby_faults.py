"""Fault injection for the multi-host tests: standby syncs whose delta reads are slow.

``slow_sync_task`` replaces ``blobstate.standby.syncer.run_sync_task`` in the driver of a test job
(workers import this module by name). Around the real blob store of a sync task only, every delta read
first sleeps ``DELAY_SECONDS``, so a failover meets a sync that is still running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

DELAY_SECONDS = 15.0


class SlowDeltas:
    """A blob store whose ``get`` of a delta sleeps first; everything else is the real store's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def get(self, name: str, *, max_bytes: int | None = None) -> bytes:
        """The real ``get``, late for deltas."""
        if name.endswith(".delta"):
            time.sleep(DELAY_SECONDS)
        return self._inner.get(name, max_bytes=max_bytes)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


def slow_sync_task(spec: Any, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``run_sync_task`` with slow delta reads (a Python worker runs one task at a time)."""
    import blobstate.batch.executor as task_module
    from blobstate.standby.sync_task import run_sync_task

    real = task_module.blob_store_for
    task_module.blob_store_for = lambda url: SlowDeltas(real(url))  # type: ignore[assignment]
    try:
        yield from run_sync_task(spec, batches)
    finally:
        task_module.blob_store_for = real  # type: ignore[assignment]
