"""``LocalCopy``, the one class that brings a local copy of a partition to a committed version, on real
RocksDB, real files, a real local blob store and real processes (no Spark)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lineage_harness import CFS, OP, QUERY_ID, Driver, dump, on_tmpfs, open_p

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout
from blobstate.state.errors import LineageError, PartitionClosedError
from blobstate.state.local_copy import LocalCopy, request_stop, stop_requested
from blobstate.state.locking import PartitionLock, PartitionLockedError
from blobstate.state.store import RocksStateStore

Model = dict[tuple[str, bytes], bytes]


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """Local directories on tmpfs when there is one: fsync and RocksDB opens are much cheaper there."""
    with on_tmpfs(tmp_path) as path:
        yield path


def layout(local: Path) -> LocalPartitionLayout:
    return LocalPartitionLayout(local, QUERY_ID, OP, 0)


def committed_history(store: BlobStore, active: Path, versions: int, snapshot_every: int) -> list[Model]:
    """Commit ``versions`` versions of partition 0 from ``active``; the model of each (index = version)."""
    driver = Driver(store)
    models: list[Model] = [{}]
    for version in range(1, versions + 1):
        model = dict(models[-1])
        with open_p(store, active, driver.committed(), snapshot_every=snapshot_every) as state:
            for i in range(3):
                key, value = b"k%d" % (version * 3 + i), b"v%d" % version
                state.store.put(CFS[i % 2], key, value)
                model[(CFS[i % 2], key)] = value
            if version > 1:
                state.store.delete(CFS[0], b"k3")
                model.pop((CFS[0], b"k3"), None)
            result = state.commit()
        driver.commit({0: result}, version)
        models.append(model)
    return models


def contents(directory: Path) -> Model:
    rocks = RocksStateStore.open(directory, read_only=True)
    try:
        return dump(rocks)
    finally:
        rocks.close()


def test_brings_a_fresh_copy_to_a_version_from_the_snapshot_and_the_deltas_after_it(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "blobs"))
    models = committed_history(store, tmp_path / "active", versions=5, snapshot_every=3)
    target = Driver(store).committed()
    assert target is not None and target.version == 5
    host = layout(tmp_path / "other-host")
    with LocalCopy.open(store, host, host.standby) as copy:
        report = copy.settle_at(target)
        assert copy.checkpoint == target
    assert (report.base_kind, report.base.split("_")[0], report.deltas_replayed) == ("snapshot", "3", 2)
    assert contents(host.standby) == models[5]
    # The copy is reused afterwards: brought to the same version again, it reads nothing remote.
    with LocalCopy.open(store, host, host.standby) as copy:
        again = copy.settle_at(target)
    assert (again.rule, again.bytes_downloaded) == ("working", 0)


def test_refuses_a_version_under_a_uid_the_commit_log_does_not_name_naming_it(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "blobs"))
    committed_history(store, tmp_path / "active", versions=2, snapshot_every=10)
    wrong = CheckpointId(2, "f" * 32)
    host = layout(tmp_path / "other-host")
    with LocalCopy.open(store, host, host.standby) as copy:
        with pytest.raises(LineageError, match=f"uid {wrong.uid} for version 2 of {OP}/0"):
            copy.bring_to(wrong)
        assert copy.checkpoint is None  # never claims a version it does not hold
    with pytest.raises(PartitionClosedError, match="closed"):
        copy.bring_to(wrong)


def test_a_processing_task_takes_a_free_lock_without_a_stop_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No sync runs while the lock is free (a sync holds it for its whole run), so a processing task takes
    a free lock at once, without writing STANDBY-STOP, and no sync starts while it holds the lock."""
    from blobstate.state import local_copy

    store = open_blob_store(str(tmp_path / "blobs"))
    host = layout(tmp_path / "host")
    requests: list[Path] = []
    monkeypatch.setattr(local_copy, "request_stop", lambda lay: requests.append(request_stop(lay)))
    with LocalCopy.open(store, host, stop_syncs=True) as task:
        assert task.held and requests == [] and not stop_requested(host)
        assert LocalCopy.open_if_free(store, host, host.standby) is None
    sync = LocalCopy.open_if_free(store, host, host.standby)
    assert sync is not None
    try:  # held by a sync: the task asks it to stop, and withdraws the request when its wait fails
        with pytest.raises(PartitionLockedError):
            LocalCopy.open(store, host, lock_timeout=0.1, stop_syncs=True)
        assert len(requests) == 1 and not stop_requested(host)
    finally:
        sync.close()


def test_a_sync_gives_way_to_a_stop_request_and_a_failed_wait_leaves_none_behind(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "blobs"))
    host = layout(tmp_path / "host")
    sync = LocalCopy.open_if_free(store, host, host.standby)
    assert sync is not None and not sync.stop_requested
    try:
        # A processing task that cannot get the lock in time withdraws its request all the same.
        with pytest.raises(PartitionLockedError, match="LOCK"):
            LocalCopy.open(store, host, lock_timeout=0.0, stop_syncs=True)
        assert not stop_requested(host)
        request_stop(host)
        assert sync.stop_requested  # what a sync checks between the versions it brings the copy to
    finally:
        sync.close()
    assert LocalCopy.open_if_free(store, host, host.standby) is None  # a pending request: no sync starts


def _processing_task(local: str, started: Any, result: Any) -> None:
    """Runs in another process: open the working copy as a processing task (Invariant 2's request)."""
    store = open_blob_store(str(Path(local) / "blobs"))
    host = layout(Path(local) / "host")
    started.set()
    with LocalCopy.open(store, host, lock_timeout=60.0, stop_syncs=True):
        result.put(stop_requested(host))


def test_a_processing_task_asks_a_running_sync_to_stop_and_opens_only_after_it_did(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "blobs"))
    host = layout(tmp_path / "host")
    sync = LocalCopy.open_if_free(store, host, host.standby)
    assert sync is not None
    ctx = multiprocessing.get_context("spawn")
    started, result = ctx.Event(), ctx.Queue()
    task = ctx.Process(target=_processing_task, args=(str(tmp_path), started, result))
    task.start()
    try:
        assert started.wait(60)
        for _ in range(3000):
            if sync.stop_requested:
                break
            time.sleep(0.02)
        assert sync.stop_requested
        assert result.empty()  # the task waits while the sync holds the partition
        sync.close()  # the sync stops at the version it completed
        assert result.get(timeout=60) is False  # the task holds the lock and withdrew its request
    finally:
        task.join(60)
        if task.is_alive():
            task.kill()
    assert task.exitcode == 0


def _holder(local: str, held: Any) -> None:
    """Runs in another process: hold the partition's working copy until killed."""
    store = open_blob_store(str(Path(local) / "blobs"))
    copy = LocalCopy.open(store, layout(Path(local) / "host"))
    held.set()
    while copy.held:
        time.sleep(1)


def test_the_lock_is_exclusive_across_processes_and_freed_when_its_holder_dies(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "blobs"))
    host = layout(tmp_path / "host")
    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()
    holder = ctx.Process(target=_holder, args=(str(tmp_path), held))
    holder.start()
    try:
        assert held.wait(60)
        assert LocalCopy.open_if_free(store, host, host.standby) is None
        with pytest.raises(PartitionLockedError, match=str(host.lock_file)):
            LocalCopy.open(store, host, host.standby, lock_timeout=0.1)
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)  # a crash: nothing releases the lock but the kernel
        holder.join(60)
        with LocalCopy.open(store, host, host.standby, lock_timeout=60.0) as copy:
            assert copy.held
    finally:
        if holder.is_alive():
            holder.kill()


def test_shared_locks_exclude_an_exclusive_one_and_a_change_after_a_sweep_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "p" / "READERS.lock"
    first = PartitionLock(path).acquire(timeout=None, shared=True)
    second = PartitionLock(path).acquire(timeout=0.0, shared=True)
    with pytest.raises(PartitionLockedError):
        PartitionLock(path).acquire(timeout=0.0)
    second.release()
    assert first.change(shared=False)  # the only holder now: it may write
    with pytest.raises(PartitionLockedError):
        PartitionLock(path).acquire(timeout=0.0, shared=True)
    assert first.change(shared=True)
    # The idle-directory sweep removed the directory between two steps of a change: the lock protects
    # nothing any more, so the change says so and lets go; taken again, it is on the new file.
    os.replace(tmp_path / "p", tmp_path / "removed")
    assert not first.change(shared=False)
    assert not first.held
    again = PartitionLock(path).acquire(timeout=0.0)
    assert path.is_file()
    again.release()
