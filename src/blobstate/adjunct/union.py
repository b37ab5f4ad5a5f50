"""One query for the main stream and its side streams: ``unionByName`` with a tag column.

Because every side stream feeds the same query as the main stream, Spark's offset log records all of
their offsets for each batch in one entry: a replayed batch re-reads exactly the same side rows, and
the first batch takes each side stream's whole backlog (unless the side source is rate-limited).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from blobstate.adjunct.order import file_of_row
from blobstate.adjunct.spec import (
    FILE_COLUMN,
    ORDER_COLUMNS,
    PARTITIONED,
    ROW_COLUMN,
    TAG_COLUMN,
    Adjunct,
    AdjunctError,
    AdjunctSpec,
    column_name,
)
from blobstate.batch.jvm import JvmSeam, SourceLeaf


def side_rows(
    adjunct: AdjunctSpec,
    df: DataFrame,
    main_key_columns: Sequence[str],
    main_types: dict[str, Any],
    order: Sequence[Any] | None = None,
    leaves: Sequence[SourceLeaf] = (),
) -> DataFrame:
    """``df``'s rows in the layout of the query's one input: key columns (for a partitioned adjunct named
    and typed like the main key, so Spark's hash partitioning sends a side row to the partition of the
    main rows with the same key), the side columns under :func:`column_name`, the order columns, the
    row's file and the tag. ``order`` gives the phase, rank and row expressions (default: the stream's
    own rows, whose rank comes from their file when they are applied, which they carry when ``leaves``,
    the stream's plan leaves, show a file source)."""
    name = adjunct.name
    columns = []
    if adjunct.mode == PARTITIONED:
        for main_key, side_key in zip(main_key_columns, adjunct.side_key_columns, strict=True):
            columns.append(F.col(f"`{side_key}`").cast(main_types[main_key]).alias(main_key))
    columns += [F.col(f"`{c}`").alias(column_name(name, c)) for c in df.columns if not c.startswith("__")]
    file = F.lit(None).cast("string")
    if order is None:  # the row's position is set per micro-batch (streaming plans cannot number rows)
        order = (F.lit(1), F.lit(0).cast("long"), F.lit(None).cast("long"))
        file = file_of_row(leaves)
    columns += [expr.alias(col) for expr, col in zip(order, ORDER_COLUMNS, strict=True)]
    try:
        return df.select(*columns, file.alias(FILE_COLUMN), F.lit(name).alias(TAG_COLUMN))
    except AnalysisException:  # input_file_name() over a join of sources: no file order to keep
        none = F.lit(None).cast("string").alias(FILE_COLUMN)
        return df.select(*columns, none, F.lit(name).alias(TAG_COLUMN))


def with_side_streams(
    main: DataFrame, main_key_columns: Sequence[str], adjuncts: Sequence[Adjunct], jvm: JvmSeam
) -> tuple[DataFrame, list[AdjunctSpec]]:
    """The query's one input (main rows with a null tag, side rows tagged with their adjunct's name) and
    the adjuncts' specs, in declaration order. Main sources come first in Spark's offset log. ``jvm``
    reads the side streams' plans (which of them read files)."""
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
        adjunct.validate([main_types[k] for k in main_key_columns], main_key_columns)
    specs = [a.spec(main_key_columns) for a in adjuncts]
    combined = main.withColumn(TAG_COLUMN, F.lit(None).cast("string"))
    for adjunct, spec in zip(adjuncts, specs, strict=True):
        side = side_rows(
            spec, adjunct.df, main_key_columns, main_types, leaves=jvm.streaming_leaves(adjunct.df)
        )
        combined = combined.unionByName(side, allowMissingColumns=True)
    return combined, specs


def numbered(batch_df: DataFrame) -> DataFrame:
    """A micro-batch's input with each side row's position in it (Spark's shuffle does not keep the
    input order; a replayed batch reads the same splits, so it numbers its rows the same)."""
    row = F.col(ROW_COLUMN)
    return batch_df.withColumn(ROW_COLUMN, F.coalesce(row, F.monotonically_increasing_id()))


def count_sources(leaves: Sequence[SourceLeaf]) -> int:
    """How many streaming sources a stream whose plan has ``leaves`` (``JvmSeam.streaming_leaves``) reads
    (its entries in Spark's offset log)."""
    names = {"StreamingRelation", "StreamingRelationV2", "StreamingExecutionRelation"}
    return sum(1 for leaf in leaves if leaf.node in names)
