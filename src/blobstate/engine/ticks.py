"""The ticks source: batches without new input, and blobstate's metrics in Spark's query progress.

Spark runs a micro-batch only when a source has new data, or when a stateful operator of the last batch
asks for one (``shouldRunAnotherBatch``: processing-time timers, a watermark that moved). blobstate's
processing runs inside ``foreachBatch``, which Spark does not ask, so every blobstate query reads one
more source, ``TicksSource`` (``java/TicksSource.java``): it has no rows, and its offset moves only when
the driver requests a batch after a commit, by the rule of Spark's ``transformWithState``:

- ``ProcessingTime``: always (Spark's operator always asks for another batch in this mode), so timers
  and TTL fire on an idle stream at the trigger interval;
- ``EventTime``: when the batch moved the watermark past the one its timers fired at;
- ``None``: never.

As Spark's own operators, it runs no such batch with ``spark.sql.streaming.noDataMicroBatches.enabled``
set to false.

The same source reports the metrics of the batch that just ran as its source metrics, which Spark puts
in ``query.lastProgress["sources"]`` and hands to every ``StreamingQueryListener``; their numbers also go
to Spark's metrics system as the gauges of the source ``blobstate.<query>`` (``java/QueryMetrics.java``,
:func:`gauges`), which its sinks, JMX and the Prometheus servlet carry.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blobstate.batch.jvm import MetricsChannel, TicksChannel

TICKS_CLASS = "org.apache.spark.sql.blobstate.TicksSource"
"""The JVM class of the source (``spark.readStream.format(TICKS_CLASS)``)."""


def wants_another_batch(time_mode: str, eviction_watermark_ms: int | None, watermark_ms: int | None) -> bool:
    """Whether Spark's ``transformWithState`` would run a batch after this one without new input.

    ``eviction_watermark_ms`` is the watermark the batch fired timers at, ``watermark_ms`` the one its
    input moved the query to.
    """
    if time_mode == "ProcessingTime":
        return True
    if time_mode == "EventTime":
        return (
            eviction_watermark_ms is not None
            and watermark_ms is not None
            and watermark_ms > eviction_watermark_ms
        )
    return False


def owes_a_batch(time_mode: str, commit: Any) -> bool:
    """Whether Spark's ``transformWithState`` would run a batch after the one ``commit`` recorded
    without new input (:func:`wants_another_batch` with the commit's watermarks)."""
    eviction = (commit.metrics or {}).get("eviction_watermark_ms")
    return wants_another_batch(time_mode, eviction, commit.watermark_ms)


class Ticks:
    """The driver's end of one query's ticks source (a channel in the driver JVM, named by a token)."""

    def __init__(
        self,
        source: TicksChannel,
        *,
        enabled: bool = True,
        metrics: MetricsChannel | None = None,
        metrics_name: str = "blobstate",
        token: str | None = None,
    ) -> None:
        """``source`` is the ticks source's driver end (``JvmSeam.ticks_channel``); with ``enabled``
        False (Spark conf ``spark.sql.streaming.noDataMicroBatches.enabled=false``) no batch is requested.
        ``metrics`` (``JvmSeam.metrics_channel``; None: none) receives the published numbers as the
        gauges of the metrics source ``metrics_name``. ``token`` names the channel (default: a new one;
        a query's driver built elsewhere, in a Spark Connect server, takes the client's)."""
        self._source = source
        self._metrics = metrics
        self.metrics_name = metrics_name
        self.enabled = enabled
        self.token = token if token is not None else uuid.uuid4().hex

    def with_ticks(self, spark: SparkSession, df: DataFrame) -> DataFrame:
        """``df`` with the ticks source unioned in (it adds no rows; its columns are ``df``'s)."""
        ticks = spark.readStream.format(TICKS_CLASS).option("token", self.token).load()
        typed = [F.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields]
        return df.unionByName(ticks.select(*typed))

    def request(self, next_batch_id: int) -> None:
        """Have Spark run batch ``next_batch_id`` at its next trigger even without new input."""
        if self.enabled:
            self._source.request(self.token, int(next_batch_id))

    def publish(self, metrics: dict[str, Any]) -> None:
        """Report ``metrics`` as the source metrics of the batch that is finishing (values become strings)."""
        keys = sorted(metrics)
        values = [v if isinstance(v, str) else json.dumps(v) for v in (metrics[k] for k in keys)]
        self._source.publish(self.token, keys, values)
        if self._metrics is not None:
            numbers = gauges(metrics)
            names = sorted(numbers)
            self._metrics.update(self.metrics_name, names, [numbers[n] for n in names])

    def release(self) -> None:
        """Forget the channel and remove the metrics source (after the query stopped)."""
        self._source.release(self.token)
        if self._metrics is not None:
            self._metrics.remove(self.metrics_name)


GAUGE_GROUPS = ("standby", "loadRules")
"""Metrics whose values are objects: their numbers become gauges ``<group>.<name>``."""


def gauges(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of one batch's metrics as gauge values of Spark's metrics system: every number or
    boolean at the top level (``inputRows``, ``stateKeys``, ``seconds``, ``skipped`` as 0 or 1, ...) and in
    :data:`GAUGE_GROUPS` one level down (``standby.failovers``, ``loadRules.working``, ...). Per-partition
    figures stay in the progress only: hundreds of partitions would be hundreds of series."""

    def number(value: Any) -> float | None:
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, int | float) and value == value:  # not NaN
            return float(value)
        return None

    out: dict[str, float] = {}
    for key, value in metrics.items():
        if (n := number(value)) is not None:
            out[key] = n
        elif key in GAUGE_GROUPS and isinstance(value, dict):
            for inner, v in value.items():
                if (n := number(v)) is not None:
                    out[f"{key}.{inner}"] = n
    return out


def metrics_source_name(query_name: str | None, query_id: str) -> str:
    """The name of a query's source in Spark's metrics system: ``blobstate.<queryName>``, else
    ``blobstate.<query id>`` (the checkpoint's, stable across restarts), as Spark names its own
    ``spark.streaming.<queryName or id>``; characters other than letters, digits, ``-`` and ``_`` become
    ``_`` (a dot would split the name in sinks)."""
    return "blobstate." + re.sub(r"[^A-Za-z0-9_-]", "_", query_name or query_id)
