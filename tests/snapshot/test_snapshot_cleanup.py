"""Post-commit cleanup: idempotent, crash-safe, never deleting what a snapshot needs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from snapshot_helpers import FaultyStore, read_tree, write_tree

from blobstate.blobstore import BlobStore, BlobStoreError
from blobstate.snapshot import (
    SnapshotBlobMissingError,
    backup_directory,
    post_commit_cleanup,
    referenced_objects,
    restore_directory,
)
from blobstate.snapshot.backup import BackupResult


def backup(store: BlobStore, src: Path, n: int, previous: BackupResult | None = None) -> BackupResult:
    return backup_directory(
        store,
        src,
        index_name=f"state/0/0/{n}_{n:08x}.snapshot",
        blob_prefix="blobs/0/0/",
        previous=previous.index if previous else None,
        previous_name=previous.index_name if previous else None,
        checkpoint_id=f"{n}_{n:08x}",
        checksum_cache=None,
    )


def three_generations(store: BlobStore, tmp_path: Path) -> tuple[Path, list[BackupResult]]:
    """Snapshots 1..3 of a directory that loses files and a whole subdirectory tree along the way."""
    src = write_tree(
        tmp_path / "src",
        {"1.sst": b"one", "2.sst": b"two", "MANIFEST": b"m1", "d/3.sst": b"3", "d/e/4.sst": b"4"},
        dirs=("d/e/f",),
    )
    s1 = backup(store, src, 1)
    (src / "1.sst").unlink()
    (src / "5.sst").write_bytes(b"five")
    (src / "MANIFEST").write_bytes(b"m2")
    s2 = backup(store, src, 2, s1)
    for p in ("d/3.sst", "d/e/4.sst"):
        (src / p).unlink()
    for p in ("d/e/f", "d/e", "d"):
        (src / p).rmdir()
    (src / "MANIFEST").write_bytes(b"m3")
    s3 = backup(store, src, 3, s2)
    return src, [s1, s2, s3]


def test_referenced_objects_are_the_index_and_its_blobs(mem_store: BlobStore, tmp_path: Path) -> None:
    result = backup(mem_store, write_tree(tmp_path / "s", {"a": b"a", "b/c": b"c", "e": b""}), 1)
    refs = referenced_objects(result.index_name, result.index)
    assert refs == set(mem_store.list())  # nothing else was written; the empty file has no blob
    assert len(refs) == 3


def test_cleanup_makes_snapshot_permanent_and_deletes_what_it_removed(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    _src, (s1, s2, _) = three_generations(mem_store, tmp_path)
    post_commit_cleanup(mem_store, s1.index_name, s1.index)
    stats = post_commit_cleanup(mem_store, s2.index_name, s2.index)
    refs2 = referenced_objects(s2.index_name, s2.index)
    assert stats.ttls_removed == len(refs2)
    assert not any(mem_store.has_ttl(name) for name in refs2)
    assert not mem_store.exists(s1.index_name)
    for blob in s2.index.removed_blob_ids():  # 1.sst and the old MANIFEST
        assert not mem_store.exists(blob)
    assert stats.blobs_deleted == len(s2.index.removed_blob_ids()) + 1
    restored = tmp_path / "r2"
    restore_directory(mem_store, s2.index, restored)
    assert (restored / "5.sst").read_bytes() == b"five" and (restored / "d/e/4.sst").read_bytes() == b"4"


def test_cleanup_deletes_removed_subdirectories_recursively(mem_store: BlobStore, tmp_path: Path) -> None:
    src, (s1, s2, s3) = three_generations(mem_store, tmp_path)
    for s in (s1, s2, s3):
        post_commit_cleanup(mem_store, s.index_name, s.index)
    removed = s3.index.removed_blob_ids()
    s2_files = dict(s2.index.iter_present_files())
    assert {b.blob_id for p in ("d/3.sst", "d/e/4.sst", "MANIFEST") for b in s2_files[p].blobs} == removed
    assert set(mem_store.list()) == referenced_objects(s3.index_name, s3.index)
    assert not any(mem_store.has_ttl(n) for n in mem_store.list())
    restored = tmp_path / "r"
    restore_directory(mem_store, s3.index, restored)
    assert read_tree(restored) == read_tree(src)


def test_cleanup_twice_is_a_no_op(mem_store: BlobStore, tmp_path: Path) -> None:
    _, (s1, s2, _) = three_generations(mem_store, tmp_path)
    post_commit_cleanup(mem_store, s1.index_name, s1.index)
    post_commit_cleanup(mem_store, s2.index_name, s2.index)
    snapshot = {n: mem_store.get(n) for n in mem_store.list()}
    again = post_commit_cleanup(mem_store, s2.index_name, s2.index)
    assert again.blobs_deleted == 0
    assert again.already_gone == len(s2.index.removed_blob_ids()) + 1
    assert {n: mem_store.get(n) for n in mem_store.list()} == snapshot


@pytest.mark.parametrize("crash_after", [0, 1, 2])
def test_cleanup_after_a_crash_part_way_completes(
    mem_store: BlobStore, tmp_path: Path, crash_after: int
) -> None:
    _src, (s1, s2, _) = three_generations(mem_store, tmp_path)
    post_commit_cleanup(mem_store, s1.index_name, s1.index)
    faulty = FaultyStore(mem_store, fail_delete_after=crash_after)
    with pytest.raises(BlobStoreError, match="injected failure"):
        post_commit_cleanup(faulty, s2.index_name, s2.index)
    post_commit_cleanup(mem_store, s2.index_name, s2.index)
    assert not mem_store.exists(s1.index_name)
    assert not any(mem_store.exists(b) for b in s2.index.removed_blob_ids())
    assert all(
        mem_store.exists(n) and not mem_store.has_ttl(n) for n in referenced_objects(s2.index_name, s2.index)
    )


def test_next_cleanup_finishes_an_interrupted_one(mem_store: BlobStore, tmp_path: Path) -> None:
    src, (s1, s2, s3) = three_generations(mem_store, tmp_path)
    post_commit_cleanup(mem_store, s1.index_name, s1.index)
    # s2's cleanup crashed after making s2 permanent but before deleting anything.
    with pytest.raises(BlobStoreError):
        post_commit_cleanup(FaultyStore(mem_store, fail_delete_after=0), s2.index_name, s2.index)
    post_commit_cleanup(mem_store, s3.index_name, s3.index)
    # Everything s2 should have deleted is gone too, and nothing leaked.
    assert set(mem_store.list()) == referenced_objects(s3.index_name, s3.index)
    restored = tmp_path / "r"
    restore_directory(mem_store, s3.index, restored)
    assert read_tree(restored) == read_tree(src)


def test_cleanup_never_deletes_what_the_snapshot_references(mem_store: BlobStore, tmp_path: Path) -> None:
    from dataclasses import replace

    result = backup(mem_store, write_tree(tmp_path / "s", {"a": b"a"}), 1)
    # An index naming itself as its own predecessor (a bug elsewhere) must not destroy itself.
    selfish = replace(result.index, prev_snapshot_index=result.index_name)
    post_commit_cleanup(mem_store, result.index_name, selfish)
    assert set(mem_store.list()) == referenced_objects(result.index_name, result.index)


def test_cleanup_with_a_missing_referenced_blob_fails_naming_it(mem_store: BlobStore, tmp_path: Path) -> None:
    result = backup(mem_store, write_tree(tmp_path / "s", {"a": b"a", "b": b"b"}), 1)
    blob = result.index.dir_index.files_present[1].blobs[0].blob_id
    mem_store.delete(blob)
    with pytest.raises(SnapshotBlobMissingError, match=blob):
        post_commit_cleanup(mem_store, result.index_name, result.index)


def test_uncommitted_attempt_expires_while_committed_snapshot_survives(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    _src, (s1, s2, _s3) = three_generations(mem_store, tmp_path)
    post_commit_cleanup(mem_store, s1.index_name, s1.index)
    post_commit_cleanup(mem_store, s2.index_name, s2.index)
    # s3 never commits: its own new objects expire, s2 stays complete.
    mem_store.expire(time.time() + 31 * 24 * 3600)
    assert set(mem_store.list()) == referenced_objects(s2.index_name, s2.index)


def test_cleanup_leaves_pending_objects_of_other_attempts_alone(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "s", {"a.sst": os.urandom(100)})
    s1 = backup(mem_store, src, 1)
    post_commit_cleanup(mem_store, s1.index_name, s1.index)
    (src / "b.sst").write_bytes(b"b")
    loser = backup_directory(
        mem_store,
        src,
        index_name="state/0/0/2_ffffffff.snapshot",
        blob_prefix="blobs/0/0/",
        previous=s1.index,
        previous_name=s1.index_name,
        checkpoint_id="2_ffffffff",
    )
    winner = backup(mem_store, src, 2, s1)
    post_commit_cleanup(mem_store, winner.index_name, winner.index)
    loser_only = referenced_objects(loser.index_name, loser.index) - referenced_objects(
        winner.index_name, winner.index
    )
    assert loser_only and all(mem_store.has_ttl(n) for n in loser_only)
