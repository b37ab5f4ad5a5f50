"""Post-commit cleanup of snapshots.

After the version a snapshot belongs to has committed, :func:`post_commit_cleanup` makes everything the
snapshot references permanent (removes its TTL), deletes the blobs the snapshot lists as removed, and
deletes the previous snapshot's index. Each step is idempotent: objects to be deleted that are already
gone count as done, so running it twice, or again after a crash part-way, is safe. It also finishes an
interrupted cleanup of the previous snapshot (whose removed blobs and previous index it deletes too),
so a crash never leaks committed objects. Anything the current snapshot references is never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from blobstate.blobstore.base import BlobNotFoundError, BlobStore
from blobstate.snapshot.index import SnapshotBlobMissingError, SnapshotFormatError, SnapshotIndex
from blobstate.snapshot.restore import read_snapshot_index

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CleanupStats:
    """What a cleanup did."""

    ttls_removed: int
    """Objects made permanent (the index and every blob it references)."""
    blobs_deleted: int
    """Removed blobs (and previous indexes) deleted by this call."""
    already_gone: int
    """Objects to delete that did not exist any more (an earlier run deleted them)."""


def referenced_objects(index_name: str, index: SnapshotIndex) -> set[str]:
    """The object names a snapshot needs: its index and every blob of every file present."""
    return {index_name} | index.present_blob_ids()


def make_permanent(store: BlobStore, index_name: str, index: SnapshotIndex) -> int:
    """Remove the TTL of every blob the snapshot references, then of its index; returns the count.

    A referenced object that is missing raises :class:`SnapshotBlobMissingError`: the snapshot is broken.
    """

    def remove(name: str) -> None:
        try:
            store.remove_ttl(name)
        except BlobNotFoundError:
            raise SnapshotBlobMissingError(
                f"snapshot {index_name!r} references {name!r}, which is missing from {store.url}",
                blob_id=name,
            ) from None

    blobs = sorted(index.present_blob_ids())
    store.run_parallel(remove, blobs)
    remove(index_name)  # last: a permanent index implies permanent blobs
    return len(blobs) + 1


def post_commit_cleanup(store: BlobStore, index_name: str, index: SnapshotIndex) -> CleanupStats:
    """Post-commit cleanup of the committed snapshot ``index_name``; idempotent.

    1. Remove the TTL of the index and every blob it references.
    2. If the previous index still exists (an earlier cleanup was interrupted), delete the blobs it
       listed as removed and its own previous index.
    3. Delete the blobs this index lists as removed (files and, recursively, subdirectories).
    4. Delete the previous index.
    Nothing referenced by ``index`` is ever deleted, even if an index wrongly lists it as removed.
    """
    ttls = make_permanent(store, index_name, index)
    keep = referenced_objects(index_name, index)
    to_delete = set(index.removed_blob_ids())
    previous = index.prev_snapshot_index
    if previous is not None:
        try:
            prev_index = read_snapshot_index(store, previous)
        except BlobNotFoundError:
            prev_index = None
        except SnapshotFormatError as error:
            # It is superseded anyway; what it would have removed is left for a full gc.
            log.warning(
                "previous snapshot index %r is unreadable, deleting it without its cleanup: %s",
                previous,
                error,
            )
            prev_index = None
        if prev_index is not None:
            to_delete |= prev_index.removed_blob_ids()
            if prev_index.prev_snapshot_index is not None:
                to_delete.add(prev_index.prev_snapshot_index)
    to_delete -= keep

    results = store.run_parallel(store.delete_if_exists, sorted(to_delete))
    deleted = sum(results)
    gone = len(results) - deleted
    if previous is not None and previous not in keep:
        if store.delete_if_exists(previous):
            deleted += 1
        else:
            gone += 1
    return CleanupStats(ttls_removed=ttls, blobs_deleted=deleted, already_gone=gone)
