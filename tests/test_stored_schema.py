"""Schemas read from storage are parsed by blobstate's own parser: an allow-list of types within bounds,
built without PySpark's parser, so no type named in storage is ever imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from blobstate.errors import BlobstateError
from blobstate.stored_schema import (
    MAX_DEPTH,
    MAX_FIELDS,
    MAX_NAME_LENGTH,
    StoredSchemaError,
    parse_declaration,
    parse_stored_schema,
)

PROBE = "blobstate_stored_schema_probe"


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module on sys.path that leaves a marker file when it is imported; returns the marker's path."""
    marker = tmp_path / "imported"
    (tmp_path / f"{PROBE}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "from pyspark.sql.types import LongType, UserDefinedType\n\n"
        "class Probe(UserDefinedType):\n"
        "    @classmethod\n    def sqlType(cls):\n        return LongType()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PROBE, raising=False)
    return marker


def udt() -> dict[str, Any]:
    return {"type": "udt", "class": "x.Probe", "pyClass": f"{PROBE}.Probe", "sqlType": "long"}


def struct(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
    }


def nested(levels: int) -> dict[str, Any]:
    """A struct whose field ``a`` is an array ``levels - 1`` deep (``levels`` levels of nesting)."""
    inner: Any = "long"
    for _ in range(levels - 1):
        inner = {"type": "array", "elementType": inner, "containsNull": True}
    return struct(("a", inner))


def test_pyspark_parser_imports_the_module_a_stored_udt_names(probe: Path) -> None:
    # What the stored-schema parser replaces: PySpark runs the named module's import-time code.
    T.StructType.fromJson(struct(("x", udt())))
    assert probe.exists()


def test_a_udt_anywhere_is_refused_naming_the_field_and_nothing_is_imported(probe: Path) -> None:
    cases = {
        "x": struct(("x", udt())),
        "a[]": struct(("a", {"type": "array", "elementType": udt(), "containsNull": True})),
        "m{value}": struct(
            ("m", {"type": "map", "keyType": "string", "valueType": udt(), "valueContainsNull": True})
        ),
        "s.deep": struct(("s", struct(("deep", udt())))),
    }
    for path, schema in cases.items():
        with pytest.raises(StoredSchemaError) as caught:
            parse_stored_schema(schema, where="value schema of the planted object")
        message = str(caught.value)
        assert message.startswith(f"invalid value schema of the planted object: field {path!r}: ")
        assert f"'{PROBE}.Probe'" in message and "user-defined type" in message and "\n" not in message
        assert caught.value.field == path
    assert not probe.exists() and PROBE not in sys.modules


def test_a_top_level_udt_or_non_struct_is_refused(probe: Path) -> None:
    for value, problem in [
        (udt(), "user-defined type"),
        ("long", "expected a struct"),
        (7, "expected a struct"),
    ]:
        with pytest.raises(StoredSchemaError, match=problem):
            parse_stored_schema(value, where="w")
    assert not probe.exists()


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        (struct(("a", 7)), "a", "the type is 7, not a type name"),
        (struct(("a", None)), "a", "the type is None"),
        (struct(("a", ["long"])), "a", "the type is list"),
        (struct(("a", "variant")), "a", "type 'variant' is not one blobstate reads"),
        (struct(("a", "interval")), "a", "type 'interval' is not one"),
        (struct(("a", "geometry(4326)")), "a", "type 'geometry(4326)' is not one"),
        (struct(("a", "decimal(40,2)")), "a", "is not a decimal type"),
        (struct(("a", "decimal(5,6)")), "a", "is not a decimal type"),
        (struct(("a", "interval second to day")), "a", "is not one blobstate reads"),
        (struct(("a", {"type": "struct", "fields": "ab"})), "a", "fields are 'ab', not a list"),
        (struct(("a", {"type": "mystery"})), "a", "type 'mystery' is not one"),
        (struct(("a", {"type": "array", "elementType": "long", "containsNull": "yes"})), "a", "containsNull"),
        (
            struct(("a", {"type": "array", "elementType": "long", "pyClass": "os.X"})),
            "a",
            "unknown key 'pyClass'",
        ),
        ({"type": "struct", "fields": [7]}, "#0", "a field is 7, not an object"),
        ({"type": "struct", "fields": [{"name": 7, "type": "long"}]}, "#0", "field name is 7"),
        ({"type": "struct", "fields": [{"name": "a", "type": "long", "nullable": 1}]}, "a", "nullable is 1"),
        (
            {"type": "struct", "fields": [{"name": "a", "type": "long", "metadata": []}]},
            "a",
            "metadata is list",
        ),
        (
            {
                "type": "struct",
                "fields": [{"name": "a", "type": "long", "metadata": {"__COLLATIONS": {"a": "x.y"}}}],
            },
            "a",
            "not a collation",
        ),
        (
            {
                "type": "struct",
                "fields": [
                    {"name": "a", "type": "long", "metadata": {"__COLLATIONS": {"a": "spark.UTF8_LCASE"}}}
                ],
            },
            "a",
            "collations apply to strings",
        ),
    ],
)
def test_malformed_schemas_are_one_line_errors_naming_the_field(value: Any, path: str, problem: str) -> None:
    with pytest.raises(StoredSchemaError) as caught:
        parse_stored_schema(value, where="key_schema of operator 0 in metadata.json of /ckpt")
    assert isinstance(caught.value, BlobstateError) and isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert message.startswith(f"invalid key_schema of operator 0 in metadata.json of /ckpt: field {path!r}: ")
    assert problem in message and "\n" not in message


def test_depth_is_bounded_and_deep_nesting_is_one_line_not_a_recursion_error() -> None:
    assert parse_stored_schema(nested(MAX_DEPTH), where="w") == T.StructType.fromJson(nested(MAX_DEPTH))
    for levels in (MAX_DEPTH + 1, 3000):
        with pytest.raises(StoredSchemaError, match=f"nests deeper than {MAX_DEPTH} levels") as caught:
            parse_stored_schema(nested(levels), where="w")
        assert "\n" not in str(caught.value)
    deep_structs: Any = struct(("x", "long"))
    for _ in range(3000):
        deep_structs = struct(("s", deep_structs))
    with pytest.raises(StoredSchemaError, match="nests deeper"):
        parse_stored_schema(deep_structs, where="w")


def test_field_count_and_name_length_are_bounded() -> None:
    wide = struct(*[(f"f{i}", "long") for i in range(MAX_FIELDS)])
    assert len(parse_stored_schema(wide, where="w").fields) == MAX_FIELDS
    with pytest.raises(StoredSchemaError, match=f"more than {MAX_FIELDS} fields"):
        parse_stored_schema(struct(*[(f"f{i}", "long") for i in range(MAX_FIELDS + 1)]), where="w")
    half = [(f"f{i}", "long") for i in range(MAX_FIELDS // 2)]
    with pytest.raises(StoredSchemaError, match="more than"):  # counted at every level
        parse_stored_schema(struct(*half, ("s", struct(*half, ("x", "long")))), where="w")
    assert parse_stored_schema(struct(("n" * MAX_NAME_LENGTH, "long")), where="w").names == [
        "n" * MAX_NAME_LENGTH
    ]
    with pytest.raises(StoredSchemaError, match=f"has {MAX_NAME_LENGTH + 1} characters"):
        parse_stored_schema(struct(("n" * (MAX_NAME_LENGTH + 1), "long")), where="w")


def test_field_metadata_is_plain_json_within_the_depth_bound() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH + 1):
        deep = {"k": deep}
    field = {"name": "a", "type": "long", "nullable": True, "metadata": {"comment": "c", "x": deep}}
    with pytest.raises(StoredSchemaError, match="metadata is not plain JSON"):
        parse_stored_schema({"type": "struct", "fields": [field]}, where="w")


# -- round trip: every schema of allowed types reads back as itself --------------------------------

_COLLATIONS = ["UTF8_BINARY", "UTF8_LCASE", "UNICODE", "UNICODE_CI"]
_atomic = st.one_of(
    st.sampled_from(
        [
            T.NullType(),
            T.BooleanType(),
            T.ByteType(),
            T.ShortType(),
            T.IntegerType(),
            T.LongType(),
            T.FloatType(),
            T.DoubleType(),
            T.BinaryType(),
            T.DateType(),
            T.TimestampType(),
            T.TimestampNTZType(),
        ]
    ),
    st.sampled_from(_COLLATIONS).map(T.StringType),
    st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: T.DecimalType(p, s))),
    st.integers(1, 10_000).map(T.CharType),
    st.integers(1, 10_000).map(T.VarcharType),
    st.integers(0, 6).map(T.TimeType),
    st.integers(0, 3).flatmap(lambda a: st.integers(a, 3).map(lambda b: T.DayTimeIntervalType(a, b))),
    st.integers(0, 1).flatmap(lambda a: st.integers(a, 1).map(lambda b: T.YearMonthIntervalType(a, b))),
)
_names = st.text(min_size=1, max_size=12)  # PySpark itself mislays an unnamed field's collations
_metadata = st.one_of(st.just({}), st.builds(lambda c: {"comment": c}, st.text(max_size=20)))


def _struct_of(children: st.SearchStrategy) -> st.SearchStrategy:
    field = st.builds(T.StructField, _names, children, st.booleans(), _metadata)
    return st.lists(field, max_size=4).map(T.StructType)


_types = st.recursive(
    _atomic,
    lambda children: st.one_of(
        st.builds(T.ArrayType, children, st.booleans()),
        st.builds(T.MapType, children, children, st.booleans()),
        _struct_of(children),
    ),
    max_leaves=12,
)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # reprs of deep schemas
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_struct_of(_types))
def test_any_schema_of_allowed_types_round_trips(schema: T.StructType) -> None:
    stored = json.loads(json.dumps(schema.jsonValue()))  # as it is stored: JSON text
    parsed = parse_stored_schema(stored, where="w")
    assert parsed == schema
    assert parsed == T.StructType.fromJson(stored)  # what PySpark's own parser makes of it


# -- declarations in $meta -----------------------------------------------------------------------

WHERE = "state variable 'totals' in $meta of operator 0 partition 1 at version 4 (uid u1) of /ckpt"
SCHEMA = struct(("count", "long"))


def decl(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_a_declaration_blobstate_wrote_parses() -> None:
    parsed = parse_declaration(decl(kind="value", schema=SCHEMA, ttl=True), where=WHERE)
    assert (parsed.kind, parsed.schema, parsed.user_key_schema, parsed.ttl) == (
        "value", T.StructType.fromJson(SCHEMA), None, True,
    )  # fmt: skip
    parsed = parse_declaration(decl(kind="map", schema=SCHEMA, userKeySchema=SCHEMA, ttl=False), where=WHERE)
    assert parsed.user_key_schema == T.StructType.fromJson(SCHEMA)
    assert parse_declaration(json.dumps(parsed.to_json()).encode(), where=WHERE) == parsed


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x80\x04\x95not json", "invalid declaration of {w}: not JSON (UnicodeDecodeError"),
        (b"{kind: value", "invalid declaration of {w}: not JSON (JSONDecodeError"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid declaration of {w}: not JSON (RecursionError"),
        (b"cblobstate_stored_schema_probe\nProbe\n(tR.", "invalid declaration of {w}: not JSON"),
        (b"[1, 2]", "invalid declaration of {w}: list is not a JSON object"),
        (b"{}", "invalid declaration of {w}: field 'kind': None is not value, list or map"),
        (decl(kind="value"), "invalid declaration of {w}: field 'schema': missing"),
        (decl(kind="value", schema="struct<a:int>"), "invalid value schema of {w}: expected a struct"),
        (
            decl(kind="value", schema={"type": "struct", "fields": "a"}),
            "invalid value schema of {w}: a struct's fields are 'a', not a list",
        ),
        (decl(kind="value", schema=SCHEMA, ttl="yes"), "invalid declaration of {w}: field 'ttl'"),
        (decl(kind="map", schema=SCHEMA), "invalid declaration of {w}: field 'userKeySchema': missing"),
        (
            decl(kind="map", schema=SCHEMA, userKeySchema=struct(("k", udt()))),
            "invalid user key schema of {w}: field 'k'",
        ),
        (decl(kind="value", schema=nested(40)), "invalid value schema of {w}: field 'a[][]"),
    ],
)
def test_damaged_declarations_are_one_line_errors_naming_the_variable(
    probe: Path, data: bytes, problem: str
) -> None:
    with pytest.raises(StoredSchemaError) as caught:
        parse_declaration(data, where=WHERE)
    message = str(caught.value)
    assert message.startswith(problem.format(w=WHERE)), message
    assert "\n" not in message and len(message) < 500
    assert not probe.exists()
