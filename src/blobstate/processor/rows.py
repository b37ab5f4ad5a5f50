"""The row-based processor API: PySpark's ``transformWithState`` (4.1+) instead of ``...InPandas``.

The handlers are the same; only what flows through them differs. ``handleInputRows(key, rows,
timerValues)`` gets an iterator of :class:`pyspark.sql.Row` (one per input row, every input column,
values as ``pyarrow``'s ``as_py`` gives them, as Spark's worker builds them) and yields ``Row``
objects, which are matched to the output schema by field name (``Row.asDict(True)`` and
``pyarrow.RecordBatch.from_pylist``, Spark's conversion; fields the schema lacks are ignored, as
Spark ignores them). A Row lacking an output field, a value that does not convert, or a null in a
NOT NULL column raises :class:`OutputSchemaError` naming the column, its Spark type, the value and
the grouping key. ``handleInitialState`` is called once per initial-state row. No pandas is
involved, so a key costs a few microseconds of framework time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import numpy as np
import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.types import StructType

from blobstate import defaults
from blobstate.encoding import codec
from blobstate.encoding.codec import Key
from blobstate.processor.errors import OutputSchemaError
from blobstate.processor.grouping import sort_by_key
from blobstate.processor.output_errors import (
    OutputOrigins,
    column_text,
    find_misfit,
    forbidden_nulls,
    has_nested_not_null,
    misfit_error,
    schema_text,
    show,
    unexplained_error,
    yielded_by,
)
from blobstate.processor.schema import to_struct_type

DEFAULT_FLUSH_ROWS = defaults.FLUSH_ROWS


@dataclass
class RowGroups:
    """Rows of one table grouped by key, in ascending key order, as Python values."""

    columns: list[list[Any]]
    row_class: Any
    keys: list[Key]
    key_bytes: list[bytes]
    starts: list[int]
    ends: list[int]

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, i: int) -> Iterator[Row]:
        """The rows of the ``i``-th key, built lazily."""
        make = self.row_class
        start, end = self.starts[i], self.ends[i]
        if end - start == 1:
            return iter((make(*[column[start] for column in self.columns]),))
        return (make(*values) for values in zip(*[column[start:end] for column in self.columns], strict=True))


def group_rows_by_key(table: pa.Table, key_columns: Sequence[str]) -> RowGroups:
    """Sort ``table`` by ``key_columns``, find each key's row range, and convert every column to
    Python values once (``to_pylist``, the same values as Spark's per-row ``as_py``)."""
    table, starts, ends = sort_by_key(table, key_columns)
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    names = table.column_names
    key_positions = [names.index(c) for c in key_columns]
    keys = [tuple(columns[p][s] for p in key_positions) for s in starts]
    encode = codec.encode_key
    return RowGroups(
        columns=columns,
        row_class=Row(*names),
        keys=keys,
        key_bytes=[encode(k) for k in keys],
        starts=starts,
        ends=ends,
    )


class RowOutputCollector:
    """Validates the Rows a processor yields and emits them as record batches of the output schema.

    Per row, :meth:`add` only converts the Row to a dict and notes its grouping key; whether every
    row carries every output field and fits its type is checked on the whole batch at the flush
    (a missing field shows up as a null there, so only rows with nulls are looked at twice).
    """

    items = "Rows"
    """What handlers must yield, for error messages."""

    def __init__(
        self,
        arrow_schema: pa.Schema,
        *,
        schema: StructType | None = None,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
    ) -> None:
        self.arrow_schema = arrow_schema
        self.schema = schema if schema is not None else to_struct_type(arrow_schema, what="output_schema")
        self.flush_rows = flush_rows
        self._names = arrow_schema.names
        self._name_set = frozenset(self._names)
        self._not_null = [i for i, f in enumerate(self.schema.fields) if not f.nullable]
        self._nested_not_null = [i for i, f in enumerate(arrow_schema) if has_nested_not_null(f.type)]
        # Only nested values (structs, arrays, maps) may hold Rows that must become dicts.
        self._flat = not any(pa.types.is_nested(f.type) for f in arrow_schema)
        self._pending: list[dict[str, Any]] = []
        self._keys: list[Any] = []  # the grouping key of each pending row
        self._sources = OutputOrigins()  # the handler of each pending row (it changes rarely)
        self._source: str | None = None
        self.total_rows = 0

    def add(self, row: Any, source: str, key: Any = None) -> None:
        """Keep one yielded Row; ``source`` (the handler) and ``key`` (the grouping key it ran for)
        are named in error messages."""
        as_dict = getattr(row, "asDict", None)
        if as_dict is None or not isinstance(row, tuple):
            raise OutputSchemaError(
                f"{yielded_by(source, key)} yielded a {type(row).__name__}; with the row-based API it must"
                f" yield pyspark.sql.Row objects with the output fields ({schema_text(self.schema)})"
            )
        try:
            values = dict(zip(cast(Row, row).__fields__, row, strict=False)) if self._flat else as_dict(True)
        except Exception:  # a Row of values without field names
            raise OutputSchemaError(
                f"{yielded_by(source, key)} yielded {show(row)} without field names; build it as"
                f" Row(name=value, ...) with the output fields ({schema_text(self.schema)})"
            ) from None
        if source is not self._source:
            self._source = source
            self._sources.mark(len(self._pending), source, None)
        self._pending.append(values)
        self._keys.append(key)

    @property
    def ready(self) -> bool:
        """Whether enough rows are pending to emit a batch."""
        return len(self._pending) >= self.flush_rows

    def flush(self) -> pa.RecordBatch | None:
        """Convert the pending rows into one record batch (None when nothing is pending)."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        origins = _Origins(self._sources, self._keys)
        self._keys, self._sources, self._source = [], OutputOrigins(), None
        try:
            batch = pa.RecordBatch.from_pylist(pending, schema=self.arrow_schema)
        except Exception as e:  # any failure converting user values; the diagnosis names it
            lacking = self._first_lacking(pending, range(len(pending)))
            if lacking is not None:
                raise self._lacking(pending[lacking], origins.at(lacking)) from None
            raise self._misfit(pending, origins, e) from None
        # from_pylist reads a missing field as null: only rows with a null may lack one
        lacking = self._first_lacking(pending, _rows_with_nulls(batch))
        if lacking is not None:
            raise self._lacking(pending[lacking], origins.at(lacking))
        # from_pylist does not enforce nullability
        if any(batch.column(i).null_count for i in self._not_null) or any(
            forbidden_nulls(batch.column(i)) for i in self._nested_not_null
        ):
            raise self._misfit(pending, origins, ValueError("null in a NOT NULL field"))
        self.total_rows += batch.num_rows
        return batch

    def _first_lacking(self, pending: list[dict[str, Any]], rows: Iterable[int]) -> int | None:
        names = self._name_set
        return next((r for r in rows if not pending[r].keys() >= names), None)

    def _lacking(self, values: dict[str, Any], origin: tuple[str, Any] | None) -> OutputSchemaError:
        missing = [f for f in self.schema.fields if f.name not in values]
        source, key = origin if origin is not None else (None, None)
        return OutputSchemaError(
            f"{yielded_by(source, key)} yielded a Row that lacks field(s) {[f.name for f in missing]}"
            f" ({', '.join(column_text(f) for f in missing)}): {show(Row(**values))}; the output schema is"
            f" ({schema_text(self.schema)})"
        )

    def _misfit(
        self, pending: list[dict[str, Any]], origins: _Origins, error: Exception
    ) -> OutputSchemaError:
        """The error naming the first column and row whose value does not convert (the slow path)."""
        for field, arrow_field in zip(self.schema.fields, self.arrow_schema, strict=True):
            values = [row[field.name] for row in pending]
            fits = partial(_prefix_fits, values, arrow_field.type, field.nullable)
            row = find_misfit(len(values), fits)
            if row is not None:
                return misfit_error(field, values[row], origins.at(row))
        return unexplained_error(self.schema, error)


class _Origins:
    """The (handler, grouping key) of each row of one flush of a :class:`RowOutputCollector`."""

    def __init__(self, sources: OutputOrigins, keys: list[Any]) -> None:
        self.sources = sources
        self.keys = keys

    def at(self, row: int) -> tuple[str, Any] | None:
        source = self.sources.at(row)
        return None if source is None else (source[0], self.keys[row])


def _rows_with_nulls(batch: pa.RecordBatch) -> list[int]:
    """The rows of ``batch`` with a null in some column, in order (none for most batches: no work)."""
    rows: set[int] = set()
    for column in batch.columns:
        if column.null_count:
            rows.update(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist())
    return sorted(rows)


def _prefix_fits(values: list[Any], arrow_type: pa.DataType, nullable: bool, stop: int) -> bool:
    """Whether the first ``stop`` values of a column convert to ``arrow_type`` as ``from_pylist`` does."""
    try:
        array = pa.array(values[:stop], type=arrow_type)
    except Exception:
        return False
    return (nullable or not array.null_count) and not forbidden_nulls(array)
