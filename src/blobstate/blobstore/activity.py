"""The blob store operations of this process, reported to one observer while one is set: the command
line's sign of life on commands that read, write or delete for minutes (``verify --checksums``,
``gc --full``, ``rescale``, ``restore`` of a query checkpoint), whichever module opened the store.

Every :class:`~blobstate.blobstore.base.BlobStore` reports each object it read (``"read"``, bytes),
wrote (``"write"``, bytes), deleted (``"delete"``) and each listing (``"list"``, names listed), from
whichever thread ran it. Nothing is reported while no observer is set (a query's tasks, the library);
an observer that fails is ignored: it never fails the operation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Observer = Callable[[str, int], None]
"""``observer(kind, amount)``: ``kind`` is ``read``, ``write``, ``delete`` or ``list``; ``amount`` the
bytes read or written, the names listed, 1 for a delete."""

_observer: Observer | None = None


@contextlib.contextmanager
def observe(observer: Observer) -> Iterator[None]:
    """Report every blob store operation of this process to ``observer`` until the block ends (the one
    set before is set again then)."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = previous


def observed() -> bool:
    """Whether an observer is set (so that an amount that costs something to find is found only then)."""
    return _observer is not None


def note(kind: str, amount: int) -> None:
    """Report one operation to the observer, if one is set (the blob stores call it)."""
    observer = _observer
    if observer is None:
        return
    with contextlib.suppress(Exception):  # a progress display never fails the operation it shows
        observer(kind, amount)


__all__ = ["Observer", "note", "observe", "observed"]
