"""Fixtures for processor tests: a real RocksStateStore in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstate.state.store import RocksStateStore


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Where the test's store lives (reopen it with ``RocksStateStore.open(store_path)``)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_path: Path) -> Iterator[RocksStateStore]:
    """A fresh, real RocksDB state store, closed after the test."""
    s = RocksStateStore.open(store_path)
    yield s
    s.close()
