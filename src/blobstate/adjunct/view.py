"""The processor's read-only view of an adjunct store (``handle.getAdjunct(name)``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.types import StructType

from blobstate.encoding import codec
from blobstate.encoding.codec import Key
from blobstate.encoding.values import EXPIRED, StateCodec, StateRow
from blobstate.state.interface import KeyValueStore


class AdjunctView:
    """A read-only map from key to value over one adjunct store, at the batch's version.

    Keys are tuples of the side stream's key columns (a single-column key may be given as the bare
    value); values are tuples laid out by :attr:`schema`, like ``ValueState.get``. Every task of a
    batch sees the same version: the side rows of the batch are applied before its main rows.
    """

    def __init__(self, name: str, store: KeyValueStore, cf: str, schema: StructType, key_arity: int) -> None:
        """A view of ``cf`` in ``store`` holding values of ``schema`` under keys of ``key_arity`` columns."""
        self.name = name
        self.schema = schema
        """The schema of the stored values."""
        self._store = store
        self._cf = cf
        self._codec = StateCodec(f"adjunct {name}", schema)
        self._arity = key_arity

    def _kb(self, key: Any) -> bytes:
        parts = tuple(key) if isinstance(key, (tuple, list)) else (key,)
        if len(parts) != self._arity:
            raise ValueError(
                f"adjunct {self.name!r} has {self._arity} key column(s); the key {key!r} has {len(parts)}"
            )
        return codec.encode_key(parts)

    def _decode(self, data: bytes, key: Any) -> StateRow:
        value: StateRow = self._codec.decode_live(data, 0, key)
        assert value is not EXPIRED  # adjunct values carry no TTL
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for ``key``, or ``default`` when the side stream has none."""
        data = self._store.get(self._cf, self._kb(key))
        return default if data is None else self._decode(data, key)

    def get_many(self, keys: Sequence[Any]) -> list[StateRow | None]:
        """The values of many keys at once (None where there is none), in one multi-get."""
        found = self._store.multi_get(self._cf, [self._kb(k) for k in keys])
        return [None if d is None else self._decode(d, k) for d, k in zip(found, keys, strict=True)]

    def contains(self, key: Any) -> bool:
        """Whether the store has a value for ``key``."""
        return self._store.get(self._cf, self._kb(key)) is not None

    __contains__ = contains

    def items(self) -> Iterator[tuple[Key, StateRow]]:
        """Every ``(key, value)`` in key order (a partitioned store: the partition's keys only)."""
        for kb, data in self._store.items(self._cf):
            key = codec.decode_key(bytes(kb), self._arity)[0]
            yield key, self._decode(data, key)

    def keys(self) -> Iterator[Key]:
        """Every key, in key order."""
        for key, _ in self.items():
            yield key

    def __iter__(self) -> Iterator[Key]:
        return self.keys()

    def __repr__(self) -> str:
        return f"AdjunctView({self.name!r}, {self.schema.simpleString()})"
