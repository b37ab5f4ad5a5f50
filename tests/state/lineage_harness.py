"""Helpers for the partition, load-rule, retention and crash tests: fault injection around a real store,
a recording wrapper, a tiny driver that commits through the real commit log, and state dumps."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from blobstate.blobstore import BlobStore
from blobstate.ids import CheckpointId
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.state.chain import LINEAGE_CACHE
from blobstate.state.partition import SNAPSHOT_INDEX_CACHE, CommitResult, PartitionState, open_partition
from blobstate.state.retention import MEMO, after_commit, declared_horizon, retained_from

QUERY_ID = "5f0c3f3e-9d7e-4c55-a1a4-0a0b0c0d0e0f"
OP = "0"
CFS = ("a", "b")
MUTATING = ("put", "put_if_absent", "delete", "remove_ttl")


@contextlib.contextmanager
def on_tmpfs(fallback: Path) -> Iterator[Path]:
    """A scratch directory on tmpfs when there is one (fsync and RocksDB opens are much cheaper there)."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield fallback
        return
    path = Path(tempfile.mkdtemp(prefix="blobstate-test-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class InjectedCrash(BaseException):
    """A simulated process crash: a BaseException, so no ``except Exception`` handler swallows it."""


class FaultyStore(BlobStore):
    """A real store behind a wrapper that records every call and can crash at a chosen one.

    ``crash_when(op, name, n)`` is asked before every call (``n`` counts mutating calls since
    :meth:`arm`); when it returns True the call raises :class:`InjectedCrash` instead of running.
    ``fail_when`` does the same with an ordinary exception (an I/O error the caller may handle).
    """

    def __init__(self, inner: BlobStore) -> None:
        super().__init__(inner.url, io_threads=4)
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.bytes_read: dict[str, int] = {}
        """The most bytes one get returned of each object (a bounded get reads no more)."""
        self.crash_when: Callable[[str, str, int], bool] | None = None
        self.fail_when: Callable[[str, str], bool] | None = None
        self.mutations = 0
        self.crashed = False
        self._lock = threading.Lock()

    def arm(self, crash_when: Callable[[str, str, int], bool] | None) -> None:
        """Start counting mutating calls from zero and crash when ``crash_when`` says so."""
        with self._lock:
            self.crash_when = crash_when
            self.mutations = 0
            self.crashed = False

    def _check(self, op: str, name: str) -> None:
        with self._lock:
            self.calls.append((op, name))
            if op in MUTATING:
                self.mutations += 1
            if self.crashed:
                raise InjectedCrash(f"already crashed ({op} {name})")
            if self.crash_when is not None and self.crash_when(op, name, self.mutations):
                self.crashed = True
                self.crash_when = None
                raise InjectedCrash(f"crash at {op} {name} (mutation #{self.mutations})")
        if self.fail_when is not None and self.fail_when(op, name):
            raise OSError(f"injected failure: {op} {name}")

    def names_touched(self) -> set[str]:
        """Every object name any call was about."""
        return {name for _, name in self.calls}

    # primitives delegate to the real store's public operations
    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None:
        self._check("put", name)
        self.inner.put(name, data, ttl=ttl)

    def _put_file(self, name: str, path: Path, ttl: float | None) -> None:
        self._check("put", name)
        self.inner.put(name, path, ttl=ttl)

    def _put_if_absent(self, name: str, data: bytes, ttl: float | None) -> bool:
        self._check("put_if_absent", name)
        return self.inner.put_if_absent(name, data, ttl=ttl)

    def _get_bytes(self, name: str) -> bytes:
        self._check("get", name)
        data = self.inner.get(name)
        self.bytes_read[name] = max(self.bytes_read.get(name, 0), len(data))
        return data

    def _get_prefix(self, name: str, limit: int) -> bytes:
        self._check("get", name)
        data = self.inner.get(name, max_bytes=limit - 1)
        self.bytes_read[name] = max(self.bytes_read.get(name, 0), len(data))
        return data

    def _get_file(self, name: str, path: Path) -> int:
        self._check("get", name)
        return self.inner.get_file(name, path)

    def _delete(self, name: str) -> None:
        self._check("delete", name)
        self.inner.delete(name)

    def _remove_ttl(self, name: str) -> None:
        self._check("remove_ttl", name)
        self.inner.remove_ttl(name)

    def _has_ttl(self, name: str) -> bool:
        self._check("has_ttl", name)
        return self.inner.has_ttl(name)

    def _exists(self, name: str) -> bool:
        self._check("exists", name)
        return self.inner.exists(name)

    def _list(self, prefix: str) -> list[str]:
        self._check("list", prefix)
        return self.inner.list(prefix)

    def _list_sizes(self, prefix: str) -> dict[str, int]:
        self._check("list", prefix)
        return self.inner.list_sizes(prefix)

    def expire(self, now: float | None = None) -> list[str]:
        return self.inner.expire(now)

    def expired(self, now: float | None = None) -> list[str]:
        return self.inner.expired(now)


class GatedStore(FaultyStore):
    """A real store whose snapshot uploads (blob puts) wait until :attr:`gate` is set."""

    def __init__(self, inner: BlobStore) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()

    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None:
        if name.startswith("blobs/"):
            self.blocked.set()
            assert self.gate.wait(60), "the test never opened the gate"
        super()._put_bytes(name, data, ttl)

    def _put_file(self, name: str, path: Path, ttl: float | None) -> None:
        if name.startswith("blobs/"):
            self.blocked.set()
            assert self.gate.wait(60), "the test never opened the gate"
        super()._put_file(name, path, ttl)


def forget_process_memory() -> None:
    """What a process restart loses: the caches and memos of this module's process."""
    LINEAGE_CACHE.clear()
    MEMO.forget()
    with SNAPSHOT_INDEX_CACHE._lock:
        SNAPSHOT_INDEX_CACHE._items.clear()


def new_memory_store() -> BlobStore:
    """A fresh in-memory store."""
    from blobstate.blobstore import open_blob_store

    return open_blob_store(f"memory://{uuid.uuid4().hex}")


def dump(state: PartitionState | Any) -> dict[tuple[str, bytes], bytes]:
    """Every (column family, key) -> value of an open partition's store."""
    store = state.store if isinstance(state, PartitionState) else state
    out = {}
    for cf in CFS:
        for key, value in store.items(cf):
            out[(cf, bytes(key))] = bytes(value)
    return out


def apply_model(store: Any, model: dict[tuple[str, bytes], bytes], ops: list[tuple]) -> None:
    """Apply ops to the real store and to the plain-dict model alike."""
    for op in ops:
        if op[0] == "put":
            _, cf, key, value = op
            store.put(cf, key, value)
            model[(cf, key)] = value
        elif op[0] == "delete":
            _, cf, key = op
            store.delete(cf, key)
            model.pop((cf, key), None)
        else:
            _, cf = op
            store.clear(cf)
            for k in [k for k in model if k[0] == cf]:
                del model[k]


class Driver:
    """The driver role: writes ``metadata.json`` and ``commits/<v>`` through the real commit log.

    Each commit's ``retained_from`` follows ``retain`` (min_versions_to_retain) and its ``horizon`` what
    this driver's last cleanup found still needed, as the engine's do.
    """

    def __init__(
        self, store: BlobStore, num_partitions: int = 1, writer: str = "test-driver", retain: int = 1000
    ) -> None:
        self.store = store
        self.log = CommitLog(store)
        self.writer = writer
        self.retain = retain
        self.needed_from = 0
        self._latest: Commit | None = None
        self.log.write_metadata(QueryMetadata(QUERY_ID, num_partitions, {OP: {"key_columns": ["k"]}}))

    def committed(self, partition: int = 0) -> CheckpointId | None:
        """The newest committed checkpoint of a partition (None: version 0)."""
        version = self.log.latest_version()
        if not version:
            return None
        return self.log.read_commit(version).checkpoint_id(OP, partition)

    def commit(self, results: dict[int, CommitResult], version: int, *, retain: int | None = None) -> Commit:
        """Write ``commits/<version>`` naming the checkpoints (and object references) of ``results``."""
        previous = self._previous(version)
        retained = retained_from(previous, version, retain or self.retain)
        commit = Commit(
            version=version,
            checkpoints={OP: {p: r.checkpoint_id.uid for p, r in results.items()}},
            objects={OP: {p: r.objects for p, r in results.items()}},
            retained_from=retained,
            horizon=declared_horizon(previous, self.needed_from, retained),
            writer=self.writer,
        )
        self.log.write_commit(commit)
        self._latest = commit
        return commit

    def _previous(self, version: int) -> Commit | None:
        """The commit before ``version``, as the engine's driver has it: the one it wrote last, else (its
        first batch) the newest one a listing found, read as an accepted loss left it
        (``CommitLog.read_commit``)."""
        if version <= 1:
            return None
        if self._latest is not None and self._latest.version == version - 1:
            return self._latest
        self.log.versions()
        return self.log.read_commit(version - 1)

    def cleanup(self, commit: Commit) -> Any:
        """Post-commit cleanup (and commit pruning) through the real retention code."""
        stats = after_commit(self.store, commit, commit_log=self.log)
        self.needed_from = max(self.needed_from, stats.needed_from)
        return stats


def open_p(
    store: BlobStore, local: Path, committed: CheckpointId | None, partition: int = 0, **options: Any
) -> PartitionState:
    """``open_partition`` with the test query id and operator."""
    options.setdefault("lock_timeout", 5.0)
    options.setdefault("snapshot_upload", "inline")  # the histories modelled here upload inside the commit
    return open_partition(store, local, QUERY_ID, OP, partition, committed, **options)
