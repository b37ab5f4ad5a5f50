"""Collect the DataFrames a processor yields and turn them into Arrow record batches.

Each yielded DataFrame is checked against the output schema (by column name when its columns are
strings, else by position, as Spark assigns them) and kept; every ``flush_rows`` rows the kept
frames are concatenated once and converted with PySpark's own pandas-to-Arrow conversion, so
type coercions and their errors are Spark's.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.types import StructType

from blobstate.processor.errors import OutputSchemaError

DEFAULT_FLUSH_ROWS = 65_536


class OutputCollector:
    """Validates output frames and emits them as record batches of the output schema."""

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
        # Column indexes already validated (usually one), with whether they are assigned by position.
        self._ok_columns: list[tuple[pd.Index, bool]] = []
        self._frames: list[pd.DataFrame] = []
        self.pending_rows = 0
        self.total_rows = 0

    def _check(self, frame: Any, source: str) -> pd.DataFrame | None:
        if not isinstance(frame, pd.DataFrame):
            raise OutputSchemaError(
                f"{source} yielded a {type(frame).__name__}; it must yield pandas DataFrames with the"
                f" output columns {self._names}"
            )
        columns = frame.columns
        for ok, positional in self._ok_columns:
            if columns is ok or (len(columns) == len(ok) and columns.equals(ok)):
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
                    f"{source} yielded a DataFrame with {', '.join(parts)}; the output schema has columns"
                    f" {self._names}"
                )
            self._ok_columns.append((columns, False))
            return frame
        if len(names) != len(self._names):
            raise OutputSchemaError(
                f"{source} yielded a DataFrame with {len(names)} unnamed column(s); the output schema has"
                f" {len(self._names)} columns {self._names}"
            )
        self._ok_columns.append((columns, True))
        return self._positional(frame)

    def _positional(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame.set_axis(self._names, axis=1)

    def add(self, frame: Any, source: str) -> None:
        """Validate and keep one yielded frame; ``source`` names the handler for error messages."""
        checked = self._check(frame, source)
        if checked is None or len(checked) == 0:
            return
        self._frames.append(checked)
        self.pending_rows += len(checked)

    @property
    def ready(self) -> bool:
        """Whether enough rows are pending to emit a batch."""
        return self.pending_rows >= self.flush_rows

    def flush(self) -> pa.RecordBatch | None:
        """Convert the pending frames into one record batch (None when nothing is pending)."""
        if not self._frames:
            return None
        from pyspark.sql.conversion import PandasToArrowConversion

        frames = self._frames
        self._frames = []
        self.pending_rows = 0
        data = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True, sort=False)
        try:
            batch = PandasToArrowConversion.convert(
                data[self._names],
                self.schema,
                timezone=self.timezone,
                safecheck=True,
                arrow_cast=True,
                assign_cols_by_name=True,
            )
        except (TypeError, ValueError) as e:
            raise OutputSchemaError(f"output rows do not fit the output schema: {e}") from e
        if batch.schema != self.arrow_schema:
            batch = batch.cast(self.arrow_schema)
        self.total_rows += batch.num_rows
        return batch
