"""Schemas read from storage, parsed by blobstate itself: an allow-list of types, bounded in size.

A schema in a checkpoint (a state variable's declaration in ``$meta``, an operator's ``key_schema`` in
``metadata.json``) is data anyone with write access to the store can change, and PySpark's own parser
(``StructType.fromJson``) imports the module a user-defined type names. So every schema read from
storage goes through :func:`parse_stored_schema`, which builds the PySpark types directly and accepts
only:

- atomic types: ``void``, ``boolean``, ``byte``, ``short``, ``integer``, ``long``, ``float``,
  ``double``, ``decimal(p,s)``, ``string`` (with a collation), ``char(n)``, ``varchar(n)``,
  ``binary``, ``date``, ``timestamp``, ``timestamp_ntz``, ``time(p)``, day-time and year-month
  intervals;
- ``struct``, ``array`` and ``map`` of those;

within :data:`MAX_DEPTH` levels of nesting, :data:`MAX_FIELDS` struct fields in all and field names of
at most :data:`MAX_NAME_LENGTH` characters. Anything else (a user-defined type, a variant, a geometry,
a field type that is not a type, an unknown key) is a :class:`StoredSchemaError` naming the object and
the field. :func:`parse_declaration` reads a whole ``$meta`` declaration the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NoReturn

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
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    TimeType,
    VarcharType,
    YearMonthIntervalType,
)

from blobstate.errors import CorruptionError

MAX_DEPTH = 16
"""Levels of nesting (struct, array, map) a stored schema may have, the top-level struct being 1."""
MAX_FIELDS = 4096
"""Struct fields a stored schema may have, counted at every level."""
MAX_NAME_LENGTH = 256
"""Characters in a field name (and in a collation name)."""

_COLLATIONS = "__COLLATIONS"  # PySpark's field metadata key for the collations of the field's strings
_COLLATION_PROVIDERS = ("spark", "icu")
_COLLATION_NAME = re.compile(r"[A-Za-z0-9_]{1,256}")

_SIMPLE: dict[str, type[DataType]] = {
    "void": NullType,
    "null": NullType,
    "boolean": BooleanType,
    "byte": ByteType,
    "short": ShortType,
    "integer": IntegerType,
    "long": LongType,
    "float": FloatType,
    "double": DoubleType,
    "string": StringType,
    "binary": BinaryType,
    "date": DateType,
    "timestamp": TimestampType,
    "timestamp_ntz": TimestampNTZType,
}
_DECIMAL = re.compile(r"decimal\(\s*(\d{1,2})\s*,\s*(\d{1,2})\s*\)")
_CHAR = re.compile(r"(char|varchar)\((\d{1,10})\)")
_TIME = re.compile(r"time\((\d)\)")
_STRING_COLLATED = re.compile(r"string collate ([A-Za-z0-9_]{1,256})")
_DAY_TIME = {"day": 0, "hour": 1, "minute": 2, "second": 3}
_YEAR_MONTH = {"year": 0, "month": 1}
_INTERVAL = re.compile(r"interval (\w+)(?: to (\w+))?")
_ALLOWED = "allowed: atomic types, struct, array and map"


class StoredSchemaError(CorruptionError, ValueError):
    """A schema or state variable declaration read from storage is malformed or names a type blobstate
    does not read from storage; names the object and the field."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        at = f": field {field!r}" if field else ""
        super().__init__(f"invalid {where}{at}: {problem}")
        self.where = where
        self.field = field
        self.problem = problem


def parse_stored_schema(json_value: Any, *, where: str) -> StructType:
    """The StructType of ``json_value`` (``StructType.jsonValue()`` form) read from storage.

    ``where`` names the schema and the object it was read from (it starts the error message: "invalid
    <where>: field ...: <problem>"). Builds the types directly, never through PySpark's parser, so a
    user-defined type is refused rather than imported. Raises :class:`StoredSchemaError`.
    """
    parser = _Parser(where)
    if not isinstance(json_value, dict):
        parser.fail("", f"expected a struct (a JSON object), found {_shown(json_value)}")
    parsed = parser.data_type(json_value, "", 1, None)
    if not isinstance(parsed, StructType):
        parser.fail("", f"expected a struct, found {_shown(json_value)}")
    return parsed


class _Parser:
    def __init__(self, where: str) -> None:
        self.where = where
        self.fields = 0

    def fail(self, path: str, problem: str) -> NoReturn:
        raise StoredSchemaError(self.where, path, problem)

    def data_type(
        self, value: Any, path: str, depth: int, collation: tuple[dict[str, str], str] | None
    ) -> DataType:
        """The type ``value`` describes; ``collation`` is the enclosing field's collations and this
        type's path in them (PySpark's ``name``, ``name.element``, ``name.key``, ``name.value``)."""
        if isinstance(value, str):
            return self.atomic(value, path, collation)
        if not isinstance(value, dict):
            self.fail(path, f"the type is {_shown(value)}, not a type name or a type object ({_ALLOWED})")
        if depth > MAX_DEPTH:
            self.fail(path, f"nests deeper than {MAX_DEPTH} levels")
        kind = value.get("type")
        if collation is not None and collation[1] in collation[0]:
            self.fail(path, f"a collation is recorded for its {kind} type; collations apply to strings")
        if kind == "struct":
            return self.struct(value, path, depth)
        if kind == "array":
            self.keys(value, path, {"type", "elementType", "containsNull"})
            element = self.data_type(
                value.get("elementType"), path + "[]", depth + 1, _sub(collation, "element")
            )
            return ArrayType(element, self.flag(value, "containsNull", path))
        if kind == "map":
            self.keys(value, path, {"type", "keyType", "valueType", "valueContainsNull"})
            key = self.data_type(value.get("keyType"), path + "{key}", depth + 1, _sub(collation, "key"))
            item = self.data_type(
                value.get("valueType"), path + "{value}", depth + 1, _sub(collation, "value")
            )
            return MapType(key, item, self.flag(value, "valueContainsNull", path))
        if kind == "udt":
            named = value.get("pyClass") or value.get("class")
            self.fail(path, f"a user-defined type ({_shown(named)}) is never read from storage ({_ALLOWED})")
        self.fail(path, f"type {_shown(kind)} is not one blobstate reads from storage ({_ALLOWED})")

    def struct(self, value: dict[str, Any], path: str, depth: int) -> StructType:
        self.keys(value, path, {"type", "fields"})
        raw = value.get("fields")
        if not isinstance(raw, list):
            self.fail(path, f"a struct's fields are {_shown(raw)}, not a list")
        if self.fields + len(raw) > MAX_FIELDS:
            self.fail(path, f"more than {MAX_FIELDS} fields")
        self.fields += len(raw)
        prefix = f"{path}." if path else ""
        fields = []
        for i, f in enumerate(raw):
            if not isinstance(f, dict):
                self.fail(f"{prefix}#{i}", f"a field is {_shown(f)}, not an object")
            name = f.get("name")
            if not isinstance(name, str):
                self.fail(f"{prefix}#{i}", f"the field name is {_shown(name)}, not a string")
            here = prefix + name
            if len(name) > MAX_NAME_LENGTH:
                self.fail(
                    f"{prefix}#{i}", f"the field name has {len(name)} characters (at most {MAX_NAME_LENGTH})"
                )
            self.keys(f, here, {"name", "type", "nullable", "metadata"})
            metadata = f.get("metadata", {})
            if not isinstance(metadata, dict):
                self.fail(here, f"metadata is {_shown(metadata)}, not an object")
            if not _plain(metadata, MAX_DEPTH):
                self.fail(here, f"metadata is not plain JSON within {MAX_DEPTH} levels")
            collations = self.collations(metadata.get(_COLLATIONS), here)
            if collations:
                metadata = {k: v for k, v in metadata.items() if k != _COLLATIONS}
            data_type = self.data_type(f.get("type"), here, depth + 1, (collations, name))
            fields.append(StructField(name, data_type, self.flag(f, "nullable", here), dict(metadata)))
        return StructType(fields)

    def atomic(self, name: str, path: str, collation: tuple[dict[str, str], str] | None) -> DataType:
        collated = None if collation is None else collation[0].get(collation[1])
        if collated is not None and name != "string":
            self.fail(
                path, f"a collation is recorded for its {name[:64]!r} type; collations apply to strings"
            )
        if name == "string" and collated is not None:
            return StringType(collated)
        simple = _SIMPLE.get(name)
        if simple is not None:
            return simple()
        if m := _DECIMAL.fullmatch(name):
            precision, scale = int(m.group(1)), int(m.group(2))
            if not 1 <= precision <= 38 or scale > precision:
                self.fail(path, f"{name!r} is not a decimal type (precision 1..38, scale 0..precision)")
            return DecimalType(precision, scale)
        if m := _CHAR.fullmatch(name):
            length = int(m.group(2))
            if length >= 1 << 31:
                self.fail(path, f"{name!r} is longer than a string can be")
            return CharType(length) if m.group(1) == "char" else VarcharType(length)
        if m := _TIME.fullmatch(name):
            precision = int(m.group(1))
            if precision > 6:
                self.fail(path, f"{name!r} has a precision above 6")
            return TimeType(precision)
        if m := _STRING_COLLATED.fullmatch(name):
            return StringType(m.group(1))
        if m := _INTERVAL.fullmatch(name):
            start, end = m.group(1), m.group(2) or m.group(1)
            for units, make in ((_DAY_TIME, DayTimeIntervalType), (_YEAR_MONTH, YearMonthIntervalType)):
                if start in units and end in units and units[start] <= units[end]:
                    return make(units[start], units[end])
        self.fail(path, f"type {_shown(name)} is not one blobstate reads from storage ({_ALLOWED})")

    def collations(self, value: Any, path: str) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"{_COLLATIONS} is {_shown(value)}, not an object")
        out = {}
        for key, qualified in value.items():
            provider, _, name = qualified.partition(".") if isinstance(qualified, str) else ("", "", "")
            if provider.lower() not in _COLLATION_PROVIDERS or not _COLLATION_NAME.fullmatch(name):
                self.fail(path, f"{_COLLATIONS} has {_shown(qualified)}, not a collation (provider.name)")
            out[key] = name
        return out

    def flag(self, value: dict[str, Any], key: str, path: str) -> bool:
        flag = value.get(key, True)
        if not isinstance(flag, bool):
            self.fail(path, f"{key} is {_shown(flag)}, not true or false")
        return flag

    def keys(self, value: dict[str, Any], path: str, known: set[str]) -> None:
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            self.fail(path, f"unknown key {_shown(unknown[0])} in a {_shown(value.get('type', 'field'))}")


def _sub(collation: tuple[dict[str, str], str] | None, part: str) -> tuple[dict[str, str], str] | None:
    return None if collation is None else (collation[0], f"{collation[1]}.{part}")


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` is JSON data (objects with string keys, lists, scalars) within ``depth`` levels."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    if depth <= 0:
        return False
    if isinstance(value, list):
        return all(_plain(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth - 1) for k, v in value.items())
    return False


def _shown(value: Any) -> str:
    """A short rendering of a value found in storage (which may be anything, of any size)."""
    text = (
        repr(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    )
    return text if len(text) <= 80 else text[:77] + "..."


# -- state variable declarations in $meta ---------------------------------------------------------

KINDS = ("value", "list", "map")


@dataclass(frozen=True)
class Declaration:
    """A state variable's declaration as ``$meta`` records it, parsed."""

    kind: str
    """``value``, ``list`` or ``map``."""
    schema: StructType
    """The value schema."""
    user_key_schema: StructType | None
    """The user key schema of a map state variable (None for the other kinds)."""
    ttl: bool

    def to_json(self) -> dict[str, Any]:
        """The declaration as ``$meta`` stores it (JSON)."""
        out: dict[str, Any] = {"kind": self.kind, "schema": self.schema.jsonValue(), "ttl": self.ttl}
        if self.user_key_schema is not None:
            out["userKeySchema"] = self.user_key_schema.jsonValue()
        return out


def parse_declaration(data: bytes, *, where: str) -> Declaration:
    """Parse the ``$meta`` declaration ``data`` of a state variable; ``where`` names the variable and
    the object it was read from (operator, partition, version, checkpoint). Raises
    :class:`StoredSchemaError`."""
    what = f"declaration of {where}"

    def fail(field: str, problem: str) -> NoReturn:
        raise StoredSchemaError(what, field, problem)

    try:
        decl = json.loads(bytes(data))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        fail("", f"not JSON ({type(error).__name__}: {str(error)[:120]})")
    if not isinstance(decl, dict):
        fail("", f"{_shown(decl)} is not a JSON object")
    kind = decl.get("kind")
    if kind not in KINDS:
        fail("kind", f"{_shown(kind)} is not value, list or map")
    if "schema" not in decl:
        fail("schema", "missing")
    ttl = decl.get("ttl", False)
    if not isinstance(ttl, bool):
        fail("ttl", f"{_shown(ttl)} is not true or false")
    schema = parse_stored_schema(decl["schema"], where=f"value schema of {where}")
    user_key = None
    if kind == "map":
        if "userKeySchema" not in decl:
            fail("userKeySchema", "missing (a map state variable has a user key schema)")
        user_key = parse_stored_schema(decl["userKeySchema"], where=f"user key schema of {where}")
    elif decl.get("userKeySchema") is not None:
        fail("userKeySchema", f"present in the declaration of {kind} state")
    return Declaration(kind, schema, user_key, ttl)


__all__ = [
    "MAX_DEPTH",
    "MAX_FIELDS",
    "MAX_NAME_LENGTH",
    "Declaration",
    "StoredSchemaError",
    "parse_declaration",
    "parse_stored_schema",
]
