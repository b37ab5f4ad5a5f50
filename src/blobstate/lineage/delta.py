"""The delta object format: ``state/<op>/<p>/<v>_<uid>.delta``.

A delta holds the lineage record (the uids of versions v-1, v-2, ... back to the newest presumed snapshot)
and the change records that turn version v-1 into version v. The byte layout is specified in
``docs/FORMATS.md``; in short::

    header   magic, format version, flags, header length, total length, lineage uids, header CRC-32
    body     the change records in columns (ops, column family ids, key lengths, value lengths, key
             bytes, value bytes), zstd-compressed when that makes it smaller
    trailer  record count, uncompressed body length, CRC-32 of everything before the CRC

Records are packed column by column with numpy rather than one at a time, which is what makes encoding
and decoding a million records take a fraction of a second in Python.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

try:  # ISA-L computes exactly zlib's CRC-32, several times faster
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    from zlib import crc32 as _crc32

from blobstate.errors import CorruptionError
from blobstate.gcpause import gc_paused
from blobstate.ids import InvalidIdError, validate_uid
from blobstate.lineage.changelog import Changelog, ChangeOp, ChangeRecord, PutBlock

MAGIC = b"BSDELTA\n"
"""The first 8 bytes of every delta object."""

FORMAT_VERSION = 1
"""The format version this module writes; it reads only this version."""

DEFAULT_COMPRESSION_LEVEL = 1
"""zstd level of the record section. Level 1 compresses small-record changelogs nearly as well as 3."""

_FLAG_ZSTD = 0x0001
_KNOWN_FLAGS = _FLAG_ZSTD

# magic, format version, flags, header length, total length, lineage count
_PREFIX = struct.Struct("<8sHHIQI")
_CRC = struct.Struct("<I")
# record count, uncompressed body length, CRC-32 of everything before the CRC itself
_TRAILER = struct.Struct("<QQI")
# column family count
_BODY_CFS = struct.Struct("<I")
_CF_NAME_LEN = struct.Struct("<H")
# record count, cf-id width, key-length width, value-length width, reserved
_BODY_COUNTS = struct.Struct("<QBBBB")

_WIDTH_DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}


_OP_BY_CODE: dict[int, ChangeOp] = {int(op): op for op in ChangeOp}


class DeltaFormatError(CorruptionError, ValueError):
    """A delta object that is malformed, truncated, corrupt or of an unknown format version."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"delta {name!r}: {problem}")
        self.name = name
        self.problem = problem


@dataclass(frozen=True)
class Delta:
    """A decoded delta: its format version, lineage record and change records in write order."""

    format_version: int
    lineage: list[str]
    records: list[ChangeRecord]


# ---------------------------------------------------------------------------------------------- encoding
def encode_delta(
    records: Iterable[ChangeRecord] | Changelog | PutBlock,
    lineage: Sequence[str],
    *,
    compression_level: int = DEFAULT_COMPRESSION_LEVEL,
) -> bytes:
    """Encode change records and a lineage record as one delta object.

    ``lineage`` is the uids of versions v-1, v-2, ... back to and including the newest snapshot (empty
    for v = 1).
    ``records`` is any iterable of change records, a store's :class:`Changelog` (its bulk blocks are
    packed as the columns they are), or one such bulk block.
    Raises :class:`~blobstate.ids.InvalidIdError` for a bad lineage uid, ``ValueError``/``TypeError``
    naming the record for a malformed record.
    """
    uids = [validate_uid(uid, f"lineage uid #{i}") for i, uid in enumerate(lineage)]
    if isinstance(records, Changelog):
        segments: Sequence[Sequence[ChangeRecord] | PutBlock] = records.segments()
    elif isinstance(records, PutBlock):
        segments = [records]
    else:
        segments = [records if isinstance(records, list | tuple) else list(records)]
    raw_body, count = _encode_body(segments)
    body, flags = raw_body, 0
    if raw_body:
        compressed = zstandard.ZstdCompressor(level=compression_level).compress(raw_body)
        if len(compressed) < len(raw_body):
            body, flags = compressed, _FLAG_ZSTD
    lineage_bytes = b"".join(bytes([len(uid)]) + uid.encode("ascii") for uid in uids)
    header_len = _PREFIX.size + len(lineage_bytes) + _CRC.size
    total_len = header_len + len(body) + _TRAILER.size
    header = _PREFIX.pack(MAGIC, FORMAT_VERSION, flags, header_len, total_len, len(uids)) + lineage_bytes
    header += _CRC.pack(_crc32(header))
    counts = _TRAILER.pack(count, len(raw_body), 0)[: -_CRC.size]
    crc = _crc32(counts, _crc32(body, _crc32(header)))
    return b"".join((header, body, counts, _CRC.pack(crc)))


def _width(max_value: int) -> int:
    for width in (1, 2, 4):
        if max_value < 1 << (8 * width):
            return width
    return 8


def _pack(values: np.ndarray, width: int) -> bytes:
    return values.astype(_WIDTH_DTYPES[width], copy=False).tobytes()


@dataclass
class _Columns:
    """The record columns of one changelog segment (cf ids index the delta's column family table)."""

    ops: np.ndarray
    cf_ids: np.ndarray
    key_lens: np.ndarray
    key_data: bytes
    value_lens: np.ndarray
    value_data: bytes


def _cf_id(table: dict[str, int], cf: object, record: int) -> int:
    """``cf``'s index in the column family table, adding it on first sight (validated then)."""
    index = table.get(cf) if isinstance(cf, str) else None
    if index is None:
        if not isinstance(cf, str) or not cf:
            raise TypeError(f"change record #{record} has bad column family {cf!r}")
        if len(cf.encode("utf-8")) > 0xFFFF:
            raise ValueError(f"column family name {cf[:40]!r}... is longer than 65535 bytes")
        index = table[cf] = len(table)
    return index


def _block_columns(block: PutBlock, first: int, table: dict[str, int]) -> _Columns:
    """A bulk put block's columns; ``first`` is its first record's number (for errors)."""
    n = len(block)
    cf_id = _cf_id(table, block.cf, first)
    positions = range(first, first + n)
    key_data, key_lens = _bytes_column(block.keys, "key", positions)
    value_data, value_lens = _bytes_column(block.values, "value", positions)
    ops = np.full(n, int(ChangeOp.PUT), dtype=np.int64)
    return _Columns(ops, np.full(n, cf_id, dtype=np.int64), key_lens, key_data, value_lens, value_data)


def _record_columns(records: Sequence[ChangeRecord], first: int, table: dict[str, int]) -> _Columns:
    """Single records' columns; ``first`` is the first one's record number (for errors)."""
    n = len(records)
    shapes = set(map(len, records))
    if shapes != {4}:
        bad = next(i for i, r in enumerate(records) if len(r) != 4)
        raise ValueError(
            f"change record #{first + bad} has {len(records[bad])} fields: expected (op, cf, key, value)"
        )
    # One list per column: zip(*records) would build a million tuples and wake the cyclic GC.
    # Typed object: the checks below are for records that break the ChangeRecord type.
    ops: list[object] = [r[0] for r in records]
    cfs = [r[1] for r in records]
    keys = [r[2] for r in records]
    values = [r[3] for r in records]

    if not all(issubclass(t, int) and t is not bool for t in set(map(type, ops))):
        i = next(i for i, op in enumerate(ops) if not isinstance(op, int) or isinstance(op, bool))
        raise TypeError(f"change record #{first + i} has bad op {ops[i]!r}: expected a ChangeOp")
    op_codes = np.fromiter(ops, dtype=np.int64, count=n)
    bad_ops = np.flatnonzero((op_codes < ChangeOp.PUT) | (op_codes > ChangeOp.CLEAR))
    if bad_ops.size:
        i = int(bad_ops[0])
        raise ValueError(f"change record #{first + i} has bad op {ops[i]!r}: expected a ChangeOp")

    for cf in dict.fromkeys(cfs):
        _cf_id(table, cf, first + cfs.index(cf))
    cf_ids = np.fromiter(map(table.__getitem__, cfs), dtype=np.int64, count=n)

    key_data, key_lens = _bytes_column(keys, "key", range(first, first + n))
    is_put = op_codes == ChangeOp.PUT
    bad_clear = np.flatnonzero((op_codes == ChangeOp.CLEAR) & (key_lens != 0))
    if bad_clear.size:
        raise ValueError(f"change record #{first + int(bad_clear[0])} is a CLEAR with a non-empty key")

    put_positions: list[int] = list(range(first, first + n))
    if is_put.all():
        put_values: Sequence[bytes | None] = values
    else:
        put_index = np.flatnonzero(is_put).tolist()
        put_positions = [first + i for i in put_index]
        put_values = [values[i] for i in put_index]
        other = np.flatnonzero(~is_put).tolist()
        other_values = [values[i] for i in other]
        if other_values.count(None) != len(other_values):
            i = next(i for i, v in zip(other, other_values, strict=True) if v is not None)
            raise ValueError(
                f"change record #{first + i} is a {ChangeOp(int(op_codes[i])).name} with a value"
            )
    if None in put_values:
        j = put_values.index(None)
        raise ValueError(f"change record #{put_positions[j]} is a PUT with value None")
    value_data, value_lens = _bytes_column(put_values, "value", put_positions)
    return _Columns(op_codes, cf_ids, key_lens, key_data, value_lens, value_data)


def _encode_body(segments: Sequence[Sequence[ChangeRecord] | PutBlock]) -> tuple[bytes, int]:
    table: dict[str, int] = {}
    parts: list[_Columns] = []
    n = 0
    for segment in segments:
        if not len(segment):
            continue
        if isinstance(segment, PutBlock):
            parts.append(_block_columns(segment, n, table))
        else:
            parts.append(_record_columns(segment, n, table))
        n += len(segment)
    if n == 0:
        return _BODY_CFS.pack(0) + _BODY_COUNTS.pack(0, 0, 1, 1, 0), 0

    def column(name: str) -> np.ndarray:
        arrays = [getattr(part, name) for part in parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    op_codes, key_lens, value_lens = column("ops"), column("key_lens"), column("value_lens")
    cf_blobs = []
    for cf in table:
        encoded = cf.encode("utf-8")
        cf_blobs.append(_CF_NAME_LEN.pack(len(encoded)) + encoded)
    cf_width, cf_column = 0, b""
    if len(table) > 1:
        cf_width = _width(len(table) - 1)
        cf_column = _pack(column("cf_ids"), cf_width)
    key_width = _width(int(key_lens.max()))
    value_width = _width(int(value_lens.max())) if value_lens.size else 1
    body = [
        _BODY_CFS.pack(len(table)),
        *cf_blobs,
        _BODY_COUNTS.pack(n, cf_width, key_width, value_width, 0),
        _pack(op_codes, 1),
        cf_column,
        _pack(key_lens, key_width),
        _pack(value_lens, value_width),
        *(part.key_data for part in parts),
        *(part.value_data for part in parts),
    ]
    return b"".join(body), n


def _bytes_column(items: Sequence[object], what: str, positions: Sequence[int]) -> tuple[bytes, np.ndarray]:
    """``items`` (keys or values) concatenated, and their lengths; ``positions[i]`` is the record number
    of ``items[i]`` (for errors)."""
    data = _join(items, what, positions)
    lens = np.fromiter(map(len, items), dtype=np.int64, count=len(items))  # type: ignore[arg-type]
    if int(lens.sum()) != len(data):
        raise TypeError(f"change record {what}s must be bytes")
    return data, lens


def _join(items: Sequence[object], what: str, positions: Sequence[int] | None = None) -> bytes:
    """``b"".join(items)``; a non-bytes item is reported by its record number (``positions[i]``)."""
    try:
        return b"".join(items)  # type: ignore[arg-type]
    except TypeError:
        j = next(j for j, item in enumerate(items) if not isinstance(item, bytes | bytearray | memoryview))
        i = positions[j] if positions is not None else j
        raise TypeError(
            f"change record #{i} has a {what} of type {type(items[j]).__name__}: expected bytes"
        ) from None


# ---------------------------------------------------------------------------------------------- decoding
@dataclass(frozen=True)
class _Header:
    format_version: int
    flags: int
    header_len: int
    total_len: int
    lineage: list[str]


def _parse_header(data: bytes | memoryview, name: str) -> _Header:
    if len(data) < len(MAGIC):
        if bytes(data) == MAGIC[: len(data)]:
            raise DeltaFormatError(name, f"truncated: {len(data)} bytes, shorter than the header")
        raise DeltaFormatError(name, "bad magic: not a blobstate delta")
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise DeltaFormatError(name, f"bad magic {bytes(data[: len(MAGIC)])!r}: not a blobstate delta")
    if len(data) < len(MAGIC) + 2:
        raise DeltaFormatError(name, f"truncated: {len(data)} bytes, shorter than the header")
    (version,) = struct.unpack_from("<H", data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise DeltaFormatError(
            name, f"unknown format version {version} (this build reads version {FORMAT_VERSION})"
        )
    if len(data) < _PREFIX.size:
        raise DeltaFormatError(name, f"truncated: {len(data)} bytes, shorter than the header")
    _, _, flags, header_len, total_len, lineage_count = _PREFIX.unpack_from(data)
    if header_len < _PREFIX.size + _CRC.size or header_len > total_len:
        raise DeltaFormatError(name, f"corrupt header: header length {header_len}, total length {total_len}")
    if len(data) < header_len:
        raise DeltaFormatError(name, f"truncated: {len(data)} bytes, the header alone has {header_len}")
    (stored_crc,) = _CRC.unpack_from(data, header_len - _CRC.size)
    if _crc32(data[: header_len - _CRC.size]) != stored_crc:
        raise DeltaFormatError(name, "header checksum mismatch: the header is corrupt")
    if flags & ~_KNOWN_FLAGS:
        raise DeltaFormatError(name, f"unknown flags {flags:#06x}")
    lineage: list[str] = []
    pos, end = _PREFIX.size, header_len - _CRC.size
    for i in range(lineage_count):
        if pos >= end or pos + 1 + data[pos] > end:
            raise DeltaFormatError(name, f"corrupt header: lineage uid #{i} runs past the header")
        size = data[pos]
        raw = bytes(data[pos + 1 : pos + 1 + size])
        try:
            lineage.append(validate_uid(raw.decode("ascii"), f"lineage uid #{i}"))
        except (UnicodeDecodeError, InvalidIdError) as error:
            raise DeltaFormatError(name, f"bad uid in lineage: uid #{i} is {raw!r}") from error
        pos += 1 + size
    if pos != end:
        raise DeltaFormatError(name, f"corrupt header: {end - pos} unexpected bytes after the lineage")
    return _Header(version, flags, header_len, total_len, lineage)


def read_delta_lineage(data: bytes | memoryview, *, name: str) -> list[str]:
    """The lineage record of a delta, without decoding its records.

    ``data`` may be the whole object or any prefix of it that holds the header (the header carries its
    own checksum), so this stays cheap for large deltas. The records are checked when the delta is
    decoded with :func:`decode_delta`.
    """
    return _parse_header(data, name).lineage


def decode_delta(data: bytes | bytearray | memoryview, *, name: str) -> Delta:
    """Decode and fully verify a delta object; ``name`` (the object's name) goes into every error.

    Raises :class:`DeltaFormatError` for bad magic, an unknown format version, truncation, a checksum
    mismatch, a record count mismatch, a bad op, a bad lineage uid or any other malformation. Never
    returns part of a delta.
    """
    opened = open_delta(data, name=name)
    return Delta(opened.format_version, opened.lineage, opened.records(0, len(opened)))


def open_delta(data: bytes | bytearray | memoryview, *, name: str) -> OpenedDelta:
    """Verify a delta object completely (as :func:`decode_delta`) and return it with its records still in
    columns, to be made into Python objects a slice at a time (:meth:`OpenedDelta.slices`)."""
    data = bytes(data)
    header = _parse_header(data, name)
    if len(data) < header.total_len:
        raise DeltaFormatError(name, f"truncated: {len(data)} of {header.total_len} bytes")
    if len(data) > header.total_len:
        raise DeltaFormatError(name, f"{len(data) - header.total_len} unexpected bytes after the end")
    if header.total_len < header.header_len + _TRAILER.size:
        raise DeltaFormatError(name, f"corrupt header: total length {header.total_len} leaves no trailer")
    count, raw_len, stored_crc = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    if _crc32(memoryview(data)[: -_CRC.size]) != stored_crc:
        raise DeltaFormatError(name, "checksum mismatch: the object is corrupt")
    body = data[header.header_len : len(data) - _TRAILER.size]
    if header.flags & _FLAG_ZSTD:
        try:
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_len)
        except zstandard.ZstdError as error:
            raise DeltaFormatError(name, f"corrupt record section: {error}") from error
    if len(body) != raw_len:
        raise DeltaFormatError(name, f"record section is {len(body)} bytes, the trailer says {raw_len}")
    return _parse_body(body, count, name, header)


class _Reader:
    """A cursor over the record section that fails with a DeltaFormatError instead of overrunning."""

    def __init__(self, body: bytes, name: str) -> None:
        self.body, self.name, self.pos = body, name, 0

    def take(self, size: int, what: str) -> int:
        start = self.pos
        if size < 0 or start + size > len(self.body):
            raise DeltaFormatError(self.name, f"corrupt record section: {what} runs past its end")
        self.pos = start + size
        return start

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[Any, ...]:
        return fmt.unpack_from(self.body, self.take(fmt.size, what))

    def column(self, count: int, width: int, what: str) -> np.ndarray:
        if width not in _WIDTH_DTYPES:
            raise DeltaFormatError(self.name, f"corrupt record section: bad {what} width {width}")
        start = self.take(count * width, what)
        return np.frombuffer(self.body, dtype=_WIDTH_DTYPES[width], count=count, offset=start)


_EMPTY = np.zeros(0, dtype=np.int64)

APPLY_SLICE_RECORDS = 65536
"""Records made into Python objects at a time by :meth:`OpenedDelta.slices` (a few MB of them)."""


class OpenedDelta:
    """A verified delta whose change records are still columns of its record section.

    Every check of :func:`decode_delta` has passed when one exists, so any slice of its records is
    valid; the records become Python objects only when asked for, a slice at a time, which keeps a
    replay's memory to one slice of a delta however many records it holds.
    """

    def __init__(
        self,
        format_version: int,
        lineage: list[str],
        body: bytes,
        table: list[str],
        op_codes: np.ndarray,
        cf_ids: np.ndarray | None,
        key_lens: np.ndarray,
        key_start: int,
        value_lens: np.ndarray,
        value_start: int,
    ) -> None:
        """Hold a parsed record section; use :func:`open_delta`."""
        self.format_version = format_version
        self.lineage = lineage
        self._body, self._table, self._ops, self._cf_ids = body, table, op_codes, cf_ids
        self._key_lens, self._key_start = key_lens, key_start
        self._key_ends = np.cumsum(key_lens) if key_lens.size else _EMPTY
        self._is_put = op_codes == ChangeOp.PUT
        # puts before record i: record i's value, when it is a put, is value number _puts_before[i]
        self._puts_before = np.concatenate(([0], np.cumsum(self._is_put))) if op_codes.size else _EMPTY
        self._value_lens, self._value_start = value_lens, value_start
        self._value_ends = np.cumsum(value_lens) if value_lens.size else _EMPTY

    def __len__(self) -> int:
        """The number of change records."""
        return int(self._ops.size)

    def records(self, start: int, stop: int) -> list[ChangeRecord]:
        """Records ``start`` to ``stop`` (excluded), in write order."""
        stop = min(stop, len(self))
        if start >= stop:
            return []
        body = self._body
        with gc_paused():
            keys = _cut(body, self._key_start, self._key_lens, self._key_ends, start, stop)
            first_put, end_put = int(self._puts_before[start]), int(self._puts_before[stop])
            put_values = _cut(body, self._value_start, self._value_lens, self._value_ends, first_put, end_put)
            if end_put - first_put == stop - start:
                values: list[bytes | None] = put_values  # type: ignore[assignment]
            else:
                it = iter(put_values)
                values = [next(it) if put else None for put in self._is_put[start:stop].tolist()]
            ops = list(map(_OP_BY_CODE.__getitem__, self._ops[start:stop].tolist()))
            if self._cf_ids is None:
                cf_names = [self._table[0]] * (stop - start)
            else:
                cf_names = list(map(self._table.__getitem__, self._cf_ids[start:stop].tolist()))
            return list(zip(ops, cf_names, keys, values, strict=True))

    def slices(self, size: int | None = None) -> Iterator[list[ChangeRecord]]:
        """Every record in write order, ``size`` (default :data:`APPLY_SLICE_RECORDS`) at a time."""
        size = size or APPLY_SLICE_RECORDS
        for start in range(0, len(self), size):
            yield self.records(start, start + size)


def _parse_body(body: bytes, count: int, name: str, header: _Header) -> OpenedDelta:
    r = _Reader(body, name)
    (cf_count,) = r.unpack(_BODY_CFS, "column family table")
    table: list[str] = []
    for i in range(cf_count):
        (size,) = r.unpack(_CF_NAME_LEN, "column family table")
        start = r.take(size, "column family table")
        try:
            table.append(body[start : start + size].decode("utf-8"))
        except UnicodeDecodeError as error:
            raise DeltaFormatError(name, f"column family #{i} is not UTF-8") from error
    n, cf_width, key_width, value_width, _ = r.unpack(_BODY_COUNTS, "record counts")
    if n != count:
        raise DeltaFormatError(name, f"record count mismatch: the trailer says {count}, the records {n}")
    if n == 0:
        if r.pos != len(body):
            raise DeltaFormatError(name, "corrupt record section: unexpected bytes after an empty record set")
        empty = np.zeros(0, dtype=np.uint8)
        return OpenedDelta(
            header.format_version, header.lineage, body, table, empty, None, _EMPTY, 0, _EMPTY, 0
        )
    if n > len(body):
        raise DeltaFormatError(name, f"record count mismatch: {n} records cannot fit in {len(body)} bytes")

    op_codes = r.column(n, 1, "op column")
    bad_ops = np.flatnonzero((op_codes < ChangeOp.PUT) | (op_codes > ChangeOp.CLEAR))
    if bad_ops.size:
        i = int(bad_ops[0])
        raise DeltaFormatError(name, f"bad op {int(op_codes[i])} in record #{i}")
    cf_ids: np.ndarray | None = None
    if cf_width == 0:
        if cf_count != 1:
            raise DeltaFormatError(name, f"corrupt record section: {cf_count} column families, no id column")
    else:
        cf_ids = r.column(n, cf_width, "column family column")
        if int(cf_ids.max()) >= cf_count:
            i = int(np.argmax(cf_ids >= cf_count))
            raise DeltaFormatError(name, f"record #{i} names column family #{int(cf_ids[i])} of {cf_count}")
    key_lens = r.column(n, key_width, "key length column").astype(np.int64)
    is_put = op_codes == ChangeOp.PUT
    bad_clear = np.flatnonzero((op_codes == ChangeOp.CLEAR) & (key_lens != 0))
    if bad_clear.size:
        raise DeltaFormatError(name, f"record #{int(bad_clear[0])} is a CLEAR with a non-empty key")
    n_put = int(np.count_nonzero(is_put))
    value_lens = r.column(n_put, value_width, "value length column").astype(np.int64)

    key_start = r.take(int(key_lens.sum()), "key data")
    value_start = r.take(int(value_lens.sum()) if n_put else 0, "value data")
    if r.pos != len(body):
        raise DeltaFormatError(
            name, f"corrupt record section: {len(body) - r.pos} unexpected bytes at the end"
        )
    return OpenedDelta(
        header.format_version,
        header.lineage,
        body,
        table,
        op_codes,
        cf_ids,
        key_lens,
        key_start,
        value_lens,
        value_start,
    )


def _cut(body: bytes, start: int, lens: np.ndarray, ends: np.ndarray, first: int, stop: int) -> list[bytes]:
    """Pieces ``first`` to ``stop`` of ``body[start:]`` cut into consecutive pieces of ``lens`` bytes
    (``ends`` = ``cumsum(lens)``)."""
    if first >= stop:
        return []
    before = int(ends[first - 1]) if first else 0  # bytes of the pieces before ``first``
    return _slices(body, start + before, lens[first:stop], ends[first:stop] - before)


def _slices(body: bytes, start: int, lens: np.ndarray, ends: np.ndarray) -> list[bytes]:
    """Cut ``body[start:]`` into consecutive pieces of ``lens`` bytes (``ends`` = ``cumsum(lens)``)."""
    if lens.size == 0:
        return []
    first = int(lens[0])
    if first == 0 and not lens.any():
        return [b""] * int(lens.size)
    if (lens == first).all():
        # Equal lengths (the common case for keys): numpy cuts them out at C speed; void items are bytes.
        pieces: list[bytes] = np.frombuffer(
            body, dtype=f"V{first}", count=int(lens.size), offset=start
        ).tolist()
        return pieces
    bounds = (ends + start).tolist()
    return [body[a:b] for a, b in zip([start, *bounds[:-1]], bounds, strict=True)]


write_delta = encode_delta
"""The name docs/ARCHITECTURE.md uses for :func:`encode_delta`."""

read_delta = decode_delta
"""The name docs/ARCHITECTURE.md uses for :func:`decode_delta`."""
