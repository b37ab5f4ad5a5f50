"""The idle-directory sweep: partition directories unused for longer than the grace period are removed,
never while in use; a worker waiting for a lock of a removed directory locks the new one."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lineage_harness import OP, QUERY_ID, Driver, dump, new_memory_store, on_tmpfs, open_p

from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout
from blobstate.state.locking import PartitionLock, PartitionLockedError
from blobstate.state.sweep import READERS_LOCK, last_use, sweep_idle, sweep_local_dir
from blobstate.state.uploads import UPLOADING, UploadDir, UploadStatus

HOUR = 3600.0
OTHER_QUERY = "0a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d"


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    with on_tmpfs(tmp_path) as path:
        yield path


def layout(local: Path, partition: int = 0, query: str = QUERY_ID, op: str = OP) -> LocalPartitionLayout:
    return LocalPartitionLayout(local, query, op, partition)


def commit_partitions(local: Path, partitions: int = 3) -> tuple[object, dict[int, CheckpointId]]:
    """Version 1 of ``partitions`` partitions (one key each) committed, their directories in ``local``."""
    store = new_memory_store()
    results = {}
    for p in range(partitions):
        with open_p(store, local, None, partition=p) as state:
            state.store.put("a", b"k", b"%d" % p)
            results[p] = state.commit()
    Driver(store, num_partitions=partitions).commit(results, 1)
    return store, {p: r.checkpoint_id for p, r in results.items()}


def wait_for_trash(local: Path) -> None:
    """Wait until the background deletions of removed directories are done."""
    deadline = time.monotonic() + 60
    while any(p.name.startswith(".trash-") for p in local.rglob(".trash-*")):
        assert time.monotonic() < deadline, "removed directories are still being deleted after 60s"
        time.sleep(0.01)


def later(hours: float = 2) -> float:
    """A clock ``hours`` from now: every directory looks unused for that long."""
    return time.time() + hours * HOUR


def test_directories_unused_past_the_grace_period_are_removed_and_recent_ones_kept(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 3)
    roots = [layout(tmp_path, p).root for p in range(3)]
    assert sweep_local_dir(tmp_path, HOUR).removed == []  # just used
    assert all(r.is_dir() for r in roots)

    report = sweep_local_dir(tmp_path, HOUR, now=later())
    assert sorted(report.removed) == roots
    assert not any(r.exists() for r in roots)
    # The operator and query directories go with their last partition once as old as the grace.
    wait_for_trash(tmp_path)
    sweep_local_dir(tmp_path, HOUR, now=later())
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


def test_what_is_not_a_partition_directory_is_left_alone(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 1)
    foreign = [tmp_path / "notes", tmp_path / QUERY_ID / "has space", tmp_path / QUERY_ID / OP / "tmp"]
    for path in foreign:
        path.mkdir(parents=True)
        (path / "f").write_text("x")
    sweep_local_dir(tmp_path, HOUR, now=later())
    assert not layout(tmp_path).root.exists()
    assert all((path / "f").read_text() == "x" for path in foreign)


def test_taking_and_releasing_the_partition_lock_records_a_use(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 2)
    lay = layout(tmp_path, 1)
    old = time.time() - 2 * HOUR
    for p in range(2):
        for path in layout(tmp_path, p).root.rglob("*"):
            os.utime(path, (old, old))
        os.utime(layout(tmp_path, p).root, (old, old))
    assert last_use(lay.root) == pytest.approx(old)
    with PartitionLock(lay.lock_file):
        pass
    assert time.time() - last_use(lay.root) < HOUR
    assert sweep_local_dir(tmp_path, HOUR).removed == [layout(tmp_path, 0).root]
    assert lay.root.is_dir()


def test_a_partition_whose_lock_is_held_is_kept(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 2)
    held = layout(tmp_path, 0)
    lock = PartitionLock(held.lock_file).acquire()  # a task of another worker has it open
    try:
        report = sweep_local_dir(tmp_path, HOUR, now=later())
    finally:
        lock.release()
    assert report.in_use == [held.root] and report.removed == [layout(tmp_path, 1).root]
    assert (held.working / "CURRENT").is_file()


def test_the_task_s_own_partition_is_kept(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 2)
    report = sweep_local_dir(tmp_path, HOUR, now=later(), keep=(layout(tmp_path, 0).root,))
    assert report.removed == [layout(tmp_path, 1).root]
    assert layout(tmp_path, 0).root.is_dir()


def test_a_broadcast_copy_being_read_is_kept(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 1)
    copy = layout(tmp_path, 0, op="adjunct-profiles")
    (copy.standby).mkdir(parents=True)
    fd = os.open(copy.root / READERS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a task reads the copy (open_replica holds this while it reads)
        report = sweep_local_dir(tmp_path, HOUR, now=later())
    finally:
        os.close(fd)
    assert report.in_use == [copy.root]
    assert copy.standby.is_dir()
    assert sweep_local_dir(tmp_path, HOUR, now=later()).removed == [copy.root]


def test_a_partition_with_a_queued_background_upload_is_kept(tmp_path: Path) -> None:
    _, cids = commit_partitions(tmp_path, 1)
    lay = layout(tmp_path, 0)
    uploads = UploadDir(lay.root / "snapshots")
    # Waiting for an earlier upload of this partition: its thread does not hold UPLOAD.lock yet.
    uploads.write(UploadStatus(cids[0], UPLOADING, os.getpid(), int(time.time() * 1000)))
    assert sweep_local_dir(tmp_path, HOUR, now=later()).in_use == [lay.root]
    uploads.forget(cids[0])
    assert sweep_local_dir(tmp_path, HOUR, now=later()).removed == [lay.root]


def test_a_removed_partition_reopens_at_its_committed_version_from_the_blob_store(tmp_path: Path) -> None:
    store, cids = commit_partitions(tmp_path, 2)
    sweep_local_dir(tmp_path, HOUR, now=later())
    for p in range(2):
        with open_p(store, tmp_path, cids[p], partition=p) as state:
            assert state.load_rule == "remote"
            assert dump(state) == {("a", b"k"): b"%d" % p}


def _open_count(path: Path) -> int:
    """How many descriptors of this process have ``path`` open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            continue
    return count


def test_a_worker_waiting_for_the_lock_of_a_removed_partition_locks_the_new_directory(tmp_path: Path) -> None:
    store, cids = commit_partitions(tmp_path, 1)
    lay = layout(tmp_path, 0)
    sweeper = PartitionLock(lay.lock_file, record_use=False).acquire(timeout=0)
    waiter = PartitionLock(lay.lock_file)
    errors: list[BaseException] = []

    def wait_for_lock() -> None:
        try:
            waiter.acquire(timeout=60, poll=0.005)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=wait_for_lock)
    thread.start()
    while _open_count(lay.lock_file) < 2:  # the sweeper's and the waiter's, polling its lock
        time.sleep(0.005)
    # What the sweep does while it holds the locks: rename the directory aside, then release.
    trash = lay.root.with_name(".trash-test")
    os.replace(lay.root, trash)
    sweeper.release()
    thread.join(60)
    assert not errors and waiter.held
    try:
        held, named = os.fstat(waiter._fd), os.stat(lay.lock_file)  # the file it locked is the named one
        assert (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
        with pytest.raises(PartitionLockedError):
            PartitionLock(lay.lock_file).acquire(timeout=0)
    finally:
        waiter.release()
    with open_p(store, tmp_path, cids[0]) as state:
        assert dump(state) == {("a", b"k"): b"0"}


def test_openers_racing_repeated_sweeps_always_see_their_committed_state(tmp_path: Path) -> None:
    """A worker sweeps without pause with a grace period of 0 (everything not locked goes at once)
    while tasks reopen and commit the partition: each version finds its directory removed (after
    the commit, the task waits for a complete sweep), rebuilds it from the blob store and holds the
    committed state, and the opens race the sweeps still running."""
    store = new_memory_store()
    driver = Driver(store)
    committed = None
    stop = threading.Event()
    sweeps: list[int] = []

    def sweep_forever() -> None:
        while not stop.is_set():
            sweeps.append(len(sweep_local_dir(tmp_path, 0.0).removed))

    sweeper = threading.Thread(target=sweep_forever)
    sweeper.start()
    try:
        for version in range(1, 21):
            with open_p(store, tmp_path, committed, lock_timeout=30) as state:
                assert state.load_rule == ("remote" if committed else "empty")
                assert dump(state) == ({("a", b"k"): b"%d" % (version - 1)} if committed else {})
                state.store.put("a", b"k", b"%d" % version)
                result = state.commit()
            driver.commit({0: result}, version)
            committed = result.checkpoint_id
            done = len(sweeps)
            deadline = time.monotonic() + 60
            while len(sweeps) < done + 2:  # one sweep that started after the release has finished
                assert time.monotonic() < deadline, "the sweeping thread stopped"
                time.sleep(0.001)
    finally:
        stop.set()
        sweeper.join(60)
    assert sum(sweeps) >= 20  # (more: a directory being made, before its lock file, is empty and idle)


def test_a_lock_whose_directory_a_sweep_removes_between_mkdirs_checks_is_taken_in_a_new_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mkdir`` finds the partition directory, a sweep removes it before ``mkdir`` checks that it is a
    directory: the lock is still taken (in a directory made again), not failed with ``FileExistsError``."""
    root = layout(tmp_path).root
    root.mkdir(parents=True)
    real_mkdir = os.mkdir
    removed: list[str] = []

    def mkdir_then_swept(path: os.PathLike[str] | str, mode: int = 0o777) -> None:
        try:
            real_mkdir(path, mode)
        except FileExistsError:
            if os.fspath(path) == str(root) and not removed:
                os.rmdir(path)  # the sweep, between the failed mkdir and its is_dir check
                removed.append(os.fspath(path))
            raise

    monkeypatch.setattr(os, "mkdir", mkdir_then_swept)
    lock = PartitionLock(root / "LOCK")
    lock.acquire(timeout=5)
    try:
        assert removed == [str(root)]  # the fault fired
        assert lock.held and (root / "LOCK").is_file()
    finally:
        lock.release()
    other = tmp_path / "file-in-the-way"
    other.write_text("")
    with pytest.raises(FileExistsError):  # a file where the directory should be is an error, not a retry
        PartitionLock(other / "LOCK").acquire(timeout=1)


def test_sweep_idle_removes_what_is_idle_and_never_raises(tmp_path: Path) -> None:
    commit_partitions(tmp_path, 2)
    assert sweep_idle(tmp_path, 0.0, keep=(layout(tmp_path, 1).root,)) == 1
    assert not layout(tmp_path, 0).root.exists() and layout(tmp_path, 1).root.is_dir()
    assert sweep_idle(tmp_path / "elsewhere", -1.0) == 0  # an invalid grace is logged, not raised
