"""Bounded parallelism on a blob store's I/O pool, for work whose best degree differs from the pool's size.

Network-bound stores (S3) want many requests in flight; the local-directory and memory stores are bound
by CPU and memory bandwidth, where more threads than cores only thrash caches (measured: restoring 1 GiB
with 8 threads on 2 cores ran at about 0.5x the speed of 2 threads).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from blobstate.blobstore.base import BlobStore

T = TypeVar("T")
R = TypeVar("R")


def default_workers(store: BlobStore) -> int:
    """How many items to process at once on ``store``: its pool size, or the core count if it is local."""
    from blobstate.blobstore.local import LocalBlobStore
    from blobstate.blobstore.memory import MemoryBlobStore

    if isinstance(store, LocalBlobStore | MemoryBlobStore):
        return max(1, min(store.io_threads, os.cpu_count() or 1))
    return store.io_threads


def run_bounded(store: BlobStore, fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """Like ``store.run_parallel(fn, items)`` but with at most ``workers`` items in progress at once.

    ``workers`` lanes on the store's pool take items from a shared cursor in order (so put the biggest
    first). Lanes never wait for one another. After a failure no new item is started; the first error
    is raised once the lanes have stopped.
    """
    todo = list(items)
    workers = max(1, min(workers, len(todo)))
    if workers >= len(todo):
        return store.run_parallel(fn, todo)
    results: list[R | None] = [None] * len(todo)
    cursor = iter(range(len(todo)))
    lock = threading.Lock()
    failed = threading.Event()

    def lane(_: int) -> None:
        while not failed.is_set():
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            try:
                results[i] = fn(todo[i])
            except BaseException:
                failed.set()
                raise

    store.run_parallel(lane, range(workers))
    return results  # type: ignore[return-value]
