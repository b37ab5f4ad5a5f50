"""One partition of one operator, engine-independent: open at a committed checkpoint, write, commit.

``open_partition`` opens the partition's working store as a :class:`~blobstate.state.local_copy.LocalCopy`
(the partition's process lock, after asking a standby sync of it on this host to stop), applies the load
rules (:mod:`blobstate.state.loader`) and returns a :class:`PartitionState` whose ``store`` is the open,
dirty working store. ``commit()`` writes version v+1 under a fresh uid:

1. take the changelog and upload ``<v+1>_<uid>.delta`` (lineage record first) with the pending TTL;
2. when a snapshot is due (every K versions, or when the deltas since the last snapshot exceed a byte
   size) take a local hard-link checkpoint ``checkpoints/<v+1>_<uid>/`` with its lineage info, and back it
   up as ``<v+1>_<uid>.snapshot``, incrementally against the previous snapshot on the lineage. Versions in
   between get no local checkpoint, as Spark's changelog checkpointing takes none between snapshots: it
   cost a fifth of a small partition's CPU per batch, open to close (``bench/partition_cost.py``), and
   only a retried batch would load from it; that one loads the committed version from the newest local
   checkpoint on its lineage (or nothing) and the deltas after it (rule 3 of :mod:`blobstate.state.loader`);
   a failed snapshot upload is reported, not fatal: the lineage presumes the snapshot and loading walks
   through the delta where it is missing (docs/DESIGN.md, "Load rules"). With ``snapshot_upload="inline"`` the
   upload runs here and this commit records it; with ``"background"`` (:mod:`blobstate.state.uploads`)
   a thread uploads it while the next batches run, and this version's commit records no snapshot;
4. before that, a finished background upload of the presumed snapshot on this commit's lineage is named
   (``late_snapshot``) when it is complete (its index exists), young enough that none of its pending
   objects can have expired, and incremental against the base the lineage still uses; failed, killed
   and superseded uploads are reported in ``snapshot_upload`` and forgotten;
5. close the store (which flushes it) and write ``CHECKPOINT-ID`` (the working store is clean at v+1);
6. when it took one, keep the newest few local checkpoints.

The driver then writes ``commits/<v+1>`` and runs :func:`blobstate.state.retention.after_commit`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from blobstate.blobstore import DEFAULT_PENDING_TTL_SECONDS, BlobStore
from blobstate.durable import fsync_dir
from blobstate.ids import CheckpointId, new_uid, validate_uid
from blobstate.layout import LocalPartitionLayout, blob_prefix, delta_name, snapshot_name, state_prefix
from blobstate.lineage.delta import encode_delta
from blobstate.lineage.refs import LateSnapshot, ObjectRef, PartitionObjects
from blobstate.snapshot.backup import BackupResult
from blobstate.snapshot.index import SnapshotIndex
from blobstate.state.chain import resolve_chain
from blobstate.state.errors import PartitionClosedError, StateLoadError
from blobstate.state.history import PartitionHistory
from blobstate.state.loader import LoadReport, read_checked_snapshot_index
from blobstate.state.local_copy import LocalCopy
from blobstate.state.localdirs import LineageInfo, prune_checkpoints, remove_tree, write_info
from blobstate.state.locking import DEFAULT_LOCK_TIMEOUT_SECONDS
from blobstate.state.policy import (
    DEFAULT_LOCAL_CHECKPOINTS_TO_KEEP,
    DEFAULT_MIN_VERSIONS_TO_RETAIN,
    DEFAULT_SNAPSHOT_DELTA_BYTES,
    DEFAULT_SNAPSHOT_EVERY,
    DEFAULT_SNAPSHOT_UPLOAD,
    SnapshotPolicy,
    validate_retention,
)
from blobstate.state.uploads import (
    DONE,
    UPLOADING,
    UploadDir,
    UploadJob,
    UploadStatus,
    background_store,
    start_upload,
    validate_mode,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    """What one commit of a partition wrote.

    ``objects_written`` are the names of every object uploaded (delta, snapshot index, new blobs);
    ``bytes_uploaded`` their total size; ``changelog_bytes`` the raw key and value bytes of the changes;
    ``lineage`` the lineage record written into the delta; ``snapshot_error`` why a due snapshot failed.
    ``objects`` are the references (size, SHA-256) of the delta and snapshot index that the driver's
    commit must record, and the earlier version's background snapshot it names (``late_snapshot``).
    ``snapshot_name`` is the snapshot index the commit records (taken inline, or named late);
    ``snapshot_upload`` reports background uploads: the one started, the one named, those in flight and
    those that failed (``failed``: one message each, never fatal).
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
    snapshot_upload: dict[str, Any] = field(default_factory=dict)


class _IndexCache:
    """Snapshot indexes by (store url, name): immutable, so a small LRU saves re-reading them.

    At most ``capacity`` indexes: a worker keeps the newest one it wrote of each partition (the next
    snapshot's base, :meth:`keep_only`), the driver's retention the ones it checked, minus those it
    deleted (:meth:`discard`)."""

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

    def discard(self, url: str, names: Iterable[str]) -> None:
        """Forget the indexes of ``names`` (deleted snapshots) of the store at ``url``."""
        with self._lock:
            for name in names:
                self._items.pop((url, name), None)

    def keep_only(self, url: str, prefix: str, name: str) -> None:
        """Forget every index of the store at ``url`` whose name starts with ``prefix`` but ``name``."""
        with self._lock:
            for key in [k for k in self._items if k[0] == url and k[1].startswith(prefix) and k[1] != name]:
                del self._items[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


SNAPSHOT_INDEX_CACHE = _IndexCache()


class PartitionState:
    """An open partition: ``store`` for reads and writes, then :meth:`commit` or :meth:`abort`.

    Use it as a context manager (or call :meth:`close`): leaving without a commit aborts, so the
    working store stays dirty and the next open rebuilds it from a clean source.
    """

    def __init__(
        self,
        copy: LocalCopy,
        store: Any,
        info: LineageInfo,
        report: LoadReport,
        *,
        policy: SnapshotPolicy,
        min_versions_to_retain: int,
        local_checkpoints_to_keep: int,
        pending_ttl: float,
        snapshot_upload: str = "inline",
    ) -> None:
        self.blob_store = copy.store
        self.history = copy.history
        self.layout = copy.layout
        self.store = store
        self.load_report = report
        self.policy = policy
        self.min_versions_to_retain = min_versions_to_retain
        self.local_checkpoints_to_keep = local_checkpoints_to_keep
        self.pending_ttl = pending_ttl
        self.snapshot_upload = validate_mode(snapshot_upload)
        self.uploads = UploadDir(self.layout.root / "snapshots")
        self.result: CommitResult | None = None
        self._info = info
        self._copy = copy
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
        repair = bool(self.load_report.snapshot_repairs)
        due = self.policy.due(deltas_since, bytes_since) or repair
        if due:
            new_info = LineageInfo(new, (new.uid,), 0, 0)
        else:
            new_info = LineageInfo(new, (new.uid, *lineage), deltas_since, bytes_since)
        checkpoint_dir = self._local_checkpoint(new, new_info) if due else None

        report: dict[str, Any] = {"mode": self.snapshot_upload, "in_flight": [], "failed": []}
        late = self._late_snapshot(new, report)
        sname: str | None = None
        snapshot_ref: ObjectRef | None = None
        snapshot_error: str | None = None
        # A repair snapshot is taken inline: the next load must not depend on the unusable one.
        inline = self.snapshot_upload == "inline" or repair
        if checkpoint_dir is not None and inline:
            try:
                sname, snap_written, snap_bytes, snapshot_ref = self._snapshot(
                    new, lineage, checkpoint_dir, late
                )
                written += snap_written
                uploaded += snap_bytes
                late = None  # this version's own snapshot supersedes the earlier one
            except Exception as error:  # a failed snapshot leaves a presumed snapshot: loading walks past it
                snapshot_error = f"{type(error).__name__}: {error}"
                log.warning("snapshot of %s/%s at %s failed: %s", op, p, new, snapshot_error)
        elif checkpoint_dir is not None:
            try:
                report["started"] = self._start_background(
                    new, lineage, checkpoint_dir, late
                ).checkpoint_id.name
            except Exception as error:
                snapshot_error = f"{type(error).__name__}: {error}"
                log.warning("background snapshot of %s/%s at %s not started: %s", op, p, new, snapshot_error)
        if late is not None:
            report["named"] = late.checkpoint_name
            self.uploads.add_named_by(CheckpointId(late.version, late.uid), new)
            sname = sname or snapshot_name(op, p, CheckpointId(late.version, late.uid))

        self.store.close()
        self.store = None
        self._copy.mark_clean(new_info)
        self._info = new_info
        self._state = "committed"
        if checkpoint_dir is not None:
            prune_checkpoints(self.layout.checkpoints, self.local_checkpoints_to_keep, protect=new)
        self.result = CommitResult(
            checkpoint_id=new,
            delta_name=dname,
            snapshot_name=sname,
            objects=PartitionObjects(delta_ref, snapshot_ref, late),
            objects_written=tuple(written),
            bytes_uploaded=uploaded,
            changelog_bytes=changelog_bytes,
            seconds=time.monotonic() - started,
            lineage=tuple(lineage),
            records=len(records),
            snapshot_error=snapshot_error,
            snapshot_upload=report,
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
        fsync_dir(checkpoints)
        return final

    def _snapshot_base(
        self, lineage: tuple[str, ...], new: CheckpointId, late: LateSnapshot | None
    ) -> tuple[CheckpointId, ObjectRef] | None:
        """The snapshot to back ``new`` up against incrementally: the base the lineage uses as of this
        commit (the snapshot it names late, if any), or None for a full snapshot."""
        if not lineage or self.load_report.snapshot_repairs:
            # After loading around an unusable snapshot, the next snapshot shares nothing with it.
            return None
        if late is not None:
            return CheckpointId(late.version, late.uid), late.index
        op, p, bs = self.operator, self.partition, self.blob_store
        presumed = CheckpointId(new.version - len(lineage), lineage[-1])
        try:
            chain = resolve_chain(
                bs, op, p, presumed, history=self.history, cached=True, upto=new.version - 1
            )
        except StateLoadError as error:
            log.warning("no previous snapshot for %s/%s at %s (%s): full snapshot", op, p, new, error)
            return None
        if chain.base_kind != "snapshot" or chain.base is None:
            return None
        ref = chain.refs[chain.base].snapshot
        assert ref is not None
        return chain.base, ref

    def _base_index(
        self, base: tuple[CheckpointId, ObjectRef] | None, store: BlobStore | None = None
    ) -> tuple[str | None, Any]:
        """The base snapshot's name and checked index (cached), or ``(None, None)``: full snapshot."""
        if base is None:
            return None, None
        cid, ref = base
        bs = store or self.blob_store
        name = snapshot_name(self.operator, self.partition, cid)
        index = SNAPSHOT_INDEX_CACHE.get(bs.url, name)
        if index is None:
            report = self.load_report
            if report.snapshot_index_name == name:
                index = report.snapshot_index
            else:
                try:
                    index = read_checked_snapshot_index(bs, name, cid, SimpleNamespace(snapshot=ref))
                except StateLoadError as error:
                    log.warning("previous snapshot %s unusable (%s): full snapshot", name, error)
                    return None, None
            SNAPSHOT_INDEX_CACHE.put(bs.url, name, index)
        return name, index

    def _backup(
        self,
        new: CheckpointId,
        lineage: tuple[str, ...],
        source: Path,
        previous_name: str | None,
        previous: Any,
        store: BlobStore | None = None,
    ) -> tuple[str, list[str], int, ObjectRef]:
        op, p, bs = self.operator, self.partition, store or self.blob_store
        name = snapshot_name(op, p, new)
        result = upload_snapshot(
            bs,
            source,
            op,
            p,
            new,
            lineage,
            previous_name=previous_name,
            previous=previous,
            ttl=self.pending_ttl,
        )
        SNAPSHOT_INDEX_CACHE.put(bs.url, name, result.index)
        # The partition's next snapshot builds on this one or a newer one, never on an older one: a worker
        # keeps one index per partition (also when its partitions move between worker processes).
        SNAPSHOT_INDEX_CACHE.keep_only(bs.url, state_prefix(op, p), name)
        reused = previous.present_blob_ids() if previous is not None else set()
        new_blobs = sorted(result.index.present_blob_ids() - reused)
        nbytes = result.stats.bytes_uploaded + result.index_size
        return name, [*new_blobs, name], nbytes, ObjectRef(result.index_size, result.index_sha256)

    def _snapshot(
        self, new: CheckpointId, lineage: tuple[str, ...], checkpoint_dir: Path, late: LateSnapshot | None
    ) -> tuple[str, list[str], int, ObjectRef]:
        previous_name, previous = self._base_index(self._snapshot_base(lineage, new, late))
        return self._backup(new, lineage, checkpoint_dir, previous_name, previous)

    def _start_background(
        self, new: CheckpointId, lineage: tuple[str, ...], checkpoint_dir: Path, late: LateSnapshot | None
    ) -> UploadStatus:
        """Start uploading ``new``'s snapshot on a background thread (the base is decided now)."""
        base = self._snapshot_base(lineage, new, late)
        base_name = None if base is None else snapshot_name(self.operator, self.partition, base[0])
        store = background_store(self.blob_store)

        def backup(files: Path) -> tuple[ObjectRef, int, str | None]:
            previous_name, previous = self._base_index(base, store)
            _, _, nbytes, ref = self._backup(new, lineage, files, previous_name, previous, store)
            return ref, nbytes, previous_name

        return start_upload(self.uploads, UploadJob(new, checkpoint_dir, base_name, backup))

    def _late_snapshot(self, new: CheckpointId, report: dict[str, Any]) -> LateSnapshot | None:
        """The finished background snapshot this commit names, if any (see the module docstring, step 4).

        Reports uploads in flight and failed ones in ``report`` and forgets what can never be named.
        """
        lineage = self._info.next_lineage
        committed = {self.version - i: uid for i, uid in enumerate(lineage)}
        presumed = CheckpointId(self.version - len(lineage) + 1, lineage[-1]) if lineage else None
        candidate: UploadStatus | None = None
        for status in self.uploads.statuses():
            cid = status.checkpoint_id
            if status.state == UPLOADING and status.process_alive():
                report["in_flight"].append(cid.name)
                continue
            if status.state == DONE:
                if cid == presumed:
                    candidate = status
                    continue
                if cid.version > self.version:
                    continue  # an attempt at a version not committed yet: its commit may still name it
                # Older than the presumed snapshot, or an attempt that was not committed: never named.
            elif status.state == UPLOADING:
                report["failed"].append(f"{cid.name}: the uploading process {status.pid} died mid-upload")
            else:
                report["failed"].append(f"{cid.name}: {status.error}")
            self.uploads.forget(cid)
        if candidate is None or presumed is None or candidate.index is None:
            return None
        if any(committed.get(a.version) == a.uid for a in self.uploads.named_by(presumed)):
            return None  # a committed version already names it
        try:
            if self.history.late_snapshot(presumed, self.version) is not None:
                return None  # named by an attempt of another process that was committed
        except StateLoadError as error:
            report["failed"].append(f"{presumed.name}: cannot read the commits after it ({error}); not used")
            return None
        problem = self._unnamable(presumed, candidate)
        if problem is not None:
            report["failed"].append(f"{presumed.name}: {problem}; not used")
            self.uploads.forget(presumed)
            return None
        report["named_upload_seconds"] = round(candidate.seconds, 4)
        report["named_bytes"] = candidate.bytes_uploaded
        return LateSnapshot(presumed.version, presumed.uid, candidate.index)

    def _unnamable(self, presumed: CheckpointId, status: UploadStatus) -> str | None:
        """Why the finished upload ``status`` of ``presumed`` must not be named (None: it may be)."""
        op, p, bs = self.operator, self.partition, self.blob_store
        age = time.time() - status.started_ms / 1000
        if age > self.pending_ttl / 2:
            return f"finished {age:.0f}s after it started, too close to its objects' pending TTL"
        # Its base must still be the base the lineage uses: retention kept that one's blobs throughout.
        if status.base is not None:
            try:
                chain = resolve_chain(
                    bs, op, p, presumed, history=self.history, cached=True, upto=self.version
                )
            except StateLoadError as error:
                return f"the lineage below it cannot be resolved ({error})"
            current = (
                snapshot_name(op, p, chain.base) if chain.base_kind == "snapshot" and chain.base else None
            )
            if current != status.base:
                return f"it is incremental against {status.base}, no longer the lineage's base ({current})"
        if not bs.exists(snapshot_name(op, p, presumed)):
            return "its index is missing from the store"
        return None

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
        self._copy.close()
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


def upload_snapshot(
    store: BlobStore,
    source: Path,
    operator: str,
    partition: int,
    checkpoint_id: CheckpointId,
    lineage: tuple[str, ...],
    *,
    previous_name: str | None = None,
    previous: SnapshotIndex | None = None,
    ttl: float,
) -> BackupResult:
    """Upload the store checkpoint in ``source`` as ``checkpoint_id``'s snapshot of one partition: its
    index named and described (operator, partition, version, uid, lineage) as every partition snapshot
    is, its blobs pending for ``ttl`` seconds; incremental against ``previous`` when given."""
    from blobstate.snapshot import backup_directory

    return backup_directory(
        store,
        source,
        index_name=snapshot_name(operator, partition, checkpoint_id),
        blob_prefix=blob_prefix(operator, partition),
        previous=previous,
        previous_name=previous_name,
        checkpoint_id=checkpoint_id.name,
        metadata={
            "operator": operator,
            "partition": str(partition),
            "version": str(checkpoint_id.version),
            "uid": checkpoint_id.uid,
            "lineage": ",".join(lineage),
        },
        lineage=list(lineage),
        ttl=ttl,
    )


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
    snapshot_upload: str = DEFAULT_SNAPSHOT_UPLOAD,
) -> PartitionState:
    """Open ``(operator, partition)`` at the committed checkpoint ``committed`` (None: empty version 0).

    Asks a standby sync of the partition on this host to stop, takes the partition's lock and applies
    the load rules exactly (see :mod:`blobstate.state.local_copy` and :mod:`blobstate.state.loader`); raises
    :class:`~blobstate.state.errors.StateLoadError` subclasses naming the missing or corrupt object, its
    version and uid, and :class:`~blobstate.state.locking.PartitionLockedError` when another worker holds
    the partition longer than ``lock_timeout`` seconds.

    ``snapshot_every`` / ``snapshot_delta_bytes`` decide when :meth:`PartitionState.commit` uploads a
    snapshot, and ``snapshot_upload`` (``inline`` or ``background``) whether inside the commit or on a
    background thread; ``local_checkpoints_to_keep`` how many local hard-link checkpoints stay;
    ``pending_ttl`` the TTL of everything uploaded. ``min_versions_to_retain`` is validated and kept on
    the state for callers; retention itself runs in the driver
    (:func:`blobstate.state.retention.after_commit`).
    ``history`` reads the checkpoint's commit log (the uids and object references of committed
    versions); by default one is made on ``store``.
    """
    if committed is not None and not isinstance(committed, CheckpointId):
        raise TypeError(f"committed must be a CheckpointId or None, not {type(committed).__name__}")
    policy = SnapshotPolicy(snapshot_every, snapshot_delta_bytes)
    validate_mode(snapshot_upload)
    validate_retention(min_versions_to_retain)
    if local_checkpoints_to_keep < 1:
        raise ValueError(f"local_checkpoints_to_keep must be at least 1, got {local_checkpoints_to_keep!r}")
    layout = LocalPartitionLayout(Path(local_dir), query_id, operator, partition)
    copy = LocalCopy.open(store, layout, history=history, lock_timeout=lock_timeout, stop_syncs=True)
    try:
        loaded = copy.bring_to(committed)
    except BaseException:
        copy.close()
        raise
    return PartitionState(
        copy,
        loaded.store,
        loaded.info,
        loaded.report,
        policy=policy,
        min_versions_to_retain=min_versions_to_retain,
        local_checkpoints_to_keep=local_checkpoints_to_keep,
        pending_ttl=pending_ttl,
        snapshot_upload=snapshot_upload,
    )
