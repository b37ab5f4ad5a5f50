"""Spark's ``hash`` (Murmur3 x86 32-bit, seed 42) of grouping keys, in Python.

A key's partition is ``pmod(hash(key columns), N)``, computed by Spark's ``Murmur3Hash`` expression. A
rescale recomputes it from the stored key, so this module reproduces that expression bit for bit for the
key types blobstate stores: Spark's hash depends on the column's Spark type (an ``int`` and a ``bigint``
of the same value hash differently), so every function takes the key's ``StructType``
(``metadata.json``'s ``key_schema``).

:func:`spark_hash` hashes one decoded key; :func:`hash_int64_column`, :func:`hash_int32_column` and
:func:`hash_bytes_column` hash a whole column at once with numpy (the common cases of one integral or
string key column). ``tests/rescale`` compares
both with Spark's ``F.hash`` on random keys, and every rescale checks, for each key of each old partition,
that the hash puts it where Spark did.
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from collections.abc import Sequence
from decimal import Context, Decimal
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from blobstate.encoding.codec import Key
from blobstate.errors import ConfigurationError

SEED = 42
"""The seed of Spark's ``hash`` function (and of ``repartition``'s hash partitioning)."""

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_M32 = 0xFFFFFFFF
_EPOCH_DATE = _dt.date(1970, 1, 1)
_EXACT = Context(prec=80)
_EPOCH = _dt.datetime(1970, 1, 1)


class UnsupportedKeyTypeError(ConfigurationError, TypeError):
    """A key column has a Spark type whose hash this module does not reproduce."""


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _M32
    k1 = _rotl(k1, 15)
    return (k1 * _C2) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def hash_int(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (unsigned 32-bit in and out)."""
    return _fmix(_mix_h1(seed & _M32, _mix_k1(value & _M32)), 4)


def hash_long(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashLong``: the low word, then the high word."""
    value &= (1 << 64) - 1
    h1 = _mix_h1(seed & _M32, _mix_k1(value & _M32))
    h1 = _mix_h1(h1, _mix_k1(value >> 32))
    return _fmix(h1, 8)


def hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` (strings, binary, wide decimals): little-endian words,
    then each trailing byte as a signed int of its own (Spark's variant, not the reference tail)."""
    h1 = seed & _M32
    aligned = len(data) - len(data) % 4
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(word))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b >= 128 else b) & _M32))
    return _fmix(h1, len(data))


def _hash_value(value: Any, dtype: DataType, seed: int) -> int:
    if value is None or (
        isinstance(value, float) and math.isnan(value) and not isinstance(dtype, (FloatType, DoubleType))
    ):
        return seed
    if isinstance(dtype, (IntegerType, ShortType, ByteType)):
        return hash_int(int(value), seed)
    if isinstance(dtype, LongType):
        return hash_long(int(value), seed)
    if isinstance(dtype, BooleanType):
        return hash_int(1 if value else 0, seed)
    if isinstance(dtype, StringType):
        return hash_bytes(str(value).encode("utf-8"), seed)
    if isinstance(dtype, BinaryType):
        return hash_bytes(bytes(value), seed)
    if isinstance(dtype, DoubleType):
        v = float(value)
        bits = 0x7FF8000000000000 if math.isnan(v) else struct.unpack("<q", struct.pack("<d", v or 0.0))[0]
        return hash_long(bits, seed)
    if isinstance(dtype, FloatType):
        v = float(value)
        bits = 0x7FC00000 if math.isnan(v) else struct.unpack("<i", struct.pack("<f", v or 0.0))[0]
        return hash_int(bits, seed)
    if isinstance(dtype, DateType):
        return hash_int((value - _EPOCH_DATE).days, seed)
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        return hash_long(_micros(value), seed)
    if isinstance(dtype, DayTimeIntervalType):
        return hash_long(pd.Timedelta(value).value // 1000, seed)
    if isinstance(dtype, DecimalType):
        # exact: the default context's 28 digits would round a DECIMAL(38)'s unscaled value
        unscaled = int(Decimal(value).scaleb(dtype.scale, context=_EXACT).to_integral_value(context=_EXACT))
        if dtype.precision <= 18:
            return hash_long(unscaled, seed)
        # Java's BigInteger.toByteArray: the shortest two's complement, bitLength() // 8 + 1 bytes, where
        # bitLength() leaves out the sign bit (-128 is one byte, 0x80; Python's bit_length() counts 8).
        bits = (~unscaled).bit_length() if unscaled < 0 else unscaled.bit_length()
        return hash_bytes(unscaled.to_bytes(bits // 8 + 1, "big", signed=True), seed)
    if isinstance(dtype, StructType):
        h = seed
        for item, f in zip(value, dtype.fields, strict=True):
            h = _hash_value(item, f.dataType, h)
        return h
    if isinstance(dtype, ArrayType):
        h = seed
        for item in value:
            h = _hash_value(item, dtype.elementType, h)
        return h
    raise UnsupportedKeyTypeError(
        f"cannot compute Spark's hash of a key column of type {dtype.simpleString()}"
    )


def _micros(value: Any) -> int:
    """Microseconds since the epoch of a stored instant (naive: its UTC reading) or wall-clock time, in
    Python's datetime range (years 1-9999, as Spark's), not pandas' nanosecond one."""
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime(warn=False)
    elif isinstance(value, np.datetime64):
        return int(value.astype("datetime64[us]").astype(np.int64))
    if value.tzinfo is not None:
        value = value.astimezone(_dt.UTC).replace(tzinfo=None)
    micros: int = (value - _EPOCH) // _dt.timedelta(microseconds=1)
    return micros


def check_key_schema(schema: StructType) -> None:
    """Raise :class:`UnsupportedKeyTypeError` naming the first key column whose hash is not reproduced."""

    def supported(dtype: DataType) -> bool:
        if isinstance(dtype, StructType):
            return all(supported(f.dataType) for f in dtype.fields)
        if isinstance(dtype, ArrayType):
            return supported(dtype.elementType)
        return isinstance(
            dtype,
            (
                IntegerType,
                ShortType,
                ByteType,
                LongType,
                BooleanType,
                StringType,
                BinaryType,
                DoubleType,
                FloatType,
                DateType,
                TimestampType,
                TimestampNTZType,
                DayTimeIntervalType,
                DecimalType,
            ),
        )

    for f in schema.fields:
        if not supported(f.dataType):
            raise UnsupportedKeyTypeError(
                f"key column {f.name!r} has type {f.dataType.simpleString()}, whose Spark hash a rescale "
                "cannot reproduce"
            )


def spark_hash(key: Key, schema: StructType) -> int:
    """``hash(key columns)`` as Spark computes it (a signed 32-bit int) for a decoded grouping key."""
    h = SEED
    for value, f in zip(key, schema.fields, strict=True):
        h = _hash_value(value, f.dataType, h)
    return _signed(h)


def spark_partition(key: Key, schema: StructType, num_partitions: int) -> int:
    """``pmod(hash(key columns), num_partitions)``: the partition Spark gives ``key``."""
    return spark_hash(key, schema) % num_partitions


# ---------------------------------------------------------------------------------------------- numpy
def _np_rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _np_mix_k1(k1: np.ndarray) -> np.ndarray:
    return _np_rotl(k1 * np.uint32(_C1), 15) * np.uint32(_C2)


def _np_mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _np_rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _np_fmix(h1: np.ndarray, length: int) -> np.ndarray:
    h1 = h1 ^ np.uint32(length)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(0xC2B2AE35)
    mixed: np.ndarray = h1 ^ (h1 >> np.uint32(16))
    return mixed


def hash_int64_column(values: np.ndarray, seed: int | np.ndarray = SEED) -> np.ndarray:
    """Spark's hash of a ``bigint`` column (signed int32 array); ``seed`` per row or one for all."""
    with np.errstate(over="ignore"):
        v = np.ascontiguousarray(values, dtype="<i8").view("<u4").reshape(-1, 2)
        h = np.broadcast_to(np.asarray(seed, dtype=np.int64).astype(np.uint32), (len(v),))
        h = _np_mix_h1(h, _np_mix_k1(v[:, 0].copy()))
        h = _np_mix_h1(h, _np_mix_k1(v[:, 1].copy()))
        return _np_fmix(h, 8).view(np.int32)


def hash_int32_column(values: np.ndarray, seed: int | np.ndarray = SEED) -> np.ndarray:
    """Spark's hash of an ``int`` (or ``smallint``/``tinyint``/``date``) column (signed int32 array)."""
    with np.errstate(over="ignore"):
        v = np.ascontiguousarray(values).astype("<i4").view("<u4")
        h = np.broadcast_to(np.asarray(seed, dtype=np.int64).astype(np.uint32), (len(v),))
        return _np_fmix(_np_mix_h1(h, _np_mix_k1(v)), 4).view(np.int32)


def hash_bytes_column(values: Sequence[bytes], seed: int = SEED) -> np.ndarray:
    """Spark's ``hashUnsafeBytes`` of each of ``values`` (the UTF-8 bytes of a ``string`` column, or a
    ``binary`` one), as :func:`hash_bytes`, for all values at once: values of one length are hashed
    together, a word (then a trailing byte) of every value per numpy step."""
    out = np.empty(len(values), dtype=np.uint32)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    order = np.argsort(lengths, kind="stable")
    bounds = np.flatnonzero(np.diff(lengths[order])) + 1
    with np.errstate(over="ignore"):
        for group in np.split(order, bounds):
            if not len(group):
                continue
            length = int(lengths[group[0]])
            joined = b"".join([values[i] for i in group.tolist()])
            rows = np.frombuffer(joined, dtype=np.uint8).reshape(len(group), length)
            h = np.full(len(group), seed & _M32, dtype=np.uint32)
            aligned = length - length % 4
            if aligned:
                words = np.ascontiguousarray(rows[:, :aligned]).view("<u4")
                for j in range(aligned // 4):
                    h = _np_mix_h1(h, _np_mix_k1(words[:, j]))
            for j in range(aligned, length):  # Spark's tail: each byte a signed int of its own
                h = _np_mix_h1(h, _np_mix_k1(rows[:, j].view(np.int8).astype(np.int32).view(np.uint32)))
            out[group] = _np_fmix(h, length)
    return out.view(np.int32)


def pmod(hashes: np.ndarray, num_partitions: int) -> np.ndarray:
    """``pmod(hash, N)`` of signed 32-bit hashes."""
    return np.mod(hashes.astype(np.int64), num_partitions)


__all__ = [
    "SEED",
    "UnsupportedKeyTypeError",
    "check_key_schema",
    "hash_bytes",
    "hash_bytes_column",
    "hash_int",
    "hash_int32_column",
    "hash_int64_column",
    "hash_long",
    "pmod",
    "spark_hash",
    "spark_partition",
]
