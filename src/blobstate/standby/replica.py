"""The executor side of a standby replica: bring ``standby/`` to a committed ``(v, uid)``, stoppably.

A replica is a RocksDB directory beside the partition's working store (``<root>/standby``) with its own
``CHECKPOINT-ID``. It only ever holds committed checkpoints: the driver names the committed ``(v, uid)``
it must reach, and every step brings the replica there as a :class:`~blobstate.state.local_copy.LocalCopy`
(the load rules of :func:`blobstate.state.loader.catch_up`), which reads only objects of the committed
lineage.

Invariant 2 (docs/DESIGN.md: an active starts only after its standby has stopped) is enforced, not assumed:

* a sync holds the partition's lock (the same ``flock`` every processing task takes) for its whole
  run, so a processing task of the partition on this host can never open the state while a sync
  writes the replica;
* a processing task that finds the lock held drops a stop request (``STANDBY-STOP``) in the partition's
  directory, then waits for the lock; a running sync checks for the request between versions, stops at
  the last committed version it completed (marked clean, so the processing task still starts from it),
  and releases the lock;
* a sync that finds a stop request, or cannot get the lock at once, does nothing
  (:meth:`~blobstate.state.local_copy.LocalCopy.open_if_free`).

Each sync also stops after ``budget_seconds`` (at a committed version), so it never holds an executor
core for long while the next batch waits; the next round continues from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blobstate.blobstore import BlobStore
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout
from blobstate.state.errors import StateLoadError
from blobstate.state.history import PartitionHistory
from blobstate.state.local_copy import LocalCopy, open_rocks
from blobstate.state.local_copy import clear_stop as clear_stop
from blobstate.state.local_copy import request_stop as request_stop
from blobstate.state.local_copy import stop_requested as stop_requested
from blobstate.state.localdirs import read_checkpoint_id
from blobstate.state.sweep import STOP_FILE as STOP_FILE  # dropped by a task that wants the partition

STEPWISE_MAX_LAG = 16
"""Up to this many versions behind, a sync advances one committed version at a time (stoppable between
versions); further behind, it catches up in one step (a snapshot restore when one is nearer)."""

SYNC_SYNCED = "synced"
SYNC_PARTIAL = "partial"
SYNC_STOPPED = "stopped"
SYNC_BUSY = "busy"
SYNC_CURRENT = "current"


@dataclass
class SyncReport:
    """What one sync of one replica did; sent to the driver as JSON."""

    partition: int
    outcome: str
    """``current`` (already there), ``synced``, ``partial`` (budget spent), ``stopped`` (a processing
    task asked for the partition), ``busy`` (the partition's lock was held), or ``misplaced``/``error``
    (set by the task around this function)."""
    version: int
    """The replica's committed version after the sync (0: none)."""
    uid: str | None
    target_version: int
    seconds: float = 0.0
    bytes_downloaded: int = 0
    deltas_applied: int = 0
    snapshot_bytes: int = 0
    started_at: float = 0.0
    """Wall-clock time (``time.time()``) the sync took the lock (0 when it never did)."""
    finished_at: float = 0.0
    """Wall-clock time it released the lock."""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def replica_checkpoint(layout: LocalPartitionLayout) -> CheckpointId | None:
    """The committed checkpoint the replica holds (None: no clean replica)."""
    return read_checkpoint_id(layout.standby)


def sync_replica(
    store: BlobStore,
    layout: LocalPartitionLayout,
    target: CheckpointId,
    history: PartitionHistory,
    *,
    budget_seconds: float = 10.0,
    open_store: Callable[[Path], Any] = open_rocks,
    clock: Callable[[], float] = time.monotonic,
) -> SyncReport:
    """Bring the replica of ``layout``'s partition towards the committed ``target``.

    ``history`` must know ``target``'s commit (and every commit it walks). Returns a report; raises only
    on a load error (a missing or corrupt object), leaving the replica dirty, never at an uncommitted
    state.
    """
    started = clock()
    report = SyncReport(layout.partition, SYNC_BUSY, 0, None, target.version)
    copy = LocalCopy.open_if_free(store, layout, layout.standby, history=history, opener=open_store)
    if copy is None:
        _set_version(report, replica_checkpoint(layout))
        return report
    report.started_at = time.time()
    try:
        current = copy.checkpoint
        _set_version(report, current)
        if current == target:
            report.outcome = SYNC_CURRENT
            return report
        target_commit = history.commit(target.version)
        if target_commit is None:
            raise _no_commit(history, target.version)
        # Only retained versions are sure to be restorable: the first step goes no lower than those.
        first = max(current.version + 1 if current is not None else 0, target_commit.retained_from)
        if current is None or current.version > target.version or target.version - first >= STEPWISE_MAX_LAG:
            steps = [target]
        else:
            steps = [_committed(history, v) for v in range(first, target.version + 1)]
        report.outcome = SYNC_SYNCED
        for i, step in enumerate(steps):
            if i > 0 and copy.stop_requested:
                report.outcome = SYNC_STOPPED
                break
            if i > 0 and clock() - started > budget_seconds:
                report.outcome = SYNC_PARTIAL
                break
            _advance(copy, step, report)
    finally:
        report.finished_at = time.time()
        report.seconds = round(clock() - started, 4)
        copy.close()
    return report


def _committed(history: PartitionHistory, version: int) -> CheckpointId:
    uid = history.uid(version)
    if uid is None:
        raise _no_commit(history, version)
    return CheckpointId(version, uid)


def _no_commit(history: PartitionHistory, version: int) -> StateLoadError:
    return StateLoadError(
        f"version {version} of {history.operator}/{history.partition} has no commit: its replica cannot"
        " be synced to it"
    )


def _advance(copy: LocalCopy, step: CheckpointId, report: SyncReport) -> None:
    load = copy.settle_at(step)
    report.bytes_downloaded += load.bytes_downloaded
    report.snapshot_bytes += load.bytes_downloaded - load.delta_bytes
    report.deltas_applied += load.deltas_replayed
    _set_version(report, step)


def _set_version(report: SyncReport, cid: CheckpointId | None) -> None:
    report.version = 0 if cid is None else cid.version
    report.uid = None if cid is None else cid.uid
