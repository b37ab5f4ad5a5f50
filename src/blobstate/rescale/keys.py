"""The grouping keys of a rescale as Spark sees them: decoded, converted from an earlier release's form,
and turned into Arrow columns of the key's Spark types so that Spark computes each key's partition.

A rescale's Spark job hands every record to Spark with its grouping key as typed columns, and Spark's own
``pmod(hash(key columns), N)`` (the expression the query's shuffle uses) names its new partition
(:mod:`blobstate.rescale.job`); no Python copy of Spark's hash runs there.

Earlier releases stored a TIMESTAMP key as a wall-clock reading: pandas' naive time of the session's zone,
or an aware time carrying the zone's name. :class:`KeyForm` turns such a key into an instant (its UTC
reading, :func:`blobstate.encoding.codec.encode_key`'s form), taking a naive reading in ``legacy_zone``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DayTimeIntervalType,
    DecimalType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from blobstate.encoding.codec import Key, decode_key, encode_key


def holds_instant(dtype: DataType) -> bool:
    """Whether ``dtype`` is a TIMESTAMP (an instant; TIMESTAMP_NTZ is a wall-clock value) or holds one."""
    if isinstance(dtype, TimestampType):
        return True
    if isinstance(dtype, StructType):
        return any(holds_instant(f.dataType) for f in dtype.fields)
    if isinstance(dtype, ArrayType):
        return holds_instant(dtype.elementType)
    return False


def timestamp_positions(schema: StructType) -> tuple[int, ...]:
    """The positions of ``schema``'s columns that are or hold a TIMESTAMP."""
    return tuple(i for i, f in enumerate(schema.fields) if holds_instant(f.dataType))


@dataclass(frozen=True)
class KeyForm:
    """How a stored grouping key becomes the key this release stores: unchanged, or with its TIMESTAMP
    columns (``positions``) taken from an earlier release's wall-clock form to instants."""

    arity: int
    positions: tuple[int, ...] = ()
    legacy_zone: str | None = None
    types: tuple[DataType, ...] = ()
    """The key columns' Spark types (where TIMESTAMPs sit inside a struct or an array)."""
    """The zone an earlier release's naive readings are of (None: the keys are already instants)."""

    @property
    def converts(self) -> bool:
        """Whether keys change."""
        return self.legacy_zone is not None and bool(self.positions)

    def instant(self, value: Any) -> Any:
        """One stored TIMESTAMP component as an instant (a naive UTC reading)."""
        if value is None:
            return None
        ts = pd.Timestamp(value)
        if ts.tz is None:
            assert self.legacy_zone is not None
            # An earlier release's pandas key: the zone's wall clock, whose repeated hour it had merged.
            ts = ts.tz_localize(self.legacy_zone, ambiguous=True, nonexistent="shift_forward")
        return ts.tz_convert("UTC").tz_localize(None)

    def convert(self, kb: bytes) -> tuple[bytes, Key]:
        """The key bytes this release stores for the stored grouping key ``kb``, and the decoded key."""
        key, _ = decode_key(kb, self.arity)
        if not self.converts:
            return kb, key
        out = list(key)
        for i in self.positions:
            out[i] = self._convert(out[i], self.types[i]) if self.types else self.instant(out[i])
        converted = tuple(out)
        return encode_key(converted), converted

    def _convert(self, value: Any, dtype: DataType) -> Any:
        if value is None:
            return None
        if isinstance(dtype, TimestampType):
            return self.instant(value)
        if isinstance(dtype, StructType):
            return tuple(self._convert(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True))
        if isinstance(dtype, ArrayType):
            return tuple(self._convert(v, dtype.elementType) for v in value)
        return value


def _arrow_value(value: Any, dtype: DataType) -> Any:
    """A decoded key component as ``pa.array`` takes it for a column of Spark type ``dtype``."""
    if value is None:
        return None
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        ts = pd.Timestamp(value)
        if ts.tz is not None:
            ts = ts.tz_convert("UTC").tz_localize(None)
        return ts.value // 1000  # microseconds: for TIMESTAMP since the epoch, for TIMESTAMP_NTZ a reading
    if isinstance(dtype, DayTimeIntervalType):
        return pd.Timedelta(value).value // 1000
    if isinstance(dtype, DecimalType):
        return Decimal(value)
    if isinstance(dtype, StructType):
        return {f.name: _arrow_value(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True)}
    if isinstance(dtype, ArrayType):
        return [_arrow_value(v, dtype.elementType) for v in value]
    if isinstance(value, _dt.datetime):
        return value
    return value


def key_arrow_fields(schema: StructType, prefix: str) -> list[pa.Field]:
    """The Arrow fields of ``schema``'s columns as a rescale's rows carry them (named ``prefix<i>``)."""
    from pyspark.sql.pandas.types import to_arrow_type

    return [
        pa.field(f"{prefix}{i}", to_arrow_type(f.dataType, timezone="UTC"), nullable=True)
        for i, f in enumerate(schema.fields)
    ]


def key_columns(keys: Sequence[Key], schema: StructType, fields: Sequence[pa.Field]) -> list[pa.Array]:
    """The decoded grouping keys ``keys`` as Arrow columns of their Spark types (``fields``)."""
    out = []
    for i, (f, field) in enumerate(zip(schema.fields, fields, strict=True)):
        values = [_arrow_value(k[i], f.dataType) for k in keys]
        t = field.type
        if pa.types.is_timestamp(t) or pa.types.is_duration(t):
            out.append(pa.array(values, type=pa.int64()).cast(t))
        else:
            out.append(pa.array(values, type=t))
    return out


__all__ = ["KeyForm", "holds_instant", "key_arrow_fields", "key_columns", "timestamp_positions"]
