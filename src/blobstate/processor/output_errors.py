"""Name the column, Spark type, value and grouping key of an output that does not fit the output schema.

The output collectors convert a whole flush of rows at once (the fast path). Only when that fails, or
leaves a null in a NOT NULL column, do they call :func:`find_misfit`: it converts one column at a time
and bisects on row prefixes to find the first value at fault, and :func:`misfit_error` words the
error. Types are written as Spark's ``DataType.simpleString()`` writes them (``bigint``,
``array<int>``), as the other processor errors do. Nothing here names Spark options: blobstate's
conversion reads none.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.types import ByteType, DataType, IntegerType, LongType, ShortType, StructField, StructType

from blobstate.processor.errors import OutputSchemaError

_INTEGER_RANGES: dict[type[DataType], tuple[int, int]] = {
    ByteType: (-(2**7), 2**7 - 1),
    ShortType: (-(2**15), 2**15 - 1),
    IntegerType: (-(2**31), 2**31 - 1),
    LongType: (-(2**63), 2**63 - 1),
}
_SHOWN_CHARS = 80


class OutputOrigins:
    """Which handler call yielded which pending output rows: the first row of each call's rows.

    Collectors record a call only when the grouping key or the handler changes, so a handler that
    yields many frames or rows for one key costs one entry.
    """

    __slots__ = ("_origins", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._origins: list[tuple[str, object]] = []

    def mark(self, first_row: int, source: str, key: object) -> None:
        """Rows from ``first_row`` on (until the next mark) were yielded by ``source`` for ``key``."""
        self._starts.append(first_row)
        self._origins.append((source, key))

    def at(self, row: int) -> tuple[str, object] | None:
        """The (handler, grouping key) that yielded pending row ``row``, if recorded."""
        i = bisect_right(self._starts, row) - 1
        return self._origins[i] if i >= 0 else None


def yielded_by(source: str | None, key: object) -> str:
    """``"handleInputRows for grouping key ('a',)"``: the handler call at fault, for messages."""
    if source is None:
        return "the processor"
    return f"{source} for grouping key {key!r}"


def show(value: object) -> str:
    """A value for an error message: its repr (shortened) and its Python type."""
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    return text if value is None else f"{text} ({type(value).__name__})"


def schema_text(schema: StructType) -> str:
    """The output schema as ``key string, n bigint NOT NULL``."""
    return ", ".join(column_text(f) for f in schema.fields)


def column_text(field: StructField) -> str:
    """One output column as ``n bigint`` (``n bigint NOT NULL`` when not nullable)."""
    return f"{field.name} {type_text(field)}"


def type_text(field: StructField) -> str:
    """A column's Spark type as ``simpleString()`` writes it, with ``NOT NULL`` when not nullable."""
    text = field.dataType.simpleString()
    return text if field.nullable else f"{text} NOT NULL"


def find_misfit(rows: int, fits: Callable[[int], bool]) -> int | None:
    """The first row at fault, given ``fits(stop)`` telling whether rows ``[0, stop)`` convert;
    None when all ``rows`` do. A value that cannot convert makes every longer prefix fail too, so
    the smallest failing prefix is found by bisection in ``log2(rows)`` conversions."""
    if fits(rows):
        return None
    good, bad = 0, rows
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return bad - 1


def misfit_error(field: StructField, value: object, origin: tuple[str, object] | None) -> OutputSchemaError:
    """The error for ``value`` (yielded by ``origin``) that column ``field`` cannot hold."""
    reason = _reason(field, value)
    source, key = origin if origin is not None else (None, None)
    return OutputSchemaError(
        f"output column {field.name!r} ({type_text(field)}) cannot hold {show(value)}"
        f"{': ' + reason if reason else ''}, yielded by {yielded_by(source, key)}; yield a value of that"
        f" type or change the output schema"
    )


def unexplained_error(schema: StructType, error: BaseException) -> OutputSchemaError:
    """The error when no single column is at fault (each converts alone): the cause's first line,
    without PySpark's advice about Spark options (blobstate's conversion reads none)."""
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    sentences = [s for s in re.split(r"(?<=\.)\s+", first_line) if not _SPARK_ADVICE.search(s)]
    return OutputSchemaError(
        f"output rows do not fit the output schema ({schema_text(schema)}):"
        f" {' '.join(sentences)[:200] or type(error).__name__}"
    )


_SPARK_ADVICE = re.compile(r"spark\.|It can be caused by", re.IGNORECASE)


def is_null(value: object) -> bool:
    """Whether a yielded scalar is a null as Spark's conversion sees it (None, NaN, NaT, pd.NA)."""
    if value is None:
        return True
    if isinstance(value, (float, np.floating)):
        return math.isnan(value)
    try:
        import pandas as pd

        return bool(pd.api.types.is_scalar(value) and pd.isna(value))
    except (TypeError, ValueError):
        return False


def has_nested_not_null(arrow_type: pa.DataType) -> bool:
    """Whether a column type declares a non-nullable field inside it (struct field, array element or
    map value), which :func:`forbidden_nulls` must then check."""
    if pa.types.is_struct(arrow_type):
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
    elif pa.types.is_map(arrow_type):
        fields = [arrow_type.item_field]
    elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        fields = [arrow_type.value_field]
    else:
        return False
    return any(not f.nullable or has_nested_not_null(f.type) for f in fields)


def forbidden_nulls(array: pa.Array) -> bool:
    """Whether ``array`` holds a null where its type declares a non-nullable struct field, array
    element or map value (pyarrow's conversions accept such nulls). Fields of null structs do not count."""
    arrow_type = array.type
    if pa.types.is_struct(arrow_type):
        parents = array.is_valid()
        for i in range(arrow_type.num_fields):
            child = array.field(i).filter(parents)
            if (not arrow_type.field(i).nullable and child.null_count) or forbidden_nulls(child):
                return True
        return False
    if pa.types.is_map(arrow_type):
        # The entries of this (possibly sliced) array; null maps have no entries as pyarrow builds them.
        start, end = array.offsets[0].as_py(), array.offsets[-1].as_py()
        values = array.items.slice(start, end - start)
        return bool(not arrow_type.item_field.nullable and values.null_count) or forbidden_nulls(values)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        values = array.flatten()
        return bool(not arrow_type.value_field.nullable and values.null_count) or forbidden_nulls(values)
    return False


def _reason(field: StructField, value: Any) -> str:
    if is_null(value):
        return "" if field.nullable else "the column is NOT NULL"
    bounds = _INTEGER_RANGES.get(type(field.dataType))
    if bounds is None or isinstance(value, (bool, np.bool_)):
        return ""
    if isinstance(value, (int, np.integer)):
        low, high = bounds
        return "" if low <= int(value) <= high else f"out of range {low}..{high}"
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and not float(value).is_integer():
        return "not a whole number"
    return ""
