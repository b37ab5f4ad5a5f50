"""Broadcast adjunct stores: one writer (the driver), one read-only copy per executor.

The store is checkpointed as its own one-partition operator ``adjunct-<name>`` with the same deltas,
snapshots and lineage as any partition, so retention, ``verify`` and ``gc`` treat it like the rest.

* Driver (:func:`write_version`): before a batch's stage, it applies the batch's side rows to its own
  copy at the last committed version and uploads version ``v+1`` under a fresh uid (pending until the
  batch's commit names it, exactly like a partition's attempt).
* Executors (:func:`open_replica`): the first task of the batch on an executor brings the executor's
  copy (``<local_dir>/<query>/adjunct-<name>/0/standby``, a :class:`~blobstate.state.local_copy.LocalCopy`)
  to the committed version as standby replicas do, then applies the batch's one pending delta, checked
  against its reference (:func:`~blobstate.state.chain.fetch_checked_delta`);
  every task of the executor then reads that copy read-only, at the same version. Tasks hold a shared
  lock while they read; the catch-up holds it exclusively, so a copy never changes under a reader.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blobstate.adjunct.records import ApplyStats, apply_side_rows
from blobstate.adjunct.spec import AdjunctSpec
from blobstate.blobstore import BlobStore
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout, delta_name
from blobstate.lineage.delta import DeltaFormatError, decode_delta
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from blobstate.state.chain import fetch_checked_delta
from blobstate.state.errors import CorruptObjectError, LineageError, StateLoadError
from blobstate.state.local_copy import LocalCopy
from blobstate.state.localdirs import LineageInfo, read_checkpoint_id
from blobstate.state.locking import PartitionLock
from blobstate.state.sweep import READERS_LOCK

REPLICA_LOCK_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class PendingVersion:
    """A broadcast store's version written for the running batch, as tasks need it."""

    version: int
    uid: str
    base_uid: str | None
    """The uid of the committed version below it (None: version 1 on an empty store)."""
    delta_ref: dict[str, Any]
    """The delta's :class:`ObjectRef` (size and checksum), checked before it is applied."""
    delta_lineage: tuple[str, ...]
    """The lineage record in the delta (the base's uid first; empty on an empty store)."""
    snapshot: bool
    """Whether the version also has a snapshot (a delta on top of it starts a new lineage)."""

    @property
    def next_lineage(self) -> tuple[str, ...]:
        """The lineage of a delta written on top of this version (its own uid first)."""
        return (self.uid,) if self.snapshot else (self.uid, *self.delta_lineage)

    @property
    def checkpoint_id(self) -> CheckpointId:
        """``(version, uid)``."""
        return CheckpointId(self.version, self.uid)


@dataclass
class Written:
    """What the driver wrote for one broadcast adjunct in one batch."""

    pending: PendingVersion
    objects: Any
    """The version's :class:`~blobstate.lineage.refs.PartitionObjects` (for the commit)."""
    stats: ApplyStats
    bytes_uploaded: int
    snapshot: bool


def write_version(
    store: BlobStore,
    local_dir: str,
    query_id: str,
    spec: AdjunctSpec,
    committed: CheckpointId | None,
    rows: Any,
    *,
    uid: str,
    snapshot_every: int,
    snapshot_delta_bytes: int,
    recreate: bool = False,
) -> Written:
    """Apply ``rows`` (the batch's side rows of ``spec``, in order) on top of ``committed`` and upload the
    result; ``recreate`` empties the store first."""
    from blobstate.state.partition import open_partition

    state = open_partition(
        store,
        local_dir,
        query_id,
        spec.operator,
        0,
        committed,
        snapshot_every=snapshot_every,
        snapshot_delta_bytes=snapshot_delta_bytes,
        snapshot_upload="inline",  # the driver's writer: a snapshot is in the version it names
    )
    try:
        if recreate and spec.column_family in state.store.column_families():
            state.store.clear(spec.column_family)
        stats = apply_side_rows(state.store, spec, rows)
        result = state.commit(uid)
    except BaseException:
        state.abort()
        raise
    finally:
        state.close()
    delta_ref = result.objects.delta
    assert delta_ref is not None
    snapshot = result.snapshot_name is not None
    pending = PendingVersion(
        result.checkpoint_id.version,
        result.checkpoint_id.uid,
        None if committed is None else committed.uid,
        delta_ref.to_json(),
        tuple(result.lineage),
        snapshot,
    )
    return Written(pending, result.objects, stats, result.bytes_uploaded, snapshot)


def _replica_at(layout: LocalPartitionLayout, target: CheckpointId) -> bool:
    return read_checkpoint_id(layout.standby) == target


def _bring_to(store: BlobStore, layout: LocalPartitionLayout, pending: PendingVersion) -> None:
    """Catch the copy up to the committed base, then apply the pending delta (caller holds the readers'
    lock exclusively)."""
    base = None if pending.base_uid is None else CheckpointId(pending.version - 1, pending.base_uid)
    target = pending.checkpoint_id
    with LocalCopy.open(store, layout, layout.standby, lock_timeout=REPLICA_LOCK_TIMEOUT_SECONDS) as copy:
        loaded = copy.bring_to(base)
        try:
            name = delta_name(layout.operator, layout.partition, target)
            refs = PartitionObjects(ObjectRef.from_json(pending.delta_ref))
            data = fetch_checked_delta(store, layout.operator, layout.partition, target, refs)
            try:
                delta = decode_delta(data, name=name)
            except DeltaFormatError as error:
                raise CorruptObjectError(name, target, error.problem) from error
            if tuple(delta.lineage) != pending.delta_lineage:
                raise LineageError(
                    name,
                    target,
                    f"its lineage {list(delta.lineage)} does not continue the committed version {base} of"
                    f" broadcast store {layout.operator}",
                )
            loaded.store.apply(delta.records)
        finally:
            loaded.store.close()
        copy.mark_clean(LineageInfo(target, pending.next_lineage, 0, 0))


@contextmanager
def open_replica(
    store: BlobStore, local_dir: str, query_id: str, spec: AdjunctSpec, pending: PendingVersion
) -> Iterator[Any]:
    """This executor's copy of the broadcast store at ``pending``, open read-only for the block.

    The first task on the executor to need the version brings the copy there; the others wait for it
    and then share it. Yields ``(store, seconds spent bringing the copy up to date)``.
    """
    from blobstate.state.store import RocksStateStore

    layout = LocalPartitionLayout(Path(local_dir), query_id, spec.operator, 0)
    readers = PartitionLock(layout.root / READERS_LOCK)
    target = pending.checkpoint_id
    started = time.monotonic()
    while True:
        readers.acquire(timeout=None, shared=True)
        try:
            if not _replica_at(layout, target):
                # No reader holds the copy while it changes.
                if not readers.change(shared=False):
                    continue
                if not _replica_at(layout, target):
                    _bring_to(store, layout, pending)
                if not readers.change(shared=True):
                    continue
                if not _replica_at(layout, target):  # pragma: no cover - another writer between the locks
                    raise StateLoadError(
                        f"broadcast store {spec.operator} on this executor moved off {target}"
                    )
            seconds = time.monotonic() - started
            replica = RocksStateStore.open(layout.standby, read_only=True)
            try:
                yield replica, seconds
            finally:
                replica.close()
            return
        finally:
            readers.release()
