"""The row-based processor API: PySpark's ``transformWithState`` (4.1+) instead of ``...InPandas``.

The handlers are the same; only what flows through them differs. ``handleInputRows(key, rows,
timerValues)`` gets an iterator of :class:`pyspark.sql.Row` (one per input row, every input column,
values as ``pyarrow``'s ``as_py`` gives them, as Spark's worker builds them) and yields ``Row``
objects, which are matched to the output schema by field name (``Row.asDict(True)`` and
``pyarrow.RecordBatch.from_pylist``, Spark's conversion). ``handleInitialState`` is called once per
initial-state row. No pandas is involved, so a key costs a few microseconds of framework time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import Row

from blobstate.processor import codec
from blobstate.processor.errors import OutputSchemaError
from blobstate.processor.grouping import sort_by_key

DEFAULT_FLUSH_ROWS = 65_536


@dataclass
class RowGroups:
    """Rows of one table grouped by key, in ascending key order, as Python values."""

    columns: list[list[Any]]
    row_class: Any
    keys: list[tuple]
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
    """Validates the Rows a processor yields and emits them as record batches of the output schema."""

    items = "Rows"
    """What handlers must yield, for error messages."""

    def __init__(self, arrow_schema: pa.Schema, *, flush_rows: int = DEFAULT_FLUSH_ROWS) -> None:
        self.arrow_schema = arrow_schema
        self.flush_rows = flush_rows
        self._names = arrow_schema.names
        self._pending: list[dict[str, Any]] = []
        self.total_rows = 0

    def add(self, row: Any, source: str) -> None:
        """Keep one yielded Row; ``source`` names the handler for error messages."""
        as_dict = getattr(row, "asDict", None)
        if as_dict is None or not isinstance(row, tuple):
            raise OutputSchemaError(
                f"{source} yielded a {type(row).__name__}; with the row-based API it must yield"
                f" pyspark.sql.Row objects with the output fields {self._names}"
            )
        self._pending.append(as_dict(True))

    @property
    def ready(self) -> bool:
        """Whether enough rows are pending to emit a batch."""
        return len(self._pending) >= self.flush_rows

    def flush(self) -> pa.RecordBatch | None:
        """Convert the pending rows into one record batch (None when nothing is pending)."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        missing = [n for n in self._names if n not in pending[0]]
        if missing:
            raise OutputSchemaError(
                f"output Row {pending[0]!r} lacks field(s) {missing} of the output schema {self._names}"
            )
        try:
            batch = pa.RecordBatch.from_pylist(pending, schema=self.arrow_schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise OutputSchemaError(
                f"output rows do not fit the output schema {self.arrow_schema}: {e}"
            ) from e
        self.total_rows += batch.num_rows
        return batch
