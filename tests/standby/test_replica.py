"""The executor side of standby replicas (``blobstate.standby.replica``), on real RocksDB and real files.

Two "hosts" are two local directories: the active writes and commits through the real commit log on
one, the replica is synced on the other, and a failover opens the partition on the replica's host.
Every replica and every failover load is compared with a plain-dict model of the committed versions.
"""

from __future__ import annotations

import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "state"))

from lineage_harness import (
    CFS,
    MUTATING,
    OP,
    QUERY_ID,
    Driver,
    FaultyStore,
    GatedStore,
    apply_model,
    dump,
    open_p,
)

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout, delta_name
from blobstate.lineage.commitlog import CommitLog
from blobstate.standby.replica import (
    STEPWISE_MAX_LAG,
    SYNC_BUSY,
    SYNC_CURRENT,
    SYNC_PARTIAL,
    SYNC_STOPPED,
    SYNC_SYNCED,
    clear_stop,
    replica_checkpoint,
    request_stop,
    sync_replica,
)
from blobstate.state.errors import StateLoadError
from blobstate.state.history import CommitCache, PartitionHistory
from blobstate.state.locking import PartitionLock
from blobstate.state.store import RocksStateStore
from blobstate.state.uploads import wait_for_uploads

Model = dict[tuple[str, bytes], bytes]


class History:
    """Commits random writes to partition 0 from the active host; keeps the model of each version."""

    def __init__(
        self,
        store: BlobStore,
        active_dir: Path,
        snapshot_every: int = 3,
        seed: int = 5,
        snapshot_upload: str = "inline",
    ) -> None:
        self.store = store
        self.active_dir = active_dir
        self.driver = Driver(store)
        self.snapshot_every = snapshot_every
        self.snapshot_upload = snapshot_upload
        self.rng = random.Random(seed)
        self.models: dict[int, Model] = {0: {}}
        self.version = 0

    def commit(self, writes: int = 30) -> CheckpointId:
        model = dict(self.models[self.version])
        with open_p(
            self.store,
            self.active_dir,
            self.driver.committed(),
            snapshot_every=self.snapshot_every,
            snapshot_upload=self.snapshot_upload,
        ) as state:
            ops: list[tuple] = []
            for _ in range(writes):
                key = b"k%d" % self.rng.randrange(200)
                if self.rng.random() < 0.2:
                    ops.append(("delete", self.rng.choice(CFS), key))
                else:
                    ops.append(("put", self.rng.choice(CFS), key, self.rng.randbytes(64)))
            apply_model(state.store, model, ops)
            result = state.commit()
        self.version += 1
        self.driver.commit({0: result}, self.version)
        self.models[self.version] = model
        return result.checkpoint_id

    def uncommitted_attempt(self) -> CheckpointId:
        """An attempt at the next version whose delta is uploaded but that is never committed."""
        with open_p(self.store, self.active_dir / "loser", self.driver.committed()) as state:
            state.store.put("a", b"loser", b"never committed")
            return state.commit().checkpoint_id


def history_of(store: BlobStore) -> PartitionHistory:
    return PartitionHistory(CommitCache(CommitLog(store)), OP, 0)


def layout(local: Path) -> LocalPartitionLayout:
    return LocalPartitionLayout(local, QUERY_ID, OP, 0)


def replica_contents(local: Path) -> Model:
    store = RocksStateStore.open(layout(local).standby)
    try:
        return dump(store)
    finally:
        store.close()


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return open_blob_store(str(tmp_path / "blobs"))


def test_a_replica_follows_every_commit_by_deltas_and_never_an_unchosen_attempt(
    store: BlobStore, tmp_path: Path
) -> None:
    h = History(store, tmp_path / "host-a")
    standby_host = tmp_path / "host-b"
    for round_ in range(10):
        target = h.commit()
        if round_ in (3, 6):
            h.uncommitted_attempt()  # its delta exists in the store; the replica must never see it
        report = sync_replica(store, layout(standby_host), target, history_of(store))
        assert report.outcome == SYNC_SYNCED and (report.version, report.uid) == (target.version, target.uid)
        assert replica_checkpoint(layout(standby_host)) == target
        assert replica_contents(standby_host) == h.models[target.version]
        # Each sync after the first applies one delta and downloads no snapshot, also onto the
        # versions that have one (every third).
        if round_ > 0:
            assert (report.deltas_applied, report.snapshot_bytes) == (1, 0), (round_, report)
    again = sync_replica(store, layout(standby_host), target, history_of(store))
    assert again.outcome == SYNC_CURRENT and again.bytes_downloaded == 0


def test_a_sync_to_a_version_without_a_commit_names_the_version_and_leaves_the_replica(
    store: BlobStore, tmp_path: Path
) -> None:
    h = History(store, tmp_path / "host-a")
    standby_host = tmp_path / "host-b"
    for fresh_replica in (True, False):
        synced = h.commit()
        if not fresh_replica:
            sync_replica(store, layout(standby_host), synced, history_of(store))
        attempt = h.uncommitted_attempt()
        with pytest.raises(StateLoadError, match=rf"version {attempt.version} of {OP}/0 has no commit"):
            sync_replica(store, layout(standby_host), attempt, history_of(store))
    assert replica_checkpoint(layout(standby_host)) == synced
    assert replica_contents(standby_host) == h.models[synced.version]


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_failover_opens_the_replica_with_no_snapshot_download(
    store: BlobStore, tmp_path: Path, lag: int
) -> None:
    h = History(store, tmp_path / "host-a", snapshot_every=3)
    standby_host = tmp_path / "host-b"
    for _ in range(6):
        synced = h.commit()
        sync_replica(store, layout(standby_host), synced, history_of(store))
    for _ in range(lag):
        h.commit()  # the active commits more; its host dies before the replica syncs them
    committed = h.driver.committed()
    assert committed is not None and committed.version == 6 + lag
    with open_p(store, standby_host, committed) as state:
        report = state.load_report
        assert dump(state) == h.models[committed.version]
        assert report.deltas_replayed == lag
        assert report.bytes_downloaded == report.delta_bytes, "a snapshot was downloaded"
        # a standby that was behind is told apart from a cold restore from the blob store
        assert state.load_rule == ("standby" if lag == 0 else "standby+deltas")
        state.store.put("a", b"after-failover", b"1")
        state.commit()  # the moved partition goes on from there


def test_budget_and_stop_request_stop_a_sync_at_a_committed_version(store: BlobStore, tmp_path: Path) -> None:
    h = History(store, tmp_path / "host-a", snapshot_every=100)
    standby_host = tmp_path / "host-b"
    first = h.commit()
    sync_replica(store, layout(standby_host), first, history_of(store))
    for _ in range(3):
        target = h.commit()
    partial = sync_replica(store, layout(standby_host), target, history_of(store), budget_seconds=0.0)
    assert partial.outcome == SYNC_PARTIAL and partial.version == 2 and partial.deltas_applied == 1
    assert replica_contents(standby_host) == h.models[2]
    request_stop(layout(standby_host))
    stopped = sync_replica(store, layout(standby_host), target, history_of(store))
    assert stopped.outcome == SYNC_BUSY and stopped.version == 2  # a stop request: it does not start
    clear_stop(layout(standby_host))
    lock = PartitionLock(layout(standby_host).lock_file).acquire()
    try:
        busy = sync_replica(store, layout(standby_host), target, history_of(store))
        assert busy.outcome == SYNC_BUSY and busy.started_at == 0.0
    finally:
        lock.release()
    done = sync_replica(store, layout(standby_host), target, history_of(store))
    assert done.outcome == SYNC_SYNCED and done.version == 4
    assert replica_contents(standby_host) == h.models[4]


class SlowStore(FaultyStore):
    """A real local store whose delta reads take ``delay`` seconds (fault injection: a slow sync)."""

    def __init__(self, inner: BlobStore, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    def _check(self, op: str, name: str) -> None:
        if name.endswith(".delta") and op not in MUTATING:
            time.sleep(self.delay)
        super()._check(op, name)


def _slow_sync(url: str, local: str, target: str, started: Any, result: Any) -> None:
    """Runs in another process: a sync whose every delta read takes 0.5 s."""
    store = SlowStore(open_blob_store(url), 0.5)
    started.set()
    report = sync_replica(store, layout(Path(local)), CheckpointId.parse(target), history_of(store))
    result.put(report.to_json())


def test_invariant_2_a_failover_waits_for_the_running_sync_to_stop_never_races_it(
    store: BlobStore, tmp_path: Path
) -> None:
    h = History(store, tmp_path / "host-a", snapshot_every=100)
    standby_host = tmp_path / "host-b"
    sync_replica(store, layout(standby_host), h.commit(), history_of(store))
    for _ in range(8):
        target = h.commit()
    ctx = multiprocessing.get_context("spawn")
    started, result = ctx.Event(), ctx.Queue()
    sync = ctx.Process(target=_slow_sync, args=(store.url, str(standby_host), target.name, started, result))
    sync.start()
    try:
        assert started.wait(60)
        time.sleep(1.2)  # the sync is a few of its eight slow versions in
        # The processing task of the failover: ask the sync to stop, then take the partition.
        request_stop(layout(standby_host))
        with open_p(store, standby_host, target, lock_timeout=60) as state:
            opened_at = time.time()
            clear_stop(layout(standby_host))
            assert dump(state) == h.models[target.version]
            report = result.get(timeout=60)
            assert report["outcome"] == SYNC_STOPPED, report
            assert report["finished_at"] <= opened_at, "the processing task opened while the sync ran"
            assert 1 < report["version"] < target.version  # stopped part-way, at a committed version
            assert state.load_report.deltas_replayed == target.version - report["version"]
            assert state.load_report.bytes_downloaded == state.load_report.delta_bytes
    finally:
        sync.join(60)
        if sync.is_alive():
            sync.kill()


def test_a_replica_behind_deltas_that_retention_removed_loads_from_the_snapshot(
    store: BlobStore, tmp_path: Path
) -> None:
    h = History(store, tmp_path / "host-a", snapshot_every=3)
    h.driver.retain = 2
    standby_host = tmp_path / "host-b"
    for _ in range(4):
        target = h.commit()
    sync_replica(store, layout(standby_host), target, history_of(store))  # the replica stays at 4
    # Version 6 has a snapshot and its delta's lineage names 5 and 4 (the replica): loading 7 would
    # rather start from the replica, but retention removed delta 5 once 6 and 7 were the retained ones.
    for _ in range(3):
        h.commit()
        h.driver.cleanup(h.driver.log.read_commit(h.version))
    five = h.driver.log.read_commit(5).checkpoint_id(OP, 0)
    assert not store.exists(delta_name(OP, 0, five)), "retention kept the delta this test needs gone"
    committed = h.driver.committed()
    assert committed is not None
    with open_p(store, standby_host, committed) as state:
        assert dump(state) == h.models[committed.version]
        assert state.load_report.base_kind == "snapshot"


def test_a_replica_far_behind_restores_late_named_snapshots_never_one_still_uploading(
    store: BlobStore, tmp_path: Path
) -> None:
    """With background uploads every snapshot is named by a later commit. A replica catching up in one
    step restores the newest named one and the deltas after it; one still uploading is not used."""
    gated = GatedStore(store)
    h = History(gated, tmp_path / "host-a", snapshot_every=3, snapshot_upload="background")
    standby_host = tmp_path / "host-b"
    for _ in range(STEPWISE_MAX_LAG + 3):
        h.commit()
        assert wait_for_uploads(60)
    gated.gate.clear()
    while not gated.blocked.is_set():  # commit until a due snapshot's upload is held at the gate
        h.commit()
    in_flight = h.driver.committed()
    assert in_flight is not None
    h.commit()  # its upload is in flight, so this commit names no snapshot
    commits = [h.driver.log.read_commit(v).objects_of(OP, 0) for v in range(1, h.version + 1)]
    assert all(c.snapshot is None for c in commits), "background uploads are never a commit's own"
    named = [c.late_snapshot.checkpoint_name for c in commits if c.late_snapshot is not None]
    assert len(named) >= 4 and in_flight.name not in named

    target = h.driver.committed()
    assert target is not None and target.version > STEPWISE_MAX_LAG
    report = sync_replica(store, layout(standby_host), target, history_of(store))
    assert report.outcome == SYNC_SYNCED and report.version == target.version, report
    assert report.snapshot_bytes > 0 and report.deltas_applied >= 2, report  # a named snapshot + deltas
    assert replica_contents(standby_host) == h.models[target.version]
    gated.gate.set()
    assert wait_for_uploads(60)


def test_a_replica_behind_the_retained_versions_syncs_to_the_target(store: BlobStore, tmp_path: Path) -> None:
    """Stepping version by version must not ask for versions retention no longer keeps restorable."""
    h = History(store, tmp_path / "host-a", snapshot_every=3)
    h.driver.retain = 2
    standby_host = tmp_path / "host-b"
    sync_replica(store, layout(standby_host), h.commit(), history_of(store))  # the replica stays at 1
    for _ in range(8):
        h.commit()
        h.driver.cleanup(h.driver.log.read_commit(h.version))
    target = h.driver.committed()
    assert target is not None
    report = sync_replica(store, layout(standby_host), target, history_of(store))
    assert report.outcome == SYNC_SYNCED and report.version == target.version, report
    assert replica_contents(standby_host) == h.models[target.version]


def test_a_sync_failing_part_way_leaves_the_replica_dirty_never_wrong(
    store: BlobStore, tmp_path: Path
) -> None:
    h = History(store, tmp_path / "host-a", snapshot_every=100)
    standby_host = tmp_path / "host-b"
    sync_replica(store, layout(standby_host), h.commit(), history_of(store))
    for _ in range(3):
        target = h.commit()
    faulty = FaultyStore(store)
    third = h.driver.log.read_commit(3).checkpoint_id(OP, 0)
    faulty.fail_when = lambda op, name: name.endswith(f"{third.name}.delta")  # fails at the step to 3
    with pytest.raises(OSError, match="injected failure"):
        sync_replica(faulty, layout(standby_host), target, history_of(faulty))
    # Version 2 was completed and marked clean; the failed step to 3 left nothing claiming a checkpoint.
    assert replica_checkpoint(layout(standby_host)) in (
        None,
        h.driver.log.read_commit(2).checkpoint_id(OP, 0),
    )
    done = sync_replica(store, layout(standby_host), target, history_of(store))
    assert done.outcome == SYNC_SYNCED and replica_contents(standby_host) == h.models[target.version]
