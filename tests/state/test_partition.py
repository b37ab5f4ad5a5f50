"""The partition API: open at a committed checkpoint, write, commit, abort; markers, locks, snapshots."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lineage_harness import (
    CFS,
    OP,
    QUERY_ID,
    Driver,
    FaultyStore,
    dump,
    new_memory_store,
    on_tmpfs,
    open_p,
)

from blobstate.blobstore import open_blob_store
from blobstate.layout import CHECKPOINT_ID_FILE, LocalPartitionLayout, delta_name, snapshot_name
from blobstate.lineage.commitlog import CommitLog
from blobstate.lineage.delta import decode_delta
from blobstate.snapshot import read_snapshot_index
from blobstate.state.errors import PartitionClosedError
from blobstate.state.history import CommitCache, PartitionHistory
from blobstate.state.localdirs import list_checkpoints, read_checkpoint_id
from blobstate.state.locking import PartitionLockedError


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """Local directories on tmpfs when there is one: fsync and RocksDB opens are much cheaper there."""
    with on_tmpfs(tmp_path) as path:
        yield path


def layout(local: Path, partition: int = 0) -> LocalPartitionLayout:
    return LocalPartitionLayout(local, QUERY_ID, OP, partition)


def commit_values(store, local: Path, committed, values: dict[bytes, bytes], *, publish=True, **options):
    """Open at ``committed``, put ``values`` into column family "a", commit the partition and (with
    ``publish``) the version in the commit log; returns the CommitResult."""
    with open_p(store, local, committed, **options) as state:
        for k, v in values.items():
            state.store.put("a", k, v)
        result = state.commit()
    if publish:
        Driver(store).commit({0: result}, result.checkpoint_id.version)
    return result


def test_first_commit_writes_a_pending_delta_a_clean_marker_and_no_local_checkpoint(tmp_path: Path) -> None:
    store = new_memory_store()
    with open_p(store, tmp_path, None) as state:
        assert state.version == 0 and state.checkpoint_id is None and state.load_rule == "empty"
        state.store.put("a", b"k1", b"v1")
        state.store.put("b", b"k2", b"v2")
        result = state.commit()
    cid = result.checkpoint_id
    assert cid.version == 1
    assert result.delta_name == delta_name(OP, 0, cid)
    assert result.lineage == ()
    assert result.changelog_bytes == len(b"ak1v1bk2v2")
    assert result.objects_written == (result.delta_name,)
    assert store.has_ttl(result.delta_name), "an uncommitted delta must be pending"
    delta = decode_delta(store.get(result.delta_name), name=result.delta_name)
    assert delta.lineage == []
    assert sorted((r[1], r[2], r[3]) for r in delta.records) == [("a", b"k1", b"v1"), ("b", b"k2", b"v2")]
    lay = layout(tmp_path)
    assert read_checkpoint_id(lay.working) == cid
    assert list_checkpoints(lay.checkpoints) == []  # no snapshot is due: no local checkpoint either


def test_a_commit_whose_snapshot_is_due_takes_a_local_checkpoint(tmp_path: Path) -> None:
    store = new_memory_store()
    committed = None
    results = []
    for i in range(5):
        results.append(commit_values(store, tmp_path, committed, {b"k": b"%d" % i}, snapshot_every=2))
        committed = results[-1].checkpoint_id
    assert [r.snapshot_name is not None for r in results] == [False, True, False, True, False]
    kept = list_checkpoints(layout(tmp_path).checkpoints)
    assert kept == [results[1].checkpoint_id, results[3].checkpoint_id]


def test_rule_1_a_clean_working_store_at_the_committed_id_is_used_without_io(tmp_path: Path) -> None:
    inner = new_memory_store()
    result = commit_values(inner, tmp_path, None, {b"k": b"v"})
    store = FaultyStore(inner)
    with open_p(store, tmp_path, result.checkpoint_id) as state:
        assert state.load_rule == "working"
        assert store.calls == [], "rule 1 must not touch the blob store"
        assert state.store.get("a", b"k") == b"v"
        # opening marks the working store dirty before any write
        assert not (layout(tmp_path).working / CHECKPOINT_ID_FILE).exists()


def test_a_commit_carries_the_lineage_back_to_the_presumed_snapshot(tmp_path: Path) -> None:
    store = new_memory_store()
    committed = None
    results = []
    for i in range(5):
        results.append(commit_values(store, tmp_path, committed, {b"k%d" % i: b"v"}, snapshot_every=3))
        committed = results[-1].checkpoint_id
    u = [r.checkpoint_id.uid for r in results]
    assert [list(r.lineage) for r in results] == [[], [u[0]], [u[1], u[0]], [u[2]], [u[3], u[2]]]
    assert [r.snapshot_name is not None for r in results] == [False, False, True, False, False]
    assert store.exists(snapshot_name(OP, 0, results[2].checkpoint_id))


def test_rule_2_a_dirty_working_store_is_rebuilt_from_the_local_checkpoint(tmp_path: Path) -> None:
    inner = new_memory_store()
    result = commit_values(inner, tmp_path, None, {b"k": b"v"}, snapshot_every=1)
    with open_p(inner, tmp_path, result.checkpoint_id) as state:
        state.store.put("a", b"k", b"dirty")
        state.abort()  # the working store now holds an uncommitted write and is dirty
    store = FaultyStore(inner)
    with open_p(store, tmp_path, result.checkpoint_id) as state:
        assert state.load_rule == "local-checkpoint"
        assert state.store.get("a", b"k") == b"v"
    assert store.calls == []


@pytest.mark.parametrize("dies", ["closing", "committed"])
def test_a_worker_killed_in_or_after_a_commit_without_a_local_checkpoint_loads_the_committed_version_exactly(
    tmp_path: Path, dies: str
) -> None:
    """A commit with no snapshot due takes no local checkpoint. A worker killed as the commit closes the
    store (``closing``: flushed, OPTIONS files removed, not marked clean) or right after the commit
    (``committed``: the working store clean at a version the driver never committed) leaves nothing the
    next task may start from: it loads the committed version from the deltas of the lineage, exactly
    (checked against a dict of every write), and commits on from there."""
    import shutil
    import subprocess
    import sys
    import textwrap

    store = open_blob_store(str(tmp_path / "blobs"))
    driver = Driver(store)
    expected: dict = {}
    committed = None
    for i in range(3):
        values = {b"k": b"v%d" % i, b"gone": b"x", b"k%d" % i: b"%d" % i}
        expected.update({("a", k): v for k, v in values.items()})
        committed = commit_values(store, tmp_path, committed, values).checkpoint_id
    assert committed is not None and list_checkpoints(layout(tmp_path).checkpoints) == []
    script = textwrap.dedent(
        f"""
        import os
        from blobstate.blobstore import open_blob_store
        from blobstate.ids import CheckpointId
        from blobstate.state import store as store_module
        from blobstate.state.partition import open_partition

        drop = store_module._drop_options_files

        def drop_then_die(path):
            drop(path)
            os._exit(9)

        if {dies!r} == "closing":
            store_module._drop_options_files = drop_then_die
        committed = CheckpointId.parse({committed.name!r})
        blobs = open_blob_store({str(tmp_path / "blobs")!r})
        state = open_partition(blobs, {str(tmp_path)!r}, {QUERY_ID!r}, {OP!r}, 0, committed)
        state.store.put("a", b"k", b"uncommitted")
        state.store.delete("a", b"gone")
        state.commit()
        os._exit(9)
        """
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 9
    lay = layout(tmp_path)
    if dies == "closing":
        assert read_checkpoint_id(lay.working) is None
        assert not any(f.name.startswith("OPTIONS-") for f in lay.working.iterdir())
    else:
        uncommitted = read_checkpoint_id(lay.working)
        assert uncommitted is not None and uncommitted.version == committed.version + 1
    assert list_checkpoints(lay.checkpoints) == []
    with open_p(store, tmp_path, committed) as state:
        report = state.load_report
        assert (report.rule, report.base_kind, report.deltas_replayed) == ("remote", "empty", 3)
        assert dump(state) == expected
        state.store.put("a", b"k", b"v3")
        second = state.commit()
    driver.commit({0: second}, committed.version + 1)
    expected[("a", b"k")] = b"v3"
    with open_p(store, tmp_path, second.checkpoint_id) as state:
        assert state.load_rule == "working"
        assert dump(state) == expected
    shutil.rmtree(lay.root)
    with open_p(store, tmp_path, second.checkpoint_id) as state:  # from the blob store alone
        assert state.load_rule == "remote"
        assert dump(state) == expected


def test_rule_2_from_a_standby_replica(tmp_path: Path) -> None:
    import shutil

    inner = new_memory_store()
    result = commit_values(inner, tmp_path / "active", None, {b"k": b"v"}, snapshot_every=1)
    lay = layout(tmp_path / "active")
    standby = layout(tmp_path / "other").standby
    shutil.copytree(lay.checkpoint(result.checkpoint_id), standby)
    (standby / CHECKPOINT_ID_FILE).write_text(result.checkpoint_id.name)
    store = FaultyStore(inner)
    with open_p(store, tmp_path / "other", result.checkpoint_id) as state:
        assert state.load_rule == "standby"
        assert state.store.get("a", b"k") == b"v"
    assert store.calls == []
    # the replica itself was not modified by opening and writing the working store
    assert read_checkpoint_id(standby) == result.checkpoint_id


def test_rule_3_a_fresh_local_dir_restores_from_the_blob_store(blob_store, tmp_path: Path) -> None:
    committed = None
    expected: dict = {}
    for i in range(4):
        values = {b"k%d" % j: b"v%d-%d" % (i, j) for j in range(i, i + 3)}
        expected.update({("a", k): v for k, v in values.items()})
        committed = commit_values(
            blob_store, tmp_path / "a", committed, values, snapshot_every=2
        ).checkpoint_id
    with open_p(blob_store, tmp_path / "b", committed, snapshot_every=2) as state:
        assert state.load_rule == "remote"
        assert dump(state) == expected
        assert state.load_report.base_kind == "snapshot"
        assert state.load_report.deltas_replayed == 0  # version 4 has its own snapshot


def test_version_0_is_empty_whatever_the_working_directory_holds(tmp_path: Path) -> None:
    store = new_memory_store()
    commit_values(store, tmp_path, None, {b"k": b"v"})
    with open_p(store, tmp_path, None) as state:
        assert dump(state) == {}


def test_abort_leaves_the_working_store_dirty_and_writes_nothing(tmp_path: Path) -> None:
    inner = new_memory_store()
    store = FaultyStore(inner)
    with open_p(store, tmp_path, None) as state:
        state.store.put("a", b"k", b"v")
        state.abort()
        with pytest.raises(PartitionClosedError):
            state.commit()
    assert not [c for c in store.calls if c[0] in ("put", "put_if_absent")]
    assert read_checkpoint_id(layout(tmp_path).working) is None


def test_leaving_the_context_without_commit_aborts(tmp_path: Path) -> None:
    store = new_memory_store()
    with pytest.raises(RuntimeError, match="processor failed"), open_p(store, tmp_path, None) as state:
        state.store.put("a", b"k", b"v")
        raise RuntimeError("processor failed")
    assert store.list("state/") == []
    assert read_checkpoint_id(layout(tmp_path).working) is None


def test_a_partition_is_locked_while_open(tmp_path: Path) -> None:
    store = new_memory_store()
    first = open_p(store, tmp_path, None)
    try:
        with pytest.raises(PartitionLockedError, match="LOCK"):
            open_p(store, tmp_path, None, lock_timeout=0.2)
        # another partition is independent
        open_p(store, tmp_path, None, partition=1).close()
    finally:
        first.close()
    open_p(store, tmp_path, None).close()


def test_a_partition_is_locked_against_another_process(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    store = new_memory_store()
    script = textwrap.dedent(
        f"""
        import sys, time
        from blobstate.state.locking import PartitionLock
        from blobstate.layout import LocalPartitionLayout
        lay = LocalPartitionLayout({str(tmp_path)!r}, {QUERY_ID!r}, {OP!r}, 0)
        lock = PartitionLock(lay.lock_file).acquire(timeout=5)
        print("locked", flush=True)
        sys.stdin.readline()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with pytest.raises(PartitionLockedError):
            open_p(store, tmp_path, None, lock_timeout=0.3)
    finally:
        child.communicate("\n", timeout=10)
    open_p(store, tmp_path, None).close()


def test_snapshots_are_incremental_and_record_their_lineage(tmp_path: Path) -> None:
    store = new_memory_store()
    committed = None
    results = []
    for i in range(4):
        values = {b"key-%04d-%d" % (j, i): b"x" * 200 for j in range(300)}
        results.append(commit_values(store, tmp_path, committed, values, snapshot_every=2))
        committed = results[-1].checkpoint_id
    snaps = [r for r in results if r.snapshot_name]
    assert [r.checkpoint_id.version for r in snaps] == [2, 4]
    first = read_snapshot_index(store, snaps[0].snapshot_name)
    second = read_snapshot_index(store, snaps[1].snapshot_name)
    assert second.prev_snapshot_index == snaps[0].snapshot_name
    expected_lineage = [results[2].checkpoint_id.uid, results[1].checkpoint_id.uid]
    assert list(second.lineage) == list(snaps[1].lineage) == expected_lineage
    assert second.metadata.properties["lineage"] == ",".join(expected_lineage)
    assert set(snaps[1].objects_written) >= {snaps[1].snapshot_name, snaps[1].delta_name}
    assert set(snaps[1].objects_written) - {snaps[1].delta_name} <= {snaps[1].snapshot_name} | (
        second.present_blob_ids() - first.present_blob_ids()
    ), "only new blobs are reported as written"


def test_an_unchanged_sst_is_reused_by_the_next_snapshot_not_uploaded_again(tmp_path: Path) -> None:
    store = new_memory_store()
    values = {b"k%05d" % i: os.urandom(100) for i in range(2000)}
    big = commit_values(store, tmp_path, None, values, snapshot_every=1)
    # no writes: the next checkpoint holds the same SST file (no flush, no compaction in between)
    same = commit_values(store, tmp_path, big.checkpoint_id, {}, snapshot_every=1)
    first = read_snapshot_index(store, big.snapshot_name)
    second = read_snapshot_index(store, same.snapshot_name)
    ssts = {f.blobs[0].blob_id for name, f in second.iter_present_files() if name.endswith(".sst")}
    assert ssts and ssts <= first.present_blob_ids()
    assert not (ssts & set(same.objects_written))
    assert same.bytes_uploaded < big.bytes_uploaded / 4


def test_a_snapshot_is_due_when_the_deltas_exceed_the_byte_size(tmp_path: Path) -> None:
    store = new_memory_store()
    options = {"snapshot_every": 100, "snapshot_delta_bytes": 10_000}
    small = commit_values(store, tmp_path, None, {b"k": b"v"}, **options)
    assert small.snapshot_name is None

    big = commit_values(
        store,
        tmp_path,
        small.checkpoint_id,
        {b"k%d" % i: os.urandom(100) for i in range(200)},
        **options,
    )
    assert big.snapshot_name is not None


def test_only_the_newest_local_checkpoints_are_kept(tmp_path: Path) -> None:
    store = new_memory_store()
    committed = None
    for i in range(6):
        committed = commit_values(
            store, tmp_path, committed, {b"k": b"%d" % i}, local_checkpoints_to_keep=2, snapshot_every=1
        ).checkpoint_id
    kept = list_checkpoints(layout(tmp_path).checkpoints)
    assert [c.version for c in kept] == [5, 6]


def test_a_failed_snapshot_upload_is_reported_not_fatal(tmp_path: Path) -> None:
    inner = new_memory_store()
    store = FaultyStore(inner)
    store.fail_when = lambda op, name: op == "put_if_absent" and name.endswith(".snapshot")
    result = commit_values(store, tmp_path, None, {b"k": b"v"}, snapshot_every=1)
    assert result.snapshot_name is None
    assert result.snapshot_error and "injected failure" in result.snapshot_error
    assert not inner.exists(snapshot_name(OP, 0, result.checkpoint_id))
    # the next version presumes the snapshot: its lineage stops at version 1
    store.fail_when = None
    nxt = commit_values(store, tmp_path, result.checkpoint_id, {b"k2": b"v2"}, snapshot_every=5)
    assert list(nxt.lineage) == [result.checkpoint_id.uid]
    with open_p(inner, tmp_path / "fresh", nxt.checkpoint_id) as state:
        assert dump(state) == {("a", b"k"): b"v", ("a", b"k2"): b"v2"}
        assert state.load_report.missing_snapshots == [result.checkpoint_id.name]


def test_commit_result_counts_what_was_uploaded(tmp_path: Path) -> None:
    store = new_memory_store()
    result = commit_values(
        store, tmp_path, None, {b"k%d" % i: b"v" * 50 for i in range(100)}, snapshot_every=1
    )
    sizes = sum(len(store.get(n)) for n in result.objects_written)
    assert result.snapshot_name in result.objects_written
    # bytes_uploaded counts the files uploaded plus the delta (the index itself is small)
    assert 0 < result.bytes_uploaded <= sizes


def test_lineage_info_survives_a_restart_on_the_same_directory(tmp_path: Path) -> None:
    store = new_memory_store()
    r1 = commit_values(store, tmp_path, None, {b"a": b"1"}, snapshot_every=10)
    r2 = commit_values(store, tmp_path, r1.checkpoint_id, {b"b": b"2"}, snapshot_every=10)
    r3 = commit_values(store, tmp_path, r2.checkpoint_id, {b"c": b"3"}, snapshot_every=10)
    assert list(r3.lineage) == [r2.checkpoint_id.uid, r1.checkpoint_id.uid]


def test_partitions_and_column_families_are_independent(tmp_path: Path) -> None:
    store = new_memory_store()
    a = commit_values(store, tmp_path, None, {b"k": b"p0"}, publish=False)
    with open_p(store, tmp_path, None, partition=1) as state:
        state.store.put("b", b"k", b"p1")
        b = state.commit()
    Driver(store, num_partitions=2).commit({0: a, 1: b}, 1)
    with open_p(store, tmp_path / "x", a.checkpoint_id) as state:
        assert dump(state) == {("a", b"k"): b"p0"}
    with open_p(store, tmp_path / "x", b.checkpoint_id, partition=1) as state:
        assert dump(state) == {("b", b"k"): b"p1"}
    assert set(CFS) == {"a", "b"}


def test_works_on_the_local_directory_store(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "blobs"))
    driver = Driver(store)
    result = commit_values(store, tmp_path / "local", None, {b"k": b"v"}, publish=False, snapshot_every=1)
    driver.cleanup(driver.commit({0: result}, 1, retain=2))
    assert not store.has_ttl(result.delta_name)
    with open_p(store, tmp_path / "other", driver.committed()) as state:
        assert dump(state) == {("a", b"k"): b"v"}


def _local_files(local: Path) -> int:
    """Files under ``local``, leaving out ``.trash-*`` trees (removed by a background thread)."""
    count = 0
    for _dirpath, dirnames, filenames in os.walk(local):
        dirnames[:] = [d for d in dirnames if not d.startswith(".trash-")]
        count += len(filenames)
    return count


@pytest.mark.parametrize("snapshot_upload", ["inline", "background"])
def test_the_local_directories_stay_bounded_over_hundreds_of_versions(
    tmp_path: Path, snapshot_upload: str
) -> None:
    """A long-running partition reopens its working store every version and syncs a standby replica
    elsewhere: neither directory grows with the number of versions (RocksDB's info logs included)."""
    from blobstate.standby.replica import sync_replica
    from blobstate.state.uploads import wait_for_uploads

    store = new_memory_store()
    driver = Driver(store, retain=10)
    active, standby = tmp_path / "active", tmp_path / "standby"
    history = PartitionHistory(CommitCache(CommitLog(store)), OP, 0)
    committed = None
    counts: dict[int, tuple[int, int]] = {}
    model: dict[tuple[str, bytes], bytes] = {}
    for version in range(1, 241):
        with open_p(store, active, committed, snapshot_every=10, snapshot_upload=snapshot_upload) as state:
            pairs = [(b"%d" % (version * 7 % 50 + i), b"%d" % version) for i in range(20)]
            state.store.put_many("a", pairs)
            model.update((("a", k), v) for k, v in pairs)
            result = state.commit()
        driver.cleanup(driver.commit({0: result}, version))
        committed = result.checkpoint_id
        sync_replica(store, layout(standby), committed, history)
        if version % 40 == 0:
            wait_for_uploads()
            counts[version] = (_local_files(active), _local_files(standby))
    assert max(a for a, _ in counts.values()) <= 60, counts
    assert max(s for _, s in counts.values()) <= 25, counts
    with open_p(store, tmp_path / "fresh", committed) as state:
        assert dump(state) == model
