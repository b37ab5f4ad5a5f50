"""Bounded parallelism on a store's I/O pool."""

from __future__ import annotations

import threading
import time

import pytest

from blobstate.blobstore import BlobStore
from blobstate.snapshot.parallel import default_workers, run_bounded


def test_results_in_order_and_at_most_workers_in_flight(mem_store: BlobStore) -> None:
    lock = threading.Lock()
    in_flight = 0
    peak = 0

    def work(i: int) -> int:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.002)
        with lock:
            in_flight -= 1
        return i * i

    assert run_bounded(mem_store, work, range(40), 3) == [i * i for i in range(40)]
    assert 1 <= peak <= 3
    assert run_bounded(mem_store, work, [], 3) == []


def test_failure_stops_new_items_and_is_raised(mem_store: BlobStore) -> None:
    started: list[int] = []

    def work(i: int) -> None:
        started.append(i)
        if i == 2:
            raise ValueError("item 2 failed")

    with pytest.raises(ValueError, match="item 2 failed"):
        run_bounded(mem_store, work, range(100), 2)
    assert len(started) < 100


def test_local_stores_use_at_most_one_worker_per_core(mem_store: BlobStore) -> None:
    import os

    assert 1 <= default_workers(mem_store) <= max(1, os.cpu_count() or 1)
