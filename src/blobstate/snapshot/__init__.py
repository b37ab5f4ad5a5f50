"""Snapshots: incremental backup of a directory to blobs, restore, and post-commit cleanup.

- :mod:`~blobstate.snapshot.index`: the SnapshotIndex format and its validated JSON form.
- :mod:`~blobstate.snapshot.checksum`: CRC-32 of files and chunks, and a cache for immutable files.
- :mod:`~blobstate.snapshot.backup`: :func:`backup_directory` (DirDiff against the previous index + upload).
- :mod:`~blobstate.snapshot.restore`: :func:`restore_directory`, :func:`read_snapshot_index`.
- :mod:`~blobstate.snapshot.cleanup`: :func:`post_commit_cleanup`, :func:`referenced_objects`.
- :mod:`~blobstate.snapshot.heads`: the head log (``heads/<n>.json``) that fences a backup repository.
- :mod:`~blobstate.snapshot.repository`: standalone backup repositories (``blobstate backup``):
  :func:`backup_to_repository`, :func:`read_snapshot`, :func:`gc_repository`, :func:`verify_repository`.
"""

from __future__ import annotations

from blobstate.snapshot.backup import (
    DEFAULT_CHUNK_SIZE,
    BackupResult,
    BackupStats,
    DirDiff,
    backup_directory,
    compute_dir_diff,
)
from blobstate.snapshot.checksum import CHECKSUM_ALGORITHM, DEFAULT_CHECKSUM_CACHE, ChecksumCache
from blobstate.snapshot.cleanup import (
    CleanupStats,
    make_permanent,
    post_commit_cleanup,
    referenced_objects,
)
from blobstate.snapshot.index import (
    SCHEMA_VERSION,
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    SnapshotBlobMissingError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotIndex,
    SnapshotMetadata,
)
from blobstate.snapshot.repository import (
    BackupConflictError,
    CommittedSnapshot,
    LegacyRepositoryError,
    NoSnapshotError,
    RepositoryError,
    backup_to_repository,
    gc_repository,
    is_backup_repository,
    read_snapshot,
    verify_repository,
)
from blobstate.snapshot.restore import (
    RestoreStats,
    RestoreTargetError,
    read_snapshot_index,
    restore_directory,
)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "DEFAULT_CHECKSUM_CACHE",
    "DEFAULT_CHUNK_SIZE",
    "SCHEMA_VERSION",
    "BackupConflictError",
    "BackupResult",
    "BackupStats",
    "ChecksumCache",
    "CleanupStats",
    "CommittedSnapshot",
    "DirDiff",
    "DirIndex",
    "FileBlob",
    "FileIndex",
    "FileMetadata",
    "LegacyRepositoryError",
    "NoSnapshotError",
    "RepositoryError",
    "RestoreStats",
    "RestoreTargetError",
    "SnapshotBlobMissingError",
    "SnapshotCorruptError",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotIndex",
    "SnapshotMetadata",
    "backup_directory",
    "backup_to_repository",
    "compute_dir_diff",
    "gc_repository",
    "is_backup_repository",
    "make_permanent",
    "post_commit_cleanup",
    "read_snapshot",
    "read_snapshot_index",
    "referenced_objects",
    "restore_directory",
    "verify_repository",
]
