"""Fixtures for snapshot tests: a fresh in-memory store, a private checksum cache, a real RocksDB."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from snapshot_helpers import RocksFixture

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.snapshot import ChecksumCache


@pytest.fixture
def mem_store() -> Iterator[BlobStore]:
    """A fresh in-memory store."""
    store = open_blob_store(f"memory://{uuid.uuid4().hex}")
    yield store
    store.close()


@pytest.fixture
def cache() -> ChecksumCache:
    """A private checksum cache, so tests do not depend on each other through the process-wide one."""
    return ChecksumCache()


@pytest.fixture
def rocks(tmp_path: Path) -> Iterator[RocksFixture]:
    """A real RocksDB database in a temporary directory."""
    fixture = RocksFixture(tmp_path / "rocks")
    yield fixture
    fixture.close()
