"""blobstate: RocksDB state for stateful PySpark streaming, checkpointed incrementally to a blob store.

Public names: :func:`transform_with_state`, :class:`StatefulProcessor` and the state API that mirrors
PySpark's ``transformWithStateInPandas`` (``StatefulProcessorHandle``, ``ValueState``, ``ListState``,
``MapState``, ``TimerValues``, ``ExpiredTimerInfo``), the vectorized API (``ArrowStatefulProcessor``,
``ArrowHandle``, ``KeyedBatch``, ``ExpiredTimers``; ``api="arrow"``), :func:`read_state` (a
checkpoint's state as a DataFrame), :func:`read_moved_state` and :func:`last_watermark_ms` (what a
move between Spark's state store and blobstate carries: every declared variable, the timers, the
watermark), :func:`progress_metrics` (a batch's blobstate metrics from Spark's query progress),
:mod:`blobstate.blobstore` and the exception tree: :class:`BlobstateError` and its
branches ``BlobStoreError``, ``StateError`` (with ``CorruptionError``), ``ConfigurationError``,
``QueryError`` and ``ProcessorError`` (drawn in :mod:`blobstate.errors`).
Imports are lazy so the command line starts without loading Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time the names load on first use (__getattr__)
    from blobstate.adjunct import Adjunct as Adjunct
    from blobstate.engine.config import QueryConfig as QueryConfig
    from blobstate.engine.handle import BlobstateQueryError as BlobstateQueryError
    from blobstate.engine.handle import ProcessorQueryError as ProcessorQueryError
    from blobstate.engine.progress import progress_metrics as progress_metrics
    from blobstate.engine.query import batch_reports as batch_reports
    from blobstate.engine.query import transform_with_state as transform_with_state
    from blobstate.engine.sinks import WriterSink as WriterSink
    from blobstate.errors import BlobstateError as BlobstateError
    from blobstate.errors import BlobStoreError as BlobStoreError
    from blobstate.errors import ConfigurationError as ConfigurationError
    from blobstate.errors import CorruptionError as CorruptionError
    from blobstate.errors import ProcessorError as ProcessorError
    from blobstate.errors import QueryError as QueryError
    from blobstate.errors import StateError as StateError
    from blobstate.processor import ArrowHandle as ArrowHandle
    from blobstate.processor import ArrowStatefulProcessor as ArrowStatefulProcessor
    from blobstate.processor import ExpiredTimerInfo as ExpiredTimerInfo
    from blobstate.processor import ExpiredTimers as ExpiredTimers
    from blobstate.processor import KeyedBatch as KeyedBatch
    from blobstate.processor import ListState as ListState
    from blobstate.processor import MapState as MapState
    from blobstate.processor import StatefulProcessor as StatefulProcessor
    from blobstate.processor import StatefulProcessorHandle as StatefulProcessorHandle
    from blobstate.processor import TimerValues as TimerValues
    from blobstate.processor import ValueState as ValueState
    from blobstate.reader import read_state as read_state
    from blobstate.reader import register_reader as register_reader
    from blobstate.reader.moving import last_watermark_ms as last_watermark_ms
    from blobstate.reader.moving import read_moved_state as read_moved_state

__version__ = "0.2.0"
"""This release. Written here only: ``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``) into the
distribution's metadata, and ``blobstate --version`` prints it with the stored formats this release writes
and reads (:mod:`blobstate.formats`). A release that changes a format it writes or reads gets a new one."""

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
    "read_moved_state": "blobstate.reader.moving",
    "last_watermark_ms": "blobstate.reader.moving",
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
