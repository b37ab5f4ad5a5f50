"""Byte encodings of grouping keys, MapState user keys and timestamps (RocksDB keys).

Keys (grouping keys and MapState user keys) use a small typed, self-delimiting encoding: every
component is a tag byte plus a body: fixed width for numbers (order-preserving: offset binary for
ints, the usual sign flip for floats), ``\x00`` escaped as ``\x00\x01`` and terminated by
``\x00\x00`` for strings and bytes (order-preserving too). It is deterministic (equal keys always
give equal bytes, unlike pickle, whose output depends on object identity), stable across
Python/pandas versions, and prefix-free for tuples of the same arity, so the bytes of one grouping
key are never a prefix of another's. That makes "all entries of grouping key k" a plain prefix
scan: ``key_bytes(k) + suffix``. Keys of one type sort in value order, so MapState iterates its
user keys in order and timers with equal expiry fire in key order.

Decoding only reads tags, fixed-width numbers and delimited text: nothing is unpickled or evaluated.
State *values* use the schema-driven encoding of :mod:`blobstate.encoding.values`.
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd

from blobstate.errors import CorruptionError, ProcessorError

Key = tuple[Any, ...]
"""A grouping key or a MapState user key: its components in order (ints, floats, str, bytes, timestamps,
dates, decimals, timedeltas, None, nested tuples of them)."""

_OFFSET = 1 << 63
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_DOUBLE = struct.Struct(">d")
_U64 = struct.Struct(">Q")
_SIGN = 1 << 63
_ALL = (1 << 64) - 1
_TERM = b"\x00\x00"
_EPOCH_DATE = _dt.date(1970, 1, 1)

# Tags of key components. Never renumber: the bytes are persisted in checkpoints.
_T_NONE = 0x00
_T_FALSE = 0x01
_T_TRUE = 0x02
_T_INT = 0x03
_T_BIGINT = 0x04
_T_FLOAT = 0x05
_T_STR = 0x06
_T_BYTES = 0x07
_T_TIMESTAMP = 0x08
_T_DATE = 0x09
_T_DECIMAL = 0x0A
_T_TIMEDELTA = 0x0B
_T_TUPLE = 0x0C


class KeyEncodingError(ProcessorError, TypeError):
    """A key component has a type the key encoding does not support."""


class CorruptKeyError(CorruptionError, ValueError):
    """Stored key bytes that do not decode; the message says where they stop making sense."""


def encode_ts(ts: int) -> bytes:
    """8 bytes, big-endian, offset binary: byte order equals numeric order, negatives included."""
    return (ts + _OFFSET).to_bytes(8, "big")


def decode_ts(data: bytes, offset: int = 0) -> int:
    """Inverse of :func:`encode_ts` on ``data[offset:offset + 8]``."""
    return int.from_bytes(data[offset : offset + 8], "big") - _OFFSET


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _escaped(body: bytes) -> bytes:
    return body.replace(b"\x00", b"\x00\x01") + _TERM


def _read_escaped(data: bytes, pos: int) -> tuple[bytes, int]:
    end = data.find(_TERM, pos)
    if end < 0:
        raise CorruptKeyError(f"corrupt key bytes: unterminated string at offset {pos}")
    return bytes(data[pos:end]).replace(b"\x00\x01", b"\x00"), end + 2


def _float_bits(v: float) -> bytes:
    bits = _U64.unpack(_DOUBLE.pack(v))[0]
    bits = bits ^ _ALL if bits & _SIGN else bits | _SIGN
    return _U64.pack(bits)


def _float_from_bits(data: bytes, pos: int) -> float:
    bits: int = _U64.unpack_from(data, pos)[0]
    bits = bits ^ _SIGN if bits & _SIGN else bits ^ _ALL
    value: float = _DOUBLE.unpack(_U64.pack(bits))[0]
    return value


def _encode_component(v: Any, out: bytearray) -> None:
    t = type(v)
    if t is int:
        if _I64_MIN <= v <= _I64_MAX:
            out.append(_T_INT)
            out += (v + _OFFSET).to_bytes(8, "big")
        else:
            body = str(v).encode()
            out.append(_T_BIGINT)
            out += _varint(len(body))
            out += body
    elif t is str:
        out.append(_T_STR)
        out += _escaped(v.encode("utf-8"))
    elif v is None:
        out.append(_T_NONE)
    elif t is bool:
        out.append(_T_TRUE if v else _T_FALSE)
    elif t is float:
        # Spark normalizes -0.0 and NaN before grouping; do the same so they group as one key.
        if v == 0.0:
            v = 0.0
        elif math.isnan(v):
            v = math.nan
        out.append(_T_FLOAT)
        out += _float_bits(v)
    elif t is bytes or t is bytearray or t is memoryview:
        out.append(_T_BYTES)
        out += _escaped(bytes(v))
    elif isinstance(v, np.generic):
        _encode_component(_numpy_scalar(v), out)
    elif isinstance(v, (_dt.datetime, np.datetime64)):
        ts = pd.Timestamp(v)
        if ts is pd.NaT:
            out.append(_T_NONE)
            return
        # An aware time is an instant: its UTC reading, with no zone, so the same instant is the same key
        # whatever zone it came in (Spark's TIMESTAMP is microseconds since the epoch). A naive time is
        # stored as read: a TIMESTAMP_NTZ, or an instant its caller already took to UTC.
        out.append(_T_TIMESTAMP)
        out += (ts.value + _OFFSET).to_bytes(8, "big")
        out.append(0)  # the length of a zone name: none (keys of earlier releases may carry one)
    elif isinstance(v, _dt.date):
        out.append(_T_DATE)
        out += ((v - _EPOCH_DATE).days + _OFFSET).to_bytes(8, "big")
    elif isinstance(v, Decimal):
        if v.is_zero() and v.is_signed():
            v = -v  # -0.00 == 0.00: one key
        body = str(v).encode()
        out.append(_T_DECIMAL)
        out += _varint(len(body))
        out += body
    elif isinstance(v, (_dt.timedelta, np.timedelta64)):
        out.append(_T_TIMEDELTA)
        out += (pd.Timedelta(v).value + _OFFSET).to_bytes(8, "big")
    elif isinstance(v, dict):  # a STRUCT key as pandas hands it: its fields in order, stored as a tuple
        _encode_component(tuple(v.values()), out)
    elif isinstance(v, (tuple, list)):
        out.append(_T_TUPLE)
        out += _varint(len(v))
        for c in v:
            _encode_component(c, out)
    elif isinstance(v, float):  # float subclasses
        _encode_component(float(v), out)
    elif isinstance(v, int):  # int subclasses other than bool
        _encode_component(int(v), out)
    elif isinstance(v, str):
        _encode_component(str(v), out)
    else:
        raise KeyEncodingError(f"cannot use a value of type {t.__name__} ({v!r}) in a key")


def _numpy_scalar(v: np.generic) -> Any:
    if isinstance(v, np.datetime64):
        return pd.Timestamp(v)
    if isinstance(v, np.timedelta64):
        return pd.Timedelta(v)
    return v.item()


def encode_key(key: Key) -> bytes:
    """Encode a key tuple (grouping key or MapState user key); see the module docstring."""
    if len(key) == 1:
        v = key[0]
        t = type(v)
        if t is int and _I64_MIN <= v <= _I64_MAX:  # fast path: one int64 column
            number: int = v
            return b"\x03" + (number + _OFFSET).to_bytes(8, "big")
        if t is str:
            text: str = v
            return b"\x06" + text.encode("utf-8").replace(b"\x00", b"\x00\x01") + _TERM
    out = bytearray()
    for v in key:
        _encode_component(v, out)
    return bytes(out)


def _decode_component(data: bytes, pos: int) -> tuple[Any, int]:
    tag = data[pos]
    pos += 1
    if tag == _T_INT:
        return int.from_bytes(data[pos : pos + 8], "big") - _OFFSET, pos + 8
    if tag == _T_STR:
        body, pos = _read_escaped(data, pos)
        return body.decode("utf-8"), pos
    if tag == _T_NONE:
        return None, pos
    if tag == _T_FALSE:
        return False, pos
    if tag == _T_TRUE:
        return True, pos
    if tag == _T_FLOAT:
        return _float_from_bits(data, pos), pos + 8
    if tag == _T_BYTES:
        return _read_escaped(data, pos)
    if tag == _T_BIGINT:
        n, pos = _read_varint(data, pos)
        return int(bytes(data[pos : pos + n])), pos + n
    if tag == _T_TIMESTAMP:
        value = int.from_bytes(data[pos : pos + 8], "big") - _OFFSET
        n, pos = _read_varint(data, pos + 8)
        tz = bytes(data[pos : pos + n]).decode()
        return pd.Timestamp(value, tz=tz or None), pos + n
    if tag == _T_DATE:
        days = int.from_bytes(data[pos : pos + 8], "big") - _OFFSET
        return _EPOCH_DATE + _dt.timedelta(days=days), pos + 8
    if tag == _T_DECIMAL:
        n, pos = _read_varint(data, pos)
        return Decimal(bytes(data[pos : pos + n]).decode()), pos + n
    if tag == _T_TIMEDELTA:
        return pd.Timedelta(int.from_bytes(data[pos : pos + 8], "big") - _OFFSET), pos + 8
    if tag == _T_TUPLE:
        n, pos = _read_varint(data, pos)
        items = []
        for _ in range(n):
            item, pos = _decode_component(data, pos)
            items.append(item)
        return tuple(items), pos
    raise CorruptKeyError(f"corrupt key bytes: unknown tag {tag:#x} at offset {pos - 1}")


def decode_key(data: bytes, arity: int, pos: int = 0) -> tuple[Key, int]:
    """Decode ``arity`` components from ``data[pos:]``; returns the tuple and the end offset."""
    items = []
    for _ in range(arity):
        item, pos = _decode_component(data, pos)
        items.append(item)
    return tuple(items), pos
