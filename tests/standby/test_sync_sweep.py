"""A standby sync task sweeps its executor's local directory, as processing tasks do: an executor holding
only standby replicas runs no processing task, and its replicas of partitions it no longer holds must
still go after the grace period, never while in use. Real files, real RocksDB, a local blob store."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "state"))

from lineage_harness import OP, QUERY_ID, Driver, dump, open_p

from blobstate.batch.executor import ExecutorIdentity
from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout
from blobstate.standby.replica import SYNC_SYNCED, sync_replica
from blobstate.standby.sync_task import SyncSpec, SyncTask, sync_here
from blobstate.state.local_copy import partition_history
from blobstate.state.store import RocksStateStore
from blobstate.state.sweep import USE_FILES

HOUR = 3600.0
ME = ExecutorIdentity("7", "standby-host")
PARTITIONS = 3


class Checkpoint:
    """``PARTITIONS`` partitions processed in the active host's local directory, committed per version."""

    def __init__(self, tmp_path: Path) -> None:
        self.url = str(tmp_path / "blobs")
        self.store: BlobStore = open_blob_store(self.url)
        self.active = tmp_path / "active-host"
        self.driver = Driver(self.store, num_partitions=PARTITIONS)
        self.version = 0

    def commit(self) -> dict[int, CheckpointId]:
        results = {}
        for p in range(PARTITIONS):
            with open_p(self.store, self.active, self.driver.committed(p), partition=p) as state:
                state.store.put("a", b"k", b"%d@%d" % (p, self.version + 1))
                results[p] = state.commit()
        self.version += 1
        self.driver.commit(results, self.version)
        return {p: r.checkpoint_id for p, r in results.items()}

    def spec(self, local_dir: Path, tasks: tuple[SyncTask, ...]) -> SyncSpec:
        return SyncSpec(self.url, QUERY_ID, OP, str(local_dir), 60.0, tasks, local_dir_grace_seconds=HOUR)


def root(local_dir: Path, partition: int) -> Path:
    return LocalPartitionLayout(local_dir, QUERY_ID, OP, partition).root


def last_used(local_dir: Path, partition: int, seconds_ago: float) -> None:
    """Make the partition directory look last used ``seconds_ago`` (its use files and itself)."""
    when = time.time() - seconds_ago
    base = root(local_dir, partition)
    for path in [base / name for name in USE_FILES] + [base]:
        if path.exists():
            os.utime(path, (when, when))


def sync(
    cp: Checkpoint, local_dir: Path, partition: int, target: CheckpointId, who: ExecutorIdentity = ME
) -> dict:
    task = SyncTask(partition, who.executor_id, who.host, target.version, target.uid)
    return sync_here(cp.spec(local_dir, (task,)), task, ME)


def earlier_round(cp: Checkpoint, local_dir: Path, partition: int, target: CheckpointId) -> None:
    """The replica an earlier round left (synced directly: the sweep runs at most once a minute per
    local directory in a process, and the round under test must be this directory's first)."""
    layout = LocalPartitionLayout(local_dir, QUERY_ID, OP, partition)
    report = sync_replica(cp.store, layout, target, partition_history(cp.store, OP, partition))
    assert report.outcome == SYNC_SYNCED


def replica(local_dir: Path, partition: int) -> dict:
    store = RocksStateStore.open(LocalPartitionLayout(local_dir, QUERY_ID, OP, partition).standby)
    try:
        return dump(store)
    finally:
        store.close()


def test_a_standby_only_executor_removes_replicas_it_no_longer_holds_but_never_one_in_use(
    tmp_path: Path,
) -> None:
    cp = Checkpoint(tmp_path)
    local = tmp_path / "standby-host"  # this executor runs sync tasks only, never a processing task
    first = cp.commit()
    for p in range(PARTITIONS):
        earlier_round(cp, local, p, first[p])
    # Partitions 1 and 2 moved their standbys elsewhere two hours ago; a process still holds 2's lock.
    last_used(local, 1, 2 * HOUR)
    last_used(local, 2, 2 * HOUR)
    held = os.open(root(local, 2) / "LOCK", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        second = cp.commit()
        report = sync(cp, local, 0, second[0])  # the round after the move syncs only partition 0 here
        assert report["outcome"] == SYNC_SYNCED and report["version"] == 2
        assert not root(local, 1).exists(), "the replica of a partition this executor no longer holds stayed"
        assert root(local, 2).is_dir(), "a directory whose lock was held was removed"
    finally:
        os.close(held)
    assert replica(local, 0) == {("a", b"k"): b"0@2"}  # the synced replica is intact
    assert replica(local, 2) == {("a", b"k"): b"2@1"}


def test_a_misplaced_sync_task_sweeps_too_and_a_replica_used_within_the_grace_period_stays(
    tmp_path: Path,
) -> None:
    cp = Checkpoint(tmp_path)
    local = tmp_path / "standby-host"
    first = cp.commit()
    for p in (0, 1):
        earlier_round(cp, local, p, first[p])
    last_used(local, 0, 2 * HOUR)
    last_used(local, 1, HOUR / 2)
    # Spark ran a task placed on another executor here: it syncs nothing, and sweeps all the same.
    report = sync(cp, local, 2, first[2], ExecutorIdentity("8", "other-host"))
    assert report["outcome"] == "misplaced" and not root(local, 2).exists()
    assert not root(local, 0).exists()
    assert replica(local, 1) == {("a", b"k"): b"1@1"}
