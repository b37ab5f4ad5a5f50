"""Helpers for processor tests: run one batch through the runner and read its output as rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from blobstate.processor import RunStats, run_partition


def run(processor: Any, store: Any, data: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Run one batch (keyword defaults: key ``key``) and return the output rows as dicts, in order."""
    kwargs.setdefault("key_columns", ["key"])
    batches = list(run_partition(processor, store, data, **kwargs))
    if not batches:
        return []
    return pa.Table.from_batches(batches).to_pylist()


def run_with_stats(
    processor: Any, store: Any, data: Any, **kwargs: Any
) -> tuple[list[dict[str, Any]], RunStats]:
    """Like :func:`run`, also returning the run's statistics."""
    stats = RunStats()
    rows = run(processor, store, data, stats=stats, **kwargs)
    return rows, stats


def table(**columns: Any) -> pa.Table:
    """A pyarrow table from keyword columns (lists)."""
    return pa.table(columns)
