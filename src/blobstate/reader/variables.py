"""The state of one partition's RocksDB store read back as rows: state variables, their entries, timers.

Reads what :mod:`blobstate.processor.api` writes (column families in :mod:`blobstate.encoding.layout`):
the declarations in ``$meta`` (JSON, their schemas parsed by :mod:`blobstate.stored_schema`,
which never imports a type named in storage), grouping keys and MapState user keys with the tagged key
decoder of :mod:`blobstate.encoding.codec`, values with the schema-driven
:class:`~blobstate.encoding.values.StateCodec`. Nothing is unpickled or evaluated.

Rows are flattened as Spark's state reader (``format("statestore")``) flattens them: one row per value,
per list element, per map entry (user key, value) and per registered timer. Values with a TTL carry
their expiry (epoch ms); values already past it that the TTL sweep had not removed at that version are
returned too: the reader shows what the version stores, and the expiry says when it lapses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from blobstate.encoding import codec, layout
from blobstate.encoding.codec import Key
from blobstate.encoding.values import StateCodec, UnsupportedTypeError
from blobstate.errors import StateError
from blobstate.stored_schema import StoredSchemaError, parse_declaration

_BEFORE_ANY_EXPIRY = -(1 << 63)

TIMERS = "$timers"
"""The name that reads the registered timers instead of a state variable (``stateVarName``)."""


class StateReadError(StateError, ValueError):
    """The state asked for does not exist (an unknown state variable, operator, partition or version)."""


@dataclass(frozen=True)
class StateVariable:
    """A state variable as its declaration in ``$meta`` records it (parsed by
    :func:`~blobstate.stored_schema.parse_declaration`)."""

    name: str
    kind: str
    """``value``, ``list`` or ``map``."""
    schema: StructType
    """The value schema."""
    user_key_schema: StructType | None
    """The user key schema of map state (None for the other kinds)."""
    ttl: bool
    where: str = "a partition's store"
    """The store it was read from (operator, partition, version, checkpoint), for errors."""

    def value_type(self) -> StructType:
        """The value schema."""
        return self.schema

    def user_key_type(self) -> StructType | None:
        """The MapState user key schema (None for other kinds)."""
        return self.user_key_schema


def declarations(store: Any, *, where: str = "a partition's store") -> dict[str, StateVariable]:
    """Every state variable declared in ``store`` (a RocksStateStore), by name.

    ``where`` names the store (operator, partition, version, checkpoint) in errors: a declaration that
    is not one blobstate wrote, or whose schema is not one it reads from storage, is a
    :class:`~blobstate.stored_schema.StoredSchemaError` naming the variable and the field.
    """
    found: dict[str, StateVariable] = {}
    prefix = layout.meta_key("")
    for key, data in store.items(layout.META_CF, prefix):
        name = bytes(key[len(prefix) :]).decode("utf-8", "backslashreplace")
        decl = parse_declaration(data, where=f"state variable {name!r} in $meta of {where}")
        found[name] = StateVariable(name, decl.kind, decl.schema, decl.user_key_schema, decl.ttl, where)
    return found


def entries(store: Any, var: StateVariable, arity: int) -> Iterator[tuple[Any, ...]]:
    """The rows of ``var``: ``(key, value, expiry)`` for value state, ``(key, element, expiry)`` per list
    element, ``(key, user_key, value, expiry)`` per map entry; ``expiry`` is None without a TTL."""
    cf = layout.state_cf(var.name)
    try:
        values = StateCodec(var.name, var.value_type())
    except UnsupportedTypeError as error:
        raise StoredSchemaError(
            f"value schema of state variable {var.name!r} in $meta of {var.where}", "", str(error)
        ) from None
    # decode_live's fast paths at a time before any expiry: every stored value, expired or not
    decode, never = values.decode_live, _BEFORE_ANY_EXPIRY
    if var.kind == "value":
        for k, data in store.items(cf):
            key, _ = codec.decode_key(k, arity)
            yield key, decode(data, never, key), values.expiry(data, key)
    elif var.kind == "list":
        for k, data in store.items(cf):
            key, end = codec.decode_key(k, arity)
            if end == len(k):  # the list's head: the next chunk number, no values
                continue
            expiry = values.expiry(data, key)
            for element in values.decode_list(data, key):
                yield key, element, expiry
    else:
        user_arity = len(var.user_key_schema.fields) if var.user_key_schema is not None else 0
        for k, data in store.items(cf):
            key, end = codec.decode_key(k, arity)
            user_key, _ = codec.decode_key(k, user_arity, end)
            yield key, user_key, decode(data, never, key), values.expiry(data, key)


def timers(store: Any, arity: int) -> Iterator[tuple[Key, int]]:
    """The registered timers: ``(key, expiry ms)`` in key order, then time order."""
    for k, _ in store.items(layout.TIMERS_BY_KEY_CF):
        key, end = codec.decode_key(k, arity)
        yield key, codec.decode_ts(k, end)


def any_key(store: Any, names: list[str], arity: int) -> Key | None:
    """A grouping key stored in ``store`` (looking in ``names``' families, then the timers), or None."""
    for cf in [*names, layout.TIMERS_BY_KEY_CF]:
        for k, _ in store.items(cf):
            return codec.decode_key(k, arity)[0]
    return None
