"""Backup repositories: fenced commits through the head log, verified reads, gc and verify, on real stores."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from snapshot_helpers import HookedStore, read_tree, write_tree

from blobstate.blobstore import BlobStore, BlobStoreError, open_blob_store
from blobstate.snapshot import (
    BackupConflictError,
    LegacyRepositoryError,
    NoSnapshotError,
    RepositoryError,
    SnapshotBlobMissingError,
    SnapshotCorruptError,
    backup_directory,
    backup_to_repository,
    gc_repository,
    is_backup_repository,
    post_commit_cleanup,
    read_snapshot,
    restore_directory,
    verify_repository,
)
from blobstate.snapshot.heads import HeadLog, HeadLogError, head_name
from blobstate.snapshot.repository import BLOB_PREFIX, REPOSITORY_MARKER, RepositoryBackup, root_indexes

LATER = time.time() + 365 * 24 * 3600  # every pending TTL has passed


def backup(store: BlobStore, src: Path) -> RepositoryBackup:
    return backup_to_repository(store, src, checksum_cache=None)


def restored(store: BlobStore, tmp_path: Path, name: str | None = None) -> dict:
    target = tmp_path / f"restored-{os.urandom(4).hex()}"
    snapshot = read_snapshot(store, name)
    restore_directory(store, snapshot.index, target, checksum_cache=None, index_name=snapshot.name)
    return read_tree(target)


def generations(store: BlobStore, tmp_path: Path, count: int = 3) -> tuple[Path, list[RepositoryBackup]]:
    """``count`` backups of a directory whose SSTs come and go."""
    src = write_tree(tmp_path / "src", {"1.sst": os.urandom(3000), "CURRENT": b"MANIFEST-1\n"})
    done = []
    for n in range(count):
        (src / f"{n + 2}.sst").write_bytes(os.urandom(2000))
        if n:
            (src / f"{n + 1}.sst").unlink()
        (src / "CURRENT").write_bytes(b"MANIFEST-%d\n" % n)
        done.append(backup(store, src))
    return src, done


class CrashAfterHead:
    """Crashes the first cleanup step after a head was written (committed, TTLs not removed yet)."""

    def __init__(self) -> None:
        self.head_written = False

    def __call__(self, op: str, name: str) -> None:
        if op == "put_if_absent" and name.startswith("heads/"):
            self.head_written = True
        elif op == "remove_ttl" and self.head_written:
            raise BlobStoreError("injected crash after the head write")


def expires(store: BlobStore) -> bool:
    """Whether ``store.expire`` deletes pending objects itself (S3 and Azure leave that to a lifecycle
    rule)."""
    return not store.url.startswith(("s3://", "az://", "abfs://", "abfss://"))


# ---------------------------------------------------------------------------------------------- commits
def test_each_backup_commits_one_head_naming_its_index_size_and_checksum(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    src, done = generations(blob_store, tmp_path)
    heads = [d.head for d in done]
    assert [h.version for h in heads] == [1, 2, 3] == [d.version for d in done]
    for head, d in zip(heads, done, strict=True):
        assert head.index == d.result.index_name
        assert head.index_size == d.result.index_size
        assert head.format_version == 2 and head.horizon == max(1, d.version - 1)
    newest = blob_store.get(heads[-1].index)
    assert (len(newest), heads[-1].index_checksum) == (heads[-1].index_size, done[-1].result.index_checksum)
    assert [h.previous for h in heads] == [None, heads[0].index, heads[1].index]
    # The third backup pruned the first head: below its horizon, the backup it was made against.
    assert [d.heads_pruned for d in done] == [[], [], [1]]
    assert HeadLog(blob_store).read_all() == heads[1:]
    assert blob_store.list("heads/") == [head_name(2), head_name(3)]
    assert root_indexes(blob_store) == [heads[-1].index]  # cleanup deleted the older ones
    assert not blob_store.has_ttl(heads[-1].index)
    assert read_snapshot(blob_store).name == heads[-1].index
    assert restored(blob_store, tmp_path) == read_tree(src)


def test_a_repository_of_an_unknown_format_is_not_written(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a"})
    backup(mem_store, src)
    assert json.loads(mem_store.get(REPOSITORY_MARKER))["format_version"] == 1
    mem_store.put(REPOSITORY_MARKER, b'{"format_version": 2}')
    before = mem_store.list()
    with pytest.raises(RepositoryError, match="repository format 2"):
        backup(mem_store, src)
    assert mem_store.list() == before


def test_is_backup_repository(tmp_path: Path) -> None:
    with open_blob_store(str(tmp_path / "repo")) as store:
        assert not is_backup_repository(store)
        backup(store, write_tree(tmp_path / "src", {"a": b"a"}))
        assert is_backup_repository(store)
    with open_blob_store(str(tmp_path / "query")) as store:
        store.put("metadata.json", b"{}")
        store.put("state/0/0/1_00000001.snapshot", b"{}")
        assert not is_backup_repository(store)


# ---------------------------------------------------------------------------------------------- finding 3
class Rendezvous:
    """Holds every writer at its head write until ``parties`` of them are there (a forced race)."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=60)

    def __call__(self, op: str, name: str) -> None:
        if op == "put_if_absent" and name.startswith("heads/"):
            self.barrier.wait()


def race(url: str, sources: list[Path], hook=None) -> list[RepositoryBackup | BaseException]:  # type: ignore[no-untyped-def]
    """Back up each source into ``url`` at once, each from its own store object (as separate hosts would)."""
    results: list[RepositoryBackup | BaseException] = [RuntimeError("not run")] * len(sources)
    start = threading.Barrier(len(sources))

    def run(i: int) -> None:
        store = open_blob_store(url)
        if hook is not None:
            store = HookedStore(store, hook)
        try:
            start.wait()
            results[i] = backup(store, sources[i])
        except BaseException as error:
            results[i] = error
        finally:
            store.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.fixture(params=["local", "s3"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A repository URL on a store several writers can share: a local directory or moto's S3."""
    if request.param == "local":
        return str(tmp_path / "repo")
    return request.getfixturevalue("s3_url")


def two_sources(tmp_path: Path, base: bytes) -> list[Path]:
    """Two directories that share ``1.sst`` and differ otherwise (each keeps or drops other files)."""
    a = write_tree(tmp_path / f"a-{os.urandom(3).hex()}", {"1.sst": base, "a.sst": os.urandom(500)})
    b = write_tree(tmp_path / f"b-{os.urandom(3).hex()}", {"1.sst": base, "b.sst": os.urandom(700)})
    return [a, b]


def test_two_backups_racing_for_one_version_one_wins_the_other_fails_clearly(
    shared_url: str, tmp_path: Path
) -> None:
    base = os.urandom(4000)
    first = write_tree(tmp_path / "first", {"1.sst": base, "2.sst": os.urandom(900), "3.sst": b"3"})
    with open_blob_store(shared_url) as store:
        backup(store, first)
    sources = two_sources(tmp_path, base)
    results = race(shared_url, sources, Rendezvous(2))
    won = [r for r in results if isinstance(r, RepositoryBackup)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1, results
    error = lost[0]
    assert isinstance(error, BackupConflictError), repr(error)
    assert error.version == 2 and error.winner == won[0].result.index_name
    assert "another backup committed version 2" in str(error) and "expire" in str(error)
    winner_source = sources[results.index(won[0])]
    with open_blob_store(shared_url) as store:
        assert HeadLog(store).versions() == [1, 2]
        assert restored(store, tmp_path) == read_tree(winner_source)
        losers = [n for n in root_indexes(store) if n != won[0].result.index_name]
        assert len(losers) == 1 and losers[0].startswith("2_")
        assert store.has_ttl(losers[0]), "the loser's index was never committed: it stays pending"
        with pytest.raises(NoSnapshotError, match="lost the race or never finished"):
            read_snapshot(store, losers[0])
        # gc (plain and full) after every TTL passed: the winner still restores exactly.
        gc_repository(store, full=False, now=LATER)
        stats = gc_repository(store, full=True, now=LATER)
        assert won[0].result.index_name not in stats.deleted
        assert restored(store, tmp_path) == read_tree(winner_source)
        if expires(store):
            assert root_indexes(store) == [won[0].result.index_name]
        # The next backup builds on the winner.
        nxt = backup(store, sources[0])
        assert nxt.version == 3 and nxt.head.previous == won[0].result.index_name
        assert restored(store, tmp_path) == read_tree(sources[0])


def test_free_running_concurrent_backups_never_break_the_repository(shared_url: str, tmp_path: Path) -> None:
    base = os.urandom(3000)
    expected: dict[int, dict] = {}
    for _ in range(4):
        sources = two_sources(tmp_path, base)
        results = race(shared_url, sources)
        for source, result in zip(sources, results, strict=True):
            if isinstance(result, RepositoryBackup):
                expected[result.version] = read_tree(source)
            else:
                assert isinstance(result, BackupConflictError), repr(result)
        assert any(isinstance(r, RepositoryBackup) for r in results)
        with open_blob_store(shared_url) as store:
            versions = HeadLog(store).versions()  # the retained ones: the newest and the one before it
            assert versions == sorted(expected)[-2:]
            assert restored(store, tmp_path) == expected[versions[-1]]
    with open_blob_store(shared_url) as store:
        gc_repository(store, full=True, now=LATER)
        assert restored(store, tmp_path) == expected[max(expected)]
        assert verify_repository(store, checksums=True).problems == []


def test_a_crash_between_the_index_upload_and_the_head_write_commits_nothing(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    src, (first,) = generations(blob_store, tmp_path, 1)
    before = read_tree(src)
    (src / "9.sst").write_bytes(os.urandom(1000))

    def crash(op: str, name: str) -> None:
        if op == "put_if_absent" and name.startswith("heads/"):
            raise BlobStoreError(f"injected crash before {name}")

    with pytest.raises(BlobStoreError, match="injected crash"):
        backup(HookedStore(blob_store, crash), src)
    crashed = [n for n in root_indexes(blob_store) if n != first.result.index_name]
    assert len(crashed) == 1 and crashed[0].startswith("2_") and blob_store.has_ttl(crashed[0])
    assert read_snapshot(blob_store).name == first.result.index_name
    assert restored(blob_store, tmp_path) == before

    retry = backup(blob_store, src)  # same version, another uid: no ambiguity, the head decides
    assert retry.version == 2 and retry.result.index_name != crashed[0]
    assert restored(blob_store, tmp_path) == read_tree(src)
    gc_repository(blob_store, full=True, now=LATER)
    assert restored(blob_store, tmp_path) == read_tree(src)
    if expires(blob_store):
        assert root_indexes(blob_store) == [retry.result.index_name]


# ---------------------------------------------------------------------------------------------- finding 1
def test_gc_full_keeps_everything_committed_snapshots_reference(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    src, done = generations(blob_store, tmp_path)
    newest = done[-1].result
    referenced = {newest.index_name} | newest.index.present_blob_ids()
    blob_store.put("blobs/orphan-permanent", b"left by a cleanup that crashed")
    blob_store.put("blobs/orphan-pending", b"an attempt in flight", ttl=3600)
    blob_store.put("99_0123456789abcdef.snapshot", b"{}", ttl=3600)  # a backup in flight

    dry = gc_repository(blob_store, full=True, dry_run=True)
    assert dry.deleted == ["blobs/orphan-permanent"] and dry.expired == []
    assert blob_store.exists("blobs/orphan-permanent")

    stats = gc_repository(blob_store, full=True)
    assert stats.newest == newest.index_name and stats.version == 3
    assert stats.deleted == ["blobs/orphan-permanent"]
    assert stats.pending_kept == 1  # the pending orphan; the index in flight is not even a candidate
    assert referenced <= set(blob_store.list())
    assert blob_store.exists("blobs/orphan-pending") and blob_store.exists("99_0123456789abcdef.snapshot")
    assert restored(blob_store, tmp_path) == read_tree(src)
    again = gc_repository(blob_store, full=True, now=LATER)
    assert again.deleted == []
    assert restored(blob_store, tmp_path) == read_tree(src)


def test_gc_finishes_the_newest_backups_cleanup_before_expiring(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    src, _ = generations(blob_store, tmp_path, 1)
    (src / "7.sst").write_bytes(os.urandom(1500))

    done = backup(HookedStore(blob_store, CrashAfterHead()), src)  # committed: a warning, not a failure
    assert done.cleanup is None and "after the head write" in str(done.warning)
    newest = read_snapshot(blob_store)
    assert newest.version == 2 and blob_store.has_ttl(newest.name)  # committed, cleanup not done
    stats = gc_repository(blob_store, full=False, now=LATER)
    assert stats.cleanup is not None and stats.cleanup.ttls_removed > 0
    assert not set(stats.expired) & ({newest.name} | newest.index.present_blob_ids())
    assert restored(blob_store, tmp_path) == read_tree(src)


def test_gc_refuses_a_head_log_with_a_hole_and_deletes_nothing(blob_store: BlobStore, tmp_path: Path) -> None:
    generations(blob_store, tmp_path)
    blob_store.put("blobs/orphan", b"x")
    blob_store.delete(head_name(2))
    before = blob_store.list()
    for full in (False, True):
        with pytest.raises(HeadLogError, match=r"hole: heads/2\.json missing"):
            gc_repository(blob_store, full=full, now=LATER)
    assert blob_store.list() == before


@pytest.mark.parametrize("damage", ["malformed", "chain"])
def test_gc_full_refuses_a_head_log_it_cannot_read_completely(
    blob_store: BlobStore, tmp_path: Path, damage: str
) -> None:
    generations(blob_store, tmp_path)  # heads 2 and 3 retained
    head = json.loads(blob_store.get(head_name(2)))
    if damage == "malformed":
        blob_store.put(head_name(2), b'{"format_version": 2, "version": 2')
    else:
        head["index"] = "2_" + "f" * 32 + ".snapshot"
        head["writer"] = "f" * 32
        blob_store.put(head_name(2), json.dumps(head).encode())
    blob_store.put("blobs/orphan", b"x")
    with pytest.raises(HeadLogError, match=r"heads/[23]\.json"):
        gc_repository(blob_store, full=True)
    assert blob_store.exists("blobs/orphan")
    gc_repository(blob_store, full=False)  # plain gc needs only the newest head
    assert restored(blob_store, tmp_path)


def test_gc_refuses_when_the_newest_index_is_missing(blob_store: BlobStore, tmp_path: Path) -> None:
    _, done = generations(blob_store, tmp_path, 2)
    blob_store.delete(done[-1].result.index_name)
    before = blob_store.list()
    for full in (False, True):
        with pytest.raises(SnapshotBlobMissingError, match=f"{done[-1].result.index_name}.*missing"):
            gc_repository(blob_store, full=full, now=LATER)
    assert blob_store.list() == before


def test_gc_full_while_a_backup_commits_deletes_nothing_the_new_snapshot_needs(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    src = write_tree(tmp_path / "src", {"1.sst": os.urandom(2000)})
    with open_blob_store(repo) as store:
        backup(store, src)
    (src / "2.sst").write_bytes(os.urandom(2000))
    (src / "1.sst").unlink()
    fired = []

    def commit_during_the_sweep(op: str, name: str) -> None:
        # Between gc's first mark and its pending checks, another process commits and cleans up.
        if op == "has_ttl" and not fired:
            fired.append(name)
            with open_blob_store(repo) as other:
                backup(other, src)

    with open_blob_store(repo) as store:
        store.put("blobs/orphan", b"x")
        stats = gc_repository(HookedStore(store, commit_during_the_sweep), full=True)
        assert fired and stats.deleted == ["blobs/orphan"]
        assert read_snapshot(store).version == 2
        assert restored(store, tmp_path) == read_tree(src)


def test_gc_full_running_all_along_never_touches_what_backups_commit(shared_url: str, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"1.sst": os.urandom(3000)})
    done = threading.Event()
    sweeps: list[int] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        with open_blob_store(shared_url) as store:
            while not done.is_set():
                try:
                    gc_repository(store, full=True)
                    sweeps.append(1)
                except BaseException as error:
                    errors.append(error)
                    return

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    try:
        with open_blob_store(shared_url) as store:
            for n in range(6):
                (src / f"{n + 2}.sst").write_bytes(os.urandom(2000))
                if n % 2:
                    (src / f"{n + 1}.sst").unlink()
                backup(store, src)
                assert restored(store, tmp_path) == read_tree(src)
    finally:
        done.set()
        sweeper.join()
    assert errors == [] and sweeps
    with open_blob_store(shared_url) as store:
        assert verify_repository(store, checksums=True).problems == []


# ---------------------------------------------------------------------------------------------- finding 8
@pytest.mark.parametrize("alteration", ["emptied file list", "one digit of an SST name"])
def test_an_altered_but_valid_index_is_detected_and_named(
    blob_store: BlobStore, tmp_path: Path, alteration: str
) -> None:
    _, done = generations(blob_store, tmp_path, 2)
    name = done[-1].result.index_name
    original = blob_store.get(name)
    raw = json.loads(original)
    if alteration == "emptied file list":
        raw["dirIndex"]["filesPresent"] = []
    else:
        entry = next(f for f in raw["dirIndex"]["filesPresent"] if f["name"].endswith(".sst"))
        entry["name"] = str((int(entry["name"][0]) + 1) % 10) + entry["name"][1:]
    altered = json.dumps(raw, separators=(",", ":")).encode()
    assert altered != original
    if alteration != "emptied file list":
        assert len(altered) == len(original)  # only the checksum can tell
    blob_store.put(name, altered)
    with pytest.raises(SnapshotCorruptError, match=f"snapshot index '{name}'.*changed or damaged"):
        read_snapshot(blob_store)
    problems = verify_repository(blob_store).problems
    assert [p.object for p in problems] == [name]
    with pytest.raises(SnapshotCorruptError):
        backup(blob_store, tmp_path / "src")


def test_verify_checks_presence_and_sizes_and_with_checksums_the_bytes(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    _, done = generations(blob_store, tmp_path, 2)
    index = done[-1].result.index
    ok = verify_repository(blob_store)
    assert ok.problems == [] and ok.version == 2 and ok.heads == 2 and ok.bytes_read == 0
    full = verify_repository(blob_store, checksums=True)
    assert full.problems == [] and full.bytes_read == index.total_size
    path, file = next((p, f) for p, f in index.iter_present_files() if p.endswith(".sst"))
    blob = file.blobs[0]
    data = blob_store.get(blob.blob_id)
    blob_store.put(blob.blob_id, bytes([data[0] ^ 1]) + data[1:])
    assert verify_repository(blob_store).problems == []  # same size: only the checksum shows it
    (problem,) = verify_repository(blob_store, checksums=True).problems
    assert problem.object == blob.blob_id and path in problem.message
    blob_store.put(blob.blob_id, data[:-1])
    (problem,) = verify_repository(blob_store).problems
    assert problem.object == blob.blob_id and "bytes" in problem.message
    blob_store.delete(blob.blob_id)
    (problem,) = verify_repository(blob_store).problems
    assert problem.object == blob.blob_id and "missing" in problem.message


def test_verify_reports_a_committed_snapshot_still_pending(mem_store: BlobStore, tmp_path: Path) -> None:
    src, _ = generations(mem_store, tmp_path, 1)

    (src / "x.sst").write_bytes(b"x")
    done = backup(HookedStore(mem_store, CrashAfterHead()), src)
    assert done.version == 2 and "blobstate gc" in str(done.warning)
    (problem,) = verify_repository(mem_store).problems
    assert "pending" in problem.message and "blobstate gc" in problem.message
    gc_repository(mem_store, full=False)
    assert verify_repository(mem_store).problems == []


# ---------------------------------------------------------------------------------------------- legacy
def legacy_repository(store: BlobStore, src: Path, versions: list[int]) -> list[str]:
    """What the old ``blobstate backup`` wrote: root indexes, ``blobs/``, no head log."""
    names, previous = [], None
    for v in versions:
        name = f"{v}_{v:032x}.snapshot"
        result = backup_directory(
            store,
            src,
            index_name=name,
            blob_prefix="blobs/",
            previous=previous.index if previous else None,
            previous_name=previous.index_name if previous else None,
            checkpoint_id=name.removesuffix(".snapshot"),
        )
        post_commit_cleanup(store, result.index_name, result.index)
        names.append(name)
        previous = result
    return names


def test_a_legacy_repository_is_read_when_unambiguous_and_never_written(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a", "CURRENT": b"c"})
    (newest,) = legacy_repository(mem_store, src, [1, 2])[1:]
    assert is_backup_repository(mem_store)
    snapshot = read_snapshot(mem_store)
    assert snapshot.name == newest and snapshot.head is None
    assert restored(mem_store, tmp_path) == read_tree(src)
    before = mem_store.list()
    with pytest.raises(LegacyRepositoryError, match="no head log"):
        backup(mem_store, src)
    for full in (False, True):
        with pytest.raises(LegacyRepositoryError, match="older blobstate"):
            gc_repository(mem_store, full=full, now=LATER)
    assert mem_store.list() == before
    assert "older blobstate" in str(verify_repository(mem_store).problems[0])


def test_a_legacy_repository_with_two_newest_indexes_is_refused(mem_store: BlobStore, tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a.sst": b"a"})
    legacy_repository(mem_store, src, [1, 2])
    other = f"2_{'e' * 32}.snapshot"
    mem_store.put(other, mem_store.get(f"2_{2:032x}.snapshot"))
    with pytest.raises(NoSnapshotError, match="several snapshot indexes at version 2"):
        read_snapshot(mem_store)


def test_an_empty_repository_and_one_whose_only_backup_never_committed(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    with pytest.raises(NoSnapshotError, match="no snapshot"):
        read_snapshot(mem_store)

    def crash(op: str, name: str) -> None:
        if op == "put_if_absent" and name.startswith("heads/"):
            raise BlobStoreError("injected")

    src = write_tree(tmp_path / "src", {"a.sst": b"a"})
    with pytest.raises(BlobStoreError):
        backup(HookedStore(mem_store, crash), src)
    with pytest.raises(NoSnapshotError, match=r"1 backup\(s\) never committed"):
        read_snapshot(mem_store)
    assert backup(mem_store, src).version == 1
    gc_repository(mem_store, full=True, now=LATER)
    assert root_indexes(mem_store) == [read_snapshot(mem_store).name]
    assert restored(mem_store, tmp_path) == read_tree(src)


# ---------------------------------------------------------------------------------------------- safety
def test_backup_refuses_a_source_that_contains_the_repository(tmp_path: Path) -> None:
    data = write_tree(tmp_path / "data", {"a.sst": b"a"})
    with open_blob_store(str(data / "repo")) as store:
        with pytest.raises(RepositoryError, match="contains the repository"):
            backup(store, data)
        assert store.list() == []


def test_gc_and_backup_refuse_a_query_checkpoint(mem_store: BlobStore, tmp_path: Path) -> None:
    mem_store.put("metadata.json", b"{}")
    with pytest.raises(RepositoryError, match="query checkpoint"):
        gc_repository(mem_store, full=True)
    with pytest.raises(RepositoryError, match="query checkpoint"):
        backup(mem_store, write_tree(tmp_path / "src", {"a": b"a"}))


# ------------------------------------------------------------------------------ readers racing a backup
def test_a_reader_racing_a_backups_cleanup_reads_the_new_snapshot(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    src = write_tree(tmp_path / "src", {"1.sst": os.urandom(500)})
    with open_blob_store(repo) as store:
        first = backup(store, src).result.index_name
    (src / "2.sst").write_bytes(os.urandom(500))

    def commit_before_the_index_is_read(op: str, name: str) -> None:
        # Between reading head 1 and its index, another backup commits and its cleanup deletes index 1.
        if op == "get" and name == first:
            with open_blob_store(repo) as other:
                backup(other, src)

    with open_blob_store(repo) as store:
        snapshot = read_snapshot(HookedStore(store, commit_before_the_index_is_read))
        assert snapshot.version == 2 and not store.exists(first)


def test_a_restore_racing_a_backups_cleanup_says_to_run_it_again(tmp_path: Path) -> None:
    from blobstate.snapshot.repository import restore_repository

    repo = str(tmp_path / "repo")
    src = write_tree(tmp_path / "src", {"1.sst": os.urandom(500)})
    with open_blob_store(repo) as store:
        backup(store, src)
    (src / "1.sst").unlink()
    (src / "2.sst").write_bytes(os.urandom(500))

    def commit_during_the_download(op: str, name: str) -> None:
        if op == "get" and name.startswith(BLOB_PREFIX) and not store.list("heads/2"):
            with open_blob_store(repo) as other:
                backup(other, src)  # its cleanup deletes the blob of 1.sst

    with open_blob_store(repo) as store:
        with pytest.raises(RepositoryError, match=r"backup 2 committed .* run the restore again"):
            restore_repository(HookedStore(store, commit_during_the_download), tmp_path / "out")
        restore_repository(store, tmp_path / "out", delete_extra=True)
        assert read_tree(tmp_path / "out") == read_tree(src)
