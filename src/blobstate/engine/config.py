"""Query configuration: keywords of ``transform_with_state``, or Spark conf ``spark.blobstate.<key>``."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

SPARK_CONF_PREFIX = "spark.blobstate."


def default_local_dir() -> str:
    """Where executors keep working stores, local checkpoints and standby replicas by default."""
    return os.path.join(tempfile.gettempdir(), f"blobstate-{os.getuid()}")


@dataclass(frozen=True)
class QueryConfig:
    """Every tunable of one blobstate query. Each field may also be set as ``spark.blobstate.<name>``."""

    operator: str = "0"
    """The stateful operator's id; one query may hold several operators under one checkpoint."""
    api: str = "pandas"
    """How handlers see rows: ``pandas`` (DataFrames in and out, as Spark's
    ``transformWithStateInPandas``) or ``row`` (``pyspark.sql.Row`` objects, as Spark's row-based
    ``transformWithState``, with no pandas per key)."""
    output_mode: str = "Update"
    """``Append`` or ``Update``, as in transformWithStateInPandas."""
    time_mode: str = "None"
    """``None``, ``ProcessingTime`` or ``EventTime``."""
    event_time_column: str | None = None
    """Event-time column (EventTime mode): the watermark is its maximum seen minus ``watermark_delay_ms``."""
    watermark_delay_ms: int = 0
    """How late event-time rows may arrive before the watermark drops them."""
    local_dir: str = field(default_factory=default_local_dir)
    """Executor-local directory for working stores, checkpoints and replicas."""
    snapshot_every: int = 10
    """Upload a snapshot every this many versions of a partition."""
    snapshot_delta_bytes: int = 64 * 1024 * 1024
    """Also upload a snapshot once the deltas since the last one exceed this many bytes."""
    min_versions_to_retain: int = 20
    """Committed versions kept restorable; older objects are deleted after each commit."""
    standby_replicas: int = 0
    """Standby replicas per partition (kept warm on other executors). Only 0 is supported so far."""
    placement: bool = True
    """Give each partition's task a preferred executor (the JVM helper); off means Spark's default."""
    trigger_interval: str | None = None
    """A processing-time trigger such as ``"5 seconds"``; None runs batches back to back."""
    spark_checkpoint: str | None = None
    """Spark's own streaming checkpoint (source offsets); default ``<checkpoint>/_spark``."""
    query_name: str | None = None
    """The streaming query's name."""
    async_cleanup: bool = True
    """Run post-commit cleanup on a background thread, overlapping the next batch."""
    pandas_object_strings: bool = True
    """In Python workers, build pandas string columns with the object dtype (pandas < 3 behaviour,
    which PySpark 4.3 expects) instead of pandas 3's Arrow-backed ``str``: per-key DataFrames that a
    processor builds are about twice as cheap."""

    @classmethod
    def build(cls, spark_conf: dict[str, str], overrides: dict[str, Any]) -> QueryConfig:
        """Merge defaults, ``spark.blobstate.*`` conf and keyword overrides (keywords win)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise TypeError(f"unknown blobstate option(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for key, raw in spark_conf.items():
            if not key.startswith(SPARK_CONF_PREFIX):
                continue
            name = key[len(SPARK_CONF_PREFIX) :]
            if name not in fields:
                raise ValueError(f"unknown Spark conf {key!r}: not a blobstate option")
            values[name] = _coerce(name, fields[name].type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Reject inconsistent settings with an error naming the option."""
        if self.api not in ("pandas", "row"):
            raise ValueError(
                f"api must be 'pandas' (transformWithStateInPandas) or 'row' (transformWithState), not"
                f" {self.api!r}"
            )
        if self.output_mode not in ("Append", "Update"):
            raise ValueError(f"output_mode must be 'Append' or 'Update', not {self.output_mode!r}")
        if self.time_mode not in ("None", "ProcessingTime", "EventTime"):
            raise ValueError(
                f"time_mode must be 'None', 'ProcessingTime' or 'EventTime', not {self.time_mode!r}"
            )
        if self.time_mode == "EventTime" and not self.event_time_column:
            raise ValueError("time_mode 'EventTime' needs event_time_column")
        for name in ("snapshot_every", "min_versions_to_retain"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.standby_replicas < 0 or self.watermark_delay_ms < 0:
            raise ValueError("standby_replicas and watermark_delay_ms must not be negative")
        if self.standby_replicas > 0:
            raise ValueError(
                f"standby_replicas={self.standby_replicas}: standby replicas are not supported yet; use 0"
            )


def _coerce(name: str, annotation: object, raw: str) -> Any:
    text = str(annotation)
    if text.startswith("bool"):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"spark.blobstate.{name}: expected true or false, got {raw!r}")
    if text.startswith("int"):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"spark.blobstate.{name}: expected an integer, got {raw!r}") from None
    return raw
