"""Typed, schema-driven byte encoding of state values (ValueState values, ListState chunks, MapState values).

A state variable's schema is always known (it is declared in ``init``), so a stored value holds no type
information of its own: one :class:`StateCodec` per state variable compiles the schema once into
``struct`` layouts (fixed-width fields packed in one call, a null bitmap, length-prefixed variable-width
fields) and encodes and decodes with them. Nothing read from storage is ever unpickled or evaluated:
decoding only unpacks numbers and slices bytes, and refuses anything that does not fit the schema
exactly (wrong format marker, truncated or trailing bytes, bad lengths, invalid UTF-8 ...) with a
:class:`ValueFormatError` naming the state variable and the grouping key.

The first byte is a format marker, so bytes of any other encoding -- in particular the pickled values
of earlier versions (first byte ``0x00`` or ``0x01``) -- are refused rather than misread. The byte
layout is specified in docs/FORMATS.md ("State values"); in short::

    value      = marker (0xB0 | 0xB1 with expiry) [expiry i64] row          (ValueState, MapState)
    list chunk = marker [expiry i64] count u32 row*count                     (ListState)
    row        = null bitmap, fixed part (one struct slot per field), variable part

Writing checks every field against its type (exact Python types take a fast path; numpy and pandas
scalars are converted first, as PySpark does) and raises :class:`StateVariableError` naming the state
variable and the field. A value read back equals the value written, with the same Python types: ints,
floats (``FLOAT`` is stored as a double so the float written is the float read), bools, str, bytes,
``datetime.date``, ``datetime.datetime`` (naive, or with its ``datetime.timezone`` or ``ZoneInfo``),
``datetime.timedelta``, ``Decimal`` (its exact digits and exponent), lists, dicts and tuples (nested
structs). Widening conversions on write: an int into a FLOAT/DOUBLE field is stored as a float (if
exact), an int into a DECIMAL field as a Decimal, a tuple or numpy array into an ARRAY field as a list,
bytearray into BINARY as bytes, ``pd.NA``/``pd.NaT`` as null.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import re
import struct
import zoneinfo
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from blobstate.encoding.errors import StateVariableError
from blobstate.errors import CorruptionError, ProcessorError

StateRow = tuple[Any, ...]
"""One row of a state variable's schema: its field values in schema order, each of the field's Python
type (the ``Tuple`` of PySpark's state API, whose fields are as dynamic as the schema)."""

MARK = 0xB0
"""First byte of a value in format 1 without expiry."""
MARK_EXPIRY = 0xB1
"""First byte of a value in format 1 followed by its expiry (TTL) as i64 milliseconds."""
_OLD_HEADERS = (0x00, 0x01)  # the pickled encoding: b"\x00" + pickle, b"\x01" + be64 expiry + pickle

_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_HEAD_LIST = struct.Struct("<BI")
_HEAD_LIST_EXPIRY = struct.Struct("<BqI")
_TS_FIELDS = struct.Struct("<HBBBBBI")  # year, month, day, hour, minute, second, microsecond
_TS = struct.Struct("<HBBBBBIB")  # ... and the flags byte
_OFFSET_US = struct.Struct("<q")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_US = _dt.timedelta(microseconds=1)
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_datetime = _dt.datetime
_fromordinal = _dt.date.fromordinal
_timedelta = _dt.timedelta
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")

# timestamp flags byte
_TS_FOLD = 0x01
_TS_FIXED = 0x02  # datetime.timezone: offset i64 microseconds follows
_TS_ZONE = 0x04  # zoneinfo.ZoneInfo: its key (UTF-8) follows
_TS_NAMED = 0x08  # with _TS_FIXED: the timezone's explicit name (UTF-8) follows the offset
_TS_KNOWN = _TS_FOLD | _TS_FIXED | _TS_ZONE | _TS_NAMED


class ValueFormatError(CorruptionError, ValueError):
    """Stored bytes are not a value of the state variable's schema in this version's encoding."""


class _Unfit(Exception):
    """A value to write does not fit its type; ``path`` is filled in on the way up."""

    def __init__(self, sql: str, message: str) -> None:
        super().__init__(message)
        self.sql = sql
        self.message = message
        self.path: list[str] = []
        self.element = 0
        """The index of the list element that did not fit (set by ``pack_list``)."""


class _OldFormat(Exception):
    """The value starts with the header of the old pickled encoding."""


class _Corrupt(Exception):
    """Stored bytes do not decode; ``path`` is filled in on the way up."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []

    def at(self, part: str) -> _Corrupt:
        """This error, one level further out (``part`` names the field or element)."""
        self.path.insert(0, part)
        return self


def _describe(v: Any) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def _shallow(v: Any) -> Any:
    """numpy/pandas scalars as plain Python values (as PySpark normalizes state values); NA/NaT as None."""
    if isinstance(v, np.generic):
        return v.tolist()
    if v is pd.NaT or v is pd.NA:
        return None
    if isinstance(v, np.ndarray):
        return v.tolist()
    if hasattr(v, "to_pytimedelta"):
        return v.to_pytimedelta()
    if hasattr(v, "to_pydatetime"):
        return v.to_pydatetime()
    return v


# -- field types ---------------------------------------------------------------------------------


class _Type:
    """How values of one Spark type are checked and stored.

    ``code`` is the struct code of the type's slot in the fixed part of a row. Plain types store the
    value itself in the slot; converted types (``to_slot``/``from_slot``) store a number derived from
    it; variable-width types (``var``) store their byte length there and their bytes in the variable
    part.
    """

    sql = ""
    code = "I"
    size = 4  # struct.calcsize of code
    exact: type = object
    plain = False
    var = False
    null_slot: Any = 0

    def accept(self, v: Any) -> Any:
        """``v`` (not None, numpy/pandas already converted) as a value of type ``exact``, or _Unfit."""
        raise NotImplementedError

    def unfit(self, v: Any, hint: str = "") -> _Unfit:
        return _Unfit(self.sql, f"cannot hold {_describe(v)}{hint}")

    def to_slot(self, v: Any) -> Any:
        return v

    def from_slot(self, x: Any) -> Any:
        return x

    def to_bytes(self, v: Any) -> bytes:
        raise NotImplementedError

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        raise NotImplementedError


class _Bool(_Type):
    sql, code, size, exact, plain, null_slot = "BOOLEAN", "?", 1, bool, True, False

    def accept(self, v: Any) -> Any:
        if type(v) is bool:
            return v
        raise self.unfit(v)


class _Int(_Type):
    exact, plain = int, True

    def __init__(self, sql: str, code: str, bits: int) -> None:
        self.sql, self.code, self.size = sql, code, bits // 8
        self.lo, self.hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def accept(self, v: Any) -> Any:
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.unfit(v)
        if not self.lo <= v <= self.hi:
            raise _Unfit(self.sql, f"{v} is out of range ({self.lo}..{self.hi})")
        return int(v)


class _Float(_Type):
    code, size, exact, plain, null_slot = "d", 8, float, True, 0.0

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def accept(self, v: Any) -> Any:
        if isinstance(v, float):
            return float(v)
        if isinstance(v, int) and not isinstance(v, bool):
            try:
                f = float(v)
            except OverflowError:
                f = math.inf
            if f != v:  # only a widening that loses nothing
                raise _Unfit(self.sql, f"int {v} cannot be stored exactly as a double")
            return f
        raise self.unfit(v)


class _Date(_Type):
    sql, code, exact = "DATE", "i", _dt.date

    def accept(self, v: Any) -> Any:
        if isinstance(v, _dt.datetime):
            raise self.unfit(v, " (a datetime; write its .date())")
        if isinstance(v, _dt.date):
            return v if type(v) is _dt.date else _dt.date(v.year, v.month, v.day)
        raise self.unfit(v)

    def to_slot(self, v: Any) -> Any:
        return v.toordinal() - _EPOCH_ORDINAL

    def from_slot(self, x: Any) -> Any:
        try:
            return _fromordinal(x + _EPOCH_ORDINAL)
        except ValueError:
            raise _Corrupt(f"date {x} days from 1970-01-01 is out of range") from None


class _Interval(_Type):
    sql, code, size, exact = "INTERVAL DAY TO SECOND", "q", 8, _dt.timedelta

    def accept(self, v: Any) -> Any:
        if not isinstance(v, _dt.timedelta):
            raise self.unfit(v)
        if not _I64_MIN <= v // _US <= _I64_MAX:
            raise _Unfit(self.sql, f"{v!r} is out of range (+-2**63 microseconds)")
        return v if type(v) is _dt.timedelta else _dt.timedelta(v.days, v.seconds, v.microseconds)

    def to_slot(self, v: Any) -> Any:
        return v // _US

    def from_slot(self, x: Any) -> Any:
        try:
            return _timedelta(0, 0, x)
        except OverflowError:
            raise _Corrupt(f"interval of {x} microseconds is out of Python's range") from None


class _String(_Type):
    exact, var = str, True

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def accept(self, v: Any) -> Any:
        if isinstance(v, str):
            return str(v)
        raise self.unfit(v)

    def to_bytes(self, v: Any) -> bytes:
        data: bytes = v.encode("utf-8", "surrogatepass")  # pickle keeps lone surrogates; so do we
        return data

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        try:
            return data[start:stop].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise _Corrupt(f"invalid UTF-8 ({e.reason})") from None


class _Binary(_Type):
    sql, exact, var = "BINARY", bytes, True

    def accept(self, v: Any) -> Any:
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        raise self.unfit(v)

    def to_bytes(self, v: Any) -> bytes:
        data: bytes = v
        return data

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        return data[start:stop]


class _Decimal(_Type):
    sql, exact, var = "DECIMAL", Decimal, True

    def accept(self, v: Any) -> Any:
        if isinstance(v, Decimal):
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return Decimal(v)
        raise self.unfit(v)

    def to_bytes(self, v: Any) -> bytes:
        return str(v).encode("ascii")  # exact: Decimal(str(d)) has d's sign, digits and exponent

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        try:
            return Decimal(data[start:stop].decode("ascii"))
        except (UnicodeDecodeError, InvalidOperation, ValueError):
            raise _Corrupt(f"not a decimal: {bytes(data[start:stop])[:40]!r}") from None


class _Timestamp(_Type):
    exact, var = _dt.datetime, True

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def accept(self, v: Any) -> Any:
        if not isinstance(v, _dt.datetime):
            hint = " (nanoseconds? write a datetime or pd.Timestamp)" if isinstance(v, int) else ""
            raise self.unfit(v, hint)
        if type(v) is not _dt.datetime:
            v = _dt.datetime(*v.timetuple()[:6], v.microsecond, v.tzinfo, fold=v.fold)
        return v

    def to_bytes(self, v: Any) -> bytes:
        # the wall-clock fields as written (decoding builds the datetime from them in one call)
        tz = v.tzinfo
        flags = v.fold
        if tz is None:
            return _TS.pack(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, flags)
        if type(tz) is _dt.timezone:
            args = tz.__getinitargs__()  # type: ignore[attr-defined]  # (offset,) or (offset, name): keeps an explicit name
            flags |= _TS_FIXED if len(args) == 1 else _TS_FIXED | _TS_NAMED
            zone = _OFFSET_US.pack(args[0] // _US) + (
                args[1].encode("utf-8", "surrogatepass") if len(args) > 1 else b""
            )
        elif type(tz) is zoneinfo.ZoneInfo and tz.key is not None and _ZONE_KEY.fullmatch(tz.key):
            flags |= _TS_ZONE
            zone = tz.key.encode("ascii")
        else:
            raise _Unfit(
                self.sql,
                f"cannot hold a datetime with time zone {tz!r} ({type(tz).__name__}): use a naive datetime,"
                " datetime.timezone or zoneinfo.ZoneInfo",
            )
        return _TS.pack(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, flags) + zone

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        if stop - start < _TS.size:
            raise _Corrupt(f"timestamp of {stop - start} bytes, needs at least {_TS.size}")
        try:
            value = _datetime(*_TS_FIELDS.unpack_from(data, start))
        except (ValueError, OverflowError) as e:
            raise _Corrupt(f"bad timestamp: {e}") from None
        flags = data[start + _TS_FIELDS.size]
        pos = start + _TS.size
        if not flags and stop == pos:
            return value  # naive
        if flags & ~_TS_KNOWN:
            raise _Corrupt(f"unknown timestamp flags {flags:#04x}")
        kind = flags & (_TS_FIXED | _TS_ZONE | _TS_NAMED)
        if kind == 0:
            if pos != stop:
                raise _Corrupt("naive timestamp with trailing bytes")
            return value.replace(fold=1)
        if kind & _TS_FIXED and not kind & _TS_ZONE:
            if stop - pos < 8 or (not kind & _TS_NAMED and stop - pos != 8):
                raise _Corrupt("bad fixed-offset time zone length")
            offset = _dt.timedelta(microseconds=_OFFSET_US.unpack_from(data, pos)[0])
            tz: _dt.tzinfo
            try:
                if kind & _TS_NAMED:
                    tz = _dt.timezone(offset, data[pos + 8 : stop].decode("utf-8", "surrogatepass"))
                else:
                    tz = _dt.timezone(offset)
            except (ValueError, UnicodeDecodeError) as e:
                raise _Corrupt(f"bad time zone: {e}") from None
        elif kind == _TS_ZONE:
            tz = _zone(data[pos:stop])
        else:
            raise _Corrupt(f"unknown timestamp flags {flags:#04x}")
        return value.replace(tzinfo=tz, fold=flags & _TS_FOLD)


@functools.lru_cache(maxsize=256)
def _zone(raw: bytes) -> zoneinfo.ZoneInfo:
    try:
        key = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _Corrupt(f"bad time zone name {raw[:40]!r}") from None
    if not _ZONE_KEY.fullmatch(key) or ".." in key:
        raise _Corrupt(f"bad time zone name {key[:40]!r}")
    try:
        return zoneinfo.ZoneInfo(key)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise _Corrupt(f"time zone {key!r} is not known on this machine (install tzdata)") from None


class _Array(_Type):
    exact, var = list, True

    def __init__(self, element: _Type) -> None:
        self.element = element
        self.sql = f"ARRAY<{element.sql}>"

    def accept(self, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            raise self.unfit(v)
        return _accept_items(self.element, v)

    def to_bytes(self, v: Any) -> bytes:
        return _U32.pack(len(v)) + _pack_items(self.element, v)

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        if stop - start < 4:
            raise _Corrupt("array without its element count")
        (n,) = _U32.unpack_from(data, start)
        items, end = _unpack_items(self.element, n, data, start + 4, stop)
        if end != stop:
            raise _Corrupt(f"array of {n} elements with {stop - end} trailing bytes")
        return items


class _Map(_Type):
    exact, var = dict, True

    def __init__(self, key: _Type, value: _Type) -> None:
        self.key, self.value = key, value
        self.sql = f"MAP<{key.sql}, {value.sql}>"

    def accept(self, v: Any) -> Any:
        if not isinstance(v, dict):
            raise self.unfit(v)
        try:
            keys = _accept_items(self.key, list(v))
        except _Unfit as e:
            e.path[0] = e.path[0].replace("[", "[key ", 1)
            raise
        values = _accept_items(self.value, list(v.values()))
        return dict(zip(keys, values, strict=True))

    def to_bytes(self, v: Any) -> bytes:
        try:
            keys = _pack_items(self.key, list(v))
        except _Unfit as e:
            e.path[0] = e.path[0].replace("[", "[key ", 1)
            raise
        return _U32.pack(len(v)) + keys + _pack_items(self.value, list(v.values()))

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        if stop - start < 4:
            raise _Corrupt("map without its entry count")
        (n,) = _U32.unpack_from(data, start)
        keys, pos = _unpack_items(self.key, n, data, start + 4, stop)
        values, end = _unpack_items(self.value, n, data, pos, stop)
        if end != stop:
            raise _Corrupt(f"map of {n} entries with {stop - end} trailing bytes")
        try:
            out = dict(zip(keys, values, strict=True))
        except TypeError:
            raise _Corrupt("map with unhashable keys") from None
        if len(out) != n:
            raise _Corrupt("map with duplicate keys")
        return out


class _Struct(_Type):
    exact, var = tuple, True

    def __init__(self, row: RowLayout) -> None:
        self.row = row
        self.sql = row.sql

    def accept(self, v: Any) -> Any:
        return self.row.accept(v)

    def to_bytes(self, v: Any) -> bytes:
        return self.row.pack_body(v)

    def from_bytes(self, data: bytes, start: int, stop: int) -> Any:
        value, end = self.row.unpack(data, start, stop)
        if end != stop:
            raise _Corrupt(f"struct with {stop - end} trailing bytes")
        return value


# -- sequences of one type (array elements, map keys and values) --------------------------------


_SEQUENCES: dict[tuple[str, int], struct.Struct] = {}


def _sequence(code: str, n: int) -> struct.Struct:
    """The struct of ``n`` slots of one code (cached for the small counts arrays and maps mostly have)."""
    compiled = _SEQUENCES.get((code, n))
    if compiled is None:
        compiled = struct.Struct(f"<{n}{code}")
        if n <= 64:
            _SEQUENCES[(code, n)] = compiled
    return compiled


def _accept_items(t: _Type, items: Sequence[Any]) -> list[Any]:
    out = []
    for i, v in enumerate(items):
        v = _shallow(v)
        if v is not None:
            try:
                v = t.accept(v)
            except _Unfit as e:
                e.path.insert(0, f"[{i}]")
                raise
        out.append(v)
    return out


def _pack_items(t: _Type, items: Sequence[Any]) -> bytes:
    """``len(items)`` values of type ``t``: null bitmap, one slot each, then variable parts."""
    n = len(items)
    nb = (n + 7) >> 3
    exact = t.exact
    if t.plain and all(type(v) is exact for v in items):
        try:
            return b"\x00" * nb + _sequence(t.code, n).pack(*items)
        except struct.error:
            pass  # out of range: the slow path says which element
    bits = 0
    slots = []
    tails = []
    for i, v in enumerate(items):
        try:
            if type(v) is not exact:
                v = _shallow(v)
                if v is None:
                    bits |= 1 << i
                    slots.append(t.null_slot)
                    continue
                v = t.accept(v)
            elif t.plain:
                v = t.accept(v)  # range
            if t.var:
                body = t.to_bytes(v)
                slots.append(len(body))
                tails.append(body)
            else:
                slots.append(t.to_slot(v))
        except _Unfit as e:
            e.path.insert(0, f"[{i}]")
            raise
    return b"".join((bits.to_bytes(nb, "little"), _sequence(t.code, n).pack(*slots), *tails))


def _unpack_items(t: _Type, n: int, data: bytes, pos: int, stop: int) -> tuple[list[Any], int]:
    """Inverse of :func:`_pack_items`: ``n`` values from ``data[pos:stop]`` and the end offset."""
    nb = (n + 7) >> 3
    fixed_end = pos + nb + n * t.size
    if fixed_end > stop:  # checked before anything is allocated for n
        raise _Corrupt(f"{n} elements need {fixed_end - pos} bytes, only {stop - pos} left")
    bits = data[pos] if nb == 1 else int.from_bytes(data[pos : pos + nb], "little")
    if bits >> n:
        raise _Corrupt("null bitmap has bits set past the last element")
    slots = list(_sequence(t.code, n).unpack_from(data, pos + nb))
    if not bits:
        if t.plain:
            return slots, fixed_end
        if type(t) is _String:  # the common case, inline
            end = fixed_end
            try:
                for i, length in enumerate(slots):
                    body_end = end + length
                    slots[i] = data[end:body_end].decode("utf-8", "surrogatepass")
                    end = body_end
            except UnicodeDecodeError as e:
                raise _Corrupt(f"invalid UTF-8 ({e.reason})").at(f"[{i}]") from None
            if end > stop:
                raise _Corrupt(f"truncated: {n} elements need {end - pos} bytes, {stop - pos} left")
            return slots, end
    end = fixed_end
    for i in range(n):
        try:
            if bits >> i & 1:
                if t.var and slots[i]:
                    raise _Corrupt("null element with a non-empty body")
                slots[i] = None
            elif t.var:
                body_end = end + slots[i]
                if body_end > stop:
                    raise _Corrupt(f"element of {slots[i]} bytes, only {stop - end} left")
                slots[i] = t.from_bytes(data, end, body_end)
                end = body_end
            elif not t.plain:
                slots[i] = t.from_slot(slots[i])
        except _Corrupt as e:
            e.path.insert(0, f"[{i}]")
            raise
    return slots, end


# -- rows (a state value, a list element, a nested struct) ---------------------------------------

_STR, _BYTES, _OTHER = 0, 1, 2  # how a variable-width field turns into bytes


def _exact_checker(exact: tuple[type, ...]) -> Callable[[Sequence[Any]], bool]:
    """Whether a row has exactly these field types (and arity): the fast path's one check.

    Spelled out for small arities because one ``type(r[i]) is t`` per field is several times faster
    than ``tuple(map(type, r)) == exact``, and most state schemas have a few fields.
    """
    n = len(exact)
    if n == 1:
        (t0,) = exact
        return lambda r: len(r) == 1 and type(r[0]) is t0
    if n == 2:
        t0, t1 = exact
        return lambda r: len(r) == 2 and type(r[0]) is t0 and type(r[1]) is t1
    if n == 3:
        t0, t1, t2 = exact
        return lambda r: len(r) == 3 and type(r[0]) is t0 and type(r[1]) is t1 and type(r[2]) is t2
    if n == 4:
        t0, t1, t2, t3 = exact
        return lambda r: (
            len(r) == 4 and type(r[0]) is t0 and type(r[1]) is t1 and type(r[2]) is t2 and type(r[3]) is t3
        )
    return lambda r: tuple(map(type, r)) == exact


class RowLayout:
    """A compiled struct schema: checks, packs and unpacks one row (tuple) of it.

    A row is a null bitmap (bit i set: field i is null), then one struct slot per field (the value,
    a number derived from it, or the byte length of a variable-width field), then the bytes of the
    variable-width fields in field order. One ``struct`` call packs or unpacks bitmap and slots.
    """

    def __init__(self, names: list[str], types: list[_Type]) -> None:
        self.names = names
        self.types = types
        self.n = n = len(types)
        self.nb = nb = (n + 7) >> 3
        self.sql = "STRUCT<" + ", ".join(f"{a}: {t.sql}" for a, t in zip(names, types, strict=True)) + ">"
        codes = "".join(t.code for t in types)
        self.exact = tuple(t.exact for t in types)
        self.check = _exact_checker(self.exact)
        self.simple = all(t.plain for t in types)
        # every value of the exact type fits (no range, time zone or element to check)
        self.always_fits = all(type(t) in (_Bool, _Float, _String, _Binary, _Date, _Decimal) for t in types)
        self.converted = tuple((i, t) for i, t in enumerate(types) if not t.plain and not t.var)
        self.variable = tuple(
            (i, t, _STR if isinstance(t, _String) else _BYTES if isinstance(t, _Binary) else _OTHER)
            for i, t in enumerate(types)
            if t.var
        )
        # only plain, string and binary fields: decoded inline, without a call per field
        self.flat = not self.converted and all(kind != _OTHER for _, _, kind in self.variable)
        # (index, is it a string) of the one string or binary field of a flat row that has one
        self.single = (
            (self.variable[0][0], self.variable[0][2] == _STR)
            if self.flat and len(self.variable) == 1
            else None
        )
        self.zero = bytes(nb)
        self.fixed = struct.Struct("<" + codes)
        self.body0 = struct.Struct(f"<{nb}x{codes}")  # no nulls: the bitmap is zero padding
        self.body = struct.Struct(f"<{nb}s{codes}")
        self.value0 = struct.Struct(f"<B{nb}x{codes}")
        self.value = struct.Struct(f"<B{nb}s{codes}")
        self.expiring0 = struct.Struct(f"<Bq{nb}x{codes}")
        self.expiring = struct.Struct(f"<Bq{nb}s{codes}")
        self.list0 = struct.Struct(f"<BI{nb}x{codes}")  # a list chunk of one row without nulls
        self.list_expiring0 = struct.Struct(f"<BqI{nb}x{codes}")
        self.size = self.body.size  # bytes of bitmap + fixed part

    # -- writing

    def accept(self, row: Any) -> StateRow:
        """A row (tuple, list, dict by field name, Row) as a tuple of checked, converted values."""
        if isinstance(row, dict):
            missing = [a for a in self.names if a not in row]
            if missing:
                raise _Unfit(self.sql, f"lacks field(s) {missing}")
            row = [row[a] for a in self.names]
        elif not isinstance(row, (tuple, list)):
            raise _Unfit(self.sql, f"cannot hold {_describe(row)} (write a tuple)")
        if len(row) != self.n:
            raise _Unfit(self.sql, f"has {self.n} field(s), got {len(row)}: {_describe(row)}")
        out = []
        for a, t, v in zip(self.names, self.types, row, strict=True):
            v = _shallow(v)
            if v is not None:
                try:
                    v = t.accept(v)
                except _Unfit as e:
                    e.path.insert(0, "." + a)
                    raise
            out.append(v)
        return tuple(out)

    def _slots(self, row: Any) -> tuple[bytes, list[Any], list[Any]]:
        """Slow path: the null bitmap, fixed-part slots and variable parts of any acceptable ``row``."""
        row = self.accept(row)
        bits = 0
        slots = []
        tails = []
        for i, (t, v) in enumerate(zip(self.types, row, strict=True)):
            if v is None:
                bits |= 1 << i
                slots.append(t.null_slot)
                continue
            try:
                if t.var:
                    body = t.to_bytes(v)
                    slots.append(len(body))
                    tails.append(body)
                else:
                    slots.append(t.to_slot(v))
            except _Unfit as e:
                e.path.insert(0, "." + self.names[i])
                raise
        return bits.to_bytes(self.nb, "little"), slots, tails

    def _exact_slots(self, row: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Fast path for a row that passed :attr:`check` (exact types, so no nulls)."""
        slots = list(row)
        for i, t in self.converted:
            slots[i] = t.to_slot(slots[i])
        tails = []
        for i, t, kind in self.variable:
            v = slots[i]
            if kind == _STR:
                body = v.encode("utf-8", "surrogatepass")  # pickle keeps lone surrogates; so do we
            elif kind == _BYTES:
                body = v
            else:
                try:
                    body = t.to_bytes(v)
                except _Unfit as e:
                    e.path.insert(0, "." + self.names[i])
                    raise
            slots[i] = len(body)
            tails.append(body)
        return slots, tails

    def pack_value(self, row: Sequence[Any], expiry_ms: int | None) -> bytes:
        """marker [+ expiry] + row: a ValueState or MapState value."""
        if self.check(row):
            try:
                if self.simple:
                    if expiry_ms is None:
                        return self.value0.pack(MARK, *row)
                    return self.expiring0.pack(MARK_EXPIRY, expiry_ms, *row)
                slots, tails = self._exact_slots(row)
                if expiry_ms is None:
                    head = self.value0.pack(MARK, *slots)
                else:
                    head = self.expiring0.pack(MARK_EXPIRY, expiry_ms, *slots)
                return _join(head, tails)
            except struct.error:
                pass  # a number out of range: the slow path names it
        bitmap, slots, tails = self._slots(row)
        if expiry_ms is None:
            head = self.value.pack(MARK, bitmap, *slots)
        else:
            head = self.expiring.pack(MARK_EXPIRY, expiry_ms, bitmap, *slots)
        return _join(head, tails)

    def pack_body(self, row: Sequence[Any]) -> bytes:
        """bitmap + fixed part + variable part of one row (a list element or a nested struct)."""
        if self.check(row):
            try:
                if self.simple:
                    return self.body0.pack(*row)
                slots, tails = self._exact_slots(row)
                return _join(self.body0.pack(*slots), tails)
            except struct.error:
                pass
        bitmap, slots, tails = self._slots(row)
        return _join(self.body.pack(bitmap, *slots), tails)

    def pack_list(self, rows: Sequence[Sequence[Any]], expiry_ms: int | None) -> bytes:
        """marker [+ expiry] + count + rows: a ListState chunk."""
        parts = [b""]  # the head, once the count is known
        check, simple, single, body0 = self.check, self.simple, self.single, self.body0.pack
        for i, row in enumerate(rows):
            try:
                try:
                    if check(row):  # the fast paths of pack_body, inline
                        if simple:
                            parts.append(body0(*row))
                            continue
                        if single is not None:
                            j, is_str = single
                            slots = list(row)
                            body = slots[j].encode("utf-8", "surrogatepass") if is_str else slots[j]
                            slots[j] = len(body)
                            parts.append(body0(*slots))
                            parts.append(body)
                            continue
                except struct.error:
                    pass
                parts.append(self.pack_body(row))
            except _Unfit as e:
                e.element = i
                raise
        if expiry_ms is None:
            parts[0] = _HEAD_LIST.pack(MARK, len(rows))
        else:
            parts[0] = _HEAD_LIST_EXPIRY.pack(MARK_EXPIRY, expiry_ms, len(rows))
        return b"".join(parts)

    # -- reading

    def unpack(self, data: bytes, pos: int, stop: int) -> tuple[StateRow, int]:
        """One row from ``data[pos:stop]``: the tuple and the offset after it."""
        end = pos + self.size
        if end > stop:
            raise _Corrupt(f"truncated: a row needs at least {self.size} bytes, {stop - pos} left")
        vals = self.body.unpack_from(data, pos)
        if vals[0] == self.zero:
            if self.simple:
                return vals[1:], end
            out = list(vals[1:])
            i = 0
            try:  # no nulls: one pass, one bounds check at the end (offsets only grow)
                for i, t in self.converted:
                    out[i] = t.from_slot(out[i])
                for i, t, kind in self.variable:
                    body_end = end + out[i]
                    if kind == _STR:
                        out[i] = data[end:body_end].decode("utf-8", "surrogatepass")
                    elif kind == _BYTES:
                        out[i] = data[end:body_end]
                    elif body_end > stop:
                        raise _Corrupt(f"truncated: field of {out[i]} bytes, {stop - end} left")
                    else:
                        out[i] = t.from_bytes(data, end, body_end)
                    end = body_end
            except UnicodeDecodeError as e:
                raise _Corrupt(f"invalid UTF-8 ({e.reason})").at("." + self.names[i]) from None
            except _Corrupt as e:
                raise e.at("." + self.names[i]) from None
            if end > stop:
                raise _Corrupt(f"truncated: the fields need {end - pos} bytes, {stop - pos} left")
            return tuple(out), end
        nulls = int.from_bytes(vals[0], "little")
        if nulls >> self.n:
            raise _Corrupt("null bitmap has bits set past the last field")
        out = list(vals[1:])
        i = 0
        try:
            for i, t in self.converted:
                if not nulls >> i & 1:
                    out[i] = t.from_slot(out[i])
            for i, t, _ in self.variable:
                n = out[i]
                if nulls >> i & 1:
                    if n:
                        raise _Corrupt("null field with a non-empty body")
                    continue
                body_end = end + n
                if body_end > stop:
                    raise _Corrupt(f"truncated: field of {n} bytes, {stop - end} left")
                out[i] = t.from_bytes(data, end, body_end)
                end = body_end
        except _Corrupt as e:
            raise e.at("." + self.names[i]) from None
        for i in range(self.n):
            if nulls >> i & 1:
                out[i] = None
        return tuple(out), end

    def unpack_whole(self, data: bytes, pos: int) -> StateRow:
        """The row that fills ``data[pos:]`` exactly."""
        if self.simple and len(data) == pos + self.size and data[pos : pos + self.nb] == self.zero:
            return self.fixed.unpack_from(data, pos + self.nb)
        row, end = self.unpack(data, pos, len(data))
        if end != len(data):
            raise _Corrupt(f"{len(data) - end} trailing bytes after the value")
        return row

    def unpack_list(self, data: bytes, pos: int) -> list[StateRow]:
        """The rows of a ListState chunk whose count is at ``data[pos:]``."""
        if len(data) < pos + 4:
            raise _Corrupt("truncated: list chunk without its count")
        (count,) = _U32.unpack_from(data, pos)
        pos += 4
        stop = len(data)
        size, nb, zero, fixed, single = self.size, self.nb, self.zero, self.fixed.unpack_from, self.single
        if count * size > stop - pos:
            raise _Corrupt(f"truncated: {count} list elements need at least {count * size} bytes")
        out = []
        for k in range(count):
            if data[pos : pos + nb] == zero:  # the fast paths of unpack, inline
                if self.simple:
                    out.append(fixed(data, pos + nb))
                    pos += size
                    continue
                if single is not None:
                    j, is_str = single
                    fields = list(fixed(data, pos + nb))
                    end = pos + size
                    body_end = end + fields[j]
                    if body_end <= stop:
                        try:
                            fields[j] = (
                                data[end:body_end].decode("utf-8", "surrogatepass")
                                if is_str
                                else data[end:body_end]
                            )
                            out.append(tuple(fields))
                            pos = body_end
                            continue
                        except UnicodeDecodeError:
                            pass  # unpack names the field
            try:
                row, pos = self.unpack(data, pos, stop)
            except _Corrupt as e:
                raise e.at(f"[{k}]") from None
            out.append(row)
        if pos != stop:
            raise _Corrupt(f"{stop - pos} trailing bytes after {count} list elements")
        return out


def _join(head: bytes, tails: list[bytes]) -> bytes:
    if not tails:
        return head
    if len(tails) == 1:
        return head + tails[0]
    return b"".join((head, *tails))


_SIMPLE_TYPES: dict[type[DataType], _Type] = {
    BooleanType: _Bool(),
    ByteType: _Int("TINYINT", "b", 8),
    ShortType: _Int("SMALLINT", "h", 16),
    IntegerType: _Int("INT", "i", 32),
    LongType: _Int("BIGINT", "q", 64),
    FloatType: _Float("FLOAT"),
    DoubleType: _Float("DOUBLE"),
    StringType: _String("STRING"),
    CharType: _String("CHAR"),
    VarcharType: _String("VARCHAR"),
    BinaryType: _Binary(),
    DateType: _Date(),
    TimestampType: _Timestamp("TIMESTAMP"),
    TimestampNTZType: _Timestamp("TIMESTAMP_NTZ"),
    DayTimeIntervalType: _Interval(),
    DecimalType: _Decimal(),
}


class UnsupportedTypeError(ProcessorError, TypeError):
    """A state schema uses a type that state values cannot hold."""


def _type_of(data_type: DataType, path: str) -> _Type:
    simple = _SIMPLE_TYPES.get(type(data_type))
    if simple is not None:
        return simple
    if isinstance(data_type, ArrayType):
        return _Array(_type_of(data_type.elementType, path + "[]"))
    if isinstance(data_type, MapType):
        return _Map(_type_of(data_type.keyType, path + "{key}"), _type_of(data_type.valueType, path + "{}"))
    if isinstance(data_type, StructType):
        return _Struct(_compile(data_type, path + "."))
    raise UnsupportedTypeError(
        f"field {path!r} has type {data_type.simpleString()}, which state values cannot hold"
    )


def _compile(schema: StructType, prefix: str = "") -> RowLayout:
    return RowLayout(
        [f.name for f in schema.fields], [_type_of(f.dataType, prefix + f.name) for f in schema.fields]
    )


@functools.lru_cache(maxsize=512)
def compile_schema(schema: StructType) -> RowLayout:
    """The compiled :class:`RowLayout` of ``schema`` (cached: ``init`` declares its variables every batch)."""
    return _compile(schema)


# -- per state variable ---------------------------------------------------------------------------


class _Expired:
    __slots__ = ()

    def __repr__(self) -> str:
        return "EXPIRED"


EXPIRED: Any = _Expired()
"""Returned by the ``decode_live*`` methods for a value whose TTL has passed."""

_READ_ERRORS = (_Corrupt, _OldFormat, struct.error, IndexError)


class StateCodec:
    """Encodes and decodes the stored values of one state variable, driven by its schema.

    Errors name the state variable: :class:`StateVariableError` for a value that does not fit the
    schema on write, :class:`ValueFormatError` for stored bytes that are not a value of the schema.
    ``key`` arguments (the grouping key tuple, or the stored key bytes) only serve those messages.
    The two hot operations, :attr:`encode` and :attr:`decode_live`, are closures over the compiled
    layout, one call deep for rows of fixed-width fields.
    """

    __slots__ = ("_row", "decode_live", "decode_live_list", "encode", "encode_list", "name")

    def __init__(self, state_name: str, schema: StructType) -> None:
        self.name = state_name
        try:
            self._row = row = compile_schema(schema)
        except UnsupportedTypeError as e:
            raise StateVariableError(f"Cannot declare state variable {state_name!r}: {e}") from None
        self.encode = self._encoder(row)
        self.decode_live = self._live_decoder(row)
        self.encode_list = self._list_encoder(row)
        self.decode_live_list = self._live_list_decoder(row)

    def _encoder(self, row: RowLayout) -> Callable[..., bytes]:
        check, simple, flat, pack_value, unfit = row.check, row.simple, row.flat, row.pack_value, self._unfit
        value0, expiring0 = row.value0.pack, row.expiring0.pack
        variable = tuple((i, kind == _STR) for i, _, kind in row.variable)
        single, single_str = row.single or (None, False)

        def encode(values: Sequence[Any], expiry_ms: int | None, what: str = "value") -> bytes:
            """``values`` (one row of the schema) as stored bytes; ``expiry_ms`` None: no TTL."""
            if check(values):  # exact types: no nulls, nothing to convert
                try:
                    if simple:
                        if expiry_ms is None:
                            return value0(MARK, *values)
                        return expiring0(MARK_EXPIRY, expiry_ms, *values)
                    if single is not None:
                        slots = list(values)
                        body: bytes = (
                            slots[single].encode("utf-8", "surrogatepass") if single_str else slots[single]
                        )
                        slots[single] = len(body)
                        if expiry_ms is None:
                            return value0(MARK, *slots) + body
                        return expiring0(MARK_EXPIRY, expiry_ms, *slots) + body
                    if flat:
                        slots = list(values)
                        tails = []
                        for i, is_str in variable:
                            body = slots[i].encode("utf-8", "surrogatepass") if is_str else slots[i]
                            slots[i] = len(body)
                            tails.append(body)
                        if expiry_ms is None:
                            return _join(value0(MARK, *slots), tails)
                        return _join(expiring0(MARK_EXPIRY, expiry_ms, *slots), tails)
                except struct.error:
                    pass  # out of range: pack_value says which field
            try:
                return pack_value(values, expiry_ms)
            except _Unfit as e:
                raise unfit(e, values, what) from None

        return encode

    def _live_decoder(self, row: RowLayout) -> Callable[..., Any]:
        simple, flat, nb, zero, size = row.simple, row.flat, row.nb, row.zero, row.size
        fixed, unpack_whole = row.fixed.unpack_from, row.unpack_whole
        variable = tuple((i, kind == _STR) for i, _, kind in row.variable)
        single, single_str = row.single or (None, False)
        expiry, start_error, corrupt = _I64.unpack_from, self._start_error, self._corrupt

        def decode_live(data: bytes, now_ms: int, key: Any = None) -> Any:
            """The row stored in ``data``, or :data:`EXPIRED` when ``now_ms`` >= its expiry."""
            try:
                marker = data[0]
                if marker == MARK:
                    pos = 1
                elif marker == MARK_EXPIRY and len(data) >= 9:
                    if now_ms >= expiry(data, 1)[0]:
                        return EXPIRED
                    pos = 9
                else:
                    raise start_error(data)
                end = pos + size
                # fast paths for rows without nulls; anything unusual goes to unpack_whole, which names it
                try:
                    if (not data[pos]) if nb == 1 else data[pos : pos + nb] == zero:
                        if simple:
                            if len(data) == end:
                                return fixed(data, pos + nb)
                        elif single is not None:
                            out = list(fixed(data, pos + nb))
                            if end + out[single] == len(data):
                                out[single] = (
                                    data[end:].decode("utf-8", "surrogatepass") if single_str else data[end:]
                                )
                                return tuple(out)
                        elif flat:
                            out = list(fixed(data, pos + nb))
                            for i, is_str in variable:
                                stop = end + out[i]
                                out[i] = (
                                    data[end:stop].decode("utf-8", "surrogatepass")
                                    if is_str
                                    else data[end:stop]
                                )
                                end = stop
                            if end == len(data):
                                return tuple(out)
                except (struct.error, IndexError, UnicodeDecodeError):
                    pass
                return unpack_whole(data, pos)
            except _READ_ERRORS as e:
                raise corrupt(e, data, key) from None

        return decode_live

    def _list_encoder(self, row: RowLayout) -> Callable[..., bytes]:
        check, simple, pack_list, unfit = row.check, row.simple, row.pack_list, self._unfit
        list0, list_expiring0 = row.list0.pack, row.list_expiring0.pack
        single, single_str = row.single or (None, False)

        def encode_list(rows: Sequence[Sequence[Any]], expiry_ms: int | None) -> bytes:
            """A ListState chunk of ``rows`` (non-empty)."""
            if len(rows) == 1 and check(rows[0]):  # appendValue: the fast paths of encode
                try:
                    if simple:
                        if expiry_ms is None:
                            return list0(MARK, 1, *rows[0])
                        return list_expiring0(MARK_EXPIRY, expiry_ms, 1, *rows[0])
                    if single is not None:
                        slots = list(rows[0])
                        body: bytes = (
                            slots[single].encode("utf-8", "surrogatepass") if single_str else slots[single]
                        )
                        slots[single] = len(body)
                        if expiry_ms is None:
                            return list0(MARK, 1, *slots) + body
                        return list_expiring0(MARK_EXPIRY, expiry_ms, 1, *slots) + body
                except struct.error:
                    pass
            try:
                return pack_list(rows, expiry_ms)
            except _Unfit as e:
                raise unfit(e, rows[e.element], "list element") from None

        return encode_list

    def _live_list_decoder(self, row: RowLayout) -> Callable[..., Any]:
        simple, nb, size, unpack_list = row.simple, row.nb, row.size, row.unpack_list
        fixed, one_row = row.fixed.unpack_from, _U32.pack(1) + row.zero  # count 1, no nulls
        single, single_str = row.single or (None, False)
        expiry, start_error, corrupt = _I64.unpack_from, self._start_error, self._corrupt

        def decode_live_list(data: bytes, now_ms: int, key: Any = None) -> Any:
            """The rows of a ListState chunk, or :data:`EXPIRED` when its TTL has passed."""
            try:
                marker = data[0]
                if marker == MARK:
                    pos = 1
                elif marker == MARK_EXPIRY and len(data) >= 9:
                    if now_ms >= expiry(data, 1)[0]:
                        return EXPIRED
                    pos = 9
                else:
                    raise start_error(data)
                end = pos + 4 + size
                # one row without nulls (appendValue): the fast paths of decode_live
                if data[pos : pos + 4 + nb] == one_row and len(data) >= end:
                    if simple:
                        if len(data) == end:
                            return [fixed(data, pos + 4 + nb)]
                    elif single is not None:
                        out = list(fixed(data, pos + 4 + nb))
                        if end + out[single] == len(data):
                            try:
                                out[single] = (
                                    data[end:].decode("utf-8", "surrogatepass") if single_str else data[end:]
                                )
                                return [tuple(out)]
                            except UnicodeDecodeError:
                                pass  # unpack_list names the field
                return unpack_list(data, pos)
            except _READ_ERRORS as e:
                raise corrupt(e, data, key) from None

        return decode_live_list

    # -- writing

    def coerce(self, row: Sequence[Any], what: str) -> StateRow:
        """``row`` checked against the schema and converted to plain Python values (e.g. a user key)."""
        layout = self._row
        if layout.check(row):
            if layout.always_fits:
                return tuple(row)
            if layout.simple:
                try:
                    layout.fixed.pack(*row)  # ranges
                    return tuple(row)
                except struct.error:
                    pass
        try:
            return layout.accept(row)
        except _Unfit as e:
            raise self._unfit(e, row, what) from None

    def _unfit(self, e: _Unfit, row: Any, what: str) -> StateVariableError:
        field = "".join(e.path).lstrip(".")
        where = f" field {field!r} ({e.sql})" if field else ""
        return StateVariableError(
            f"Cannot write {what} {row!r} to state variable {self.name!r}:{where} {e.message}; the schema"
            f" is {self._row.sql}"
        )

    # -- reading

    def decode(self, data: bytes, key: Any = None) -> StateRow:
        """The row stored in ``data`` (ignoring its expiry)."""
        try:
            return self._row.unpack_whole(data, self._body_start(data))
        except _READ_ERRORS as e:
            raise self._corrupt(e, data, key) from None

    def decode_list(self, data: bytes, key: Any = None) -> list[StateRow]:
        """The rows of a ListState chunk (ignoring its expiry)."""
        try:
            return self._row.unpack_list(data, self._body_start(data))
        except _READ_ERRORS as e:
            raise self._corrupt(e, data, key) from None

    def list_length(self, data: bytes, key: Any = None) -> int:
        """How many rows a ListState chunk holds (read from its header, not decoded)."""
        try:
            pos = self._body_start(data)
            if len(data) < pos + 4:
                raise _Corrupt("truncated: list chunk without its count")
            count: int = _U32.unpack_from(data, pos)[0]
            return count
        except _READ_ERRORS as e:
            raise self._corrupt(e, data, key) from None

    def expiry(self, data: bytes, key: Any = None) -> int | None:
        """The expiry (ms) stored with a value or list chunk, or None if it never expires."""
        try:
            return None if self._body_start(data) == 1 else _I64.unpack_from(data, 1)[0]
        except _READ_ERRORS as e:
            raise self._corrupt(e, data, key) from None

    @classmethod
    def _body_start(cls, data: bytes) -> int:
        """Where the row (or list count) starts after the marker and expiry; refuses other formats."""
        if data and data[0] == MARK:
            return 1
        if len(data) >= 9 and data[0] == MARK_EXPIRY:
            return 9
        raise cls._start_error(data)

    @staticmethod
    def _start_error(data: bytes) -> Exception:
        if not data:
            return _Corrupt("empty value")
        marker = data[0]
        if marker == MARK_EXPIRY:
            return _Corrupt("truncated expiry")
        if marker in _OLD_HEADERS:
            return _OldFormat()
        return _Corrupt(f"unknown format marker {marker:#04x} (not a state value of this version)")

    def _corrupt(self, e: Exception, data: bytes, key: Any) -> ValueFormatError:
        if key is None:
            where = ""
        elif isinstance(key, (bytes, bytearray, memoryview)):
            where = f" (stored key 0x{bytes(key).hex()})"
        else:
            where = f" (grouping key {key!r})"
        prefix = f"Cannot read state variable {self.name!r}{where}"
        if isinstance(e, _OldFormat):
            return ValueFormatError(
                f"{prefix}: the value was written with the old pickled encoding, which this version refuses"
                " to read (unpickling stored bytes could run arbitrary code). Start a new checkpoint."
            )
        if not data:
            problem = "empty value"
        elif isinstance(e, _Corrupt):
            field = "".join(e.path).lstrip(".")
            problem = f"field {field!r}: {e.message}" if field else e.message
        else:
            problem = f"{type(e).__name__}: {e}"
        return ValueFormatError(
            f"{prefix}: {len(data)} stored bytes are not a value of its schema {self._row.sql}: {problem}."
            " The checkpoint is corrupt or was written with another schema or version."
        )


# -- schema identity across restarts -------------------------------------------------------------

_SIGNATURES = {
    "boolean": "boolean",
    "byte": "tinyint",
    "short": "smallint",
    "integer": "int",
    "long": "bigint",
    "float": "double",  # both stored as a double
    "double": "double",
    "string": "string",
    "binary": "binary",
    "date": "date",
    "timestamp": "timestamp",  # both stored alike
    "timestamp_ntz": "timestamp",
    "interval day to second": "interval",
}


def storage_signature(json_type: Any) -> str:
    """What decides the byte layout of a schema, from its JSON form (``StructType.jsonValue()``).

    Two schemas with equal signatures store values alike (names, nullability, comments, decimal
    precision and string lengths do not matter). Computed from JSON without PySpark's parser, so a
    declaration read from storage is never turned into classes.
    """
    if isinstance(json_type, str):
        if json_type.startswith("decimal"):
            return "decimal"
        if json_type.startswith(("char(", "varchar(")):
            return "string"
        if json_type.startswith("interval") and "month" not in json_type and "year" not in json_type:
            return "interval"
        return _SIGNATURES.get(json_type, "?" + json_type)
    if isinstance(json_type, dict):
        kind = json_type.get("type")
        if kind == "array":
            return f"array<{storage_signature(json_type.get('elementType'))}>"
        if kind == "map":
            k, v = storage_signature(json_type.get("keyType")), storage_signature(json_type.get("valueType"))
            return f"map<{k},{v}>"
        if kind == "struct" and isinstance(json_type.get("fields"), list):
            fields = json_type["fields"]
            return (
                "struct<"
                + ",".join(storage_signature(f.get("type") if isinstance(f, dict) else None) for f in fields)
                + ">"
            )
    return "?"
