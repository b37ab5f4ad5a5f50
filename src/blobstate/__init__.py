"""blobstate: RocksDB state for stateful PySpark streaming, checkpointed incrementally to a blob store.

Public names: :func:`transform_with_state`, :class:`StatefulProcessor` and the state API that mirrors
PySpark's ``transformWithStateInPandas`` (``StatefulProcessorHandle``, ``ValueState``, ``ListState``,
``MapState``, ``TimerValues``, ``ExpiredTimerInfo``), the vectorized API (``ArrowStatefulProcessor``,
``ArrowHandle``, ``KeyedBatch``, ``ExpiredTimers``; ``api="arrow"``), :func:`read_state` (a
checkpoint's state as a DataFrame), :func:`progress_metrics` (a batch's blobstate metrics from Spark's
query progress), :mod:`blobstate.blobstore` and the exception tree: :class:`BlobstateError` and its
branches ``BlobStoreError``, ``StateError`` (with ``CorruptionError``), ``ConfigurationError``,
``QueryError`` and ``ProcessorError`` (drawn in :mod:`blobstate.errors`).
Imports are lazy so the command line starts without loading Spark.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "transform_with_state": "blobstate.engine.query",
    "batch_reports": "blobstate.engine.query",
    "QueryConfig": "blobstate.engine.config",
    "StatefulProcessor": "blobstate.processor",
    "StatefulProcessorHandle": "blobstate.processor",
    "ValueState": "blobstate.processor",
    "ListState": "blobstate.processor",
    "MapState": "blobstate.processor",
    "TimerValues": "blobstate.processor",
    "ExpiredTimerInfo": "blobstate.processor",
    "ArrowStatefulProcessor": "blobstate.processor",
    "ArrowHandle": "blobstate.processor",
    "KeyedBatch": "blobstate.processor",
    "ExpiredTimers": "blobstate.processor",
    "WriterSink": "blobstate.engine.sinks",
    "Adjunct": "blobstate.adjunct",
    "read_state": "blobstate.reader",
    "register_reader": "blobstate.reader",
    "BlobstateError": "blobstate.errors",
    "BlobStoreError": "blobstate.errors",
    "StateError": "blobstate.errors",
    "CorruptionError": "blobstate.errors",
    "ConfigurationError": "blobstate.errors",
    "QueryError": "blobstate.errors",
    "ProcessorError": "blobstate.errors",
    "BlobstateQueryError": "blobstate.engine.handle",
    "ProcessorQueryError": "blobstate.engine.handle",
    "progress_metrics": "blobstate.engine.progress",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'blobstate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
