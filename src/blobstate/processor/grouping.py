"""Group one partition's input rows by key: one sort in Arrow, one pandas conversion, cheap slices.

The rows are sorted by the key columns (ascending, nulls first, as Spark's operator orders its
input), converted to pandas once with PySpark's own Arrow-to-pandas conversion (so column dtypes
match what Spark's worker passes), and each key's rows are handed to the processor as
``frame.iloc[start:end]`` with a fresh ``RangeIndex`` — no per-key DataFrame construction.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from blobstate import defaults
from blobstate.encoding import codec
from blobstate.encoding.codec import Key

# Spark's default spark.sql.execution.arrow.maxRecordsPerBatch: a key's rows arrive in DataFrames of
# at most this many rows.
DEFAULT_MAX_ROWS_PER_FRAME = defaults.MAX_ROWS_PER_FRAME


@contextmanager
def quiet_pyspark_conversion() -> Iterator[None]:
    """Silence the pandas 3 deprecation warning PySpark 4.3's conversion code raises on every call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The copy keyword is deprecated")
        yield


def to_table(data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch] | None) -> pa.Table | None:
    """Collect input given as a Table, a RecordBatch or an iterable of RecordBatches; None if empty."""
    if data is None:
        return None
    if isinstance(data, pa.Table):
        return data if data.num_rows else None
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data]) if data.num_rows else None
    batches = [b for b in data if b.num_rows]
    if not batches:
        return None
    try:
        return pa.Table.from_batches(batches)
    except pa.ArrowInvalid as e:
        raise ValueError(f"input record batches do not share one schema: {e}") from None


def check_columns(table: pa.Table, columns: Sequence[str], what: str) -> None:
    """Raise naming the missing columns of ``table``."""
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{what} column(s) {missing} not in the input columns {table.column_names}")


def _widen(table: pa.Table) -> pa.Table:
    """Widen small ints to int64 and floats to float64, as Spark's worker (which rebuilds rows) does;
    decode dictionary-encoded columns."""
    fields = []
    changed = False
    for field in table.schema:
        t = field.type
        if pa.types.is_dictionary(t):
            t = t.value_type
            field = field.with_type(t)
            changed = True
        if pa.types.is_integer(t) and t != pa.int64():
            fields.append(field.with_type(pa.int64()))
            changed = True
        elif pa.types.is_float32(t) or pa.types.is_float16(t):
            fields.append(field.with_type(pa.float64()))
            changed = True
        else:
            fields.append(field)
    return table.cast(pa.schema(fields)) if changed else table


def _changes(column: pa.ChunkedArray) -> np.ndarray:
    """Boolean array of length n-1: whether row i+1 has a different value than row i."""
    n = len(column)
    a = column.slice(1)
    b = column.slice(0, n - 1)
    t = column.type
    if pa.types.is_nested(t):
        # compared by their key bytes: NaN equals NaN and -0.0 equals 0.0 inside a struct too, as Spark
        # groups them (Python's != would make a group of every row holding a NaN)
        encoded = [codec.encode_key((v,)) for v in column.to_pylist()]
        return np.fromiter((encoded[i + 1] != encoded[i] for i in range(n - 1)), bool, n - 1)
    changed = pc.fill_null(pc.not_equal(a, b), False)
    if pa.types.is_floating(t):
        both_nan = pc.and_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False))
        changed = pc.and_(changed, pc.invert(both_nan))
    if column.null_count:
        changed = pc.or_(changed, pc.not_equal(pc.is_null(a), pc.is_null(b)))
    return np.asarray(changed.to_numpy(zero_copy_only=False), dtype=bool)


@dataclass
class Groups:
    """Rows of one table grouped by key, in ascending key order."""

    frame: pd.DataFrame
    keys: list[Key]
    key_bytes: list[bytes]
    starts: list[int]
    ends: list[int]
    max_rows: int = DEFAULT_MAX_ROWS_PER_FRAME

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, i: int) -> Frames:
        """The rows of the ``i``-th key as DataFrames of at most ``max_rows`` rows, cut lazily."""
        return Frames(self.frame, self.starts[i], self.ends[i], self.max_rows)


def key_runs(table: pa.Table, key_columns: Sequence[str]) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """``table`` sorted by ``key_columns`` (ascending, nulls first, as Spark's operator orders its
    input), and the start and end row of each run of equal keys in it (int64 arrays)."""
    order = pc.sort_indices(table, sort_keys=[(c, "ascending", "at_start") for c in key_columns])
    table = table.take(order)
    n = table.num_rows
    changed = np.zeros(max(n - 1, 0), dtype=bool)
    for c in key_columns:
        changed |= _changes(table.column(c))
    starts = (
        np.concatenate(([0], np.flatnonzero(changed) + 1)).astype(np.int64) if n else np.zeros(0, np.int64)
    )
    ends = np.append(starts[1:], n).astype(np.int64)
    return table, starts, ends


def sort_by_key(table: pa.Table, key_columns: Sequence[str]) -> tuple[pa.Table, list[int], list[int]]:
    """:func:`key_runs` with the starts and ends as lists."""
    table, starts, ends = key_runs(table, key_columns)
    return table, starts.tolist(), ends.tolist()


def instants(column: pa.ChunkedArray | pa.Array) -> list[object]:
    """A TIMESTAMP column's values as instants: naive UTC readings (``pd.Timestamp``) or None, the form
    :func:`codec.encode_key` stores an instant in, whatever zone the column's type names."""
    micros = (
        column.cast(pa.int64())
        if column.type.unit == "us"
        else column.cast(pa.timestamp("us")).cast(pa.int64())
    )
    return [None if v is None else pd.Timestamp(v, unit="us") for v in micros.to_pylist()]


def _holds_instant(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return t.tz is not None
    if pa.types.is_struct(t):
        return any(_holds_instant(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _holds_instant(t.value_type)
    return False


def instant_key_columns(schema: pa.Schema, key_columns: Sequence[str]) -> tuple[int, ...]:
    """The positions in ``key_columns`` of columns that are or hold a Spark TIMESTAMP (an Arrow timestamp
    with a zone): their keys are instants, stored by their UTC reading, not by the session zone's wall
    clock."""
    return tuple(i for i, name in enumerate(key_columns) if _holds_instant(schema.field(name).type))


def group_by_key(
    table: pa.Table, key_columns: Sequence[str], timezone: str, max_rows: int = DEFAULT_MAX_ROWS_PER_FRAME
) -> Groups:
    """Sort ``table`` by ``key_columns`` and find each key's row range.

    The keys handed to handlers are pandas values, as Spark's worker gives them (a TIMESTAMP as a naive
    time of ``timezone``); the stored key bytes take a TIMESTAMP column's instant from the Arrow data, so
    two instants that read alike in the zone (the repeated hour when clocks go back) stay two keys and a
    restart under another zone finds the same keys."""
    from pyspark.sql.conversion import ArrowBatchTransformer

    table, starts, ends = sort_by_key(_widen(table), key_columns)
    with quiet_pyspark_conversion():
        frame = pd.concat(ArrowBatchTransformer.to_pandas(table, timezone=timezone), axis=1)
    frame.columns = table.column_names
    key_values = []
    for c in key_columns:
        values = frame[c].take(starts).tolist()
        column = table.column(c)
        if column.null_count:  # pandas shows nulls as NaN/NaT; keys carry None
            nulls = np.asarray(column.take(pa.array(starts)).is_null().to_numpy(zero_copy_only=False))
            for i in np.flatnonzero(nulls).tolist():
                values[i] = None
        key_values.append(values)
    keys = list(zip(*key_values, strict=True))
    encode = codec.encode_key
    stored = instant_key_columns(table.schema, key_columns)
    if not stored:
        return Groups(frame, keys, [encode(k) for k in keys], starts, ends, max_rows)
    stored_values = list(key_values)
    taken = pa.array(starts, type=pa.int64())
    for i in stored:
        column = table.column(key_columns[i]).take(taken)
        # Arrow's own values: a TIMESTAMP as an aware time (an instant), also inside a struct
        stored_values[i] = instants(column) if pa.types.is_timestamp(column.type) else column.to_pylist()
    key_bytes = [encode(k) for k in zip(*stored_values, strict=True)]
    return Groups(frame, keys, key_bytes, starts, ends, max_rows)


def _slice_iloc(frame: pd.DataFrame, start: int, stop: int) -> pd.DataFrame:
    chunk = frame.iloc[start:stop]
    chunk.index = pd.RangeIndex(stop - start)
    return chunk


_FROM_MGR = pd.DataFrame._from_mgr
_RANGE = pd.RangeIndex._simple_new


def _slice_fast(frame: pd.DataFrame, start: int, stop: int) -> pd.DataFrame:
    """``frame.iloc[start:stop]`` with a fresh RangeIndex, cut block by block.

    About half the cost of slicing the block manager (which also slices the index only to have it
    replaced) and a third of ``iloc`` plus an index assignment; copy-on-write still protects
    ``frame`` (each sliced block keeps its reference tracking). pandas internals, so
    :func:`slicer` checks it once against ``iloc`` and falls back when it differs or fails.
    """
    mgr = frame._mgr
    rows = slice(start, stop)
    blocks = [block.slice_block_rows(rows) for block in mgr.blocks]
    sliced = type(mgr).from_blocks(blocks, [mgr.axes[0], _RANGE(range(stop - start))])
    return _FROM_MGR(sliced, axes=sliced.axes)


_slicer: Callable[[pd.DataFrame, int, int], pd.DataFrame] | None = None


def _slice_is_safe(slice_rows: Callable[[pd.DataFrame, int, int], pd.DataFrame]) -> bool:
    """Whether ``slice_rows`` gives what ``iloc`` gives, and writing to its result leaves the source alone."""
    probe = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"], "c": [0.5, None, 1.5], "d": [4, 5, 6]})
    try:
        cut = slice_rows(probe, 1, 3)
        if not (cut.equals(_slice_iloc(probe, 1, 3)) and cut.index.equals(pd.RangeIndex(2))):
            return False
        cut.loc[0, "a"] = -1
        cut.loc[1, "b"] = "changed"
        return bool(probe["a"].tolist() == [1, 2, 3] and probe["b"].tolist() == ["x", "y", "z"])
    except Exception:
        return False


def slicer() -> Callable[[pd.DataFrame, int, int], pd.DataFrame]:
    """The row slicer to use: the fast one if it behaves exactly as ``iloc`` does here."""
    global _slicer
    if _slicer is None:
        _slicer = _slice_fast if _slice_is_safe(_slice_fast) else _slice_iloc
    return _slicer


class Frames:
    """Iterator over one key's rows as pandas DataFrames of at most ``max_rows`` rows each.

    Slices are cut lazily, so a handler that never iterates its rows costs nothing. Each has a
    fresh ``RangeIndex`` (0..n-1), as the DataFrames Spark's worker builds.
    """

    __slots__ = ("_end", "_frame", "_max", "_pos", "_slice")

    def __init__(self, frame: pd.DataFrame, start: int, end: int, max_rows: int) -> None:
        self._frame = frame
        self._pos = start
        self._end = end
        self._max = max_rows
        self._slice = _slicer or slicer()

    def __iter__(self) -> Iterator[pd.DataFrame]:
        return self

    def __next__(self) -> pd.DataFrame:
        pos = self._pos
        if pos >= self._end:
            raise StopIteration
        stop = min(pos + self._max, self._end)
        self._pos = stop
        return self._slice(self._frame, pos, stop)


def event_time_micros(column: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """An event-time column as int64 microseconds (Spark's timestamp precision)."""
    t = column.type
    if not pa.types.is_timestamp(t):
        raise ValueError(f"event time column {name!r} must be a timestamp column, not {t}")
    raw = column.cast(pa.int64())
    factor = {"s": 1_000_000, "ms": 1_000, "us": 1}.get(t.unit)
    if factor is None:  # ns
        return pc.divide(raw, 1_000)
    return raw if factor == 1 else pc.multiply(raw, factor)


def max_event_time_ms(micros: pa.ChunkedArray) -> int | None:
    """The largest event time in ms (floor), or None if every value is null."""
    value = pc.max(micros).as_py()
    return None if value is None else value // 1000


def drop_late_rows(table: pa.Table, micros: pa.ChunkedArray, watermark_ms: int) -> tuple[pa.Table, int]:
    """Drop rows whose event time is at or before the watermark (Spark's late-data rule)."""
    late = pc.fill_null(pc.less_equal(micros, watermark_ms * 1000), False)
    dropped = pc.sum(late).as_py() or 0
    if not dropped:
        return table, 0
    return table.filter(pc.invert(late)), dropped
