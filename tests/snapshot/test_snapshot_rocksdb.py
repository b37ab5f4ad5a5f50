"""Real RocksDB checkpoints backed up and restored on every blob store backend."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from snapshot_helpers import RocksFixture, open_and_read, read_tree

from blobstate.blobstore import BlobStore
from blobstate.snapshot import (
    ChecksumCache,
    backup_directory,
    post_commit_cleanup,
    read_snapshot_index,
    referenced_objects,
    restore_directory,
)
from blobstate.snapshot.checksum import is_immutable


def opened_copy(path: Path, tmp_path: Path) -> dict[bytes, bytes]:
    """The keys of the RocksDB at ``path``, read from a copy (opening a DB writes to its directory)."""
    copy = tmp_path / f"open-{path.name}-{len(os.listdir(tmp_path))}"
    shutil.copytree(path, copy)
    return open_and_read(copy)


def test_rocksdb_checkpoints_round_trip_incrementally(
    blob_store: BlobStore, rocks: RocksFixture, tmp_path: Path
) -> None:
    cache = ChecksumCache()
    rocks.write(2000)
    rocks.write(2000)
    cp1 = rocks.checkpoint("cp1")
    first = backup_directory(
        blob_store,
        cp1,
        index_name="state/0/0/1_aaaaaaaa.snapshot",
        blob_prefix="blobs/0/0/",
        previous=None,
        previous_name=None,
        checkpoint_id="1_aaaaaaaa",
        metadata={"operator": "0", "partition": "0"},
        chunk_size=64 * 1024,  # the SSTs span several blobs
        checksum_cache=cache,
    )
    assert set(first.stats.uploaded) == set(os.listdir(cp1))
    assert first.stats.blobs_uploaded > first.stats.files_uploaded
    post_commit_cleanup(blob_store, first.index_name, first.index)
    expected_v1 = dict(rocks.expected)

    # Restore v1 on a "new host": byte-identical, and RocksDB opens it with v1's keys.
    restored = tmp_path / "restored"
    restore_directory(
        blob_store, read_snapshot_index(blob_store, first.index_name), restored, checksum_cache=None
    )
    assert read_tree(restored) == read_tree(cp1)
    assert opened_copy(restored, tmp_path) == expected_v1

    # Incremental backup: exactly the new SSTs and the mutable files are uploaded.
    rocks.write(500)
    cp2 = rocks.checkpoint("cp2")
    second = backup_directory(
        blob_store,
        cp2,
        index_name="state/0/0/2_bbbbbbbb.snapshot",
        blob_prefix="blobs/0/0/",
        previous=read_snapshot_index(blob_store, first.index_name),
        previous_name=first.index_name,
        checkpoint_id="2_bbbbbbbb",
        lineage=["aaaaaaaa"],
        chunk_size=64 * 1024,
        checksum_cache=cache,
    )
    v1_files = set(os.listdir(cp1))
    new_ssts = {n for n in os.listdir(cp2) if is_immutable(n)} - v1_files
    mutable = {n for n in os.listdir(cp2) if not is_immutable(n)}
    assert new_ssts, "the second flush must have produced a new SST"
    assert set(second.stats.uploaded) == new_ssts | mutable
    assert second.stats.files_retained == len({n for n in os.listdir(cp2) if is_immutable(n)} & v1_files)
    assert second.index.lineage == ("aaaaaaaa",)
    assert second.index.prev_snapshot_index == first.index_name
    post_commit_cleanup(blob_store, second.index_name, second.index)
    assert set(blob_store.list()) == referenced_objects(second.index_name, second.index)
    assert not any(blob_store.has_ttl(n) for n in blob_store.list())

    # Incremental restore over v1: only new SSTs and mutable files whose content changed move.
    v1_tree = read_tree(cp1)
    stats = restore_directory(blob_store, second.index, restored, checksum_cache=None)
    assert read_tree(restored) == read_tree(cp2)
    changed = new_ssts | {n for n in mutable if n not in v1_tree or (cp2 / n).read_bytes() != v1_tree[n][1]}
    assert stats.files_downloaded == len(changed)
    assert stats.bytes_downloaded == sum((cp2 / n).stat().st_size for n in changed)
    assert stats.files_reused == len(os.listdir(cp2)) - len(changed)
    assert opened_copy(restored, tmp_path) == rocks.expected
    assert len(expected_v1) < len(rocks.expected)

    # And from scratch on another host.
    fresh = tmp_path / "fresh"
    restore_directory(blob_store, read_snapshot_index(blob_store, second.index_name), fresh)
    assert read_tree(fresh) == read_tree(cp2)
