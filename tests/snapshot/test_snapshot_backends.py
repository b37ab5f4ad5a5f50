"""Failure handling of snapshots on every blob store backend (local directory, memory, S3)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from snapshot_helpers import FaultyStore, read_tree, write_tree

from blobstate.blobstore import BlobStore, BlobStoreError
from blobstate.snapshot import (
    SnapshotBlobMissingError,
    SnapshotCorruptError,
    backup_directory,
    post_commit_cleanup,
    referenced_objects,
    restore_directory,
)
from blobstate.snapshot.restore import TEMP_MARKER


def backup(store: BlobStore, src: Path, n: int, previous=None, **kw):  # type: ignore[no-untyped-def]
    return backup_directory(
        store,
        src,
        index_name=f"state/0/0/{n}_{n:08x}.snapshot",
        blob_prefix="blobs/0/0/",
        previous=previous.index if previous else None,
        previous_name=previous.index_name if previous else None,
        checkpoint_id=f"{n}_{n:08x}",
        checksum_cache=None,
        **kw,
    )


def leftovers(root: Path) -> list[str]:
    return [n for _, _, files in os.walk(root) for n in files if TEMP_MARKER in n or n.endswith(".part")]


def test_corrupt_and_missing_blobs_are_named(blob_store: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(5000)
    src = write_tree(tmp_path / "src", {"one.sst": data, "multi.sst": data * 2})
    result = backup(blob_store, src, 1, chunk_size=6000)
    files = dict(result.index.iter_present_files())
    (one,) = files["one.sst"].blobs
    blob_store.put(one.blob_id, data[:-1] + bytes([data[-1] ^ 0xFF]))
    target = tmp_path / "t"
    with pytest.raises(SnapshotCorruptError) as info:
        restore_directory(blob_store, result.index, target)
    assert info.value.blob_id == one.blob_id and not (target / "one.sst").exists()
    assert leftovers(target) == []

    blob_store.put(one.blob_id, data)
    missing = files["multi.sst"].blobs[1].blob_id
    blob_store.delete(missing)
    with pytest.raises(SnapshotBlobMissingError) as info2:
        restore_directory(blob_store, result.index, target)
    assert info2.value.blob_id == missing and info2.value.file == "multi.sst"
    assert not (target / "multi.sst").exists()
    assert leftovers(target) == []


def test_failed_upload_is_pending_and_committed_state_untouched(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    src = write_tree(tmp_path / "src", {f"{i}.sst": os.urandom(1000) for i in range(4)})
    committed = backup(blob_store, src, 1)
    post_commit_cleanup(blob_store, committed.index_name, committed.index)
    before = {n: blob_store.get(n) for n in blob_store.list()}
    for i in range(4, 10):
        (src / f"{i}.sst").write_bytes(os.urandom(1000))
    with pytest.raises(BlobStoreError, match="injected failure"):
        backup(FaultyStore(blob_store, fail_put_after=3), src, 2, previous=committed, ttl=50)
    new = set(blob_store.list()) - set(before)
    assert len(new) == 3 and not any(n.endswith(".snapshot") for n in new)
    assert all(blob_store.has_ttl(n) for n in new)
    assert {n: blob_store.get(n) for n in before} == before
    expired = blob_store.expire(time.time() + 51)
    assert set(expired) <= new  # S3 leaves expiry to its lifecycle rule
    restore_directory(blob_store, committed.index, tmp_path / "r")
    assert set(os.listdir(tmp_path / "r")) == {f"{i}.sst" for i in range(4)}


def test_cleanup_twice_on_every_backend(blob_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a", "MANIFEST-1": b"m", "d/b.sst": b"b"})
    s1 = backup(blob_store, src, 1)
    post_commit_cleanup(blob_store, s1.index_name, s1.index)
    (src / "MANIFEST-1").write_bytes(b"m2")
    (src / "d/b.sst").unlink()
    (src / "d").rmdir()
    s2 = backup(blob_store, src, 2, previous=s1)
    post_commit_cleanup(blob_store, s2.index_name, s2.index)
    post_commit_cleanup(blob_store, s2.index_name, s2.index)
    assert set(blob_store.list()) == referenced_objects(s2.index_name, s2.index)
    assert not any(blob_store.has_ttl(n) for n in blob_store.list())
    restore_directory(blob_store, s2.index, tmp_path / "r")
    assert read_tree(tmp_path / "r") == read_tree(src)
