"""Backup and restore of directories: full and incremental, what moves, and every failure a user can hit."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from snapshot_helpers import FaultyStore, RocksFixture, read_tree, write_tree

from blobstate.blobstore import DEFAULT_PENDING_TTL_SECONDS, BlobStore, BlobStoreError
from blobstate.snapshot import (
    ChecksumCache,
    SnapshotBlobMissingError,
    SnapshotCorruptError,
    SnapshotError,
    backup_directory,
    read_snapshot_index,
    restore_directory,
)
from blobstate.snapshot.backup import chunk_ranges
from blobstate.snapshot.restore import TEMP_MARKER

PREFIX = "blobs/0/0/"


def backup(store: BlobStore, src: Path, n: int, previous=None, **kw):  # type: ignore[no-untyped-def]
    """Back up ``src`` as snapshot ``n`` on top of ``previous`` (a BackupResult or None)."""
    return backup_directory(
        store,
        src,
        index_name=f"state/0/0/{n}_{n:08x}.snapshot",
        blob_prefix=PREFIX,
        previous=previous.index if previous else None,
        previous_name=previous.index_name if previous else None,
        checkpoint_id=f"{n}_{n:08x}",
        **kw,
    )


def no_temp_files(root: Path) -> bool:
    return not any(TEMP_MARKER in name for _, _, files in os.walk(root) for name in files)


def test_first_backup_uploads_everything_pending(
    mem_store: BlobStore, tmp_path: Path, cache: ChecksumCache
) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a" * 10, "CURRENT": b"MANIFEST-1\n", "sub/b.sst": b"bb"})
    moved: list[int] = []
    result = backup(
        mem_store,
        src,
        1,
        metadata={"operator": "0", "partition": "0", "k": "v"},
        progress=moved.append,
        checksum_cache=cache,
    )
    stats = result.stats
    assert stats.uploaded == ("CURRENT", "a.sst", "sub/b.sst")
    assert (stats.files_uploaded, stats.bytes_uploaded, stats.files_retained, stats.files_removed) == (
        3,
        23,
        0,
        0,
    )
    assert sum(moved) == 23
    assert result.index.prev_snapshot_index is None
    assert result.index.metadata.operator == "0" and result.index.metadata.partition == 0
    assert result.index.metadata.properties == {"k": "v"}
    blobs = result.index.present_blob_ids()
    assert all(b.startswith(PREFIX) for b in blobs)
    assert set(mem_store.list()) == blobs | {result.index_name}
    assert all(mem_store.has_ttl(name) for name in mem_store.list())
    assert read_snapshot_index(mem_store, result.index_name) == result.index


def test_backup_records_ttl_and_nothing_survives_expiry_uncommitted(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a"})
    backup(mem_store, src, 1, ttl=60)
    assert mem_store.expire(time.time() + 30) == []
    assert len(mem_store.expire(time.time() + 61)) == 2
    assert mem_store.list() == []


def test_restore_into_empty_dir_recreates_everything(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(
        tmp_path / "src",
        {"a.sst": os.urandom(5000), "empty": b"", "d1/d2/d3/deep.sst": b"deep", "d1/x": b"x"},
        dirs=("emptydir", "d1/emptysub/emptier"),
    )
    os.chmod(src / "a.sst", 0o600)
    os.chmod(src / "d1/x", 0o755)
    result = backup(mem_store, src, 1)
    target = tmp_path / "target" / "nested"
    moved: list[int] = []
    stats = restore_directory(mem_store, result.index, target, progress=moved.append)
    assert read_tree(target) == read_tree(src)
    assert stat.S_IMODE((target / "a.sst").stat().st_mode) == 0o600
    assert (stats.files_downloaded, stats.bytes_downloaded, stats.files_reused, stats.files_deleted) == (
        4,
        5000 + 4 + 1,
        0,
        0,
    )
    assert sum(moved) == 5005
    assert no_temp_files(target)


def test_restore_over_partly_identical_dir_downloads_only_differences(
    mem_store: BlobStore, tmp_path: Path, cache: ChecksumCache
) -> None:
    files = {f"{i:06d}.sst": os.urandom(2000 + i) for i in range(6)}
    files["CURRENT"] = b"MANIFEST-000005\n"
    files["sub/OPTIONS"] = b"opts"
    src = write_tree(tmp_path / "src", files)
    result = backup(mem_store, src, 1, checksum_cache=cache)
    target = tmp_path / "target"
    restore_directory(mem_store, result.index, target, checksum_cache=cache)

    # Same name and size, different content; a file gone; extras of every kind.
    changed = target / "000001.sst"
    changed.write_bytes(bytes(len(files["000001.sst"])))
    (target / "000002.sst").unlink()
    (target / "sub/OPTIONS").write_bytes(b"longer options")  # same name, different size
    (target / "extra.sst").write_bytes(b"extra")
    write_tree(target / "extradir/inner", {"f": b"1", "g": b"2"})
    os.symlink("/etc/passwd", target / "link")
    os.symlink("/etc", target / "sub" / "dirlink")
    (target / "000003.sst").unlink()
    (target / "000003.sst").mkdir()  # a directory where the snapshot has a file
    (target / "000003.sst" / "junk").write_bytes(b"junk")
    os.chmod(target / "000004.sst", 0o600)  # only the mode differs: fixed, not downloaded
    (target / f".x{TEMP_MARKER}abc").write_bytes(b"left by a crashed restore")

    moved: list[int] = []
    stats = restore_directory(mem_store, result.index, target, progress=moved.append, checksum_cache=cache)
    assert read_tree(target) == read_tree(src)
    assert stats.files_downloaded == 4  # 000001 (changed), 000002 (gone), 000003 (was a dir), sub/OPTIONS
    assert (
        stats.bytes_downloaded
        == sum(moved)
        == (len(files["000001.sst"]) + len(files["000002.sst"]) + len(files["000003.sst"]) + 4)
    )
    assert stats.files_reused == 4  # 000000, 000004, 000005, CURRENT
    # extra.sst, extradir/inner/{f,g}, link, sub/dirlink, 000003.sst/junk, the stale temp file
    assert stats.files_deleted == 7
    assert stats.dirs_deleted == 3  # extradir, extradir/inner, 000003.sst
    assert os.path.exists("/etc/passwd")  # the symlink was removed, not followed


def test_restore_when_everything_is_present_moves_nothing(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": os.urandom(3000), "MANIFEST-1": b"m", "e": b""})
    result = backup(mem_store, src, 1)
    target = tmp_path / "t"
    restore_directory(mem_store, result.index, target)
    # A fresh cache: the decision rests on re-reading local files, not on remembered checksums.
    stats = restore_directory(mem_store, result.index, target, checksum_cache=ChecksumCache())
    assert (stats.files_downloaded, stats.bytes_downloaded, stats.files_reused, stats.files_deleted) == (
        0,
        0,
        3,
        0,
    )


def test_incremental_backup_of_plain_files(
    mem_store: BlobStore, tmp_path: Path, cache: ChecksumCache
) -> None:
    src = write_tree(
        tmp_path / "src",
        {"1.sst": b"one", "2.sst": b"two", "MANIFEST-1": b"m1", "old/3.sst": b"three", "keep/4.sst": b"four"},
    )
    first = backup(mem_store, src, 1, checksum_cache=cache)
    (src / "1.sst").unlink()
    (src / "5.sst").write_bytes(b"five")
    (src / "MANIFEST-1").write_bytes(b"m2")
    (src / "old/3.sst").unlink()
    (src / "old").rmdir()
    (src / "keep/6.sst").write_bytes(b"six")
    second = backup(mem_store, src, 2, previous=first, checksum_cache=cache)
    s = second.stats
    assert s.uploaded == ("5.sst", "MANIFEST-1", "keep/6.sst")
    assert (s.files_retained, s.files_removed, s.dirs_removed) == (
        2,
        3,
        1,
    )  # removed: 1.sst, MANIFEST-1, old/3.sst
    assert second.index.prev_snapshot_index == first.index_name
    root = second.index.dir_index
    assert sorted(f.name for f in root.files_removed) == ["1.sst", "MANIFEST-1"]
    assert [d.name for d in root.subdirs_removed] == ["old"]
    first_files = dict(first.index.iter_present_files())
    second_files = dict(second.index.iter_present_files())
    assert second_files["2.sst"] == first_files["2.sst"]
    assert second_files["keep/4.sst"] == first_files["keep/4.sst"]
    assert second.index.removed_blob_ids() == {
        b.blob_id for p in ("1.sst", "MANIFEST-1", "old/3.sst") for b in first_files[p].blobs
    }
    target = tmp_path / "t"
    restore_directory(mem_store, second.index, target)
    assert read_tree(target) == read_tree(src)


@pytest.mark.parametrize("use_cache", [True, False])
def test_same_name_same_size_changed_content_is_uploaded(
    mem_store: BlobStore, tmp_path: Path, use_cache: bool
) -> None:
    cache = ChecksumCache() if use_cache else None
    src = write_tree(tmp_path / "src", {"7.sst": b"aaaa", "CURRENT": b"M-1\n"})
    first = backup(mem_store, src, 1, checksum_cache=cache)
    st = (src / "7.sst").stat()
    (src / "7.sst").write_bytes(b"bbbb")
    os.utime(src / "7.sst", ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    second = backup(mem_store, src, 2, previous=first, checksum_cache=cache)
    assert set(second.stats.uploaded) == {"7.sst", "CURRENT"}  # CURRENT is mutable: always uploaded
    assert sorted(f.name for f in second.index.dir_index.files_removed) == ["7.sst", "CURRENT"]
    target = tmp_path / "t"
    restore_directory(mem_store, second.index, target, checksum_cache=cache)
    assert (target / "7.sst").read_bytes() == b"bbbb"


def test_multi_chunk_file_round_trip(mem_store: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(3500)
    src = write_tree(tmp_path / "src", {"big.sst": data, "small": b"s"})
    result = backup(mem_store, src, 1, chunk_size=1000)
    f = dict(result.index.iter_present_files())["big.sst"]
    assert [(b.offset, n) for b, n in f.chunks()] == [(0, 1000), (1000, 1000), (2000, 1000), (3000, 500)]
    assert [mem_store.get(b.blob_id) for b in f.blobs] == [
        data[0:1000],
        data[1000:2000],
        data[2000:3000],
        data[3000:],
    ]
    assert result.stats.blobs_uploaded == 5
    target = tmp_path / "t"
    write_tree(target, {"big.sst": os.urandom(3500)})  # same size, different content: replaced
    stats = restore_directory(mem_store, result.index, target)
    assert (target / "big.sst").read_bytes() == data
    assert stats.files_downloaded == 2 and no_temp_files(target)


def test_symlinks_and_special_files_are_not_backed_up(mem_store: BlobStore, tmp_path: Path) -> None:
    outside = write_tree(tmp_path / "outside", {"secret": b"do not upload"})
    src = write_tree(tmp_path / "src", {"a.sst": b"a"})
    os.symlink(outside / "secret", src / "file_link")
    os.symlink(outside, src / "dir_link")
    os.symlink("dangling-target", src / "dangling")
    os.mkfifo(src / "fifo")
    result = backup(mem_store, src, 1)
    assert result.stats.skipped == ("dangling", "dir_link", "fifo", "file_link")
    assert [p for p, _ in result.index.iter_present_files()] == ["a.sst"]
    assert all(mem_store.get(b) != b"do not upload" for b in result.index.present_blob_ids())


def test_backup_refuses_a_name_an_index_cannot_hold(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"bad\\name": b"x"})
    with pytest.raises(SnapshotError, match="backslash"):
        backup(mem_store, src, 1)
    assert mem_store.list() == []


def corrupt_blob(store: BlobStore, blob_id: str, data: bytes) -> None:
    store.put(blob_id, data)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "longer"])
def test_corrupt_blob_fails_naming_it_and_leaves_no_partial_file(
    mem_store: BlobStore, tmp_path: Path, damage: str
) -> None:
    good = os.urandom(4000)
    src = write_tree(tmp_path / "src", {"a.sst": good, "b.sst": b"bbb"})
    result = backup(mem_store, src, 1)
    (blob,) = dict(result.index.iter_present_files())["a.sst"].blobs
    bad = {"flipped": bytes([good[0] ^ 1]) + good[1:], "truncated": good[:-10], "longer": good + b"!"}[damage]
    corrupt_blob(mem_store, blob.blob_id, bad)
    target = tmp_path / "t"
    with pytest.raises(SnapshotCorruptError) as info:
        restore_directory(mem_store, result.index, target)
    assert info.value.blob_id == blob.blob_id and info.value.file == "a.sst"
    assert blob.blob_id in str(info.value) and "a.sst" in str(info.value)
    assert not (target / "a.sst").exists()
    assert no_temp_files(target)


def test_corrupt_chunk_of_multi_chunk_file_is_named(mem_store: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(2500)
    src = write_tree(tmp_path / "src", {"big.sst": data})
    result = backup(mem_store, src, 1, chunk_size=1000)
    blobs = dict(result.index.iter_present_files())["big.sst"].blobs
    corrupt_blob(mem_store, blobs[1].blob_id, b"\0" * 1000)
    target = write_tree(tmp_path / "t", {"big.sst": b"previous content kept"})
    with pytest.raises(SnapshotCorruptError) as info:
        restore_directory(mem_store, result.index, target)
    assert info.value.blob_id == blobs[1].blob_id
    assert (target / "big.sst").read_bytes() == b"previous content kept"
    assert no_temp_files(target)


def test_without_checksum_verification_truncation_is_still_caught(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"0123456789"})
    result = backup(mem_store, src, 1)
    (blob,) = result.index.dir_index.files_present[0].blobs
    corrupt_blob(mem_store, blob.blob_id, b"01234")
    with pytest.raises(SnapshotCorruptError, match="5 bytes instead of 10"):
        restore_directory(mem_store, result.index, tmp_path / "t", verify_checksums=False)


def test_missing_blob_fails_naming_it(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a", "sub/b.sst": b"b" * 3000})
    result = backup(mem_store, src, 1, chunk_size=1000)
    blob = dict(result.index.iter_present_files())["sub/b.sst"].blobs[2]
    mem_store.delete(blob.blob_id)
    target = tmp_path / "t"
    with pytest.raises(SnapshotBlobMissingError) as info:
        restore_directory(mem_store, result.index, target)
    assert info.value.blob_id == blob.blob_id and info.value.file == "sub/b.sst"
    assert blob.blob_id in str(info.value) and result.index.checkpoint_id in str(info.value)
    assert not (target / "sub" / "b.sst").exists()
    assert no_temp_files(target)


def test_restore_refuses_a_symlinked_target(mem_store: BlobStore, tmp_path: Path) -> None:
    result = backup(mem_store, write_tree(tmp_path / "src", {"a": b"a"}), 1)
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(SnapshotError, match="symlink"):
        restore_directory(mem_store, result.index, tmp_path / "link")


@pytest.mark.parametrize("fail_after", [0, 2, 5])
def test_upload_failing_part_way_leaves_only_pending_objects(
    mem_store: BlobStore, rocks: RocksFixture, tmp_path: Path, fail_after: int
) -> None:
    rocks.write(300)
    committed = backup(mem_store, rocks.checkpoint("cp1"), 1)
    for name in mem_store.list():
        mem_store.remove_ttl(name)  # as post-commit cleanup would
    before = {name: mem_store.get(name) for name in mem_store.list()}

    rocks.write(300)
    rocks.write(300)
    faulty = FaultyStore(mem_store, fail_put_after=fail_after)
    with pytest.raises(BlobStoreError, match="injected failure"):
        backup(faulty, rocks.checkpoint("cp2"), 2, previous=committed, ttl=100)
    new = set(mem_store.list()) - set(before)
    assert not any(name.endswith(".snapshot") for name in new)
    assert len(new) == fail_after
    assert all(mem_store.has_ttl(name) for name in new)
    assert {name: mem_store.get(name) for name in before} == before
    assert not any(mem_store.has_ttl(name) for name in before)

    assert sorted(mem_store.expire(time.time() + 101)) == sorted(new)
    assert {name: mem_store.get(name) for name in mem_store.list()} == before
    restored = tmp_path / "restored"
    restore_directory(mem_store, committed.index, restored)
    assert read_tree(restored) == read_tree(tmp_path / "rocks" / "cp1")


def test_index_is_never_overwritten(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a": b"a"})
    first = backup(mem_store, src, 1)
    (src / "a").write_bytes(b"b")
    with pytest.raises(SnapshotError, match="already exists"):
        backup(mem_store, src, 1)
    assert read_snapshot_index(mem_store, first.index_name) == first.index


def test_default_ttl_is_the_pending_ttl(mem_store: BlobStore, tmp_path: Path) -> None:
    backup(mem_store, write_tree(tmp_path / "src", {"a": b"a"}), 1)
    assert mem_store.expire(time.time() + DEFAULT_PENDING_TTL_SECONDS - 60) == []
    assert len(mem_store.expire(time.time() + DEFAULT_PENDING_TTL_SECONDS + 1)) == 2


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, []),
        (1, [(0, 1)]),
        (1000, [(0, 1000)]),
        (1249, [(0, 1249)]),  # a tail under a quarter chunk joins the previous blob
        (1250, [(0, 1000), (1000, 250)]),
        (3100, [(0, 1000), (1000, 1000), (2000, 1100)]),
    ],
)
def test_chunk_ranges(size: int, expected: list[tuple[int, int]]) -> None:
    assert chunk_ranges(size, 1000) == expected


def test_sst_slightly_over_the_chunk_size_is_one_blob(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"000010.sst": os.urandom(1100)})
    result = backup(mem_store, src, 1, chunk_size=1000)
    assert result.stats.blobs_uploaded == 1


def test_backup_refuses_a_file_name_that_is_not_text(mem_store: BlobStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(os.path.join(os.fsencode(src), b"bad-\xff.sst"), "wb") as f:
        f.write(b"x")
    with pytest.raises(SnapshotError, match="not valid Unicode"):
        backup(mem_store, src, 1)


def test_permission_change_of_a_reused_file_is_recorded(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"1.sst": b"one"})
    first = backup(mem_store, src, 1)
    os.chmod(src / "1.sst", 0o600)
    second = backup(mem_store, src, 2, previous=first)
    assert second.stats.uploaded == ()
    (entry,) = second.index.dir_index.files_present
    assert entry.metadata.mode == 0o600 and entry.blobs == first.index.dir_index.files_present[0].blobs
    restore_directory(mem_store, second.index, tmp_path / "t")
    assert stat.S_IMODE((tmp_path / "t" / "1.sst").stat().st_mode) == 0o600


def test_hostile_index_is_refused_before_anything_is_written(mem_store: BlobStore, tmp_path: Path) -> None:
    import json

    from blobstate.snapshot import DirIndex, SnapshotFormatError

    src = write_tree(tmp_path / "src", {"a.sst": b"a"})
    result = backup(mem_store, src, 1)
    raw = json.loads(result.index.to_json())
    raw["dirIndex"]["filesPresent"][0]["name"] = "../../escaped.sst"
    mem_store.put("state/0/0/9_hostile.snapshot", json.dumps(raw).encode())
    with pytest.raises(SnapshotFormatError, match=r"9_hostile.*'\.\./\.\./escaped\.sst'"):
        read_snapshot_index(mem_store, "state/0/0/9_hostile.snapshot")

    # An index built in code is validated too.
    from dataclasses import replace

    entry = replace(result.index.dir_index.files_present[0], name="..")
    bad = replace(result.index, dir_index=DirIndex("", files_present=(entry,)))
    target = tmp_path / "deep" / "target"
    with pytest.raises(SnapshotFormatError, match="unsafe name"):
        restore_directory(mem_store, bad, target)
    assert not (tmp_path / "deep").exists()
