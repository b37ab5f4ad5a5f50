"""The event-time watermark a streaming input declares with Spark's ``withWatermark``.

Spark users declare event time on the input (``df.withWatermark("event_time", "10 minutes")``) and
then ask ``transformWithStateInPandas`` for ``timeMode="EventTime"``. :func:`input_watermark` reads
that declaration from the DataFrame's analyzed logical plan (through the JVM seam,
``JvmSeam.watermarks``: Spark's ``EventTimeWatermark`` node holds the event-time attribute and the delay
as a ``CalendarInterval``),
so blobstate can take it instead of its own ``event_time_column`` / ``watermark_delay`` options
(:func:`blobstate.engine.config.resolve_event_time` reconciles the two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blobstate.batch.jvm import DeclaredWatermark, JvmSeam
from blobstate.errors import ConfigurationError

DELAY_METADATA_KEY = "spark.watermarkDelayMs"
"""The column metadata by which Spark marks the event-time column downstream of ``withWatermark``."""
_MS_PER_DAY = 24 * 3600 * 1000


class InputWatermarkError(ConfigurationError, ValueError):
    """The input's ``withWatermark`` is one blobstate cannot follow (several, months, column gone)."""


@dataclass(frozen=True)
class InputWatermark:
    """The event time an input declares: ``withWatermark(event_time_column, delay)``."""

    event_time_column: str
    """The event-time column as the input DataFrame names it."""
    delay_ms: int
    """The delay in milliseconds."""
    delay: str
    """The delay as Spark prints it (``"10 minutes"``), for messages."""

    def describe(self) -> str:
        """``withWatermark('t', '10 minutes')``, as the user wrote it (up to Spark's spelling)."""
        return f"withWatermark({self.event_time_column!r}, {self.delay!r})"


def input_watermark(df: Any, jvm: JvmSeam | None = None) -> InputWatermark | None:
    """The watermark the streaming DataFrame ``df`` declares with ``withWatermark``; None without one.

    Raises :class:`InputWatermarkError` when the input declares several (Spark combines them by
    ``spark.sql.streaming.multipleWatermarkPolicy``, which blobstate does not follow), when the delay
    counts months (not a fixed length of time), or when the event-time column is not among the
    input's columns. ``jvm`` reads the plan (default: the seam of ``df``'s session).
    """
    if jvm is None:
        from blobstate.engine.jvm import seam_for

        jvm = seam_for(df.sparkSession)
    nodes = jvm.watermarks(df)
    if not nodes:
        return None
    declared = [_describe(node) for node in nodes]
    if len(nodes) > 1:
        raise InputWatermarkError(
            f"the input declares {len(nodes)} event-time watermarks ({', '.join(declared)}); blobstate"
            " follows one: call withWatermark once, on the input of the stateful query"
        )
    node = nodes[0]
    if node.months:
        raise InputWatermarkError(
            f"the input's {declared[0]} counts months, which have no fixed length; give the delay in"
            " weeks, days, hours, minutes or seconds"
        )
    delay_ms = node.days * _MS_PER_DAY + node.microseconds // 1000
    column = _event_time_column(df, node.event_time, declared[0])
    return InputWatermark(event_time_column=column, delay_ms=delay_ms, delay=node.delay)


def _describe(node: DeclaredWatermark) -> str:
    return f"withWatermark({node.event_time!r}, {node.delay!r})"


def _event_time_column(df: Any, declared_name: str, declared: str) -> str:
    """The input column that carries the watermark: the one Spark marks with the delay metadata (the
    declared column, or its new name after a rename)."""
    marked = [f.name for f in df.schema.fields if DELAY_METADATA_KEY in (f.metadata or {})]
    if declared_name in marked or (not marked and declared_name in df.columns):
        return declared_name
    if len(marked) == 1:
        return str(marked[0])
    if not marked:
        raise InputWatermarkError(
            f"the input's {declared} names event-time column {declared_name!r}, which is not among the"
            f" input columns {df.columns}; keep it in the input of the stateful query"
        )
    raise InputWatermarkError(
        f"the input's {declared} event-time column appears as several columns {marked}; keep one of them"
    )
