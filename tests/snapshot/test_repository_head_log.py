"""The bounded head log of backup repositories: each head declares a horizon, the heads below it are
pruned once the backup's cleanup is done, and readers tell a pruned prefix from a hole."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from snapshot_helpers import HookedStore, read_tree, write_tree

from blobstate.blobstore import BlobStore, BlobStoreError
from blobstate.snapshot import (
    BackupConflictError,
    NoSnapshotError,
    backup_to_repository,
    gc_repository,
    read_snapshot,
    verify_repository,
)
from blobstate.snapshot.heads import (
    HEAD_FORMAT_VERSION,
    HeadFormatError,
    HeadLog,
    HeadLogError,
    HeadRecord,
    head_name,
    parse_head,
)
from blobstate.snapshot.repository import (
    BLOB_PREFIX,
    GUARD_INDEX,
    REPOSITORY_MARKER,
    RepositoryBackup,
    restore_repository,
    root_indexes,
)

UID = "a" * 32
LATER = time.time() + 365 * 24 * 3600  # every pending TTL has passed


def backup(store: BlobStore, src: Path) -> RepositoryBackup:
    return backup_to_repository(store, src, checksum_cache=None)


def change(src: Path, n: int) -> None:
    """Backup ``n``'s source: one file rewritten, one added and the one before it removed."""
    (src / "CURRENT").write_bytes(b"MANIFEST-%d\n" % n)
    (src / f"{n}.sst").write_bytes(os.urandom(200))
    if (src / f"{n - 1}.sst").exists():
        (src / f"{n - 1}.sst").unlink()


def backups(store: BlobStore, tmp_path: Path, count: int) -> tuple[Path, list[RepositoryBackup]]:
    src = write_tree(tmp_path / "src", {"base.sst": os.urandom(500)})
    done = []
    for n in range(1, count + 1):
        change(src, n)
        done.append(backup(store, src))
    return src, done


def restored(store: BlobStore, tmp_path: Path, name: str | None = None) -> dict:
    target = tmp_path / f"restored-{os.urandom(4).hex()}"
    restore_repository(store, target, name, checksum_cache=None)
    return read_tree(target)


def test_300_backups_leave_a_bounded_number_of_heads_and_objects(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    """The heads (and every other object) a repository holds do not grow with the number of backups."""
    src = write_tree(tmp_path / "src", {"base.sst": os.urandom(500)})
    most_heads = most_objects = 0
    for n in range(1, 301):
        change(src, n)
        done = backup(mem_store, src)
        assert done.warning is None and done.version == n
        most_heads = max(most_heads, len(mem_store.list("heads/")))
        most_objects = max(most_objects, len(mem_store.list()))
    assert most_heads == 2  # the newest head and the one it was made against
    # marker, guard, 2 heads, 1 index, 3 blobs (base, CURRENT, the newest SST)
    assert most_objects == len(mem_store.list()) == 8
    assert mem_store.list("heads/") == [head_name(299), head_name(300)]
    assert HeadLog(mem_store).read(300).horizon == 299
    assert restored(mem_store, tmp_path) == read_tree(src)
    result = verify_repository(mem_store, checksums=True)
    assert result.problems == [] and (result.version, result.heads, result.horizon) == (300, 2, 299)


def test_a_pruned_prefix_is_not_a_hole_but_a_missing_retained_head_is(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    src, done = backups(blob_store, tmp_path, 4)
    assert blob_store.list("heads/") == [head_name(3), head_name(4)]
    # Heads 1 and 2 are a pruned prefix: every reader works.
    assert verify_repository(blob_store).problems == []
    assert restored(blob_store, tmp_path) == read_tree(src)
    assert gc_repository(blob_store, full=True).newest == done[-1].result.index_name
    # A snapshot of a pruned head is named as superseded, not as damage; so is the one before the newest,
    # whose index the newest backup's cleanup deleted.
    for old in (done[0], done[2]):
        with pytest.raises(NoSnapshotError, match=r"no longer kept.*superseded") as error:
            read_snapshot(blob_store, old.result.index_name)
        assert done[-1].result.index_name in str(error.value)
    # A retained head missing is a hole, named by every reader.
    blob_store.delete(head_name(3))
    hole = r"hole: heads/3\.json missing from heads/3\.json to the newest heads/4\.json"
    (problem,) = verify_repository(blob_store).problems
    assert problem.object == "heads/" and "hole: heads/3.json" in problem.message
    before = blob_store.list()
    for full in (False, True):
        with pytest.raises(HeadLogError, match=hole):
            gc_repository(blob_store, full=full)
    with pytest.raises(HeadLogError, match=hole):
        restored(blob_store, tmp_path)
    with pytest.raises(HeadLogError, match=hole):
        backup(blob_store, src)
    assert blob_store.list() == before


def test_a_pruning_cut_short_is_finished_by_the_next_backup_or_gc(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    src, _ = backups(mem_store, tmp_path, 4)
    # Heads left below the horizon, as a crash part-way through pruning leaves them (oldest gone first).
    for v in (1, 2):
        mem_store.put(head_name(v), b"left behind by a crash")
    assert verify_repository(mem_store).problems == []  # below the horizon: never read
    assert gc_repository(mem_store, full=False, dry_run=True).heads_pruned == [1, 2]
    assert mem_store.list("heads/") == [head_name(v) for v in (1, 2, 3, 4)]
    assert gc_repository(mem_store, full=False).heads_pruned == [1, 2]
    assert mem_store.list("heads/") == [head_name(3), head_name(4)]

    def failing_prune(op: str, name: str) -> None:
        if op == "delete" and name.startswith("heads/"):
            raise BlobStoreError("injected failure of a head deletion")

    change(src, 5)
    done = backup(HookedStore(mem_store, failing_prune), src)
    assert done.version == 5 and "pruning of old heads" in str(done.warning)  # committed all the same
    assert done.cleanup is not None and mem_store.list("heads/") == [head_name(v) for v in (3, 4, 5)]
    change(src, 6)
    nxt = backup(mem_store, src)
    assert nxt.warning is None and nxt.heads_pruned == [3, 4]  # 3 when it finished backup 5's
    assert mem_store.list("heads/") == [head_name(5), head_name(6)]
    assert restored(mem_store, tmp_path) == read_tree(src)


def test_readers_racing_backups_that_prune_read_the_new_log(mem_store: BlobStore, tmp_path: Path) -> None:
    """A listing that misses a head pruned while it was taken (a paginated listing is not one instant),
    and a newest head pruned between the listing and its read, are the log moving, not damage."""
    src, _ = backups(mem_store, tmp_path, 3)

    class TornListing(HookedStore):
        """The first listing of heads/ sees the heads of that moment, then backups commit and prune; with
        ``torn`` the answer holds what it saw minus what was pruned meanwhile, and nothing newer."""

        def __init__(self, inner: BlobStore, meanwhile: int, torn: bool) -> None:
            super().__init__(inner, lambda op, name: None)
            self.meanwhile, self.torn = meanwhile, torn

        def _list(self, prefix):  # type: ignore[no-untyped-def]
            seen = self.inner.list(prefix)
            if prefix == "heads/" and self.meanwhile:
                for _ in range(self.meanwhile):
                    change(src, HeadLog(self.inner).latest() + 1)
                    backup(self.inner, src)
                self.meanwhile = 0
                now = set(self.inner.list(prefix))
                return [n for n in seen if n in now] if self.torn else seen
            return seen

    # A false hole below the newest; the newest listed pruned before it is read; a listing that saw no head.
    for meanwhile, torn in ((1, True), (2, False), (2, True)):
        assert verify_repository(TornListing(mem_store, meanwhile, torn)).problems == []
        if not (meanwhile == 2 and torn):  # (a read of the log alone cannot tell that listing from none)
            newest = HeadLog(TornListing(mem_store, meanwhile, torn)).read_all()[-1]
            assert newest.version == HeadLog(mem_store).latest()
        assert restored(TornListing(mem_store, meanwhile, torn), tmp_path) == read_tree(src)
        swept = gc_repository(TornListing(mem_store, meanwhile, torn), full=True)
        assert swept.version == HeadLog(mem_store).latest()


def test_a_log_of_format_1_heads_was_never_pruned_so_it_needs_every_head(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    """Format 1 heads have no horizon (1): a missing head 1 is a hole, never a pruned prefix."""
    _, done = backups(mem_store, tmp_path, 2)
    assert mem_store.list("heads/") == [head_name(1), head_name(2)]
    for d in done:  # the log as an earlier release wrote it
        head = {k: v for k, v in json.loads(mem_store.get(head_name(d.version))).items() if k != "horizon"}
        mem_store.put(head_name(d.version), json.dumps({**head, "format_version": 1}).encode())
    assert [h.horizon for h in HeadLog(mem_store).read_all()] == [1, 1]
    mem_store.delete(head_name(1))
    with pytest.raises(HeadLogError, match=r"hole: heads/1\.json missing"):
        HeadLog(mem_store).read_all()


def test_a_backup_whose_head_lands_after_its_version_was_committed_and_pruned_commits_nothing(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    """A slow backup made against backup n whose head lands only after n + 1 committed and was pruned (by
    n + 3) re-creates heads/<n+1>.json: it must not count as committed, nor run a cleanup that would
    delete blobs the newest snapshot still references."""
    src = write_tree(tmp_path / "src", {"keep.sst": os.urandom(800), "CURRENT": b"1"})
    backup(mem_store, src)  # backup 1: keep.sst's blob
    slow = tmp_path / "slow"
    shutil.copytree(src, slow)
    (slow / "keep.sst").write_bytes(os.urandom(800))  # its cleanup would delete backup 1's keep.sst blob
    others = []

    def three_backups_first(op: str, name: str) -> None:
        if op == "put_if_absent" and name == head_name(2) and not others:
            for n in (2, 3, 4):  # keep.sst unchanged: every newer snapshot references backup 1's blob
                (src / "CURRENT").write_bytes(b"%d" % n)
                others.append(backup(mem_store, src))

    pruned = r"version 2's head was pruned before this one's landed"
    with pytest.raises(BackupConflictError, match=pruned) as lost:
        backup(HookedStore(mem_store, three_backups_first), slow)
    assert [o.version for o in others] == [2, 3, 4]
    assert (lost.value.version, lost.value.winner) == (2, others[-1].result.index_name)
    assert mem_store.list("heads/") == [head_name(3), head_name(4)]  # its head was removed again
    assert verify_repository(mem_store, checksums=True).problems == []
    assert restored(mem_store, tmp_path) == read_tree(src)
    stats = gc_repository(mem_store, full=True, now=LATER)
    assert stats.pending_kept == 0 and restored(mem_store, tmp_path) == read_tree(src)


def test_a_slow_backup_that_committed_and_was_superseded_and_pruned_still_succeeds(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    """The other order: its head landed first, then newer backups finished its cleanup and pruned its
    head before it looked again. It committed: it succeeds, and its cleanup is not run a second time."""
    src = write_tree(tmp_path / "src", {"a.sst": os.urandom(800)})
    backup(mem_store, src)
    (src / "b.sst").write_bytes(os.urandom(800))
    later = tmp_path / "later"
    shutil.copytree(src, later)
    others = []

    def three_backups_after_the_head(op: str, name: str) -> None:
        # The first call after the head's creation: the check that looks at the log again.
        if op == "list" and name == "heads/" and mem_store.exists(head_name(2)) and not others:
            for n in (3, 4, 5):
                (later / f"{n}.sst").write_bytes(os.urandom(100))
                others.append(backup(mem_store, later))

    done = backup(HookedStore(mem_store, three_backups_after_the_head), src)
    assert done.version == 2 and done.warning is None and done.cleanup is None
    assert [o.version for o in others] == [3, 4, 5]
    assert mem_store.list("heads/") == [head_name(4), head_name(5)]
    assert verify_repository(mem_store, checksums=True).problems == []
    assert restored(mem_store, tmp_path) == read_tree(later)


def test_head_format_2_records_the_horizon_and_format_1_still_reads() -> None:
    index = f"5_{UID}.snapshot"
    head = HeadRecord(5, index, 10, 7, f"4_{UID}.snapshot", UID, 1_000, horizon=4)
    data = head.to_json()
    assert json.loads(data)["horizon"] == 4 and json.loads(data)["format_version"] == HEAD_FORMAT_VERSION == 2
    assert parse_head(data, head_name(5), 5) == head
    old = {k: v for k, v in json.loads(data).items() if k != "horizon"}
    assert parse_head(json.dumps({**old, "format_version": 1}).encode(), head_name(5), 5).horizon == 1
    with pytest.raises(HeadFormatError, match=r"heads/5\.json: field horizon: missing"):
        parse_head(json.dumps(old).encode(), head_name(5), 5)
    for bad in (0, 6, "4", 4.0, None):
        obj = {**json.loads(data), "horizon": bad}
        with pytest.raises(HeadFormatError, match=r"heads/5\.json: field horizon"):
            parse_head(json.dumps(obj).encode(), head_name(5), 5)


def test_a_horizon_below_the_previous_heads_is_refused(mem_store: BlobStore, tmp_path: Path) -> None:
    backups(mem_store, tmp_path, 3)
    head = json.loads(mem_store.get(head_name(3)))
    mem_store.put(head_name(3), json.dumps({**head, "horizon": 1}).encode())
    mem_store.put(head_name(1), b"{}")  # retained again by the lowered horizon, and malformed
    with pytest.raises(HeadLogError, match=r"heads/1\.json"):
        HeadLog(mem_store).read_all()
    mem_store.delete(head_name(1))
    with pytest.raises(HeadLogError, match=r"hole: heads/1\.json"):
        HeadLog(mem_store).read_all()


def test_gc_full_leaves_only_the_newest_snapshot_and_the_retained_heads(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    backups(mem_store, tmp_path, 5)
    mem_store.put(f"{BLOB_PREFIX}orphan", b"x")
    stats = gc_repository(mem_store, full=True)
    assert stats.deleted == [f"{BLOB_PREFIX}orphan"] and stats.heads_pruned == []
    newest = read_snapshot(mem_store)
    assert set(mem_store.list()) == {
        REPOSITORY_MARKER,
        GUARD_INDEX,
        head_name(4),
        head_name(5),
        *root_indexes(mem_store),
        *newest.index.present_blob_ids(),
    }
