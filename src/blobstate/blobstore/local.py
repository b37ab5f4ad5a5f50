"""The local-directory blob store (``file:///abs/dir`` or a plain path): the embedded default.

Objects are regular files under the root. Writes go to a temporary file in the reserved
``.blobstate-tmp/`` area, are fsynced, and are renamed into place, so a reader never sees a half-written
object. ``put_if_absent`` hard-links the temporary file to the final name, which fails atomically if the
name exists, so it is create-only across threads and processes. TTLs are recorded by the store itself
as files ``.blobstate-ttl/<name>`` holding the expiry time in epoch seconds; :meth:`LocalBlobStore.expire`
(run by ``blobstate gc``) deletes the objects whose recorded expiry has passed.

Paths inside the store are plain strings, not :class:`pathlib.Path`: Python 3.11's pathlib interns every
path part, and the parts of per-version object and temporary names come and go every batch. That churn
rebuilt Python's interned-string table about every 900 batches of a soak (a 1.9 MB block each time), and
in a long-running driver those blocks were left resident in one thread's malloc arena after another.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from blobstate.blobstore.base import (
    BlobNotFoundError,
    BlobStore,
    InvalidBlobNameError,
    LocationNotADirectoryError,
)
from blobstate.blobstore.names import RESERVED_PREFIX
from blobstate.blobstore.redact import redact
from blobstate.durable import fsync_dir
from blobstate.errors import BlobStoreError

TTL_DIR = ".blobstate-ttl"
"""Reserved top-level directory holding one TTL record per pending object."""

TMP_DIR = ".blobstate-tmp"
"""Reserved top-level directory holding in-flight temporary files."""

STALE_TMP_SECONDS = 24 * 3600.0
"""Temporary files untouched for this long were left by a crashed writer; ``expire`` removes them."""

_MKDIR_RETRIES = 5


class LocalPathError(BlobStoreError, ValueError):
    """A ``file://`` URL that names another host or no path, or an empty path (names it, redacted)."""


def local_path(url: str) -> str:
    """The path a ``file://`` URL (``file:///p``, ``file://localhost/p``, percent-decoded) or a plain path
    names, as given: the one reading of a local location, for the store and for the location's spelling
    (:func:`blobstate.blobstore.schemes.normalize_location`). Raises :class:`LocalPathError`."""
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise LocalPathError(
                f"file URL {redact(url)!r} names host {redact(url).split('/')[2]!r}; only local paths are"
                " supported"
            )
        path = unquote(parsed.path)
        if not path:
            raise LocalPathError(f"file URL {redact(url)!r} has no path")
    else:
        path = url
    if not path:
        raise LocalPathError("empty blob store path")
    return path


def root_from_url(url: str) -> Path:
    """The absolute root directory named by a ``file://`` URL or a plain path."""
    return Path(local_path(url)).expanduser().resolve()


def _refuse_a_file(url: str, root: Path) -> None:
    """Refuse a root that is a file, or lies below one: no object could ever be stored there, and every
    operation would fail with the operating system's bare ``NotADirectoryError``."""
    for path in (root, *root.parents):
        if not os.path.lexists(path):
            continue
        if os.path.isdir(path):
            return
        what = "a file" if os.path.isfile(path) else "neither a file nor a directory"
        if path == root:
            raise LocationNotADirectoryError(
                f"{url} is {what}, not a checkpoint directory (a checkpoint or backup repository is a"
                " directory)"
            )
        shown = redact(str(path))
        raise LocationNotADirectoryError(f"{url} cannot be a checkpoint directory: {shown} is {what}")


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBlobStore(BlobStore):
    """Objects as files under a local directory; TTLs recorded under ``.blobstate-ttl/``."""

    def __init__(self, url: str, *, fsync: bool = True, **options: object) -> None:
        """Open the store at ``url``. ``fsync=False`` skips fsyncs (only for scratch stores and tests)."""
        super().__init__(url, **options)  # type: ignore[arg-type]
        self.root = root_from_url(url)
        self._root = str(self.root)
        self.fsync = fsync
        _refuse_a_file(self.url, self.root)

    def location_missing(self) -> str | None:
        """``<url> does not exist`` while the root directory is not there (a mistyped path); else None."""
        return None if os.path.isdir(self._root) else f"{self.url} does not exist"

    # ----------------------------------------------------------------- paths
    def _inside(self, name: str, path: str) -> str:
        """``path`` if it resolves inside the root, else an error: a symlink in the root points out.

        The root was resolved when the store was opened, and ``path`` is normally the root joined with
        a validated name, which can lead out only through a symlink below the root: so only the
        components below the root are looked at (``lstat``), and the path is resolved in full only when
        one of them is a symlink, or the path is not of that form.
        """
        if _no_symlink_below(path, self._root):
            return path
        resolved = os.path.realpath(path)
        if resolved != self._root and not _below(resolved, self._root):
            raise InvalidBlobNameError(
                f"blob {name!r} in {self.url} resolves to {resolved!r}, outside the store root "
                f"{self._root!r} (a symlink inside the root points out of it)"
            )
        return path

    def _object_path(self, name: str) -> str:
        return self._inside(name, os.path.join(self._root, name))

    def _ttl_path(self, name: str) -> str:
        return self._inside(name, os.path.join(self._root, TTL_DIR, name))

    def _tmp_path(self) -> str:
        tmp_dir = os.path.join(self._root, TMP_DIR)
        if not os.path.isdir(tmp_dir):  # one stat where it exists, which is almost always
            os.makedirs(tmp_dir, exist_ok=True)
        return os.path.join(self._inside(TMP_DIR, tmp_dir), f"{uuid.uuid4().hex}.tmp")

    # ----------------------------------------------------------------- writing
    def _write_tmp(self, fill: Callable[[str], object], *, durable: bool = True) -> str:
        """A fresh temporary file filled by ``fill`` (fsynced if ``durable``); removed if filling fails."""
        tmp = self._tmp_path()
        try:
            fill(tmp)
            if durable and self.fsync:
                _fsync_file(tmp)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp

    def _place(self, name: str, tmp: str, final: str, *, exclusive: bool, durable: bool = True) -> bool:
        """Move ``tmp`` to ``final`` (replacing it, or only creating it when ``exclusive``).

        Parent directories are created as needed; a concurrent delete may prune them between ``mkdir``
        and the rename, so that race is retried. Returns False when ``exclusive`` and ``final`` exists.
        """
        directory = os.path.dirname(final)
        for attempt in range(_MKDIR_RETRIES):
            # One stat where the directory exists (most writes), makedirs (a mkdir and two stats) only
            # where it does not, or after a concurrent delete pruned it.
            if attempt or not os.path.isdir(directory):
                try:
                    os.makedirs(directory, exist_ok=True)
                except FileNotFoundError:
                    # A concurrent prune removed a parent makedirs had just made: make them again.
                    if attempt == _MKDIR_RETRIES - 1:
                        raise
                    continue
                except (FileExistsError, NotADirectoryError) as error:
                    raise BlobStoreError(
                        f"cannot write blob {name!r} in {self.url}: a parent of {final!r} is an object, "
                        "not a directory"
                    ) from error
            self._inside(name, final)
            try:
                if exclusive:
                    os.link(tmp, final, follow_symlinks=False)
                else:
                    os.replace(tmp, final)
            except FileExistsError:
                return False
            except FileNotFoundError:
                if attempt == _MKDIR_RETRIES - 1:
                    raise
                continue
            except IsADirectoryError as error:
                raise BlobStoreError(
                    f"cannot write blob {name!r} in {self.url}: {final!r} is a directory"
                ) from error
            if durable and self.fsync:
                fsync_dir(directory)
            return True
        raise AssertionError("unreachable")

    def _write_atomic(
        self, name: str, final: str, fill: Callable[[str], object], *, durable: bool = True
    ) -> None:
        tmp = self._write_tmp(fill, durable=durable)
        placed = False
        try:
            placed = self._place(name, tmp, final, exclusive=False, durable=durable)
        finally:
            if not placed:  # renamed into place otherwise: nothing left to remove
                _unlink_quietly(tmp)

    def _record_ttl(self, name: str, ttl: float, record: str | None = None) -> None:
        """Write ``name``'s TTL record (at ``record``, its :meth:`_ttl_path` when the caller has it)."""
        expiry = f"{time.time() + ttl!r}\n".encode()
        # Not fsynced: losing a fresh record in a power cut only leaks a pending object (which a full gc
        # of unreferenced objects still finds); syncing it would halve the rate of small pending puts.
        path = self._ttl_path(name) if record is None else record
        self._write_atomic(name, path, _writer(expiry), durable=False)

    def _drop_ttl_record(self, name: str) -> None:
        path = self._ttl_path(name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        # Durable before returning: a record that came back after a crash would expire a committed object.
        if self.fsync:
            directory = os.path.dirname(path)
            while True:
                try:
                    fsync_dir(directory)
                    break
                except FileNotFoundError:
                    # A concurrent call pruned the emptied directory: make that removal durable instead.
                    directory = os.path.dirname(directory)
        self._prune(os.path.dirname(path), os.path.join(self._root, TTL_DIR))

    def _put(self, name: str, ttl: float | None, fill: Callable[[str], object]) -> None:
        final = self._object_path(name)
        if ttl is None:
            self._write_atomic(name, final, fill)
            self._drop_ttl_record(name)
            return
        # The record goes first: a crash after it leaves a record without an object, which expire drops;
        # the other order could leave a pending object that never expires.
        record = self._ttl_path(name)
        previous = self._read_record(name, record)
        self._record_ttl(name, ttl, record)
        try:
            self._write_atomic(name, final, fill)
        except BaseException:
            # The old object is still in place: give it back its old TTL state, or a failed pending
            # overwrite would make a permanent object expire.
            self._restore_record(name, previous)
            raise

    def _read_record(self, name: str, record: str | None = None) -> bytes | None:
        try:
            return _read_bytes(self._ttl_path(name) if record is None else record)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None:
        self._put(name, ttl, _writer(data))

    def _put_file(self, name: str, path: Path, ttl: float | None) -> None:
        self._put(name, ttl, lambda tmp: shutil.copyfile(path, tmp))

    def _put_if_absent(self, name: str, data: bytes, ttl: float | None) -> bool:
        final = self._object_path(name)
        if ttl is None:
            if not self._create(name, final, data):
                return False
            # Only the winner touches the TTL record, so a loser can never make the winner's object pending.
            self._drop_ttl_record(name)
            return True
        if os.path.isfile(final):
            return False
        # The record goes first, as in put: a crash between the two steps leaves a record without an
        # object, which expire drops; the other order would leave a pending object that never expires.
        # Pending creates use names unique to their writer, so no other creator races for the record.
        previous = self._read_record(name)
        self._record_ttl(name, ttl)
        created = False
        try:
            created = self._create(name, final, data)
        finally:
            if not created:
                self._restore_record(name, previous)
        return created

    def _create(self, name: str, final: str, data: bytes) -> bool:
        """Create ``final`` holding ``data`` unless it exists; whether this call created it."""
        tmp = self._write_tmp(_writer(data))
        try:
            return self._place(name, tmp, final, exclusive=True)
        finally:
            _unlink_quietly(tmp)

    def _restore_record(self, name: str, previous: bytes | None) -> None:
        """Give ``name``'s TTL record back the state it had (none, or ``previous``)."""
        if previous is None:
            self._drop_ttl_record(name)
        else:
            self._write_atomic(name, self._ttl_path(name), _writer(previous))

    # ----------------------------------------------------------------- reading
    def _get_bytes(self, name: str) -> bytes:
        return self._get_prefix(name, -1)

    def _get_prefix(self, name: str, limit: int) -> bytes:
        """The object's first ``limit`` bytes (-1: all of them)."""
        try:
            return _read_bytes(self._object_path(name), limit)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFoundError(name, self.url) from None

    def _get_file(self, name: str, path: Path) -> int:
        source = self._object_path(name)
        if not os.path.isfile(source):
            raise BlobNotFoundError(name, self.url)
        try:
            shutil.copyfile(source, path)
        except FileNotFoundError:
            if not os.path.isfile(source):
                raise BlobNotFoundError(name, self.url) from None
            raise
        return path.stat().st_size

    def _exists(self, name: str) -> bool:
        return os.path.isfile(self._object_path(name))

    def _require(self, name: str) -> str:
        path = self._object_path(name)
        if not os.path.isfile(path):
            raise BlobNotFoundError(name, self.url)
        return path

    def _has_ttl(self, name: str) -> bool:
        self._require(name)
        return os.path.isfile(self._ttl_path(name))

    def _list(self, prefix: str) -> list[str]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._inside(prefix, os.path.join(self._root, base)) if base else self._root
        return [name for name in self._walk(start, base) if name.startswith(prefix)]

    def _list_sizes(self, prefix: str) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for name in self._list(prefix):
            try:
                sizes[name] = os.stat(self._object_path(name)).st_size
            except FileNotFoundError:
                continue  # deleted since it was listed
        return sizes

    def _walk(self, directory: str, relative: str) -> Iterator[str]:
        """Names of regular files under ``directory``; skips symlinks and the reserved directories."""
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if not relative and entry.name.startswith(RESERVED_PREFIX):
                continue
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(entry.path, name)
            elif entry.is_file(follow_symlinks=False):
                yield name

    # ----------------------------------------------------------------- deleting and TTLs
    def _prune(self, directory: str, stop: str) -> None:
        """Remove empty directories from ``directory`` upwards, never ``stop`` or anything above it."""
        while _below(directory, stop):
            try:
                os.rmdir(directory)
            except OSError as error:
                if error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                    return
                raise
            directory = os.path.dirname(directory)

    def _delete(self, name: str) -> None:
        path = self._object_path(name)
        if not os.path.isfile(path):
            raise BlobNotFoundError(name, self.url)
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise BlobNotFoundError(name, self.url) from None
        self._drop_ttl_record(name)
        self._prune(os.path.dirname(path), self._root)

    def _remove_ttl(self, name: str) -> None:
        self._drop_ttl_record(name)
        self._require(name)

    def expire(self, now: float | None = None) -> list[str]:
        """Delete objects whose recorded expiry is at or before ``now``; returns their names.

        Records left without an object (a writer crashed between the record and the object) are dropped
        once expired, and temporary files abandoned by crashed writers are removed after a day (judged by
        the real clock).
        """
        now = time.time() if now is None else now
        deleted = [name for name in self._pending_names() if self._expire_one(name, now)]
        self._drop_stale_tmp()
        return sorted(deleted)

    def expired(self, now: float | None = None) -> list[str]:
        """Objects whose recorded expiry is at or before ``now``, deleting nothing."""
        now = time.time() if now is None else now
        out = []
        for name in self._pending_names():
            record = self._ttl_path(name)
            try:
                expiry = float(_read_bytes(record))
            except FileNotFoundError:
                continue
            except ValueError as error:
                raise BlobStoreError(f"corrupt TTL record {record!r} for blob {name!r}") from error
            if expiry <= now and os.path.isfile(self._object_path(name)):
                out.append(name)
        return sorted(out)

    def _pending_names(self) -> list[str]:
        ttl_root = os.path.join(self._root, TTL_DIR)
        if not os.path.isdir(ttl_root):
            return []
        return list(self._walk(ttl_root, ""))

    def _expire_one(self, name: str, now: float) -> bool:
        record = self._ttl_path(name)
        try:
            expiry = float(_read_bytes(record))
        except FileNotFoundError:
            return False
        except ValueError as error:
            raise BlobStoreError(f"corrupt TTL record {record!r} for blob {name!r}") from error
        if expiry > now:
            return False
        # Claim the record by renaming it, so concurrent expire calls delete each object once and a
        # concurrent remove_ttl (which unlinks the record) wins if it came first.
        claimed = self._tmp_path()
        try:
            os.rename(record, claimed)
        except FileNotFoundError:
            return False
        try:
            if float(_read_bytes(claimed)) > now:  # re-written by a new put in between: put it back
                with contextlib.suppress(FileExistsError):
                    os.link(claimed, record)
                return False
            self._prune(os.path.dirname(record), os.path.join(self._root, TTL_DIR))
            path = self._object_path(name)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            self._prune(os.path.dirname(path), self._root)
            return True
        finally:
            _unlink_quietly(claimed)

    def _drop_stale_tmp(self) -> None:
        # Judged by the real clock, not expire's ``now``: an in-flight write must never look stale.
        tmp_dir = os.path.join(self._root, TMP_DIR)
        if not os.path.isdir(tmp_dir):
            return
        cutoff = time.time() - STALE_TMP_SECONDS
        for entry in os.scandir(tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)


def _no_symlink_below(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` joined with plain segments (none empty, ``.`` or ``..``) of which no
    existing one is a symlink: then it resolves to itself, inside ``root``, as ``os.path.realpath`` would
    find looking at the same components. False means: resolve it in full to tell."""
    prefix = root if root.endswith(os.sep) else root + os.sep
    if path == root or not path.startswith(prefix):
        return False
    component = prefix[:-1]
    for segment in path[len(prefix) :].split(os.sep):
        if segment in ("", ".", ".."):
            return False
        component = f"{component}{os.sep}{segment}"
        try:
            mode = os.lstat(component).st_mode
        except OSError:
            # Missing (or unreadable, as realpath treats it): no component below it can be a link either.
            return True
        if stat.S_ISLNK(mode):
            return False
    return True


def _below(path: str, directory: str) -> bool:
    """Whether the normalized ``path`` lies strictly below ``directory`` (``/`` included)."""
    prefix = directory if directory.endswith(os.sep) else directory + os.sep
    return path != directory and path.startswith(prefix)


def _writer(data: bytes | memoryview) -> Callable[[str], object]:
    """A ``fill`` for a temporary file: write ``data`` to it."""

    def fill(path: str) -> None:
        with open(path, "wb") as out:
            out.write(data)

    return fill


def _read_bytes(path: str, limit: int = -1) -> bytes:
    with open(path, "rb") as source:
        return source.read(limit)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
