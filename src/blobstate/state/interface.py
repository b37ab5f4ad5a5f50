"""What the processor layer needs of a partition's state store: a small protocol, apart from RocksDB.

:class:`~blobstate.state.store.RocksStateStore` implements it; the processor runner and the state
variables depend only on this, so they can be tested and reused (for a standby replica's store or an
adjunct store) without knowing the backend.
"""

from __future__ import annotations

from collections.abc import Iterator
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

    def items(self, cf: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs of ``cf`` whose key starts with ``prefix``, in key order."""
        ...

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` in ``cf``."""
        ...

    def delete(self, cf: str, key: bytes) -> None:
        """Delete ``key`` from ``cf`` (absent keys are fine)."""
        ...

    def clear(self, cf: str) -> None:
        """Delete every key of ``cf``."""
        ...


__all__ = ["KeyValueStore"]
