"""Incremental backup of a local directory (a RocksDB checkpoint) to a blob store as a snapshot.

The directory is compared with the previous snapshot's index (a :class:`DirDiff`): immutable RocksDB files
(``*.sst``, ``*.blob``) whose name, size and checksum match are reused by reference; every other file is
uploaded, in chunks of ``chunk_size`` bytes (one blob per chunk; see :func:`chunk_ranges`), in parallel on
the store's I/O pool,
each object with the pending TTL. The index is written last, also with the TTL, and records what the
previous snapshot had that this one does not (``files_removed`` / ``subdirs_removed``) for post-commit
cleanup. Symlinks and special files are never followed nor uploaded; they are reported as skipped.

Memory: each upload task holds one chunk in memory, so the peak is about
``store.io_threads * chunk_size * 1.25``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from blobstate.blobstore.base import DEFAULT_PENDING_TTL_SECONDS, BlobStore
from blobstate.blobstore.names import validate_prefix
from blobstate.snapshot.checksum import (
    DEFAULT_CHECKSUM_CACHE,
    ChecksumCache,
    cached_file_crc32,
    combine_chunks,
    crc32,
    is_immutable,
)
from blobstate.snapshot.index import (
    ROOT_DIR_NAME,
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    SnapshotError,
    SnapshotIndex,
    SnapshotMetadata,
    validate_entry_name,
)
from blobstate.snapshot.parallel import default_workers, run_bounded

DEFAULT_CHUNK_SIZE = 64 << 20
"""Files larger than this (plus a quarter, see :func:`chunk_ranges`) are stored as several blobs."""

Progress = Callable[[int], None]


@dataclass(frozen=True)
class LocalFile:
    """A regular file found in the directory being backed up."""

    relpath: str
    path: str
    stat: os.stat_result

    @property
    def name(self) -> str:
        """The file's name within its directory."""
        return os.path.basename(self.path)

    @property
    def size(self) -> int:
        """Size in bytes when scanned."""
        return self.stat.st_size


@dataclass(frozen=True)
class LocalDir:
    """A directory found in the directory being backed up (``relpath`` is ``""`` for the root)."""

    name: str
    relpath: str
    files: tuple[LocalFile, ...]
    subdirs: tuple[LocalDir, ...]


@dataclass(frozen=True)
class DirDiff:
    """What changed in one directory between the previous snapshot and the local directory."""

    dir_name: str
    files_added: tuple[LocalFile, ...]
    """New or changed files, and every mutable file: uploaded."""
    files_retained: tuple[FileIndex, ...]
    """Immutable files identical to the previous snapshot's: reused by reference."""
    files_removed: tuple[FileIndex, ...]
    """Previous snapshot's entries not retained: their blobs are deleted after commit."""
    subdirs_added: tuple[DirDiff, ...]
    subdirs_retained: tuple[DirDiff, ...]
    subdirs_removed: tuple[DirIndex, ...]


@dataclass(frozen=True)
class BackupStats:
    """What a backup did."""

    files_uploaded: int
    bytes_uploaded: int
    blobs_uploaded: int
    files_retained: int
    bytes_retained: int
    files_removed: int
    """Files of the previous snapshot (including those of removed subdirectories) not in this one."""
    dirs_removed: int
    uploaded: tuple[str, ...]
    """Relative paths of the files uploaded."""
    skipped: tuple[str, ...]
    """Relative paths of symlinks and special files that were not backed up."""
    seconds: float


@dataclass(frozen=True)
class BackupResult:
    """The index written, its object name, the size and CRC-32 of its bytes, and statistics."""

    index: SnapshotIndex
    index_name: str
    stats: BackupStats
    index_size: int
    """Bytes of the index object as written (a commit or head record holds them to check it later)."""
    index_checksum: int
    """CRC-32 of the index object's bytes."""
    index_sha256: str
    """SHA-256 (lowercase hex) of the index object's bytes, for a query commit's reference."""


# ---------------------------------------------------------------------------------------------- scanning


def scan_directory(root: str | os.PathLike[str], skipped: list[str]) -> LocalDir:
    """Walk ``root`` without following symlinks; regular files and real directories only.

    Symlinks (to files or directories), fifos, sockets and devices are appended to ``skipped``. A name
    that a snapshot index could not hold safely (for example one containing a backslash) is an error.
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"backup source {root!r} is not a directory")
    return _scan(root, "", "", skipped)


def _scan(path: str, name: str, relpath: str, skipped: list[str]) -> LocalDir:
    files: list[LocalFile] = []
    subdirs: list[LocalDir] = []
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            rel = relpath + entry.name
            try:
                validate_entry_name(entry.name)
            except ValueError as error:
                raise SnapshotError(f"cannot back up {os.path.join(path, entry.name)!r}: {error}") from None
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                files.append(LocalFile(rel, entry.path, st))
            elif stat.S_ISDIR(st.st_mode):
                subdirs.append(_scan(entry.path, entry.name, rel + "/", skipped))
            else:
                skipped.append(rel)
    return LocalDir(name, relpath, tuple(files), tuple(subdirs))


def _reuse_candidates(
    local: LocalDir, previous: DirIndex | None, reuse_prefix: str | None = None
) -> list[LocalFile]:
    """Immutable local files whose name and size match the previous snapshot: their checksums decide.

    With ``reuse_prefix``, only previous entries whose every blob lies under it are candidates.
    """
    if previous is None:
        return []
    prev_files = {
        f.name: f
        for f in previous.files_present
        if reuse_prefix is None or all(b.blob_id.startswith(reuse_prefix) for b in f.blobs)
    }
    out = [
        f
        for f in local.files
        if is_immutable(f.name) and f.name in prev_files and prev_files[f.name].size == f.size
    ]
    prev_dirs = {d.name: d for d in previous.subdirs_present}
    for sub in local.subdirs:
        out.extend(_reuse_candidates(sub, prev_dirs.get(sub.name), reuse_prefix))
    return out


def _present_only(d: DirIndex) -> DirIndex:
    # A removed subdirectory keeps only what it held; its own removed lists were an older cleanup's job.
    return DirIndex(d.name, d.files_present, (), tuple(_present_only(s) for s in d.subdirs_present), ())


def compute_dir_diff(local: LocalDir, previous: DirIndex | None, checksums: Mapping[str, int]) -> DirDiff:
    """The DirDiff of ``local`` against ``previous`` (None: everything is added).

    ``checksums`` maps relative paths of reuse candidates to their CRC-32; an immutable file is retained
    only when its name, size and checksum equal the previous snapshot's entry.
    """
    prev_files = {f.name: f for f in previous.files_present} if previous else {}
    prev_dirs = {d.name: d for d in previous.subdirs_present} if previous else {}
    added: list[LocalFile] = []
    retained: list[FileIndex] = []
    removed: list[FileIndex] = []
    for f in local.files:
        prev = prev_files.pop(f.name, None)
        if (
            prev is not None
            and is_immutable(f.name)
            and prev.size == f.size
            and checksums.get(f.relpath) == prev.checksum
        ):
            mode = stat.S_IMODE(f.stat.st_mode)
            if prev.metadata.mode != mode:  # same content, new permissions: same blobs, new attributes
                prev = replace(prev, metadata=replace(prev.metadata, mode=mode))
            retained.append(prev)
        else:
            added.append(f)
            if prev is not None:
                removed.append(prev)
    removed.extend(prev_files.values())
    subdirs_added: list[DirDiff] = []
    subdirs_retained: list[DirDiff] = []
    for sub in local.subdirs:
        prev_sub = prev_dirs.pop(sub.name, None)
        diff = compute_dir_diff(sub, prev_sub, checksums)
        (subdirs_retained if prev_sub is not None else subdirs_added).append(diff)
    return DirDiff(
        local.name,
        tuple(added),
        tuple(retained),
        tuple(removed),
        tuple(subdirs_added),
        tuple(subdirs_retained),
        tuple(_present_only(d) for d in prev_dirs.values()),
    )


# ---------------------------------------------------------------------------------------------- upload


def chunk_ranges(size: int, chunk_size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the blobs a file of ``size`` bytes is cut into.

    Pieces of ``chunk_size`` bytes, except that a tail shorter than a quarter chunk joins the piece before
    it: RocksDB writes SSTs slightly over their 64 MiB target, and a tiny second blob per SST would only
    add requests and slow restores down. So every blob is at most ``1.25 * chunk_size`` bytes.
    """
    ranges = [(offset, min(chunk_size, size - offset)) for offset in range(0, size, chunk_size)]
    if len(ranges) > 1 and ranges[-1][1] < chunk_size / 4:
        tail = ranges.pop()
        offset, length = ranges.pop()
        ranges.append((offset, length + tail[1]))
    return ranges


@dataclass(frozen=True)
class _Chunk:
    file: LocalFile
    offset: int
    length: int


def _read_exactly(fd: int, length: int, offset: int, path: str) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise SnapshotError(f"file {path!r} shrank while it was backed up (short read at {offset + got})")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _iter_diff_files(diff: DirDiff) -> list[LocalFile]:
    out = list(diff.files_added)
    for sub in diff.subdirs_added + diff.subdirs_retained:
        out.extend(_iter_diff_files(sub))
    return out


def _build_dir_index(diff: DirDiff, uploaded: Mapping[str, FileIndex]) -> DirIndex:
    files = [uploaded[f.relpath] for f in diff.files_added] + list(diff.files_retained)
    subdirs = [_build_dir_index(d, uploaded) for d in diff.subdirs_added + diff.subdirs_retained]
    return DirIndex(
        diff.dir_name,
        tuple(sorted(files, key=lambda f: f.name)),
        tuple(sorted(diff.files_removed, key=lambda f: f.name)),
        tuple(sorted(subdirs, key=lambda d: d.name)),
        tuple(sorted(diff.subdirs_removed, key=lambda d: d.name)),
    )


def _count_removed(diff: DirDiff) -> tuple[int, int]:
    files = len(diff.files_removed)
    dirs = len(diff.subdirs_removed)
    for d in diff.subdirs_removed:
        files += sum(1 for _ in d.iter_present_files())
        dirs += _count_dirs(d) - 1
    for sub in diff.subdirs_retained:
        f, n = _count_removed(sub)
        files += f
        dirs += n
    return files, dirs


def _count_dirs(d: DirIndex) -> int:
    return 1 + sum(_count_dirs(s) for s in d.subdirs_present)


def _retained_files(diff: DirDiff) -> list[FileIndex]:
    out = list(diff.files_retained)
    for sub in diff.subdirs_retained:
        out.extend(_retained_files(sub))
    return out


def backup_directory(
    store: BlobStore,
    source_dir: str | os.PathLike[str],
    *,
    index_name: str,
    blob_prefix: str,
    previous: SnapshotIndex | None,
    previous_name: str | None,
    checkpoint_id: str,
    metadata: SnapshotMetadata | Mapping[str, str] | None = None,
    lineage: Sequence[str] = (),
    reuse_prefix: str | None = None,
    ttl: float | None = DEFAULT_PENDING_TTL_SECONDS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress: Progress | None = None,
    checksum_cache: ChecksumCache | None = DEFAULT_CHECKSUM_CACHE,
) -> BackupResult:
    """Back up ``source_dir`` incrementally against ``previous`` and write its index as ``index_name``.

    Blob ids are ``<blob_prefix><random hex>``. Every object, the index last, is written with ``ttl``
    (pending until :func:`~blobstate.snapshot.cleanup.post_commit_cleanup` makes it permanent); if the
    backup fails part-way, no index exists and what was written expires. Nothing the previous snapshot
    references is modified or deleted. ``progress(nbytes)`` is called from I/O threads as chunks land.
    ``checksum_cache`` (None to disable) avoids re-reading unchanged immutable files. With
    ``reuse_prefix``, a file is reused only when every blob of its previous entry lies under that
    prefix; otherwise it is uploaded again and its previous entry is recorded as removed, so the
    post-commit cleanup deletes the old blobs (how a backup repository moves its blobs out of a former
    prefix). Must not be called from the store's own I/O pool.
    """
    started = time.monotonic()
    if (previous is None) != (previous_name is None):
        raise ValueError("backup_directory needs both previous and previous_name, or neither")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not blob_prefix:
        raise ValueError("blob_prefix must not be empty")
    validate_prefix(blob_prefix)
    snapshot_metadata = (
        metadata if isinstance(metadata, SnapshotMetadata) else SnapshotMetadata.from_mapping(metadata)
    )
    skipped: list[str] = []
    local = scan_directory(source_dir, skipped)
    prev_root = previous.dir_index if previous is not None else None

    # Checksums of reuse candidates decide retained vs uploaded; read in parallel (cache first).
    candidates = _reuse_candidates(local, prev_root, reuse_prefix)
    crcs = run_bounded(
        store, lambda f: cached_file_crc32(f.path, checksum_cache)[0], candidates, default_workers(store)
    )
    diff = compute_dir_diff(local, prev_root, {f.relpath: c for f, c in zip(candidates, crcs, strict=True)})

    to_upload = _iter_diff_files(diff)
    chunks = [
        _Chunk(f, offset, length) for f in to_upload for offset, length in chunk_ranges(f.size, chunk_size)
    ]
    # Biggest first keeps all threads busy until the end.
    chunks.sort(key=lambda c: c.length, reverse=True)

    def upload(chunk: _Chunk) -> FileBlob:
        with open(chunk.file.path, "rb", buffering=0) as f:
            data = _read_exactly(f.fileno(), chunk.length, chunk.offset, chunk.file.path)
        blob_id = f"{blob_prefix}{uuid.uuid4().hex}"
        checksum = crc32(data)
        store.put(blob_id, data, ttl=ttl)
        if progress is not None:
            progress(chunk.length)
        return FileBlob(blob_id, chunk.offset, checksum)

    blobs = store.run_parallel(upload, chunks)
    by_file: dict[str, list[FileBlob]] = {f.relpath: [] for f in to_upload}
    for chunk, blob in zip(chunks, blobs, strict=True):
        by_file[chunk.file.relpath].append(blob)

    uploaded: dict[str, FileIndex] = {}
    for f in to_upload:
        now = os.stat(f.path, follow_symlinks=False)
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (f.stat.st_ino, f.stat.st_size, f.stat.st_mtime_ns):
            raise SnapshotError(f"file {f.path!r} changed while it was backed up")
        file_blobs = sorted(by_file[f.relpath], key=lambda b: b.offset)
        lengths = [b2.offset - b1.offset for b1, b2 in itertools.pairwise(file_blobs)]
        if file_blobs:
            lengths.append(f.size - file_blobs[-1].offset)
        checksum = combine_chunks([(b.checksum, n) for b, n in zip(file_blobs, lengths, strict=True)])
        if checksum_cache is not None:
            checksum_cache.put(f.name, f.stat, checksum)
        uploaded[f.relpath] = FileIndex(
            name=f.name,
            blobs=tuple(file_blobs),
            metadata=FileMetadata(
                size=f.size,
                mtime_ms=f.stat.st_mtime_ns // 1_000_000,
                ctime_ms=f.stat.st_ctime_ns // 1_000_000,
                mode=stat.S_IMODE(f.stat.st_mode),
            ),
            checksum=checksum,
        )

    dir_index = _build_dir_index(diff, uploaded)
    assert dir_index.name == ROOT_DIR_NAME
    index = SnapshotIndex(
        checkpoint_id=checkpoint_id,
        created_time_ms=int(time.time() * 1000),
        metadata=snapshot_metadata,
        dir_index=dir_index,
        prev_snapshot_index=previous_name,
        lineage=tuple(lineage),
    )
    payload = index.validate(index_name).to_json()
    if not store.put_if_absent(index_name, payload, ttl=ttl) and store.get(index_name) != payload:
        # A retried create whose first try landed reads back our own bytes; anything else is not ours.
        raise SnapshotError(
            f"snapshot index {index_name!r} already exists in {store.url}; not overwriting it"
        )

    files_removed, dirs_removed = _count_removed(diff)
    retained = _retained_files(diff)
    stats = BackupStats(
        files_uploaded=len(to_upload),
        bytes_uploaded=sum(f.size for f in to_upload),
        blobs_uploaded=len(chunks),
        files_retained=len(retained),
        bytes_retained=sum(f.size for f in retained),
        files_removed=files_removed,
        dirs_removed=dirs_removed,
        uploaded=tuple(sorted(f.relpath for f in to_upload)),
        skipped=tuple(sorted(skipped)),
        seconds=time.monotonic() - started,
    )
    return BackupResult(
        index=index,
        index_name=index_name,
        stats=stats,
        index_size=len(payload),
        index_checksum=crc32(payload),
        index_sha256=hashlib.sha256(payload).hexdigest(),
    )
