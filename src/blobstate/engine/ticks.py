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
in ``query.lastProgress["sources"]`` and hands to every ``StreamingQueryListener``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

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


class Ticks:
    """The driver's end of one query's ticks source (a channel in the driver JVM, named by a token)."""

    def __init__(self, source_class: Any, *, enabled: bool = True) -> None:
        """``source_class`` is the py4j class ``TicksSource`` of the loaded JVM helper; with ``enabled``
        False (Spark conf ``spark.sql.streaming.noDataMicroBatches.enabled=false``) no batch is requested."""
        self._source = source_class
        self.enabled = enabled
        self.token = uuid.uuid4().hex

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

    def release(self) -> None:
        """Forget the channel (after the query stopped)."""
        self._source.release(self.token)
