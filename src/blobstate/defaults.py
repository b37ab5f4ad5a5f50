"""Every option default and allowed value shared by the engine and the library, defined once.

The engine's :class:`~blobstate.engine.config.QueryConfig`, the state library (``state/policy.py``,
``open_partition``), the processor runner and the batch contracts (``blobstate.batch``) all read
them from here, so a query and a direct library call behave alike. This module imports nothing.
"""

from __future__ import annotations

SNAPSHOT_EVERY = 10
"""Take a snapshot after this many deltas since the last one (the lineage's "presumed snapshot")."""

SNAPSHOT_DELTA_BYTES = 64 * 1024 * 1024
"""... or as soon as the deltas since the last snapshot add up to this many bytes."""

SNAPSHOT_UPLOAD = "background"
"""How a due snapshot is uploaded: ``background`` (a thread, named by a later commit) or ``inline``."""

SNAPSHOT_UPLOADS = ("inline", "background")
"""The allowed ``snapshot_upload`` values."""

MIN_VERSIONS_TO_RETAIN = 20
"""The newest this-many committed versions stay restorable; older objects are deleted."""

LOCAL_CHECKPOINTS_TO_KEEP = 3
"""Local hard-link checkpoints kept per partition (the newest ones)."""

LOCAL_DIR_GRACE_SECONDS = 3600.0
"""A partition's local directory unused for this long is removed by the executors' tasks."""

MAX_ROWS_PER_FRAME = 10_000
"""At most this many rows of one key in one pandas frame handed to ``handleInputRows``."""

FLUSH_ROWS = 65_536
"""Output rows collected before they are emitted as one Arrow batch."""

APIS = ("pandas", "row", "arrow")
"""``pandas``: handlers see and yield pandas DataFrames (Spark's ``transformWithStateInPandas``);
``row``: they see and yield ``pyspark.sql.Row`` objects (Spark's row-based ``transformWithState``);
``arrow``: one call per partition and batch with every key, bulk state (``processor/arrow_api.py``)."""

OUTPUT_MODES = ("Append", "Update")
"""The supported output modes, in Spark's spelling (accepted in any case)."""

TIME_MODES = ("None", "ProcessingTime", "EventTime")
"""The time modes, in Spark's spelling (accepted in any case)."""


def spelled(value: object, allowed: tuple[str, ...]) -> str | None:
    """``value`` in the spelling of ``allowed`` (compared case-insensitively); None when not allowed."""
    if not isinstance(value, str):
        return None
    return {a.lower(): a for a in allowed}.get(value.lower())
