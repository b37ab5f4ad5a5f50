"""The blobstate query several benchmarks time: the row API's running count over a parquet file source.

One file per micro-batch (``maxFilesPerTrigger=1``), the sink a function writing to ``noop`` (so the
engine takes its general path for sinks; ``spark_vs_native.py`` declares a ``WriterSink`` instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def start_running_count(
    spark: Any,
    input_dir: Path,
    checkpoint: Path,
    local_dir: Path,
    partitions: int,
    on_batch: Any,
    **options: Any,
) -> Any:
    """Start the query; ``options`` are further ``transform_with_state`` options (``sink`` replaces the
    function writing to ``noop``)."""
    import blobstate
    from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, RowRunningCount

    events = (
        spark.readStream.schema("key STRING, value BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    return blobstate.transform_with_state(
        events,
        key="key",
        processor=RowRunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=str(checkpoint),
        sink=options.pop("sink", lambda frame, _: frame.write.format("noop").mode("overwrite").save()),
        num_partitions=partitions,
        api="row",
        local_dir=str(local_dir),
        on_batch=on_batch,
        **options,
    )
