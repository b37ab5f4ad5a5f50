"""A local copy of one partition, brought to committed versions: one class for every such copy.

Four places keep a RocksDB directory of a partition on a host: the working store a processing task
writes (``working/``), a standby replica (``standby/``), an executor's copy of a broadcast store (its
``standby/``) and the state reader's restore (a directory of its own). Each is a :class:`LocalCopy`:

* :meth:`LocalCopy.open` takes the partition's lock (``LOCK`` in its directory,
  :class:`~blobstate.state.locking.PartitionLock`) and holds it until :meth:`LocalCopy.close`;
* :meth:`LocalCopy.bring_to` applies the load rules (:func:`blobstate.state.loader.catch_up`) through the
  partition's commit history and returns the copy open and dirty;
* :meth:`LocalCopy.mark_clean` records the committed version it holds once closed (``CHECKPOINT-ID``
  and the lineage info: the clean marks of :mod:`blobstate.state.localdirs`); :meth:`LocalCopy.settle_at`
  does both steps for a copy nothing writes (a replica, a restore).

Invariant 2 (docs/DESIGN.md: a processing task opens a partition only after any standby sync of it on
the host stopped) is the stop request here. The processing side opens with ``stop_syncs=True``: it takes
the lock at once when it is free (no sync runs then: a sync holds the lock for its whole run, and none
starts while another holds it); else it drops ``STANDBY-STOP`` in the partition's directory, waits for
the lock, then withdraws the request. A sync opens with :meth:`LocalCopy.open_if_free`, which does
nothing while a request exists or the lock is held, and checks :attr:`LocalCopy.stop_requested` between
the versions it brings the copy to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from blobstate.blobstore import BlobStore
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout
from blobstate.state.errors import PartitionClosedError
from blobstate.state.history import CommitCache, PartitionHistory
from blobstate.state.loader import Loaded, LoadReport, catch_up
from blobstate.state.localdirs import LineageInfo, mark_clean, read_checkpoint_id
from blobstate.state.locking import (
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    PartitionLock,
    PartitionLockedError,
    create_despite_sweeps,
)
from blobstate.state.sweep import STOP_FILE

if TYPE_CHECKING:
    from blobstate.lineage.commitlog import Commit
    from blobstate.state.store import RocksStateStore

Opener = Callable[[Path], "RocksStateStore"]
"""Opens the RocksDB store in a directory (read-write, creating it when empty)."""


def open_rocks(path: Path) -> RocksStateStore:
    """The default :data:`Opener`: :meth:`blobstate.state.store.RocksStateStore.open`."""
    from blobstate.state.store import RocksStateStore

    return RocksStateStore.open(path)


def partition_history(
    store: BlobStore, operator: str, partition: int, known: Mapping[int, Commit] | None = None
) -> PartitionHistory:
    """The commit history of ``(operator, partition)`` read from ``store``'s commit log (``known``: commits
    already read, by version)."""
    from blobstate.lineage.commitlog import CommitLog

    return PartitionHistory(CommitCache(CommitLog(store), dict(known or {})), operator, partition)


def request_stop(layout: LocalPartitionLayout) -> Path:
    """Ask a running sync of this partition (on this host) to stop; returns the request's path."""
    path = layout.root / STOP_FILE
    create_despite_sweeps(path, Path.touch)
    return path


def clear_stop(layout: LocalPartitionLayout) -> None:
    """Withdraw a stop request (the requester holds the lock now, or gave up)."""
    (layout.root / STOP_FILE).unlink(missing_ok=True)


def stop_requested(layout: LocalPartitionLayout) -> bool:
    """Whether a processing task asked for this partition."""
    return (layout.root / STOP_FILE).exists()


class LocalCopy:
    """One local copy of a partition (``directory``) that this process brings to committed versions,
    holding the partition's lock from :meth:`open` (or :meth:`open_if_free`) to :meth:`close`.

    Use it as a context manager. The store :meth:`bring_to` opens belongs to the caller, who closes it
    before marking the copy clean or bringing it elsewhere.
    """

    def __init__(
        self,
        store: BlobStore,
        layout: LocalPartitionLayout,
        directory: Path,
        history: PartitionHistory,
        lock: PartitionLock,
        opener: Opener,
    ) -> None:
        """Wrap a lock already held; use :meth:`open` or :meth:`open_if_free` instead."""
        self.store = store
        self.layout = layout
        self.directory = directory
        self.history = history
        self._lock = lock
        self._opener = opener

    @classmethod
    def open(
        cls,
        store: BlobStore,
        layout: LocalPartitionLayout,
        directory: Path | None = None,
        *,
        history: PartitionHistory | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
        stop_syncs: bool = False,
        opener: Opener = open_rocks,
    ) -> LocalCopy:
        """Take the partition's lock, waiting up to ``lock_timeout`` seconds, for the copy in ``directory``
        (by default the working store, ``layout.working``).

        ``stop_syncs`` (Invariant 2): when the lock is not free at once, ask a standby sync of the
        partition on this host to stop, and withdraw the request once the lock is held, or the wait
        failed. A free lock is taken without a request: no sync runs then, and none can start while this
        copy holds the lock. ``history`` is the partition's commit history (by default one read from
        ``store``). Raises :class:`~blobstate.state.locking.PartitionLockedError` when the time is up.
        """
        lock = PartitionLock(layout.lock_file)
        if stop_syncs:
            try:
                lock.acquire(timeout=0.0)
            except PartitionLockedError:
                request_stop(layout)
                try:
                    lock.acquire(timeout=lock_timeout)
                finally:
                    clear_stop(layout)
        else:
            lock.acquire(timeout=lock_timeout)
        return cls._held(store, layout, directory, history, lock, opener)

    @classmethod
    def open_if_free(
        cls,
        store: BlobStore,
        layout: LocalPartitionLayout,
        directory: Path,
        *,
        history: PartitionHistory | None = None,
        opener: Opener = open_rocks,
    ) -> LocalCopy | None:
        """:meth:`open` for work that gives way to processing (a standby sync): None, without waiting,
        when a processing task asked for the partition or another holder has its lock."""
        if stop_requested(layout):
            return None
        lock = PartitionLock(layout.lock_file)
        try:
            lock.acquire(timeout=0.0)
        except PartitionLockedError:
            return None
        return cls._held(store, layout, directory, history, lock, opener)

    @classmethod
    def _held(
        cls,
        store: BlobStore,
        layout: LocalPartitionLayout,
        directory: Path | None,
        history: PartitionHistory | None,
        lock: PartitionLock,
        opener: Opener,
    ) -> LocalCopy:
        if history is None:
            history = partition_history(store, layout.operator, layout.partition)
        return cls(store, layout, layout.working if directory is None else directory, history, lock, opener)

    # ------------------------------------------------------------------ state
    @property
    def held(self) -> bool:
        """Whether the copy still holds the partition's lock (until :meth:`close`)."""
        return self._lock.held

    @property
    def checkpoint(self) -> CheckpointId | None:
        """The committed checkpoint the copy is marked clean at (None: empty, or dirty)."""
        return read_checkpoint_id(self.directory)

    @property
    def stop_requested(self) -> bool:
        """Whether a processing task asked for the partition (a sync stops at its next version)."""
        return stop_requested(self.layout)

    # ------------------------------------------------------------------ bringing it to a version
    def bring_to(self, committed: CheckpointId | None, *, upto: int | None = None) -> Loaded:
        """Bring the copy to the committed ``committed`` (None: the empty version 0) by the load rules.

        ``upto`` is the newest durable commit the caller read: a snapshot named late by any commit up to
        it may be the base (default: only commits up to ``committed``'s version).

        Returns the store open and dirty, the lineage info and the load report. Raises
        :class:`~blobstate.state.errors.StateLoadError` subclasses naming the missing or corrupt object,
        or the uid the commit log does not name for that version; the copy then stays dirty.
        """
        self._require_held()
        return catch_up(
            self.store, self.layout, self.directory, committed, self._opener, self.history, upto=upto
        )

    def mark_clean(self, info: LineageInfo) -> None:
        """Record that the copy (its store closed) holds exactly the committed ``info.checkpoint_id``."""
        self._require_held()
        mark_clean(self.directory, info)

    def settle_at(self, committed: CheckpointId) -> LoadReport:
        """:meth:`bring_to` ``committed``, close the store and mark the copy clean there; the load report."""
        loaded = self.bring_to(committed)
        loaded.store.close()
        self.mark_clean(loaded.info)
        return loaded.report

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Release the partition's lock (idempotent). The copy stays as it is: clean only if marked."""
        self._lock.release()

    def _require_held(self) -> None:
        if not self._lock.held:
            raise PartitionClosedError(
                f"the local copy {self.directory} of partition {self.layout.operator}/{self.layout.partition}"
                " is closed: open it again to bring it to a version"
            )

    def __enter__(self) -> LocalCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "held" if self.held else "closed"
        return f"LocalCopy({self.layout.operator}/{self.layout.partition} {self.directory.name}, {state})"
