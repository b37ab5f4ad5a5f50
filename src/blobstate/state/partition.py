"""One partition of one operator, engine-independent: open at a committed checkpoint, write, commit.

``open_partition`` takes the partition's process lock, applies the load rules
(:mod:`blobstate.state.loader`) and returns a :class:`PartitionState` whose ``store`` is the open,
dirty working store. ``commit()`` writes version v+1 under a fresh uid:

1. take the changelog and upload ``<v+1>_<uid>.delta`` (lineage record first) with the pending TTL;
2. take a local hard-link checkpoint ``checkpoints/<v+1>_<uid>/`` with its lineage info;
3. when due (every K versions, or when the deltas since the last snapshot exceed a byte size) back the
   checkpoint up as ``<v+1>_<uid>.snapshot``, incrementally against the previous snapshot on the lineage;
   a failed snapshot upload is reported, not fatal: the lineage presumes the snapshot and loading walks
   through the delta where it is missing (seed 002, example 3);
4. close the store and write ``CHECKPOINT-ID`` (the working store is clean at v+1);
5. keep the newest few local checkpoints.

The driver then writes ``commits/<v+1>`` and runs :func:`blobstate.state.retention.after_commit`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blobstate.blobstore import DEFAULT_PENDING_TTL_SECONDS, BlobStore
from blobstate.ids import CheckpointId, new_uid, validate_uid
from blobstate.layout import LocalPartitionLayout, blob_prefix, delta_name, snapshot_name
from blobstate.lineage.delta import encode_delta
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from blobstate.state.chain import resolve_chain
from blobstate.state.errors import PartitionClosedError, StateLoadError
from blobstate.state.history import CommitCache, PartitionHistory
from blobstate.state.loader import LoadReport, load_working, read_checked_snapshot_index
from blobstate.state.localdirs import (
    LineageInfo,
    mark_clean,
    prune_checkpoints,
    remove_tree,
    write_info,
)
from blobstate.state.locking import DEFAULT_LOCK_TIMEOUT_SECONDS, PartitionLock
from blobstate.state.policy import (
    DEFAULT_LOCAL_CHECKPOINTS_TO_KEEP,
    DEFAULT_MIN_VERSIONS_TO_RETAIN,
    DEFAULT_SNAPSHOT_DELTA_BYTES,
    DEFAULT_SNAPSHOT_EVERY,
    SnapshotPolicy,
    validate_retention,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    """What one commit of a partition wrote.

    ``objects_written`` are the names of every object uploaded (delta, snapshot index, new blobs);
    ``bytes_uploaded`` their total size; ``changelog_bytes`` the raw key and value bytes of the changes;
    ``lineage`` the lineage record written into the delta; ``snapshot_error`` why a due snapshot failed.
    ``objects`` are the references (size, SHA-256) of the delta and snapshot index that the driver's
    commit must record.
    """

    checkpoint_id: CheckpointId
    delta_name: str
    snapshot_name: str | None
    objects: PartitionObjects
    objects_written: tuple[str, ...]
    bytes_uploaded: int
    changelog_bytes: int
    seconds: float
    lineage: tuple[str, ...] = ()
    records: int = 0
    snapshot_error: str | None = None


class _IndexCache:
    """Snapshot indexes by (store url, name): immutable, so a small LRU saves re-reading them."""

    def __init__(self, capacity: int = 256) -> None:
        self._items: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def get(self, url: str, name: str) -> Any:
        with self._lock:
            return self._items.get((url, name))

    def put(self, url: str, name: str, index: Any) -> None:
        with self._lock:
            self._items[(url, name)] = index
            self._items.move_to_end((url, name))
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)


SNAPSHOT_INDEX_CACHE = _IndexCache()


def _open_rocks(path: Path) -> Any:
    from blobstate.state.store import RocksStateStore

    return RocksStateStore.open(path)


class PartitionState:
    """An open partition: ``store`` for reads and writes, then :meth:`commit` or :meth:`abort`.

    Use it as a context manager (or call :meth:`close`): leaving without a commit aborts, so the
    working store stays dirty and the next open rebuilds it from a clean source.
    """

    def __init__(
        self,
        blob_store: BlobStore,
        layout: LocalPartitionLayout,
        lock: PartitionLock,
        store: Any,
        info: LineageInfo,
        report: LoadReport,
        *,
        policy: SnapshotPolicy,
        min_versions_to_retain: int,
        local_checkpoints_to_keep: int,
        pending_ttl: float,
        history: PartitionHistory,
    ) -> None:
        self.blob_store = blob_store
        self.history = history
        self.layout = layout
        self.store = store
        self.load_report = report
        self.policy = policy
        self.min_versions_to_retain = min_versions_to_retain
        self.local_checkpoints_to_keep = local_checkpoints_to_keep
        self.pending_ttl = pending_ttl
        self.result: CommitResult | None = None
        self._info = info
        self._lock = lock
        self._state = "open"

    # ------------------------------------------------------------------ properties
    @property
    def operator(self) -> str:
        """The operator id."""
        return self.layout.operator

    @property
    def partition(self) -> int:
        """The partition number."""
        return self.layout.partition

    @property
    def checkpoint_id(self) -> CheckpointId | None:
        """The checkpoint the store was loaded at (None for the empty version 0)."""
        return self._info.checkpoint_id

    @property
    def version(self) -> int:
        """The version the store was loaded at."""
        return self._info.version

    @property
    def lineage(self) -> tuple[str, ...]:
        """The lineage record the next commit's delta will carry."""
        return self._info.next_lineage

    @property
    def load_rule(self) -> str:
        """Which load rule brought the store here (``working``, ``local-checkpoint``, ``standby``, ...)."""
        return self.load_report.rule

    @property
    def restore_bytes(self) -> int:
        """Bytes downloaded to load the store."""
        return self.load_report.bytes_downloaded

    # ------------------------------------------------------------------ commit
    def commit(self, uid: str | None = None) -> CommitResult:
        """Write version v+1 under a fresh uid (see the module docstring); the state is closed after it.

        ``uid`` is the attempt's uid when the caller chose it before processing (the engine announces
        it in the stage's output); by default a new one.
        """
        self._require_open()
        self._state = "committing"
        started = time.monotonic()
        op, p, bs = self.operator, self.partition, self.blob_store
        new = CheckpointId(self.version + 1, validate_uid(uid) if uid is not None else new_uid())
        changelog_bytes = self.store.changelog_bytes
        records = self.store.take_changelog()
        lineage = self._info.next_lineage
        data = encode_delta(records, lineage)
        delta_ref = ObjectRef.of(data)
        dname = delta_name(op, p, new)
        bs.put(dname, data, ttl=self.pending_ttl)
        written = [dname]
        uploaded = len(data)

        deltas_since = self._info.deltas_since_snapshot + 1
        bytes_since = self._info.delta_bytes_since_snapshot + len(data)
        # A load that had to rebuild around an unusable snapshot takes a fresh one at once, so later
        # loads stop depending on it before retention removes what the rebuild needed.
        due = self.policy.due(deltas_since, bytes_since) or bool(self.load_report.snapshot_repairs)
        if due:
            new_info = LineageInfo(new, (new.uid,), 0, 0)
        else:
            new_info = LineageInfo(new, (new.uid, *lineage), deltas_since, bytes_since)
        checkpoint_dir = self._local_checkpoint(new, new_info)

        sname: str | None = None
        snapshot_ref: ObjectRef | None = None
        snapshot_error: str | None = None
        if due:
            try:
                sname, snap_written, snap_bytes, snapshot_ref = self._snapshot(new, lineage, checkpoint_dir)
                written += snap_written
                uploaded += snap_bytes
            except Exception as error:  # a failed snapshot leaves a presumed snapshot: loading walks past it
                snapshot_error = f"{type(error).__name__}: {error}"
                log.warning("snapshot of %s/%s at %s failed: %s", op, p, new, snapshot_error)

        self.store.close()
        self.store = None
        mark_clean(self.layout.working, new_info)
        self._info = new_info
        self._state = "committed"
        prune_checkpoints(self.layout.checkpoints, self.local_checkpoints_to_keep, protect=new)
        self.result = CommitResult(
            checkpoint_id=new,
            delta_name=dname,
            snapshot_name=sname,
            objects=PartitionObjects(delta_ref, snapshot_ref),
            objects_written=tuple(written),
            bytes_uploaded=uploaded,
            changelog_bytes=changelog_bytes,
            seconds=time.monotonic() - started,
            lineage=tuple(lineage),
            records=len(records),
            snapshot_error=snapshot_error,
        )
        return self.result

    def _local_checkpoint(self, cid: CheckpointId, info: LineageInfo) -> Path:
        checkpoints = self.layout.checkpoints
        checkpoints.mkdir(parents=True, exist_ok=True)
        final = self.layout.checkpoint(cid)
        tmp = checkpoints / f".{cid.name}.tmp"
        remove_tree(tmp)
        self.store.checkpoint(tmp)
        write_info(tmp, info)
        os.replace(tmp, final)
        fd = os.open(checkpoints, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return final

    def _previous_snapshot(self, lineage: tuple[str, ...], new: CheckpointId) -> tuple[str | None, Any]:
        """The newest existing snapshot on the lineage, to back up against incrementally (or none)."""
        if not lineage or self.load_report.snapshot_repairs:
            # After loading around an unusable snapshot, the next snapshot shares nothing with it.
            return None, None
        op, p, bs = self.operator, self.partition, self.blob_store
        presumed = CheckpointId(new.version - len(lineage), lineage[-1])
        try:
            chain = resolve_chain(bs, op, p, presumed, history=self.history, cached=True)
        except StateLoadError as error:
            log.warning("no previous snapshot for %s/%s at %s (%s): full snapshot", op, p, new, error)
            return None, None
        if chain.base_kind != "snapshot" or chain.base is None:
            return None, None
        name = snapshot_name(op, p, chain.base)
        index = SNAPSHOT_INDEX_CACHE.get(bs.url, name)
        if index is None:
            report = self.load_report
            if report.snapshot_index_name == name:
                index = report.snapshot_index
            else:
                try:
                    index = read_checked_snapshot_index(bs, name, chain.base, chain.refs[chain.base])
                except StateLoadError as error:
                    log.warning("previous snapshot %s unusable (%s): full snapshot", name, error)
                    return None, None
            SNAPSHOT_INDEX_CACHE.put(bs.url, name, index)
        return name, index

    def _snapshot(
        self, new: CheckpointId, lineage: tuple[str, ...], checkpoint_dir: Path
    ) -> tuple[str, list[str], int, ObjectRef]:
        from blobstate.snapshot import backup_directory

        op, p, bs = self.operator, self.partition, self.blob_store
        previous_name, previous = self._previous_snapshot(lineage, new)
        name = snapshot_name(op, p, new)
        result = backup_directory(
            bs,
            checkpoint_dir,
            index_name=name,
            blob_prefix=blob_prefix(op, p),
            previous=previous,
            previous_name=previous_name,
            checkpoint_id=new.name,
            metadata={
                "operator": op,
                "partition": str(p),
                "version": str(new.version),
                "uid": new.uid,
                "lineage": ",".join(lineage),
            },
            lineage=list(lineage),
            ttl=self.pending_ttl,
        )
        SNAPSHOT_INDEX_CACHE.put(bs.url, name, result.index)
        reused = previous.present_blob_ids() if previous is not None else set()
        new_blobs = sorted(result.index.present_blob_ids() - reused)
        nbytes = result.stats.bytes_uploaded + result.index_size
        return name, [*new_blobs, name], nbytes, ObjectRef(result.index_size, result.index_sha256)

    # ------------------------------------------------------------------ abort / close
    def abort(self) -> None:
        """Give up this attempt: nothing is written remotely, the working store stays dirty."""
        if self._state in ("open", "committing"):
            self._state = "aborted"
            store, self.store = self.store, None
            if store is not None:
                try:
                    store.close()
                except Exception:
                    log.exception("closing the working store of %s/%s failed", self.operator, self.partition)
        self._release()

    def close(self) -> None:
        """Release the partition (aborting if not committed). Idempotent."""
        if self._state in ("open", "committing"):
            self.abort()
        self._release()

    def _release(self) -> None:
        self._lock.release()
        if self._state == "committed":
            self._state = "closed"

    def _require_open(self) -> None:
        if self._state != "open":
            raise PartitionClosedError(
                f"partition {self.operator}/{self.partition} is {self._state}: open it again to write"
            )

    def __enter__(self) -> PartitionState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PartitionState({self.operator}/{self.partition} at {self.checkpoint_id}, {self._state})"


def open_partition(
    store: BlobStore,
    local_dir: str | os.PathLike[str],
    query_id: str,
    operator: str,
    partition: int,
    committed: CheckpointId | None,
    *,
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    snapshot_delta_bytes: int = DEFAULT_SNAPSHOT_DELTA_BYTES,
    min_versions_to_retain: int = DEFAULT_MIN_VERSIONS_TO_RETAIN,
    local_checkpoints_to_keep: int = DEFAULT_LOCAL_CHECKPOINTS_TO_KEEP,
    pending_ttl: float = DEFAULT_PENDING_TTL_SECONDS,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    history: PartitionHistory | None = None,
) -> PartitionState:
    """Open ``(operator, partition)`` at the committed checkpoint ``committed`` (None: empty version 0).

    Applies the load rules exactly (see :mod:`blobstate.state.loader`); raises
    :class:`~blobstate.state.errors.StateLoadError` subclasses naming the missing or corrupt object, its
    version and uid, and :class:`~blobstate.state.locking.PartitionLockedError` when another worker holds
    the partition longer than ``lock_timeout`` seconds.

    ``snapshot_every`` / ``snapshot_delta_bytes`` decide when :meth:`PartitionState.commit` uploads a
    snapshot; ``local_checkpoints_to_keep`` how many local hard-link checkpoints stay; ``pending_ttl``
    the TTL of everything uploaded. ``min_versions_to_retain`` is validated and kept on the state for
    callers; retention itself runs in the driver (:func:`blobstate.state.retention.after_commit`).
    ``history`` reads the checkpoint's commit log (the uids and object references of committed
    versions); by default one is made on ``store``.
    """
    if committed is not None and not isinstance(committed, CheckpointId):
        raise TypeError(f"committed must be a CheckpointId or None, not {type(committed).__name__}")
    policy = SnapshotPolicy(snapshot_every, snapshot_delta_bytes)
    validate_retention(min_versions_to_retain)
    if local_checkpoints_to_keep < 1:
        raise ValueError(f"local_checkpoints_to_keep must be at least 1, got {local_checkpoints_to_keep!r}")
    layout = LocalPartitionLayout(Path(local_dir), query_id, operator, partition)
    if history is None:
        from blobstate.lineage.commitlog import CommitLog

        history = PartitionHistory(CommitCache(CommitLog(store)), operator, partition)
    lock = PartitionLock(layout.lock_file).acquire(timeout=lock_timeout)
    try:
        loaded = load_working(store, layout, committed, _open_rocks, history)
    except BaseException:
        lock.release()
        raise
    return PartitionState(
        store,
        layout,
        lock,
        loaded.store,
        loaded.info,
        loaded.report,
        policy=policy,
        min_versions_to_retain=min_versions_to_retain,
        local_checkpoints_to_keep=local_checkpoints_to_keep,
        pending_ttl=pending_ttl,
        history=history,
    )
