"""Whole-column versions of the key and value encodings, for the vectorized (``api="arrow"``) processor API.

The bytes are exactly those of :mod:`blobstate.encoding.codec` (grouping keys) and
:mod:`blobstate.encoding.values` (state values): a checkpoint does not depend on the API that wrote it.
Only the way they are produced differs: the common cases (string, integer, boolean and floating-point
key columns; state schemas of fixed-width fields only, without TTL) are encoded and decoded for a whole
column at once with pyarrow and numpy; anything else goes through the per-row codecs, value by value.
Decoding checks what it reads as the per-row decoder does (marker, length, null bitmap) and hands
anything unusual to it, so a corrupt value is refused with the same error naming the state variable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobstate.encoding import codec
from blobstate.encoding.values import EXPIRED, MARK, StateCodec, compile_schema
from blobstate.processor.errors import StateVariableError

_NULL_KEY = pa.scalar(b"\x00", pa.binary())
_STR_TAG = pa.scalar(b"\x06", pa.binary())
_TERM = pa.scalar(b"\x00\x00", pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())
_SIGN = np.uint64(1 << 63)
_ALL = np.uint64((1 << 64) - 1)
_CANONICAL_NAN = np.float64("nan").view(np.uint64)


def _fixed_to_binary(buffer: np.ndarray, width: int) -> pa.Array:
    """Rows of a ``(n, width)`` uint8 array as a binary array of n values."""
    n = buffer.shape[0]
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(buffer.tobytes())])
    return fixed.cast(pa.binary())


def _tagged_be64(tag: int, bits: np.ndarray) -> pa.Array:
    """``tag`` byte + 8 big-endian bytes of each uint64 in ``bits``."""
    out = np.empty((len(bits), 9), dtype=np.uint8)
    out[:, 0] = tag
    out[:, 1:] = bits.astype(">u8").view(np.uint8).reshape(-1, 8)
    return _fixed_to_binary(out, 9)


def _encode_column(column: pa.ChunkedArray) -> pa.Array | None:
    """One key column's components as binary values (codec's encoding); None: no vectorized form."""
    t = column.type
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(t):
        array = array.dictionary_decode()
        t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        body = pc.replace_substring(array.cast(pa.binary()), b"\x00", b"\x00\x01")
        encoded = pc.binary_join_element_wise(_STR_TAG, body, _TERM, _EMPTY)
    elif pa.types.is_integer(t):
        if pa.types.is_uint64(t) and pc.max(array).as_py() is not None and pc.max(array).as_py() >= 1 << 63:
            return None  # beyond int64: codec's big-int form
        values = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        encoded = _tagged_be64(0x03, values.view(np.uint64) ^ _SIGN)
    elif pa.types.is_boolean(t):
        encoded = pc.if_else(array, pa.scalar(b"\x02", pa.binary()), pa.scalar(b"\x01", pa.binary()))
    elif pa.types.is_floating(t):
        values = array.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False).copy()
        values[values == 0.0] = 0.0  # -0.0 groups with 0.0, as Spark normalizes it
        bits = values.view(np.uint64)
        bits[np.isnan(values)] = _CANONICAL_NAN
        negative = (bits & _SIGN) != 0
        encoded = _tagged_be64(0x05, np.where(negative, bits ^ _ALL, bits | _SIGN))
    else:
        return None
    if array.null_count:
        encoded = pc.if_else(array.is_null(), _NULL_KEY, encoded)
    return encoded


def encode_keys(keys: pa.Table) -> list[bytes]:
    """The encoded grouping key (:func:`codec.encode_key`) of every row of ``keys``, in row order."""
    parts = []
    for column in keys.columns:
        encoded = _encode_column(column)
        if encoded is None:
            columns = [c.to_pylist() for c in keys.columns]
            encode = codec.encode_key
            return [encode(k) for k in zip(*columns, strict=True)]
        parts.append(encoded)
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, _EMPTY)
    encoded_keys: list[bytes] = joined.to_pylist()
    return encoded_keys


def decode_keys(key_bytes: Sequence[bytes], schema: pa.Schema | Sequence[str]) -> pa.Table:
    """The encoded grouping keys ``key_bytes`` as a table: of ``schema``, or with those column names and
    types inferred from the values (when no input told the key columns' types)."""
    names = schema.names if isinstance(schema, pa.Schema) else list(schema)
    arity = len(names)
    rows = [codec.decode_key(kb, arity)[0] for kb in key_bytes]
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in names]
    if isinstance(schema, pa.Schema):
        return pa.table(
            [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
        )
    return pa.table({name: pa.array(c) for name, c in zip(names, columns, strict=True)})


class ValueColumns:
    """Encodes and decodes the values of one state variable for many keys at once, as Arrow columns.

    ``codec`` is the variable's per-row :class:`StateCodec` (the fallback, and the source of every error
    message); ``arrow_schema`` the Arrow form of its Spark schema.
    """

    def __init__(self, codec_: StateCodec, schema: Any, arrow_schema: pa.Schema) -> None:
        self.codec = codec_
        self.arrow_schema = arrow_schema
        row = compile_schema(schema)
        self._row = row
        # Vectorized only when every field is a fixed-width number or bool with a numpy dtype.
        self._dtype = _numpy_layout(row, arrow_schema) if row.simple else None

    @property
    def vectorized(self) -> bool:
        """Whether values of this schema are encoded and decoded column-wise (else value by value)."""
        return self._dtype is not None

    # -- reading

    def decode(self, data: Sequence[bytes | None], now_ms: int, keys: Sequence[bytes]) -> pa.Table:
        """The stored values ``data`` (None: absent) as a table of the schema, a row per value; absent
        or expired values are a row of nulls. ``keys`` name a value in errors."""
        if self._dtype is not None:
            table = self._decode_fixed(data)
            if table is not None:
                return table
        decode_live = self.codec.decode_live
        rows: list[Any] = []
        for i, value in enumerate(data):
            if value is None:
                rows.append(None)
                continue
            row = decode_live(value, now_ms, keys[i])
            rows.append(None if row is EXPIRED else row)
        return _rows_to_table(rows, self.arrow_schema)

    def _decode_fixed(self, data: Sequence[bytes | None]) -> pa.Table | None:
        dtype, row = self._dtype, self._row
        assert dtype is not None
        n = len(data)
        absent = data.count(None)
        if absent:
            present = np.fromiter((v is not None for v in data), dtype=bool, count=n)
            values = [v for v in data if v is not None]
        else:  # every key has a value: the common case of a steady stream
            present = np.ones(n, dtype=bool)
            values = data  # type: ignore[assignment]
        joined = b"".join(values)
        if len(joined) != len(values) * dtype.itemsize:
            return None  # a TTL value or an odd length: the per-row decoder reads (or refuses) it
        records = np.frombuffer(joined, dtype=dtype)
        if len(records) and not (records["marker"] == MARK).all():
            return None
        bitmap = records["nulls"] if row.nb else None
        if bitmap is not None:
            last = bitmap if row.nb == 1 else bitmap[:, -1]
            if (last >> (row.n - 8 * (row.nb - 1))).any():
                return None  # bits past the last field: the per-row decoder names the corruption
        columns = []
        for i, field in enumerate(self.arrow_schema):
            raw = records[f"f{i}"]
            null = ~present
            if bitmap is not None:
                byte = bitmap if row.nb == 1 else bitmap[:, i >> 3]
                field_null = (byte >> (i & 7)) & 1 != 0
                full = np.zeros(n, dtype=bool)
                full[present] = field_null
                null = null | full
            if absent:
                full_values = np.zeros(n, dtype=raw.dtype.newbyteorder("="))
                full_values[present] = raw
            else:
                full_values = raw.astype(raw.dtype.newbyteorder("="))
            array = pa.array(full_values, mask=null if null.any() else None)
            columns.append(array if array.type == field.type else array.cast(field.type, safe=False))
        return pa.table(columns, schema=self.arrow_schema)

    # -- writing

    def encode(self, table: pa.Table, expiry_ms: int | None, keys: Sequence[Any]) -> list[bytes]:
        """Every row of ``table`` (columns by the schema's names) as stored bytes; ``keys`` name a row
        that does not fit in the error."""
        table = self.conform(table)
        if self._dtype is not None and expiry_ms is None:
            return self._encode_fixed(table)
        encode = self.codec.encode
        columns = [c.to_pylist() for c in table.columns]
        out = []
        for i, row in enumerate(zip(*columns, strict=True)):
            try:
                out.append(encode(row, expiry_ms))
            except StateVariableError as e:
                e.add_note(f"(the value for grouping key {keys[i]!r})")
                raise
        return out

    def conform(self, table: pa.Table) -> pa.Table:
        """``table`` with the schema's columns, in its order, cast to its types (safely: a value that
        does not fit raises :class:`StateVariableError` naming the state variable and the field)."""
        name = self.codec.name
        return conform_columns(
            table,
            self.arrow_schema,
            missing=lambda columns: StateVariableError(
                f"values for state variable {name!r} lack column(s) {columns}; the schema has"
                f" {self.arrow_schema.names}"
            ),
            unfit=lambda field, found, error: StateVariableError(
                f"column {field.name!r} ({found}) of the values for state variable {name!r} does not fit"
                f" its type {field.type}: {error}"
            ),
        )

    def _encode_fixed(self, table: pa.Table) -> list[bytes]:
        dtype, row = self._dtype, self._row
        assert dtype is not None
        n = table.num_rows
        records = np.zeros(n, dtype=dtype)
        records["marker"] = MARK
        for i, column in enumerate(table.columns):
            array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            if array.null_count:
                nulls = array.is_null().to_numpy(zero_copy_only=False)
                if row.nb == 1:
                    records["nulls"] |= nulls.astype(np.uint8) << i
                else:
                    records["nulls"][:, i >> 3] |= nulls.astype(np.uint8) << (i & 7)
                array = array.fill_null(False if pa.types.is_boolean(array.type) else 0)
            records[f"f{i}"] = array.to_numpy(zero_copy_only=False)
        values: list[bytes] = _fixed_to_binary(
            records.view(np.uint8).reshape(n, dtype.itemsize), dtype.itemsize
        ).to_pylist()
        return values


def conform_columns(
    table: pa.Table,
    schema: pa.Schema,
    *,
    missing: Callable[[list[str]], Exception],
    unfit: Callable[[pa.Field, pa.DataType, Exception], Exception],
) -> pa.Table:
    """``table``'s columns named by ``schema``, in its order, each cast (safely) to its type; raises
    ``missing(names)`` for absent columns and ``unfit(field, found type, error)`` for a failed cast."""
    absent = [f.name for f in schema if f.name not in table.column_names]
    if absent:
        raise missing(absent)
    columns = []
    for field in schema:
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise unfit(field, column.type, e) from None
        columns.append(column)
    return pa.table(columns, schema=schema)


_NUMPY_CODES = {"?": "?", "b": "i1", "h": "<i2", "i": "<i4", "q": "<i8", "d": "<f8"}


def _numpy_layout(row: Any, arrow_schema: pa.Schema) -> np.dtype | None:
    """The numpy record of a value ``marker + null bitmap + fixed part`` (values.RowLayout.value), or None."""
    fields: list[tuple[str, str] | tuple[str, str, tuple[int]]] = [("marker", "u1")]
    if row.nb == 1:
        fields.append(("nulls", "u1"))
    elif row.nb:
        fields.append(("nulls", "u1", (row.nb,)))
    for i, (t, f) in enumerate(zip(row.types, arrow_schema, strict=True)):
        code = _NUMPY_CODES.get(t.code)
        numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type)
        if code is None or not numeric:
            return None
        fields.append((f"f{i}", code))
    dtype = np.dtype(fields)
    if dtype.itemsize != row.value.size:
        return None
    return dtype


def _rows_to_table(rows: list[Any], schema: pa.Schema) -> pa.Table:
    """Decoded rows (tuples, None for a row of nulls) as a table of ``schema``."""
    n = len(schema)
    columns: list[list[Any]] = [[] for _ in range(n)]
    for row in rows:
        if row is None:
            for c in columns:
                c.append(None)
        else:
            for c, v in zip(columns, row, strict=True):
                c.append(v)
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)
