"""Collect the DataFrames a processor yields and turn them into Arrow record batches.

Each yielded DataFrame is checked against the output schema (by column name when its columns are
strings, else by position, as Spark assigns them) and kept; every ``flush_rows`` rows the kept
frames are concatenated once and converted with PySpark's own pandas-to-Arrow conversion, so
the type coercions Spark accepts are accepted. A value that does not convert, or a null in a NOT
NULL column, raises :class:`OutputSchemaError` naming the column, its Spark type, the value and
the handler call (grouping key) that yielded it (:mod:`blobstate.processor.output_errors`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.types import StructField, StructType

from blobstate import defaults
from blobstate.processor.errors import OutputSchemaError
from blobstate.processor.grouping import quiet_pyspark_conversion
from blobstate.processor.output_errors import (
    OutputOrigins,
    find_misfit,
    forbidden_nulls,
    has_nested_not_null,
    misfit_error,
    schema_text,
    unexplained_error,
    yielded_by,
)

DEFAULT_FLUSH_ROWS = defaults.FLUSH_ROWS


class OutputCollector:
    """Validates output frames and emits them as record batches of the output schema."""

    items = "pandas DataFrames"
    """What handlers must yield, for error messages."""

    def __init__(
        self,
        schema: StructType,
        arrow_schema: pa.Schema,
        *,
        timezone: str = "UTC",
        flush_rows: int = DEFAULT_FLUSH_ROWS,
    ) -> None:
        self.schema = schema
        self.arrow_schema = arrow_schema
        self.timezone = timezone
        self.flush_rows = flush_rows
        self._names = list(schema.names)
        self._name_set = set(self._names)
        # Column name tuples already validated (usually one) -> whether they are assigned by position.
        self._ok_columns: dict[tuple[object, ...], bool] = {}
        self._not_null = [i for i, f in enumerate(schema.fields) if not f.nullable]
        self._nested_not_null = [i for i, f in enumerate(arrow_schema) if has_nested_not_null(f.type)]
        self._runs: list[_Run] = []
        self._run: _Run | None = None
        self._origins = OutputOrigins()
        self._last_origin: tuple[str, Any] | None = None
        self.pending_rows = 0
        self.total_rows = 0

    def _check(self, frame: Any, source: str, key: Any) -> pd.DataFrame | None:
        if not isinstance(frame, pd.DataFrame):
            raise OutputSchemaError(
                f"{yielded_by(source, key)} yielded a {type(frame).__name__}; it must yield pandas"
                f" DataFrames with the output columns ({schema_text(self.schema)})"
            )
        columns = frame.columns
        fingerprint = _fingerprint(columns)
        positional = self._ok_columns.get(fingerprint)
        if positional is not None:
            return self._positional(frame) if positional else frame
        if len(columns) == 0 and len(frame) == 0:
            return None
        names = list(columns)
        if any(isinstance(c, str) for c in names):
            missing = [c for c in self._names if c not in set(names)]
            extra = [c for c in names if c not in self._name_set]
            duplicated = sorted({c for c in names if names.count(c) > 1})
            if missing or extra or duplicated:
                parts = []
                if missing:
                    parts.append(f"missing column(s) {missing}")
                if extra:
                    parts.append(f"unexpected column(s) {extra}")
                if duplicated:
                    parts.append(f"duplicated column(s) {duplicated}")
                raise OutputSchemaError(
                    f"{yielded_by(source, key)} yielded a DataFrame with {', '.join(parts)}; the output"
                    f" schema is ({schema_text(self.schema)})"
                )
            self._ok_columns[fingerprint] = False
            return frame
        if len(names) != len(self._names):
            raise OutputSchemaError(
                f"{yielded_by(source, key)} yielded a DataFrame with {len(names)} unnamed column(s); the"
                f" output schema has {len(self._names)} columns ({schema_text(self.schema)})"
            )
        self._ok_columns[fingerprint] = True
        return self._positional(frame)

    def _positional(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame.set_axis(self._names, axis=1)

    def add(self, frame: Any, source: str, key: Any = None) -> None:
        """Validate and keep one yielded frame; ``source`` (the handler) and ``key`` (the grouping
        key it ran for) are named in error messages."""
        checked = self._check(frame, source, key)
        if checked is None:
            return
        rows = len(checked)
        if rows == 0:
            return
        origin = self._last_origin
        if origin is None or origin[1] is not key or origin[0] != source:
            self._last_origin = (source, key)
            self._origins.mark(self.pending_rows, source, key)
        self.pending_rows += rows
        blocks = checked._mgr.blocks
        layout = (_fingerprint(checked.columns), *((b.dtype, _locs(b)) for b in blocks))
        run = self._run
        values = [b.values for b in blocks]
        if run is None or run.layout != layout:
            run = self._run = _Run(checked.columns, layout, values)
            self._runs.append(run)
        run.parts.append(values)
        if run.keep_frames:
            run.frames.append(checked)

    @property
    def ready(self) -> bool:
        """Whether enough rows are pending to emit a batch."""
        return self.pending_rows >= self.flush_rows

    def flush(self) -> pa.RecordBatch | None:
        """Convert the pending frames into one record batch (None when nothing is pending)."""
        if not self._runs:
            return None
        from pyspark.sql.conversion import PandasToArrowConversion

        runs, origins = self._runs, self._origins
        self._runs = []
        self._run = None
        self._origins = OutputOrigins()
        self._last_origin = None
        self.pending_rows = 0
        parts = [run.concat() for run in runs]
        data = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True, sort=False)
        data = _single_chunks(data[self._names])
        try:
            with quiet_pyspark_conversion():
                batch = PandasToArrowConversion.convert(
                    data,
                    self.schema,
                    timezone=self.timezone,
                    safecheck=True,
                    arrow_cast=True,
                    assign_cols_by_name=True,
                )
            for i in self._not_null:
                if batch.column(i).null_count:
                    raise ValueError(f"null in NOT NULL column {self._names[i]!r}")
            if batch.schema != self.arrow_schema:
                batch = batch.cast(self.arrow_schema)
            for i in self._nested_not_null:
                if forbidden_nulls(batch.column(i)):
                    raise ValueError(f"null in a NOT NULL field inside column {self._names[i]!r}")
        except Exception as e:  # any failure converting user values; the diagnosis names it
            raise self._misfit(data, origins, e) from None
        self.total_rows += batch.num_rows
        return batch

    def _misfit(self, data: pd.DataFrame, origins: OutputOrigins, error: Exception) -> OutputSchemaError:
        """The error naming the first column and row whose value does not convert (the slow path)."""
        for i, field in enumerate(self.schema.fields):
            series = data.iloc[:, i]
            fits = partial(self._prefix_fits, series, field, self.arrow_schema.field(i).type)
            row = find_misfit(len(series), fits)
            if row is not None:
                return misfit_error(field, series.iloc[row], origins.at(row))
        return unexplained_error(self.schema, error)

    def _prefix_fits(self, series: pd.Series, field: StructField, arrow_type: pa.DataType, stop: int) -> bool:
        """Whether one column's first ``stop`` values convert to ``field`` as :meth:`flush` converts them."""
        from pyspark.sql.conversion import PandasToArrowConversion

        series = series.iloc[:stop]
        try:
            with quiet_pyspark_conversion():
                batch = PandasToArrowConversion.convert(
                    [series], StructType([field]), timezone=self.timezone, safecheck=True, arrow_cast=True
                )
            array = batch.column(0)
            if array.null_count and not field.nullable:
                return False
            if array.type != arrow_type:
                array = array.cast(arrow_type)
            return not forbidden_nulls(array)
        except Exception:
            return False


def _single_chunks(frame: pd.DataFrame) -> pd.DataFrame:
    """Combine the chunks of Arrow-backed columns (concatenation leaves one chunk per frame), which
    PySpark's conversion expects as single arrays."""
    replaced = {}
    for name, column in frame.items():
        array = column.array
        chunks = getattr(array, "_pa_array", None)
        if isinstance(chunks, pa.ChunkedArray) and chunks.num_chunks > 1:
            replaced[name] = pd.array(chunks.combine_chunks(), dtype=column.dtype)
    if not replaced:
        return frame
    return frame.assign(**replaced)


def _fingerprint(columns: pd.Index) -> tuple[object, ...]:
    """The column names as a tuple, cheaply (``Index.equals`` costs more than building a small frame)."""
    data = getattr(columns, "_data", None)
    chunks = getattr(data, "_pa_array", None)
    if isinstance(chunks, (pa.ChunkedArray, pa.Array)):
        return tuple(chunks.to_pylist())
    if isinstance(data, np.ndarray):
        return tuple(data.tolist())
    return tuple(columns)


def _locs(block: Any) -> Any:
    indexer = block.mgr_locs.indexer
    return indexer if isinstance(indexer, slice) else tuple(indexer.tolist())


def _plain_block(values: Any) -> bool:
    """Whether a block's values concatenate block-wise: a 2-D numpy array or a 1-D extension array."""
    if isinstance(values, np.ndarray):
        return values.ndim == 2
    return getattr(values, "ndim", 1) == 1 and hasattr(type(values), "_concat_same_type")


class _Run:
    """Consecutive frames with the same columns and the same pandas block layout.

    Concatenating them block by block (one ``np.concatenate`` per block) costs a few microseconds
    per frame, against tens for ``pd.concat`` of many one-row frames. Only the block values are
    kept: holding thousands of small DataFrames alive until the flush costs more in garbage
    collection than building them. Runs with a block kind this does not know keep their frames
    and fall back to ``pd.concat``.
    """

    __slots__ = ("columns", "frames", "keep_frames", "layout", "parts")

    def __init__(self, columns: pd.Index, layout: tuple[Any, ...], first_values: list[Any]) -> None:
        self.columns = columns
        self.layout = layout
        self.parts: list[list[Any]] = []
        self.keep_frames = not all(_plain_block(v) for v in first_values)
        self.frames: list[pd.DataFrame] = []

    def concat(self) -> pd.DataFrame:
        if self.keep_frames:
            try:
                return self._concat_blocks()
            except Exception:
                return pd.concat(self.frames, ignore_index=True, sort=False)
        return self._concat_blocks()

    def _concat_blocks(self) -> pd.DataFrame:
        columns: dict[int, Any] = {}
        for i, (_, locs) in enumerate(self.layout[1:]):
            values = [part[i] for part in self.parts]
            first = values[0]
            positions = range(len(self.columns))[locs] if isinstance(locs, slice) else locs
            if isinstance(first, np.ndarray):
                if first.ndim != 2:
                    raise TypeError("unexpected block shape")
                merged = np.concatenate(values, axis=1)
                for row, pos in enumerate(positions):
                    columns[pos] = merged[row]
            elif getattr(first, "ndim", 1) == 2:
                merged = type(first)._concat_same_type(values, axis=1)
                for row, pos in enumerate(positions):
                    columns[pos] = merged[row]
            else:
                merged = type(first)._concat_same_type(values)
                (pos,) = positions
                columns[pos] = merged
        names = list(self.columns)
        frame = pd.DataFrame({names[pos]: columns[pos] for pos in range(len(names))}, copy=False)
        if len(frame.columns) != len(names):  # duplicate names would have collapsed
            raise ValueError("duplicate column names")
        return frame
