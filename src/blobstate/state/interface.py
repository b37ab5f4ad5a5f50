"""What the processor layer needs of a partition's state store: a small protocol, apart from RocksDB.

:class:`~blobstate.state.store.RocksStateStore` implements it; the processor runner and the state
variables depend only on this, so they can be tested and reused (for a standby replica's store or an
adjunct store) without knowing the backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class KeyValueStore(Protocol):
    """Byte keys and values in named column families, with writes captured for the next commit."""

    def column_families(self) -> list[str]:
        """Names of the store's column families, sorted."""
        ...

    def get(self, cf: str, key: bytes) -> bytes | None:
        """The value of ``key`` in ``cf``, or None."""
        ...

    def multi_get(self, cf: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in ``cf`` (None where absent), in the order of ``keys``."""
        ...

    def items(self, cf: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs of ``cf`` whose key starts with ``prefix``, in key order."""
        ...

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` in ``cf``."""
        ...

    def put_many(self, cf: str, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        """``put`` every ``(key, value)`` pair, in order."""
        ...

    def put_columns(self, cf: str, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """``put`` ``keys[i]`` = ``values[i]`` for every i, in order (the bulk form for many keys)."""
        ...

    def delete(self, cf: str, key: bytes) -> None:
        """Delete ``key`` from ``cf`` (absent keys are fine)."""
        ...

    def clear(self, cf: str) -> None:
        """Delete every key of ``cf``."""
        ...


__all__ = ["KeyValueStore"]
