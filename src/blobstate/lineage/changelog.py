"""The change records of one attempt, as the store captures them and a delta encodes them.

A store's writes come one at a time (``put``, ``delete``, ``clear``) or many at once (a bulk put of many
keys of one column family, ``RocksStateStore.put_columns``). :class:`Changelog` keeps them in write order
as segments: runs of single records, and bulk blocks that stay three columns (the column family, the
keys, the values) instead of a tuple per record. The delta encoder (:func:`blobstate.lineage.delta
.encode_delta`) packs a block column-wise as it is, so a bulk write of a hundred thousand keys costs no
per-record Python object on its way to the blob store.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import IntEnum
from itertools import repeat


class ChangeOp(IntEnum):
    """What one change record does to its column family."""

    PUT = 1
    """Set ``key`` to ``value``."""
    DELETE = 2
    """Delete ``key``; ``value`` is None."""
    CLEAR = 3
    """Delete every key of the column family; ``key`` is ``b""`` and ``value`` is None."""


ChangeRecord = tuple[ChangeOp, str, bytes, bytes | None]
"""One change: ``(op, column_family, key, value)``."""

_PUT = ChangeOp.PUT


class PutBlock:
    """``PUT`` records of many keys of one column family: ``keys[i]`` = ``values[i]``, in order."""

    __slots__ = ("cf", "keys", "values")

    def __init__(self, cf: str, keys: list[bytes], values: list[bytes]) -> None:
        self.cf = cf
        self.keys = keys
        self.values = values

    def __len__(self) -> int:
        return len(self.keys)

    def records(self) -> Iterator[ChangeRecord]:
        """The block as change records."""
        return zip(repeat(_PUT), repeat(self.cf), self.keys, self.values)

    @property
    def nbytes(self) -> int:
        """Column family, key and value bytes summed over the block's records."""
        return len(self.cf) * len(self.keys) + sum(map(len, self.keys)) + sum(map(len, self.values))


Segment = list[ChangeRecord] | PutBlock
"""A run of single change records, or a bulk block."""


def _records_nbytes(records: Sequence[ChangeRecord], start: int) -> int:
    total = 0
    for i in range(start, len(records)):
        _, cf, key, value = records[i]
        total += len(cf) + len(key)
        if value is not None:
            total += len(value)
    return total


class Changelog:
    """Change records in write order: single records and bulk put blocks (see the module docstring).

    Iterating yields ``(op, column_family, key, value)`` tuples; :meth:`segments` gives the blocks as they
    are, for encoders that pack columns.
    """

    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._tail: list[ChangeRecord] | None = None
        self._length = 0
        # bytes of the segments before the tail, and of the tail's first ``_tail_counted`` records
        self._bytes = 0
        self._tail_counted = 0

    def append(self, record: ChangeRecord) -> None:
        """Add one change record."""
        tail = self._tail
        if tail is None:
            tail = self._tail = []
            self._tail_counted = 0
            self._segments.append(tail)
        tail.append(record)
        self._length += 1

    def add_puts(self, cf: str, keys: list[bytes], values: list[bytes]) -> None:
        """Add ``PUT`` records of ``keys[i]`` = ``values[i]`` in ``cf``; the lists are kept, not copied
        (the caller hands them over)."""
        if len(keys) != len(values):
            raise ValueError(f"a put block needs as many values as keys, got {len(keys)} and {len(values)}")
        if not keys:
            return
        self._close_tail()
        block = PutBlock(cf, keys, values)
        self._segments.append(block)
        self._bytes += block.nbytes
        self._length += len(keys)

    def _count_tail(self) -> None:
        """Add the tail's records not counted yet to the byte count."""
        tail = self._tail
        if tail is not None and self._tail_counted < len(tail):
            self._bytes += _records_nbytes(tail, self._tail_counted)
            self._tail_counted = len(tail)

    def _close_tail(self) -> None:
        self._count_tail()
        self._tail = None

    def segments(self) -> list[Segment]:
        """The segments in write order (the object's own lists: do not modify them)."""
        return self._segments

    @property
    def nbytes(self) -> int:
        """The sum of ``len(cf) + len(key) + len(value)`` over every record (counted once per record)."""
        self._count_tail()
        return self._bytes

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[ChangeRecord]:
        for segment in self._segments:
            if isinstance(segment, PutBlock):
                yield from segment.records()
            else:
                yield from segment

    def __repr__(self) -> str:
        return f"Changelog({self._length} records in {len(self._segments)} segments)"
