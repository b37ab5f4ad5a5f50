"""One query for the main stream and its side streams: ``unionByName`` with a tag column.

Because every side stream feeds the same query as the main stream, Spark's offset log records all of
their offsets for each batch in one entry: a replayed batch re-reads exactly the same side rows, and
the first batch takes each side stream's whole backlog (unless the side source is rate-limited).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from blobstate.adjunct.spec import PARTITIONED, TAG_COLUMN, Adjunct, AdjunctError, AdjunctSpec, column_name


def _side_frame(adjunct: Adjunct, main_key_columns: Sequence[str], main_types: dict[str, Any]) -> DataFrame:
    df = adjunct.df
    columns = []
    if adjunct.mode == PARTITIONED:
        # Named and typed like the main key, so Spark's hash partitioning sends a side row to the
        # partition of the main rows with the same key.
        for main_key, side_key in zip(main_key_columns, adjunct.key_columns, strict=True):
            columns.append(F.col(f"`{side_key}`").cast(main_types[main_key]).alias(main_key))
    else:
        columns += [F.col(f"`{k}`").alias(column_name(adjunct.name, k)) for k in adjunct.key_columns]
    keys_taken = (
        {column_name(adjunct.name, k) for k in adjunct.key_columns} if adjunct.mode != PARTITIONED else set()
    )
    columns += [
        F.col(f"`{c}`").alias(column_name(adjunct.name, c))
        for c in df.columns
        if column_name(adjunct.name, c) not in keys_taken
    ]
    return df.select(*columns, F.lit(adjunct.name).alias(TAG_COLUMN))


def with_side_streams(
    main: DataFrame, main_key_columns: Sequence[str], adjuncts: Sequence[Adjunct]
) -> tuple[DataFrame, list[AdjunctSpec]]:
    """The query's one input (main rows with a null tag, side rows tagged with their adjunct's name) and
    the adjuncts' specs, in declaration order. Main sources come first in Spark's offset log."""
    if not adjuncts:
        return main, []
    names = [a.name for a in adjuncts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AdjunctError(f"adjunct names must be unique; repeated: {duplicates}")
    main_types = {f.name: f.dataType for f in main.schema.fields}
    for adjunct in adjuncts:
        if not isinstance(adjunct, Adjunct):
            raise AdjunctError(
                f"adjuncts must be blobstate.Adjunct declarations, not {type(adjunct).__name__}"
            )
        adjunct.validate([main_types[k] for k in main_key_columns])
    combined = main.withColumn(TAG_COLUMN, F.lit(None).cast("string"))
    for adjunct in adjuncts:
        combined = combined.unionByName(
            _side_frame(adjunct, main_key_columns, main_types), allowMissingColumns=True
        )
    return combined, [a.spec(main_key_columns) for a in adjuncts]


def count_sources(df: DataFrame) -> int:
    """How many streaming sources feed ``df`` (its entries in Spark's offset log)."""
    plan = df._jdf.queryExecution().analyzed()
    names = {"StreamingRelation", "StreamingRelationV2", "StreamingExecutionRelation"}
    leaves = plan.collectLeaves()
    return sum(1 for i in range(leaves.size()) if leaves.apply(i).getClass().getSimpleName() in names)
