"""Standalone backup repositories: fenced backups, verified reads, gc and verify.

A repository (made by ``blobstate backup``) holds, at its root::

    blobstate-repository.json   the repository marker, written before anything else
    9999999999999999999_00000000000000000000000000000000.snapshot
                                the guard (:data:`GUARD_INDEX`): not a snapshot; stops builds from before
                                the head log (see below)
    heads/<n>.json              the head log: backup n committed this index (create-only; pruned below
                                the newest head's horizon)
    <n>_<uid>.snapshot          snapshot indexes (blobstate.snapshot.index)
    data/<hex>                  file contents the indexes reference (``blobs/<hex>`` in repositories
                                written before the guard, until their next backup)

A backup uploads its blobs and its index pending (with a TTL), then commits by creating ``heads/<n>.json``
(:class:`~blobstate.snapshot.heads.HeadLog`): of two backups racing for version n one wins, the other
fails with :class:`BackupConflictError` and its objects expire. Only the winner then runs the post-commit
cleanup, which makes its snapshot permanent and deletes what the previous one had and it does not. The
newest snapshot is always the one the highest head names, and its index is checked against the size and
CRC-32 the head records before it is parsed; the index in turn records every blob's CRC-32 and length.
Each head declares a horizon, the backup it was made against: once its cleanup is done (that older
snapshot's index is deleted by then), the heads below the horizon are pruned, so a repository holds two
heads in the steady state however many backups it received. A crash part-way through pruning leaves the
oldest heads, which the next backup or gc prunes.

Builds from before the head log cannot be changed, and they know nothing of ``heads/``: their backup
takes the root index with the highest ``n`` for the newest snapshot and its cleanup deletes that index
and the blobs only it referenced; their ``gc --full`` deletes every permanent object under ``blobs/``.
So this release keeps no committed blob under ``blobs/``, and the guard, an object named as a root index
of the highest version any build parses, holds JSON that no build parses as an index: such a build's
backup, restore and inspect read it first and stop with an error naming it, before they write anything.
A repository written before the guard gets it from its next backup or gc, and its next backup uploads
again the files whose blobs lie under ``blobs/`` (into ``data/``); its cleanup deletes the old ones.

Repositories written before the head log existed (indexes, but neither ``heads/`` nor the marker) are
read by restore and inspect when their newest index is unambiguous and permanent, unverified; backup and
gc refuse them (:class:`LegacyRepositoryError`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from blobstate.blobstore.base import DEFAULT_PENDING_TTL_SECONDS, BlobNotFoundError, BlobStore
from blobstate.errors import BlobStoreError
from blobstate.ids import CheckpointId, new_uid
from blobstate.layout import COMMITS_PREFIX, METADATA
from blobstate.snapshot.backup import DEFAULT_CHUNK_SIZE, BackupResult, Progress, backup_directory
from blobstate.snapshot.checksum import DEFAULT_CHECKSUM_CACHE, ChecksumCache, crc32
from blobstate.snapshot.cleanup import CleanupStats, post_commit_cleanup
from blobstate.snapshot.heads import (
    HEADS_PREFIX,
    HeadLog,
    HeadLogError,
    HeadRecord,
    HeadScan,
    head_name,
    index_name,
    parse_index_name,
)
from blobstate.snapshot.index import (
    FileBlob,
    SnapshotBlobMissingError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotIndex,
)
from blobstate.snapshot.restore import (
    RestoreStats,
    check_restore_target,
    read_snapshot_index,
    restore_directory,
)

BLOB_PREFIX = "data/"
"""Where this release writes a repository's blobs: not ``blobs/``, whose every permanent object the
``gc --full`` of builds from before the head log deletes."""

FORMER_BLOB_PREFIX = "blobs/"
"""Where repositories written before the guard keep their blobs: read, swept by gc, and emptied by their
next backup (which uploads those files again under :data:`BLOB_PREFIX`)."""

GUARD_INDEX = "9999999999999999999_00000000000000000000000000000000.snapshot"
"""Not a snapshot: the root index of the highest version any build parses, holding JSON no build parses
as an index. A build from before the head log takes it for the newest snapshot and stops reading it,
before it writes anything. Never named by a head, never deleted, not in :func:`root_indexes`."""

GUARD_MESSAGE = (
    "not a snapshot: this backup repository has a head log (heads/), which this blobstate predates and "
    "would damage; use the blobstate that wrote it, or a newer one"
)
"""What the guard's ``schemaVersion`` holds: builds that read only schema version 1 name it in their error."""

REPOSITORY_MARKER = "blobstate-repository.json"
"""Created by the first backup before anything else: tells a repository with a head log from an older one."""

REPOSITORY_FORMAT_VERSION = 1

_RACE_RETRIES = 5

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RepositoryError(SnapshotError):
    """A backup repository that cannot be used as asked; the message names it and says what to do."""


class NoSnapshotError(RepositoryError):
    """The repository has no committed snapshot (or not the one asked for)."""


class LegacyRepositoryError(RepositoryError):
    """A repository written before the head log existed: readable, but not safely writable or sweepable."""


class BackupConflictError(RepositoryError):
    """Another backup committed the version this backup meant to commit; nothing of this one committed."""

    def __init__(self, message: str, *, version: int, winner: str) -> None:
        super().__init__(message)
        self.version = version
        self.winner = winner


@dataclass(frozen=True)
class CommittedSnapshot:
    """A snapshot read from a repository: its index object's name, the index, and the head naming it."""

    name: str
    index: SnapshotIndex
    head: HeadRecord | None
    """None only for a repository without a head log (read unverified)."""

    @property
    def version(self) -> int:
        """The backup number (``n`` of ``<n>_<uid>.snapshot``)."""
        cid = parse_index_name(self.name)
        return cid.version if cid is not None else 0


def _while_the_log_moves(store: BlobStore, log: HeadLog, read: Callable[[], T]) -> T:
    """``read()``, again while it fails because a backup committed meanwhile and cleaned up behind it.

    A committing backup's cleanup deletes the previous index and what only it referenced; a reader that
    started from the previous head then finds an object missing. That is a race, not damage, when the
    head log has moved on: the read is repeated from the new newest head.
    """
    for _ in range(_RACE_RETRIES):
        before = log.latest()
        try:
            return read()
        except SnapshotBlobMissingError:
            if log.latest() == before:
                raise  # nothing committed meanwhile: the object really is missing
    raise RepositoryError(f"backups kept committing to {store.url} while it was read; try again")


# ---------------------------------------------------------------------------------------------- layout
def root_indexes(store: BlobStore) -> list[str]:
    """Every ``<n>_<uid>.snapshot`` object at the repository's root, committed or not, but the guard."""
    names: list[str] = []
    for digit in "0123456789":  # one listing per leading digit: never lists the blobs on S3
        names.extend(n for n in store.list(digit) if n != GUARD_INDEX and parse_index_name(n) is not None)
    return sorted(names)


def guard_bytes() -> bytes:
    """The bytes of :data:`GUARD_INDEX`: JSON whose ``schemaVersion`` is :data:`GUARD_MESSAGE`."""
    return json.dumps(
        {
            "schemaVersion": GUARD_MESSAGE,
            "kind": "blobstate backup repository guard",
            "repository_format_version": REPOSITORY_FORMAT_VERSION,
        },
        indent=1,
    ).encode("utf-8")


def _ensure_guard(store: BlobStore) -> bool:
    """Create the guard (permanent) unless it exists; whether this call created it.

    Called only once the marker exists: the release before this one lists the guard among the root
    indexes, and a repository with root indexes but neither marker nor head it takes for one from
    before the head log.
    """
    return store.put_if_absent(GUARD_INDEX, guard_bytes())


def is_backup_repository(store: BlobStore) -> bool:
    """Whether ``store`` holds a backup repository (its marker, a head log, or root snapshot indexes).

    A query checkpoint (``metadata.json``) without a head log is not one; an empty location is not one.
    """
    if store.exists(REPOSITORY_MARKER) or store.list(HEADS_PREFIX):
        return True
    if store.exists(METADATA):
        return False
    return bool(root_indexes(store))


def _read_marker(store: BlobStore) -> bool:
    """Whether the repository marker exists; one of another format version is refused."""
    try:
        data = store.get(REPOSITORY_MARKER)
    except BlobNotFoundError:
        return False
    try:
        version = json.loads(data).get("format_version")
    except (ValueError, AttributeError):
        version = None
    if version != REPOSITORY_FORMAT_VERSION:
        raise RepositoryError(
            f"{REPOSITORY_MARKER} in {store.url} declares repository format {version!r}; this blobstate "
            f"writes and reads format {REPOSITORY_FORMAT_VERSION}: use the blobstate that wrote it"
        )
    return True


def _ensure_marker(store: BlobStore) -> None:
    """Create the repository marker (before anything else of a first backup), or check the one there."""
    data = json.dumps(
        {"format_version": REPOSITORY_FORMAT_VERSION, "kind": "blobstate backup repository"}, indent=1
    ).encode("utf-8")
    if not store.put_if_absent(REPOSITORY_MARKER, data):
        _read_marker(store)


def _refuse_query_checkpoint(store: BlobStore, action: str) -> None:
    if store.exists(METADATA) or store.list(COMMITS_PREFIX):
        raise RepositoryError(
            f"{store.url} holds a query checkpoint ({METADATA}, {COMMITS_PREFIX}); refusing to {action} a "
            "backup repository there: use a location of its own for backups"
        )


def _refuse_overlap(store: BlobStore, path: str | os.PathLike[str], what: str) -> None:
    from blobstate.blobstore.local import LocalBlobStore

    if not isinstance(store, LocalBlobStore):
        return
    root = Path(os.path.realpath(store.root))
    resolved = Path(os.path.realpath(os.fspath(path)))
    if root.is_relative_to(resolved) or resolved.is_relative_to(root):
        relation = "contains" if root.is_relative_to(resolved) else "lies inside"
        raise RepositoryError(
            f"{what} {os.fspath(path)!r} {relation} the repository {store.url} ({str(root)!r}); "
            "keep the repository outside the directories it backs up or restores"
        )


def _legacy_indexes(store: BlobStore) -> list[str]:
    """The root indexes of a repository written before the head log existed; [] for any other.

    Such a repository has no marker: every backup since creates the marker before it writes anything,
    so the marker is checked after the indexes are listed, and an index of a current repository always
    finds it.
    """
    indexes = root_indexes(store)
    if not indexes or _read_marker(store):
        return []
    return indexes


def _legacy_error(store: BlobStore, indexes: list[str], action: str) -> LegacyRepositoryError:
    shown = ", ".join(repr(n) for n in indexes[-3:])
    return LegacyRepositoryError(
        f"{store.url} has snapshot indexes ({shown}) but no head log ({HEADS_PREFIX}): it was written by "
        f"an older blobstate, whose backups were not fenced; refusing to {action} it. Restore it "
        "(blobstate restore URL DIR) and back up into a new repository"
    )


# ---------------------------------------------------------------------------------------------- reading
def _read_committed(store: BlobStore, head: HeadRecord) -> CommittedSnapshot:
    """The index ``head`` names, checked against the head's size and checksum before it is parsed."""
    try:
        index = read_snapshot_index(store, head.index, size=head.index_size, checksum=head.index_checksum)
    except BlobNotFoundError:
        raise SnapshotBlobMissingError(
            f"snapshot index {head.index!r}, committed by {head_name(head.version)}, is missing from "
            f"{store.url}: the repository was damaged",
            blob_id=head.index,
        ) from None
    _check_names(store, head.index, index, head.previous)
    return CommittedSnapshot(head.index, index, head)


def _check_names(store: BlobStore, name: str, index: SnapshotIndex, previous: str | None) -> None:
    stem = name.removesuffix(".snapshot")
    if index.checkpoint_id != stem:
        raise SnapshotFormatError(
            f"snapshot index {name!r} in {store.url} says it is checkpoint {index.checkpoint_id!r}"
        )
    if previous is not None and index.prev_snapshot_index != previous:
        raise SnapshotFormatError(
            f"snapshot index {name!r} in {store.url} was made against {index.prev_snapshot_index!r}, "
            f"but its head record says {previous!r}"
        )


def _read_legacy(store: BlobStore, name: str | None, indexes: list[str]) -> CommittedSnapshot:
    if name is None:
        top = max(parse_index_name(n).version for n in indexes)  # type: ignore[union-attr]
        newest = [n for n in indexes if parse_index_name(n).version == top]  # type: ignore[union-attr]
        if len(newest) > 1:
            raise NoSnapshotError(
                f"{store.url} has no head log ({HEADS_PREFIX}) and several snapshot indexes at version "
                f"{top} ({', '.join(map(repr, newest))}); choose one with --snapshot NAME"
            )
        name = newest[0]
    if name not in indexes or store.has_ttl(name):
        raise NoSnapshotError(
            f"no snapshot {name!r} in {store.url} that finished: it is missing or still pending"
        )
    index = read_snapshot_index(store, name)
    _check_names(store, name, index, None)
    return CommittedSnapshot(name, index, None)


def read_snapshot(store: BlobStore, name: str | None = None) -> CommittedSnapshot:
    """The newest committed snapshot of the repository, or the committed snapshot ``name``.

    Found from the head log, never by guessing among indexes; the index is checked against its head's
    size and checksum before it is parsed. A name no head commits raises :class:`NoSnapshotError` (an
    attempt that lost a race or never finished). Repositories without a head log are read when their
    newest index is unambiguous and permanent (see the module docstring).
    """
    log = HeadLog(store)
    scan = log.scan()
    if scan.newest is None:
        legacy = _legacy_indexes(store)
        if legacy:
            return _read_legacy(store, name, legacy)
        scan = log.scan()  # a first backup may have committed meanwhile
        if scan.newest is None:
            attempts = len(root_indexes(store))
            raise NoSnapshotError(
                f"no snapshot in {store.url}"
                + (f": {attempts} backup(s) never committed (their objects expire)" if attempts else "")
            )
    if name is None:
        return _while_the_log_moves(store, log, lambda: _read_newest(store, log))
    cid = parse_index_name(name)
    if cid is None or cid.version > scan.latest:
        raise NoSnapshotError(
            f"{name!r} is not a committed snapshot of {store.url} (the newest is {scan.newest.index!r}, "
            f"backup {scan.latest}, named by {head_name(scan.latest)})"
        )
    if cid.version < scan.horizon:
        raise _superseded(store, name, scan.newest, f"the heads below {head_name(scan.horizon)} were pruned")
    try:
        head = log.read(cid.version)
    except BlobNotFoundError:  # pruned since the scan: backups committed meanwhile
        raise _superseded(store, name, scan.newest, f"{head_name(cid.version)} was pruned") from None
    if head.index != name:
        raise NoSnapshotError(
            f"{name!r} is not a committed snapshot of {store.url}: version {cid.version} committed "
            f"{head.index!r} ({head_name(cid.version)}); {name!r} lost the race or never finished"
        )
    try:
        return _read_committed(store, head)
    except SnapshotBlobMissingError as error:
        if error.blob_id != head.index or cid.version == log.latest():
            raise
        raise _superseded(store, name, scan.newest, "a newer backup's cleanup deleted its index") from None


def _superseded(store: BlobStore, name: str, newest: HeadRecord, why: str) -> NoSnapshotError:
    return NoSnapshotError(
        f"{name!r} is no longer kept in {store.url}: a repository keeps its newest snapshot and newer "
        f"backups superseded this one ({why}); the newest is {newest.index!r} (backup {newest.version})"
    )


def _read_newest(store: BlobStore, log: HeadLog) -> CommittedSnapshot:
    newest = log.scan().newest
    if newest is None:  # pragma: no cover - the newest head is never pruned
        raise NoSnapshotError(f"no snapshot in {store.url}")
    return _read_committed(store, newest)


def _newest_for_writing(
    store: BlobStore, log: HeadLog, action: str
) -> tuple[CommittedSnapshot | None, HeadScan]:
    """The newest committed snapshot (None: nothing committed) and the scan of the head log it came from."""
    scan = log.scan()
    if scan.newest is None:
        legacy = _legacy_indexes(store)
        if legacy:
            raise _legacy_error(store, legacy, action)
        scan = log.scan()  # a first backup may have committed meanwhile
        if scan.newest is None:
            return None, scan  # nothing committed; indexes of attempts that never committed expire
    return _read_committed(store, scan.newest), scan


@dataclass(frozen=True)
class _Finished:
    newest: CommittedSnapshot | None
    cleanup: CleanupStats | None
    heads_pruned: list[int]


def _finish_cleanup(store: BlobStore, log: HeadLog, action: str) -> _Finished:
    """Finish the post-commit cleanup of the newest committed backup, then prune the heads below its
    horizon; returns it and what was done."""

    def finish() -> _Finished:
        newest, scan = _newest_for_writing(store, log, action)
        if newest is None:
            return _Finished(None, None, [])
        cleanup = post_commit_cleanup(store, newest.name, newest.index)
        return _Finished(newest, cleanup, log.prune(scan.horizon, scan.versions))

    return _while_the_log_moves(store, log, finish)


# ---------------------------------------------------------------------------------------------- backup
@dataclass(frozen=True)
class RepositoryBackup:
    """What :func:`backup_to_repository` committed."""

    version: int
    head: HeadRecord
    result: BackupResult
    cleanup: CleanupStats | None
    """The post-commit cleanup; None when it failed (see :attr:`warning`)."""
    warning: str | None = None
    """Why the committed backup's cleanup did not finish (the next backup or ``gc`` finishes it)."""
    heads_pruned: list[int] = field(default_factory=list)
    """Versions whose heads this backup pruned: those a pruning cut short left below the previous head's
    horizon, then those below its own once its cleanup was done."""


def backup_to_repository(
    store: BlobStore,
    source_dir: str | os.PathLike[str],
    *,
    metadata: dict[str, str] | None = None,
    progress: Progress | None = None,
    ttl: float = DEFAULT_PENDING_TTL_SECONDS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    checksum_cache: ChecksumCache | None = DEFAULT_CHECKSUM_CACHE,
) -> RepositoryBackup:
    """Back up ``source_dir`` as the next version of the repository, fenced by the head log.

    Finishes the newest backup's cleanup, creates the marker and the guard (:data:`GUARD_INDEX`) unless
    they exist, uploads what changed against it (pending) under :data:`BLOB_PREFIX`, writes the index
    (pending), then creates ``heads/<n+1>.json`` with horizon ``n`` (the backup it was made against).
    A file whose blobs the previous snapshot keeps under :data:`FORMER_BLOB_PREFIX` is uploaded again,
    so the cleanup deletes the old blobs and nothing committed stays under ``blobs/``.
    If another backup created it first this raises :class:`BackupConflictError` naming the version:
    nothing of this backup was committed, its objects expire, and the winner's snapshot is untouched.
    Otherwise the post-commit cleanup runs, then the heads below the horizon are pruned; once the head is
    created the backup has committed and never raises: a cleanup or pruning that fails is logged and
    returned as :attr:`RepositoryBackup.warning` (the next backup or gc finishes it). A source that
    contains the repository, or lies inside it, is refused.
    """
    _refuse_overlap(store, source_dir, "backup source")
    _refuse_query_checkpoint(store, "back up into")
    log = HeadLog(store)
    finished = _finish_cleanup(store, log, "back up into")
    previous = finished.newest
    _ensure_marker(store)
    _ensure_guard(store)
    version = previous.version + 1 if previous is not None else 1
    cid = CheckpointId(version, new_uid())
    result = backup_directory(
        store,
        source_dir,
        index_name=index_name(cid),
        blob_prefix=BLOB_PREFIX,
        reuse_prefix=BLOB_PREFIX,  # files kept under FORMER_BLOB_PREFIX are uploaded again
        previous=previous.index if previous is not None else None,
        previous_name=previous.name if previous is not None else None,
        checkpoint_id=cid.name,
        metadata=metadata,
        ttl=ttl,
        chunk_size=chunk_size,
        progress=progress,
        checksum_cache=checksum_cache,
    )
    head = HeadRecord(
        version=version,
        index=result.index_name,
        index_size=result.index_size,
        index_checksum=result.index_checksum,
        previous=previous.name if previous is not None else None,
        writer=cid.uid,
        horizon=previous.version if previous is not None else 1,
    )
    standing = _write_head(store, log, head)
    if standing.index != head.index:
        raise BackupConflictError(
            f"another backup committed version {version} of {store.url} first ({head_name(version)} "
            f"names {standing.index!r}): this backup of {os.fspath(source_dir)!r} was not committed and "
            "its uploaded objects stay pending until they expire; run it again to back up on top of the "
            "new snapshot",
            version=version,
            winner=standing.index,
        )
    landed = _where_it_landed(store, log, head)
    if landed.stale:
        store.delete_if_exists(head_name(version))  # below the horizon: ignored by readers, as if pruned
        raise BackupConflictError(
            f"backups up to version {landed.newest.version} of {store.url} committed while this backup "
            f"of {os.fspath(source_dir)!r} ran, and version {version}'s head was pruned before this one's "
            "landed: this backup was not committed and its uploaded objects stay pending until they "
            "expire; run it again to back up on top of the newest snapshot",
            version=version,
            winner=landed.newest.index,
        )
    if landed.superseded:
        # Committed, then superseded: newer backups finished its cleanup and pruned its head meanwhile.
        return RepositoryBackup(version, head, result, None)
    # Committed: from here on nothing may report the backup as failed.
    try:
        cleanup = post_commit_cleanup(store, result.index_name, result.index)
    except Exception as error:  # any failure of the cleanup leaves the backup committed
        return _committed_with_warning(store, version, head, result, None, "cleanup", error)
    try:
        # After the cleanup: the heads below the horizon name indexes already deleted.
        pruned = log.prune(head.horizon, log.listed())
    except Exception as error:
        return _committed_with_warning(store, version, head, result, cleanup, "pruning of old heads", error)
    return RepositoryBackup(version, head, result, cleanup, heads_pruned=finished.heads_pruned + pruned)


def _committed_with_warning(
    store: BlobStore,
    version: int,
    head: HeadRecord,
    result: BackupResult,
    cleanup: CleanupStats | None,
    what: str,
    error: Exception,
) -> RepositoryBackup:
    warning = (
        f"backup {version} ({result.index_name}) committed to {store.url}, but its {what} did not"
        f" finish ({_first_line(error)}); the next backup or `blobstate gc {store.url}` finishes it"
    )
    logger.warning("%s", warning)
    return RepositoryBackup(version, head, result, cleanup, warning)


@dataclass(frozen=True)
class _Landing:
    newest: HeadRecord
    """The newest head once ``head`` was created."""
    superseded: bool
    """Below the newest head's horizon: newer backups committed (and pruned) after it."""
    stale: bool
    """It re-created a version committed and pruned before it landed: it did not commit."""


def _where_it_landed(store: BlobStore, log: HeadLog, head: HeadRecord) -> _Landing:
    """Whether ``head``, just created, committed, and whether newer backups superseded it since.

    A head at or above the newest head's horizon was never pruned: it committed. Below the horizon it
    either landed first and newer backups pruned it since (the backup after it finished its cleanup
    before committing, so its index is permanent or already deleted), or it re-created a version another
    backup committed and newer ones pruned before it landed (a backup that stalled while three or more
    others committed): then its index is still pending, since no backup ever took it for the newest.
    """
    newest = log.scan().newest
    assert newest is not None, "a head was just created"
    if newest.horizon <= head.version:
        return _Landing(newest, superseded=False, stale=False)
    try:
        stale = store.has_ttl(head.index)
    except BlobNotFoundError:
        stale = False  # deleted by the cleanup of the backup after the next: committed and superseded
    return _Landing(newest, superseded=True, stale=stale)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _write_head(store: BlobStore, log: HeadLog, head: HeadRecord) -> HeadRecord:
    """Create ``head`` (see :meth:`HeadLog.write`). If the store gave up on the request, the head may
    have been created all the same (only its answers were lost): read it back before failing."""
    try:
        return log.write(head)
    except BlobStoreError as error:
        try:
            standing = log.read(head.version)
        except Exception:  # the write's error says more
            raise error from None
        if standing != head:
            raise
        logger.warning(
            "creating %s in %s failed (%s), but it was created", head_name(head.version), store.url, error
        )
        return standing


def restore_repository(
    store: BlobStore,
    target_dir: str | os.PathLike[str],
    snapshot: str | CommittedSnapshot | None = None,
    *,
    delete_extra: bool = False,
    progress: Progress | None = None,
    checksum_cache: ChecksumCache | None = DEFAULT_CHECKSUM_CACHE,
) -> tuple[CommittedSnapshot, RestoreStats]:
    """Restore the newest committed snapshot (or the one named, or one already read) into ``target_dir``.

    See :func:`read_snapshot` and :func:`~blobstate.snapshot.restore.restore_directory` (which refuses a
    target holding the repository and, unless ``delete_extra``, a target holding other files). A blob
    that went missing because a backup committed meanwhile (its cleanup deletes what the older snapshot
    alone referenced) is reported as that race: run the restore again.
    """
    check_restore_target(store, target_dir)
    chosen = snapshot if isinstance(snapshot, CommittedSnapshot) else read_snapshot(store, snapshot)
    try:
        stats = restore_directory(
            store,
            chosen.index,
            target_dir,
            progress=progress,
            checksum_cache=checksum_cache,
            delete_extra=delete_extra,
            index_name=chosen.name,
        )
    except SnapshotBlobMissingError as error:
        latest = HeadLog(store).latest() if chosen.head is not None else 0
        if latest in (0, chosen.version):
            raise
        raise RepositoryError(
            f"backup {latest} committed to {store.url} while {chosen.name!r} was being restored, and "
            f"its cleanup deleted {error.blob_id!r}, which the restore still needed; run the restore "
            "again to restore the new snapshot"
        ) from error
    return chosen, stats


# ---------------------------------------------------------------------------------------------- gc
@dataclass
class RepositoryGcStats:
    """What :func:`gc_repository` did (or, with ``dry_run``, would delete)."""

    newest: str | None = None
    """The newest committed snapshot's index (None: nothing committed)."""
    version: int = 0
    cleanup: CleanupStats | None = None
    """The newest backup's post-commit cleanup, finished first (None with ``dry_run`` or no snapshot)."""
    heads_pruned: list[int] = field(default_factory=list)
    """Versions whose heads were pruned (would be, with ``dry_run``): below the newest head's horizon."""
    expired: list[str] = field(default_factory=list)
    listed: int = 0
    """Blobs and root indexes listed by the sweep (``full`` only)."""
    referenced: int = 0
    deleted: list[str] = field(default_factory=list)
    pending_kept: int = 0
    """Unreferenced objects left alone because they are pending (they expire)."""
    guard_created: bool = False
    """Whether this run created the guard (:data:`GUARD_INDEX`; would, with ``dry_run``)."""
    dry_run: bool = False


def _mark(store: BlobStore, log: HeadLog, present: list[str]) -> tuple[int, set[str]]:
    """The newest version and everything committed snapshots still present reference.

    Reads the whole retained head log (every record from the newest head's horizon, checked as one
    chain): an unreadable log is an error, never an empty mark. The newest snapshot must be readable;
    older committed indexes still present (a cleanup not finished yet) are retained too.
    """

    def mark() -> tuple[int, set[str]]:
        heads = log.read_all()
        if not heads:
            return 0, set()
        by_index = {h.index: h for h in heads}
        retained = [by_index[n] for n in present if n in by_index and n != heads[-1].index]
        referenced = _referenced(store, heads[-1])
        for head in retained:
            try:
                referenced |= _referenced(store, head)
            except SnapshotBlobMissingError:
                continue  # an older index deleted meanwhile by a cleanup
        return heads[-1].version, referenced

    return _while_the_log_moves(store, log, mark)


def _referenced(store: BlobStore, head: HeadRecord) -> set[str]:
    snapshot = _read_committed(store, head)
    return {snapshot.name} | snapshot.index.present_blob_ids()


def _unreferenced(names: list[str], referenced: set[str], newest: int) -> list[str]:
    out = []
    for name in names:
        if name in referenced:
            continue
        cid = parse_index_name(name)
        if cid is not None and cid.version > newest:
            continue  # a backup in flight
        out.append(name)
    return out


def gc_repository(
    store: BlobStore, *, full: bool, now: float | None = None, dry_run: bool = False
) -> RepositoryGcStats:
    """Garbage-collect a backup repository without ever deleting what a committed snapshot references.

    1. Finish the newest committed backup's post-commit cleanup, so nothing it references stays pending,
       then prune the heads below the newest head's horizon (what a pruning cut short left).
    2. When a backup has committed, create the marker and the guard (:data:`GUARD_INDEX`) if they are
       missing (a repository written before them).
    3. Expire pending objects past their TTL (``store.expire(now)``): attempts that never committed.
    4. With ``full``: list ``data/``, ``blobs/`` and the root indexes, mark what every committed
       snapshot still present references (from a complete, chain-checked read of the head log; an
       incomplete or unreadable log, or a missing or altered newest index, raises instead), and delete
       the unmarked objects that are not pending. If a backup commits meanwhile, the mark is taken again
       and only objects unmarked by both go. Indexes newer than the newest head (backups in flight),
       retained heads, the guard and anything else in the repository are never touched.

    ``dry_run`` changes nothing and reports in ``deleted`` what a full sweep would delete, in
    ``heads_pruned`` the heads it would prune and in ``guard_created`` whether it would create the
    guard. Refuses a repository without a head log that holds committed-looking snapshots, and a query
    checkpoint.
    """
    _refuse_query_checkpoint(store, "garbage-collect")
    stats = RepositoryGcStats(dry_run=dry_run)
    log = HeadLog(store)
    if dry_run:
        newest, scan = _newest_for_writing(store, log, "garbage-collect")
        stats.heads_pruned = scan.prunable
        stats.guard_created = newest is not None and not store.exists(GUARD_INDEX)
    else:
        finished = _finish_cleanup(store, log, "garbage-collect")
        newest, stats.cleanup, stats.heads_pruned = finished.newest, finished.cleanup, finished.heads_pruned
        if newest is not None:  # a repository with a head log and committed data: guard it
            _ensure_marker(store)
            stats.guard_created = _ensure_guard(store)
        stats.expired = sorted(store.expire(now))
    if newest is not None:
        stats.newest, stats.version = newest.name, newest.version
    if not full:
        return stats

    present = root_indexes(store)
    listed = store.list(BLOB_PREFIX) + store.list(FORMER_BLOB_PREFIX) + present
    stats.listed = len(listed)
    newest_version, referenced = _mark(store, log, present)
    candidates = _unreferenced(listed, referenced, newest_version)
    kept = []
    for name in candidates:
        try:
            if store.has_ttl(name):
                stats.pending_kept += 1
                continue
        except BlobNotFoundError:
            continue  # gone already
        kept.append(name)
    # After the pending checks: a backup that committed and made its objects permanent since the first
    # mark is in this one.
    if log.latest() != newest_version:
        again, referenced_again = _mark(store, log, present)
        kept = _unreferenced(kept, referenced_again, again)
        referenced |= referenced_again
    stats.referenced = len(referenced)
    if dry_run:
        stats.deleted = sorted(kept)
    else:
        done = store.run_parallel(store.delete_if_exists, sorted(kept))
        stats.deleted = [n for n, d in zip(sorted(kept), done, strict=True) if d]
    return stats


# ---------------------------------------------------------------------------------------------- verify
@dataclass(frozen=True)
class RepositoryProblem:
    """One thing wrong with a backup repository: the object at fault and what is wrong with it."""

    object: str
    message: str
    version: int | None = None

    def __str__(self) -> str:
        where = f" (backup {self.version})" if self.version is not None else ""
        return f"{self.object}: {self.message}{where}"


@dataclass
class RepositoryVerifyResult:
    """What :func:`verify_repository` checked and found."""

    problems: list[RepositoryProblem] = field(default_factory=list)
    snapshot: str | None = None
    version: int = 0
    heads: int = 0
    """Head records read: the retained ones, from :attr:`horizon` to the newest."""
    horizon: int = 1
    """The newest head's horizon: heads below it were pruned (or may be), not missing."""
    blobs: int = 0
    bytes_read: int = 0
    checksums: bool = False
    """Whether blob contents were read and checked (otherwise only presence and sizes)."""


def verify_repository(store: BlobStore, *, checksums: bool = False) -> RepositoryVerifyResult:
    """Check that the newest committed snapshot is restorable, without restoring it.

    Reads every retained head record (from the newest head's horizon, complete, one chain; heads
    missing below the horizon were pruned, one missing above it is a hole), reads the newest index and
    checks its bytes against
    its head's size and CRC-32, checks that it is permanent, and checks that every blob it references
    exists with the recorded length (one listing of ``data/``, and of ``blobs/`` when the snapshot
    still keeps blobs there). With ``checksums`` every blob is also
    downloaded and its CRC-32 compared with the index's. Each problem names the object at fault. If a
    backup commits meanwhile (its cleanup may delete what the older snapshot alone needed) and problems
    were found, the newer snapshot is verified instead.
    """
    for _ in range(_RACE_RETRIES):
        result = _verify(store, checksums)
        if not result.problems or result.version == 0:
            return result
        if HeadLog(store).latest() in (0, result.version):
            return result
    return result


def _verify(store: BlobStore, checksums: bool) -> RepositoryVerifyResult:
    result = RepositoryVerifyResult(checksums=checksums)
    problems = result.problems
    try:
        heads = HeadLog(store).read_all()
    except (HeadLogError, BlobNotFoundError) as error:
        problems.append(RepositoryProblem(HEADS_PREFIX, str(error)))
        return result
    result.heads = len(heads)
    if heads:
        result.horizon = heads[-1].horizon
    if not heads:
        legacy = _legacy_indexes(store)
        if legacy:
            problems.append(RepositoryProblem(HEADS_PREFIX, str(_legacy_error(store, legacy, "verify"))))
        elif HeadLog(store).latest():  # a first backup committed meanwhile
            return _verify(store, checksums)
        elif _read_marker(store):
            problems.append(RepositoryProblem(store.url, "no backup has committed here yet"))
        else:
            problems.append(
                RepositoryProblem(store.url, "no committed backup here (no head log and no snapshot index)")
            )
        return result
    head = heads[-1]
    result.snapshot, result.version = head.index, head.version
    try:
        snapshot = _read_committed(store, head)
    except (SnapshotError, BlobNotFoundError) as error:
        problems.append(RepositoryProblem(head.index, str(error), head.version))
        return result
    if store.has_ttl(head.index):
        problems.append(
            RepositoryProblem(
                head.index,
                "still pending: its backup's cleanup did not finish, so it would expire; run "
                f"`blobstate gc {store.url}` (or the next backup) to finish it",
                head.version,
            )
        )
    chunks = [
        (path, blob, length) for path, f in snapshot.index.iter_present_files() for blob, length in f.chunks()
    ]
    result.blobs = len(chunks)
    prefixes = [
        p for p in (BLOB_PREFIX, FORMER_BLOB_PREFIX) if any(b.blob_id.startswith(p) for _, b, _ in chunks)
    ]
    sizes: dict[str, int] = {}
    for prefix in prefixes:
        sizes.update(store.list_sizes(prefix))
    for path, blob, length in chunks:
        if blob.blob_id not in sizes and not blob.blob_id.startswith(tuple(prefixes)):
            sizes.update(store.list_sizes(blob.blob_id))
        size = sizes.get(blob.blob_id)
        if size is None:
            problems.append(
                RepositoryProblem(blob.blob_id, f"missing (file {path!r} of {head.index})", head.version)
            )
        elif size != length:
            problems.append(
                RepositoryProblem(
                    blob.blob_id, f"{size} bytes, the index records {length} (file {path!r})", head.version
                )
            )
    if checksums and not problems:

        def check(item: tuple[str, FileBlob, int]) -> RepositoryProblem | None:
            path, blob, _ = item
            try:
                actual = crc32(store.get(blob.blob_id))
            except BlobNotFoundError:  # deleted since the listing (a newer backup's cleanup, or damage)
                missing = f"missing (file {path!r} of {head.index})"
                return RepositoryProblem(blob.blob_id, missing, head.version)
            if actual == blob.checksum:
                return None
            message = f"checksum {actual}, the index records {blob.checksum} (file {path!r})"
            return RepositoryProblem(blob.blob_id, message, head.version)

        found = store.run_parallel(check, chunks)
        problems.extend(p for p in found if p is not None)
        result.bytes_read = sum(length for _, _, length in chunks)
    return result


__all__ = [
    "BLOB_PREFIX",
    "BackupConflictError",
    "CommittedSnapshot",
    "LegacyRepositoryError",
    "NoSnapshotError",
    "RepositoryBackup",
    "RepositoryError",
    "RepositoryGcStats",
    "RepositoryProblem",
    "RepositoryVerifyResult",
    "backup_to_repository",
    "gc_repository",
    "is_backup_repository",
    "read_snapshot",
    "restore_repository",
    "root_indexes",
    "verify_repository",
]
