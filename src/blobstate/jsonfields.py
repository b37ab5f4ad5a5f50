"""Strict reading of small JSON records (commits, metadata, backup heads): one loader, typed fields.

Duplicate keys, ``NaN`` and ``Infinity`` are refused, and every failure goes through the record's own
``fail(field, problem)`` so each format raises its own error naming the object and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal, NoReturn, overload

Fail = Callable[[str, str], NoReturn]
"""Raises the record format's error for ``(field, problem)``; ``field`` is "" for the whole object."""


def load_strict_json(data: bytes, fail: Fail) -> object:
    """Parse ``data`` as JSON, refusing duplicate keys, ``NaN``/``Infinity``, undecodable bytes and nesting
    deeper than the interpreter's recursion limit."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                fail(repr(key), "duplicate key")
            out[key] = value
        return out

    def no_constants(token: str) -> NoReturn:
        fail("", f"{token} is not valid JSON")

    try:
        return json.loads(data, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        fail("", f"not valid JSON: {error}")
    except RecursionError:
        fail("", "not valid JSON: nested too deeply")


def mib(size: int) -> str:
    """``16 MiB``, ``1.5 MiB``: a byte count in MiB, for messages about size bounds."""
    return f"{size / (1 << 20):,.{0 if size % (1 << 20) == 0 else 1}f} MiB"


def check_record_size(size: int, bound: int, fail: Fail, *, read: bool, cut: bool = False) -> None:
    """Refuse a record of ``size`` bytes above ``bound`` (``fail("", problem)``) before it is parsed: a
    JSON record takes about 4.4 times its size in memory once parsed. ``read``: whether its bytes were
    already read (else the size came from a listing and the object was not read); ``cut``: the read
    stopped at ``size`` bytes, so the record has at least that many."""
    if size > bound:
        how = "read but not parsed" if read else "not read"
        at_least = "at least " if cut else ""
        fail(
            "",
            f"{at_least}{size:,} bytes, above the {bound:,} bytes ({mib(bound)}) a reader accepts for it"
            f" ({how}): "
            "no record blobstate writes is that large, so it was not written by blobstate or is damaged",
        )


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


class JsonFields:
    """Typed access to one JSON object's fields; ``prefix`` qualifies field names of nested objects."""

    def __init__(self, obj: object, fail: Fail, prefix: str = "") -> None:
        self._fail, self.prefix = fail, prefix
        if not isinstance(obj, dict):
            self.fail("", f"expected a JSON object, found {type(obj).__name__}")
        self.obj: dict[str, Any] = obj

    def fail(self, key: str, problem: str) -> NoReturn:
        """Raise the format's error for field ``key`` of this object."""
        self._fail(f"{self.prefix}{key}", problem)

    def nested(self, obj: object, key: str) -> JsonFields:
        """The fields of ``obj``, the value of this object's field ``key``."""
        return JsonFields(obj, self._fail, f"{self.prefix}{key}")

    def get(
        self,
        key: str,
        check: Callable[[Any], bool] | None = None,
        expected: str = "",
        *,
        optional: bool = False,
    ) -> Any:
        """The value of ``key``: missing is an error unless ``optional`` (then None, as is null)."""
        if key not in self.obj:
            if optional:
                return None
            self.fail(key, "missing")
        value = self.obj[key]
        if value is None and optional:
            return None
        if check is not None and not check(value):
            self.fail(key, f"expected {expected}, found {value!r}")
        return value

    @overload
    def integer(
        self,
        key: str,
        minimum: int | None = None,
        maximum: int | None = None,
        *,
        optional: Literal[False] = False,
    ) -> int: ...

    @overload
    def integer(
        self, key: str, minimum: int | None = None, maximum: int | None = None, *, optional: bool
    ) -> int | None: ...

    def integer(
        self, key: str, minimum: int | None = None, maximum: int | None = None, *, optional: bool = False
    ) -> int | None:
        """An integer field within ``minimum..maximum`` (each bound optional)."""
        if maximum is not None:
            expected = f"an integer between {minimum} and {maximum}"
        elif minimum is not None:
            expected = f"an integer >= {minimum}"
        else:
            expected = "an integer"
        value: int | None = self.get(
            key,
            lambda v: is_int(v) and (minimum is None or v >= minimum) and (maximum is None or v <= maximum),
            expected,
            optional=optional,
        )
        return value

    def text(self, key: str) -> str:
        """A non-empty string field."""
        value: str = self.get(key, lambda v: isinstance(v, str) and v != "", "a non-empty string")
        return value

    def mapping(self, key: str, *, optional: bool = False) -> dict[str, Any] | None:
        """A JSON object field."""
        value: dict[str, Any] | None = self.get(
            key, lambda v: isinstance(v, dict), "a JSON object", optional=optional
        )
        return value


__all__ = ["Fail", "JsonFields", "check_record_size", "is_int", "load_strict_json", "mib"]
