"""Restore a snapshot into a local directory, downloading only what differs.

The target ends up holding exactly the snapshot: local files whose name, size and checksum match are kept,
other files are downloaded, extra files and directories are deleted (never following a symlink, never
across filesystems, never the store's own directory), empty files and (nested, empty) directories are
created and permission bits restored (at most ``0o755``). The plan is made before anything changes, so a
refused target is left untouched. Every download goes to a temporary name in the
file's directory and is renamed into place only after its length and checksum are verified, so a
truncated or corrupt blob never appears under a real file name. Downloads run in parallel on the store's
I/O pool; a single-blob file is streamed to disk with ``store.get_file`` (the local-directory backend
copies in the kernel) and checksummed through a memory map of the page cache; chunks of multi-blob files
are fetched into memory, verified and written at their offsets (peak memory: workers x chunk size).
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from blobstate.blobstore.base import BlobNotFoundError, BlobStore
from blobstate.snapshot.checksum import (
    DEFAULT_CHECKSUM_CACHE,
    ChecksumCache,
    cached_file_crc32,
    crc32,
    mapped_file_crc32,
)
from blobstate.snapshot.index import (
    DirIndex,
    FileBlob,
    FileIndex,
    SnapshotBlobMissingError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotIndex,
)
from blobstate.snapshot.parallel import default_workers, run_bounded

TEMP_MARKER = ".blobstate-restore-"
"""Part of the name of in-progress downloads; leftovers of a crashed restore are deleted as extras."""

Progress = Callable[[int], None]


@dataclass(frozen=True)
class RestoreStats:
    """What a restore did."""

    files_downloaded: int
    bytes_downloaded: int
    files_reused: int
    bytes_reused: int
    files_deleted: int
    """Local files (and symlinks or special files) removed because the snapshot does not hold them."""
    dirs_deleted: int
    seconds: float


class RestoreTargetError(SnapshotError):
    """A restore target that restore refuses to touch: nothing in it was changed."""

    def __init__(self, message: str, *, extras: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.extras = extras
        """With ``delete_extra=False``: the entries the target holds that the snapshot does not."""


RESTORED_MODE_BITS = 0o755
"""The only permission bits a restore sets: owner rwx, group and others r-x (never set-uid, set-gid,
sticky, or write for group and others), whatever the index asks for."""


def restored_mode(mode: int) -> int:
    """The permission bits restore gives a file the index records with ``mode`` (``mode & 0o755``)."""
    return mode & RESTORED_MODE_BITS


def read_snapshot_index(
    store: BlobStore, index_name: str, *, size: int | None = None, checksum: int | None = None
) -> SnapshotIndex:
    """Read and validate the snapshot index ``index_name``; a missing one raises ``BlobNotFoundError``.

    With ``size`` and ``checksum`` (the CRC-32 of its bytes, as a head or commit record holds them), the
    bytes are checked before they are parsed: an index changed after it was committed, even into other
    valid JSON, raises :class:`SnapshotCorruptError` naming it.
    """
    data = store.get(index_name)
    problem = None
    if size is not None and len(data) != size:
        problem = f"has {len(data)} bytes, but {size} were committed"
    elif checksum is not None and crc32(data) != checksum:
        problem = f"has checksum {crc32(data)}, but {checksum} was committed"
    if problem is not None:
        raise SnapshotCorruptError(
            f"snapshot index {index_name!r} in {store.url} {problem}: it was changed or damaged after its "
            "backup committed; it cannot be trusted",
            blob_id=index_name,
        )
    return SnapshotIndex.from_json(data, name=index_name)


def check_restore_target(
    store: BlobStore, target_dir: str | os.PathLike[str], *, what: str = "repository", after: str = ""
) -> None:
    """Refuse a target directory that contains the store's root or lies inside it.

    Only a local-directory store has a root on this machine; paths are compared after resolving symlinks,
    so neither ``restore repo .`` from inside ``data/`` holding ``repo/`` nor a target inside the
    repository can reach the repository's files. ``what`` names the store in the message (``repository``,
    ``query checkpoint``); ``after`` is appended to it (e.g. `` (nothing was changed)``).
    """
    from blobstate.blobstore.local import LocalBlobStore

    if not isinstance(store, LocalBlobStore):
        return
    root = Path(os.path.realpath(store.root))
    target = Path(os.path.realpath(os.fspath(target_dir)))
    if root == target or root.is_relative_to(target):
        raise RestoreTargetError(
            f"restore target {os.fspath(target_dir)!r} contains the {what} {store.url} "
            f"({str(root)!r}) that it would be restored from; restore into a directory outside it{after}"
        )
    if target.is_relative_to(root):
        raise RestoreTargetError(
            f"restore target {os.fspath(target_dir)!r} lies inside the {what} {store.url} "
            f"({str(root)!r}); restore into a directory outside it{after}"
        )


@dataclass
class _Download:
    relpath: str
    final: str
    temp: str
    file: FileIndex
    done: bool = False


@dataclass
class _Plan:
    """What a restore will do, worked out before anything in the target changes."""

    device: int
    candidates: list[tuple[str, str, FileIndex]] = field(default_factory=list)
    downloads: list[_Download] = field(default_factory=list)
    doomed: list[tuple[str, bool]] = field(default_factory=list)
    """``(path, is_dir)`` to delete, children before their directory."""
    extras: list[str] = field(default_factory=list)
    """Relative paths of the entries deleted that are not leftovers of an earlier restore."""
    mkdirs: list[str] = field(default_factory=list)
    """Directories to create, parents first."""


def _doom(path: str, relpath: str, st: os.stat_result, plan: _Plan) -> None:
    """Plan the deletion of ``path``: symlinks are removed, never followed; never across filesystems."""
    if stat.S_ISDIR(st.st_mode):
        if st.st_dev != plan.device:
            raise RestoreTargetError(
                f"restore would delete {path!r}, which is on another filesystem (a mount point); "
                "refusing to delete across filesystems: unmount it or restore into another directory"
            )
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            _doom(entry.path, f"{relpath}/{entry.name}", entry.stat(follow_symlinks=False), plan)
    plan.doomed.append((path, stat.S_ISDIR(st.st_mode)))


def _plan_dir(d: DirIndex, path: str, relpath: str, plan: _Plan, *, exists: bool) -> None:
    if not exists:
        for f in d.files_present:
            plan.downloads.append(_new_download(relpath + f.name, path, os.path.join(path, f.name), f))
        for s in d.subdirs_present:
            sub = os.path.join(path, s.name)
            plan.mkdirs.append(sub)
            _plan_dir(s, sub, f"{relpath}{s.name}/", plan, exists=False)
        return
    wanted_files = {f.name for f in d.files_present}
    wanted_dirs = {s.name for s in d.subdirs_present}
    local_files: dict[str, os.stat_result] = {}
    local_dirs: set[str] = set()
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        if entry.name in wanted_files and stat.S_ISREG(st.st_mode):
            local_files[entry.name] = st
        elif entry.name in wanted_dirs and stat.S_ISDIR(st.st_mode) and st.st_dev == plan.device:
            local_dirs.add(entry.name)
        else:
            _doom(entry.path, relpath + entry.name, st, plan)
            if TEMP_MARKER not in entry.name:
                plan.extras.append(relpath + entry.name)
    for f in d.files_present:
        final = os.path.join(path, f.name)
        local = local_files.get(f.name)
        if local is not None and local.st_size == f.size:
            plan.candidates.append((relpath + f.name, final, f))
        else:
            plan.downloads.append(_new_download(relpath + f.name, path, final, f))
    for s in d.subdirs_present:
        sub = os.path.join(path, s.name)
        if s.name not in local_dirs:
            plan.mkdirs.append(sub)
        _plan_dir(s, sub, f"{relpath}{s.name}/", plan, exists=s.name in local_dirs)


def _new_download(relpath: str, dirpath: str, final: str, f: FileIndex) -> _Download:
    temp = os.path.join(dirpath, f".{f.name[:64]}{TEMP_MARKER}{uuid.uuid4().hex}")
    return _Download(relpath, final, temp, f)


def _describe(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def restore_directory(
    store: BlobStore,
    index: SnapshotIndex,
    target_dir: str | os.PathLike[str],
    *,
    verify_checksums: bool = True,
    progress: Progress | None = None,
    checksum_cache: ChecksumCache | None = DEFAULT_CHECKSUM_CACHE,
    workers: int | None = None,
    delete_extra: bool = True,
    index_name: str | None = None,
) -> RestoreStats:
    """Make ``target_dir`` (created if missing) hold exactly the snapshot ``index``.

    Local files matching the index's name, size and checksum are kept (their permission bits fixed);
    everything else is downloaded, verified (length always, checksum unless ``verify_checksums`` is
    False) and renamed into place. Only the permission bits :func:`restored_mode` allows are set.
    Extra files and directories are deleted; symlinks are removed, never followed, and nothing on another
    filesystem (a mount point) is deleted. With ``delete_extra=False`` a target holding anything the
    snapshot does not (besides leftovers of an interrupted restore) raises :class:`RestoreTargetError`
    naming them, before anything is changed. A target that contains the store's root, or lies inside it,
    is refused (:func:`check_restore_target`).

    A missing blob raises :class:`SnapshotBlobMissingError`, a truncated or corrupt one
    :class:`SnapshotCorruptError`, both naming the blob, the file and the snapshot (``index_name`` when
    given); no partial file is left behind under a real name; the target may then hold a mix of old and
    new files, and running the restore again completes it. ``progress(nbytes)`` is called from I/O
    threads as blobs are downloaded. Must not be called from the store's own I/O pool. ``workers``
    bounds the blobs in flight (default: :func:`~blobstate.snapshot.parallel.default_workers`).
    """
    started = time.monotonic()
    where = f"snapshot {index.checkpoint_id!r}" if index_name is None else f"snapshot {index_name!r}"
    # Never trust names or offsets of an index built elsewhere.
    index.validate(where if index_name is None else index_name)
    target = os.fspath(target_dir)
    if os.path.islink(target):
        raise RestoreTargetError(f"restore target {target!r} is a symlink; refusing to restore through it")
    if os.path.exists(target) and not os.path.isdir(target):
        raise RestoreTargetError(f"restore target {target!r} exists and is not a directory")
    check_restore_target(store, target)
    Path(target).mkdir(parents=True, exist_ok=True)

    plan = _Plan(device=os.stat(target).st_dev)
    _plan_dir(index.dir_index, target, "", plan, exists=True)
    if plan.extras and not delete_extra:
        raise RestoreTargetError(
            f"restore target {target!r} holds {len(plan.extras)} entries that {where} does not: "
            f"{_describe(plan.extras)}; restoring makes the directory identical to the snapshot and would "
            "delete them: restore into an empty directory, or allow deleting them",
            extras=tuple(plan.extras),
        )
    files_deleted = dirs_deleted = 0
    for path, is_dir in plan.doomed:
        with contextlib.suppress(FileNotFoundError):
            if is_dir:
                os.rmdir(path)
                dirs_deleted += 1
            else:
                os.unlink(path)
                files_deleted += 1
    for path in plan.mkdirs:
        os.makedirs(path, exist_ok=True)

    # Same-size local files: keep those whose checksum matches.
    def check(candidate: tuple[str, str, FileIndex]) -> bool:
        _, path, f = candidate
        crc, st = cached_file_crc32(path, checksum_cache)
        if crc != f.checksum:
            return False
        if stat.S_IMODE(st.st_mode) != restored_mode(f.metadata.mode):
            os.chmod(path, restored_mode(f.metadata.mode))
        return True

    workers = workers or default_workers(store)
    matches = run_bounded(store, check, plan.candidates, workers)
    files_reused = bytes_reused = 0
    for (relpath, final, f), same in zip(plan.candidates, matches, strict=True):
        if same:
            files_reused += 1
            bytes_reused += f.size
        else:
            plan.downloads.append(_new_download(relpath, os.path.dirname(final), final, f))

    def missing(blob: FileBlob, d: _Download) -> SnapshotBlobMissingError:
        return SnapshotBlobMissingError(
            f"{where}: blob {blob.blob_id!r} of file {d.relpath!r} is missing from {store.url}",
            blob_id=blob.blob_id,
            file=d.relpath,
        )

    def corrupt(blob: FileBlob, d: _Download, what: str) -> SnapshotCorruptError:
        return SnapshotCorruptError(
            f"{where}: blob {blob.blob_id!r} of file {d.relpath!r} is corrupt: {what}",
            blob_id=blob.blob_id,
            file=d.relpath,
        )

    def finish(d: _Download, verified_crc: int | None) -> None:
        # mtime is left as written: the checksum cache keys on it, so it must reflect this local write.
        os.chmod(d.temp, restored_mode(d.file.metadata.mode))
        os.replace(d.temp, d.final)
        d.done = True
        if checksum_cache is not None and verified_crc is not None:
            checksum_cache.put(d.file.name, os.stat(d.final, follow_symlinks=False), verified_crc)

    def whole_file(d: _Download) -> None:
        ((blob, length),) = d.file.chunks()
        try:
            n = store.get_file(blob.blob_id, d.temp)
        except BlobNotFoundError:
            raise missing(blob, d) from None
        if n != length or os.path.getsize(d.temp) != length:
            raise corrupt(blob, d, f"{n} bytes instead of {length}")
        crc = None
        if verify_checksums:
            crc, _ = mapped_file_crc32(d.temp)
            if crc != blob.checksum:
                raise corrupt(blob, d, f"checksum {crc} instead of {blob.checksum}")
        if progress is not None:
            progress(n)
        finish(d, crc)

    def chunk(job: tuple[_Download, FileBlob, int]) -> None:
        d, blob, length = job
        try:
            data = store.get(blob.blob_id, max_bytes=length)
        except BlobNotFoundError:
            raise missing(blob, d) from None
        if len(data) > length:
            raise corrupt(blob, d, f"more than {length} bytes")
        if len(data) != length:
            raise corrupt(blob, d, f"{len(data)} bytes instead of {length}")
        if verify_checksums and crc32(data) != blob.checksum:
            raise corrupt(blob, d, f"checksum {crc32(data)} instead of {blob.checksum}")
        view = memoryview(data)
        fd = os.open(d.temp, os.O_WRONLY)
        try:
            written = 0
            while written < length:
                written += os.pwrite(fd, view[written:], blob.offset + written)
        finally:
            os.close(fd)
        if progress is not None:
            progress(length)

    jobs: list[tuple[int, Callable[[], None]]] = []
    multi: list[_Download] = []
    try:
        for d in plan.downloads:
            if d.file.size == 0:
                with open(d.temp, "wb"):
                    pass
                finish(d, 0)
            elif len(d.file.blobs) == 1:
                jobs.append((d.file.size, functools.partial(whole_file, d)))
            else:
                os.close(os.open(d.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                multi.append(d)
                for blob, length in d.file.chunks():
                    jobs.append((length, functools.partial(chunk, (d, blob, length))))
        jobs.sort(key=lambda j: j[0], reverse=True)
        run_bounded(store, lambda job: job[1](), jobs, workers)
        for d in multi:
            if os.path.getsize(d.temp) != d.file.size:
                raise SnapshotCorruptError(
                    f"{where}: file {d.relpath!r} has {os.path.getsize(d.temp)} bytes after download, "
                    f"expected {d.file.size}",
                    file=d.relpath,
                )
            # Every chunk's checksum was verified and the index guarantees they combine to the file's.
            finish(d, d.file.checksum if verify_checksums else None)
    finally:
        for d in plan.downloads:
            if not d.done:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(d.temp)

    downloaded = plan.downloads
    return RestoreStats(
        files_downloaded=len(downloaded),
        bytes_downloaded=sum(d.file.size for d in downloaded),
        files_reused=files_reused,
        bytes_reused=bytes_reused,
        files_deleted=files_deleted,
        dirs_deleted=dirs_deleted,
        seconds=time.monotonic() - started,
    )
