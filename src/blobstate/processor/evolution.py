"""State variable schema evolution on restart: nullable fields appended at the end.

Stored values carry no schema of their own (:mod:`blobstate.encoding.values`); ``$meta`` records the
schema a variable was declared with. When a restarted query declares the variable with another schema:

- the same fields (names, in order, of the same stored types; nullability and comments may change):
  nothing to do;
- the old fields, in order, with the same names and stored types, followed by new *nullable* fields:
  every stored value of the variable in this partition is rewritten once, in the task's own write
  batch (so the rewrite is part of the version it commits), with null for the new fields; the
  processor only ever sees tuples of the new length;
- anything else (a field removed, renamed, reordered, retyped, a new field that is NOT NULL, a map's
  user key schema changed): :class:`~blobstate.processor.errors.StateVariableError` naming the variable, both
  schemas and what is allowed.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from blobstate.encoding.values import MARK, MARK_EXPIRY, StateCodec, storage_signature
from blobstate.processor.errors import StateVariableError
from blobstate.state.interface import KeyValueStore

ALLOWED = (
    "allowed between restarts: the same fields (same names and types, in order) followed by new nullable"
    " fields; "
    "otherwise declare it with the old schema, delete it with deleteIfExists in init, or start from a"
    " new checkpoint"
)


def field_signatures(schema_json: Any) -> list[str] | None:
    """``name:storage signature`` of each top-level field of a struct's JSON form (None if not a struct).

    Names count: two fields of one type swapped store the same bytes but would be read as each other."""
    if not isinstance(schema_json, dict) or not isinstance(schema_json.get("fields"), list):
        return None
    return [
        f"{f.get('name')}:{storage_signature(f.get('type'))}" if isinstance(f, dict) else "?"
        for f in schema_json["fields"]
    ]


def same_fields(before_json: Any, now_json: Any) -> bool:
    """Whether two schemas have the same fields (names and stored types, in order)."""
    before = field_signatures(before_json)
    return before is not None and before == field_signatures(now_json)


def appended_nullable(before_json: Any, now: StructType) -> int | None:
    """How many fields ``now`` appends to the stored schema ``before_json`` (all nullable), or None
    when ``now`` is not such an extension."""
    before = field_signatures(before_json)
    after = field_signatures(now.jsonValue())
    if before is None or after is None or len(after) <= len(before) or after[: len(before)] != before:
        return None
    if not all(f.nullable for f in now.fields[len(before) :]):
        return None
    return len(after) - len(before)


def migrate(store: KeyValueStore, cf: str, name: str, kind: str, now: StructType, old_count: int) -> int:
    """Rewrite every stored value of variable ``name`` (column family ``cf``) from its first
    ``old_count`` fields to ``now`` with nulls appended; returns how many entries were rewritten.

    The old layout is the prefix of ``now`` (their storage signatures were checked equal), so nothing
    read from storage is turned into a schema. List heads (be64 counters) are not values and are kept.
    """
    old_codec = StateCodec(name, StructType(now.fields[:old_count]))
    new_codec = StateCodec(name, now)
    pad = (None,) * (len(now.fields) - old_count)
    rewritten: list[tuple[bytes, bytes]] = []
    for key, value in store.items(cf):
        data = bytes(value)
        if not data or data[0] not in (MARK, MARK_EXPIRY):
            continue
        expiry = old_codec.expiry(data, key)
        if kind == "list":
            rows = [tuple(r) + pad for r in old_codec.decode_list(data, key)]
            rewritten.append((bytes(key), new_codec.encode_list(rows, expiry)))
        else:
            row = tuple(old_codec.decode(data, key)) + pad
            rewritten.append((bytes(key), new_codec.encode(row, expiry)))
    for key, data in rewritten:
        store.put(cf, key, data)
    return len(rewritten)


def refuse(name: str, what: str, before: Any, now: Any) -> StateVariableError:
    """The error for an incompatible change of a variable's ``what`` (schema or user key schema)."""
    return StateVariableError(
        f"Cannot change the {what} of state variable {name!r} from {_describe(before)} to"
        f" {_describe(now)} between query restarts: its stored values are encoded for the old"
        f" one ({ALLOWED})"
    )


def _describe(schema_json: Any) -> str:
    fields = field_signatures(schema_json)
    return storage_signature(schema_json) if fields is None else "struct<" + ", ".join(fields) + ">"
