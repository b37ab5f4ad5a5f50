"""Helpers for processor tests: run one batch through the runner and read its output as rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from blobstate.processor import RunInputs, RunSpec, RunStats, run_partition


def run_batches(processor: Any, store: Any, data: Any, **kwargs: Any) -> list[pa.RecordBatch]:
    """:func:`run_partition` with its options as keywords: the ``RunSpec`` fields, ``initial_state``,
    ``adjuncts``, ``stats``, and ``max_event_time`` (a one-item list that receives the input's largest
    event time)."""
    max_event_time = kwargs.pop("max_event_time", None)
    stats = kwargs.pop("stats", None) or RunStats()
    inputs = RunInputs(kwargs.pop("initial_state", None), kwargs.pop("adjuncts", None) or {})
    batches = list(run_partition(processor, store, data, RunSpec(**kwargs), inputs, stats))
    if max_event_time is not None:
        max_event_time[0] = stats.max_event_time_ms
    return batches


def run(processor: Any, store: Any, data: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Run one batch (keyword defaults: key ``key``) and return the output rows as dicts, in order."""
    kwargs.setdefault("key_columns", ["key"])
    batches = run_batches(processor, store, data, **kwargs)
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


KEYED_ROWS = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(-3, 3)), st.sampled_from(["x", "y", None]), st.integers(-100, 100)
    ),
    max_size=60,
)
"""Rows ``(k1, k2, v)`` with two nullable key columns (few distinct keys, so keys repeat) and a value."""


def keyed_table(rows: list[tuple[Any, Any, int]]) -> pa.Table:
    """The table of :data:`KEYED_ROWS` rows: ``k1`` BIGINT, ``k2`` STRING, ``v`` BIGINT."""
    return pa.table(
        {
            "k1": pa.array([r[0] for r in rows], pa.int64()),
            "k2": pa.array([r[1] for r in rows], pa.string()),
            "v": pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def table(**columns: Any) -> pa.Table:
    """A pyarrow table from keyword columns (lists)."""
    return pa.table(columns)


def shows_no_cause(error: BaseException) -> bool:
    """Whether a traceback of ``error`` shows only it: no chained cause or context (a pyarrow error)."""
    return error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
