"""The blob store interface shared by every backend.

A blob store holds immutable objects under slash-separated names relative to the store's root. Backends
implement the small ``_``-prefixed primitives; this base class adds what every backend needs the same
way: name validation, retries with backoff (a fresh stream per try), and an explicit bounded I/O pool.
"""

from __future__ import annotations

import builtins
import copy
import functools
import os
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from blobstate.blobstore.activity import note, observed
from blobstate.blobstore.names import validate_blob_name, validate_prefix
from blobstate.blobstore.redact import redact, scrub_chain
from blobstate.errors import BlobStoreError

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_PENDING_TTL_SECONDS = 30 * 24 * 3600.0
"""Objects written before their version commits expire after this long unless their TTL is removed."""

DEFAULT_IO_THREADS = 8


class BlobNotFoundError(BlobStoreError):
    """The named object does not exist (never written, deleted, or expired)."""

    def __init__(self, name: str, store_url: str = "") -> None:
        where = f" in {store_url}" if store_url else ""
        super().__init__(f"blob not found: {name!r}{where}")
        self.name = name
        self.store_url = store_url


class BucketNotFoundError(BlobStoreError):
    """The bucket (or other container) the store lives in does not exist: no object can be found or made.

    Never a :class:`BlobNotFoundError`: a missing bucket is not an empty store.
    """


class LocationNotFoundError(BlobStoreError):
    """The location a command reads (a checkpoint, a backup repository) does not exist: a local directory
    that is not there, most often a mistyped path (:func:`~blobstate.blobstore.open_existing_blob_store`)."""


class LocationNotADirectoryError(BlobStoreError):
    """A local location is a file (or lies below one): a checkpoint or backup repository is a directory."""


class TransientBlobError(BlobStoreError):
    """A failure worth retrying (throttling, timeouts, connection resets). Backends raise it."""


class InvalidBlobNameError(BlobStoreError, ValueError):
    """A name that is empty, absolute, or could escape the store's root."""


@dataclass(frozen=True)
class ExpiryCheck:
    """What a store can tell about the expiry of its pending objects (:meth:`BlobStore.check_expiry`)."""

    problem: str | None = None
    """Pending objects will not expire as they should: what is wrong, naming the bucket, and the fix."""
    unknown: str | None = None
    """The check could not be made: why (nothing is known either way)."""


class _NotStarted(Exception):
    """An item :meth:`BlobStore.run_parallel` skipped because another item had failed."""


Data = bytes | bytearray | memoryview | os.PathLike[str] | str
"""What ``put`` accepts: bytes in memory, or the path of a local file to stream from."""


class BlobStore(ABC):
    """One blob store: put, get, delete, remove_ttl, exists, list, put_if_absent.

    Every public method validates the name, retries transient errors with exponential backoff, and raises
    :class:`BlobNotFoundError` naming the object when it is missing. Bulk work goes through
    :meth:`run_parallel`, which uses this store's own bounded pool and refuses to block inside it.
    """

    url: str
    """The store's location as messages name it (a backend's options left out, any secret masked by
    :func:`~blobstate.blobstore.redact.redact`)."""

    def __init__(
        self,
        url: str,
        *,
        io_threads: int = DEFAULT_IO_THREADS,
        max_attempts: int = 5,
        backoff_seconds: float = 0.05,
    ) -> None:
        self.url = redact(url)
        self.io_threads = io_threads
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._pool_prefix = f"blobstate-io-{id(self):x}"
        self.retries = 0
        """How many times an operation of this store was tried again after a transient failure."""
        self._retries_lock = threading.Lock()

    # ----------------------------------------------------------------- backend primitives
    @abstractmethod
    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None: ...

    @abstractmethod
    def _put_file(self, name: str, path: Path, ttl: float | None) -> None: ...

    @abstractmethod
    def _put_if_absent(self, name: str, data: bytes, ttl: float | None) -> bool: ...

    @abstractmethod
    def _get_bytes(self, name: str) -> bytes: ...

    def _get_prefix(self, name: str, limit: int) -> bytes:
        """The object's first ``limit`` (at least 1) bytes, or all of it when shorter. Backends that can
        read a range override this; by default the object is read whole and cut."""
        return self._get_bytes(name)[:limit]

    @abstractmethod
    def _get_file(self, name: str, path: Path) -> int: ...

    @abstractmethod
    def _delete(self, name: str) -> None: ...

    @abstractmethod
    def _remove_ttl(self, name: str) -> None: ...

    @abstractmethod
    def _has_ttl(self, name: str) -> bool: ...

    @abstractmethod
    def _exists(self, name: str) -> bool: ...

    @abstractmethod
    def _list(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def _list_sizes(self, prefix: str) -> dict[str, int]: ...

    # ----------------------------------------------------------------- public operations
    def put(self, name: str, data: Data, *, ttl: float | None = None) -> None:
        """Write ``data`` (bytes, or a local file path streamed from disk) under ``name``.

        ``ttl`` in seconds marks the object pending: it expires unless :meth:`remove_ttl` is called.
        """
        name = validate_blob_name(name)
        if isinstance(data, bytes | bytearray | memoryview):
            payload = bytes(data) if isinstance(data, bytearray) else data
            self._retry("put", name, lambda: self._put_bytes(name, payload, ttl))
            note("write", len(payload))
        else:
            path = Path(data)
            self._retry("put", name, lambda: self._put_file(name, path, ttl))
            if observed():  # no stat on a query's upload path
                note("write", _size_of(path))

    def put_if_absent(self, name: str, data: bytes, *, ttl: float | None = None) -> bool:
        """Create ``name`` only if it does not exist. Returns True if this call created it.

        Of several concurrent callers (threads, processes or hosts) exactly one gets True. A try whose
        answer was lost may have created the object: a retry that finds it holding exactly ``data``
        returns True (callers write bytes unique to them, so those bytes are this call's).
        """
        name = validate_blob_name(name)
        payload = bytes(data)
        tried = False

        def create() -> bool:
            nonlocal tried
            retry, tried = tried, True
            if self._put_if_absent(name, payload, ttl):
                return True
            return retry and self._holds(name, payload)

        created = self._retry("put_if_absent", name, create)
        if created:
            note("write", len(payload))
        return created

    def _holds(self, name: str, payload: bytes) -> bool:
        """Whether ``name`` exists holding exactly ``payload``."""
        try:
            return self._get_bytes(name) == payload
        except BlobNotFoundError:
            return False

    def get(self, name: str, *, max_bytes: int | None = None) -> bytes:
        """Return the whole object; with ``max_bytes``, at most its first ``max_bytes + 1`` bytes.

        A caller that knows the object's size (a commit records it) gives it as ``max_bytes``: an object
        that is larger comes back cut one byte past it, so the size check fails without the object
        being read whole (a corrupt or foreign object may be of any size)."""
        name = validate_blob_name(name)
        if max_bytes is None:
            data = self._retry("get", name, lambda: self._get_bytes(name))
        else:
            if max_bytes < 0:
                raise ValueError(f"max_bytes must not be negative, not {max_bytes}")
            data = self._retry("get", name, lambda: self._get_prefix(name, max_bytes + 1))
        note("read", len(data))
        return data

    def get_file(self, name: str, path: str | os.PathLike[str]) -> int:
        """Stream the object into the local file ``path`` (replaced on every try); returns its size."""
        name = validate_blob_name(name)
        target = Path(path)
        size = self._retry("get", name, lambda: self._get_file(name, target))
        note("read", size)
        return size

    def delete(self, name: str) -> None:
        """Delete the object; raises :class:`BlobNotFoundError` if it does not exist.

        A retry that finds the object gone after an attempt whose answer was lost (the connection cut
        after the server deleted it) is a success: that attempt deleted it.
        """
        name = validate_blob_name(name)
        tried = False

        def attempt() -> None:
            nonlocal tried
            retrying, tried = tried, True
            try:
                self._delete(name)
            except BlobNotFoundError:
                if not retrying:
                    raise

        self._retry("delete", name, attempt)
        note("delete", 1)

    def delete_if_exists(self, name: str) -> bool:
        """Delete the object if it exists; returns whether it did. Cleanup uses this: gone is done."""
        try:
            self.delete(name)
            return True
        except BlobNotFoundError:
            return False

    def remove_ttl(self, name: str) -> None:
        """Make the object permanent. Idempotent; raises :class:`BlobNotFoundError` if it is gone."""
        name = validate_blob_name(name)
        self._retry("remove_ttl", name, lambda: self._remove_ttl(name))

    def has_ttl(self, name: str) -> bool:
        """Whether the object is still pending (carries a TTL)."""
        name = validate_blob_name(name)
        return self._retry("has_ttl", name, lambda: self._has_ttl(name))

    def exists(self, name: str) -> bool:
        """Whether the object exists."""
        name = validate_blob_name(name)
        return self._retry("exists", name, lambda: self._exists(name))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted names of all objects whose name starts with ``prefix``."""
        prefix = validate_prefix(prefix)
        names = sorted(self._retry("list", prefix, lambda: self._list(prefix)))
        note("list", len(names))
        return names

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        """Every object whose name starts with ``prefix`` and its size in bytes, in name order.

        One listing (no per-object request), so presence and sizes can be checked without reading.
        """
        prefix = validate_prefix(prefix)
        sizes = self._retry("list", prefix, lambda: self._list_sizes(prefix))
        note("list", len(sizes))
        return dict(sorted(sizes.items()))

    def expire(self, now: float | None = None) -> builtins.list[str]:
        """Delete pending objects whose TTL has passed; returns their names.

        Backends with native expiry (S3 lifecycle rules) do nothing here and return an empty list.
        """
        return []

    def expired(self, now: float | None = None) -> builtins.list[str]:
        """The names :meth:`expire` would delete at ``now``, deleting nothing (``gc --dry-run``)."""
        return []

    def expiry_problem(self) -> str | None:
        """None when pending objects will expire; otherwise a sentence saying what is wrong and the fix.

        Backends that expire pending objects in :meth:`expire` (run by ``blobstate gc``) have nothing to
        check; S3 checks that the bucket's lifecycle rule for this prefix is installed and enabled.
        """
        return None

    def check_expiry(self) -> ExpiryCheck:
        """Whether pending objects will expire, for a warning when a query starts; never raises for what
        it cannot check (:attr:`ExpiryCheck.unknown` says why). Backends that expire pending objects in
        :meth:`expire` (``blobstate gc``) have nothing to check."""
        return ExpiryCheck()

    def location_missing(self) -> str | None:
        """Why the store's location does not exist (``<url> does not exist``), when the backend can tell
        without a listing: a local directory that is not there. None when it exists, and always for object
        stores and memory, where a prefix exists only through the objects under it: there a location
        without a checkpoint is one whose ``metadata.json`` is missing, as the commands say."""
        return None

    def holds_nothing(self) -> bool:
        """Whether no object at all is stored under the store's location (a mistyped object-store path
        reads this way: a prefix exists only through its objects). Backends that page their listings
        ask for one object only."""
        return not self.list()

    def install_expiry_rule(self) -> None:
        """Set up native expiry of pending objects (the S3 lifecycle rule); nothing to do elsewhere."""
        return None

    def close(self) -> None:
        """Release the I/O pool and any client."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> BlobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- concurrency
    def with_own_pool(self) -> BlobStore:
        """A view of this store on the same backend client with an I/O pool of its own.

        Background work (snapshot uploads) runs its many parallel requests there, so they never queue
        ahead of a batch's own I/O on this store's pool. Do not :meth:`close` the view: it shares the
        client (close this store instead).
        """
        view = copy.copy(self)
        view._pool = None
        view._pool_lock = threading.Lock()
        view._pool_prefix = f"blobstate-io-{id(view):x}"
        return view

    def submit(self, fn: Callable[[], R]) -> Future[R]:
        """Run ``fn`` on this store's bounded I/O pool."""
        return self._io_pool().submit(fn)

    def run_parallel(self, fn: Callable[[T], R], items: Iterable[T]) -> builtins.list[R]:
        """Apply ``fn`` to every item on the I/O pool and return the results in order.

        Must not be called from a pool thread: waiting there for other pool tasks can deadlock a bounded
        pool, so it raises instead. After a failure no further item is started (so an endpoint that has
        stopped answering costs one retry budget, not one per item); the first failure is raised once the
        items already running have finished.
        """
        if threading.current_thread().name.startswith(self._pool_prefix):
            raise RuntimeError("run_parallel called from inside the blob store's own I/O pool")
        failed = threading.Event()

        def run(item: T) -> R:
            if failed.is_set():
                raise _NotStarted
            try:
                return fn(item)
            except BaseException:
                failed.set()
                raise

        futures = [self.submit(functools.partial(run, item)) for item in items]
        results: builtins.list[R] = []
        first_error: BaseException | None = None
        for future in futures:
            try:
                results.append(future.result())
            except _NotStarted:
                continue
            except BaseException as error:
                if first_error is None:
                    first_error = error
        if first_error is not None:
            raise first_error
        return results

    def _io_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.io_threads, thread_name_prefix=self._pool_prefix
                )
            return self._pool

    # ----------------------------------------------------------------- retries
    def _retry(self, op: str, name: str, call: Callable[[], R]) -> R:
        try:
            return self._retrying(op, name, call)
        except Exception as error:
            raise scrub_chain(error)  # noqa: B904 (the error raised as it was, its chain made safe)

    def _retrying(self, op: str, name: str, call: Callable[[], R]) -> R:
        delay = self.backoff_seconds
        started = time.monotonic()
        for attempt in range(1, self.max_attempts + 1):
            try:
                return call()
            except TransientBlobError as error:
                if attempt == self.max_attempts:
                    raise self._gave_up(op, name, attempt, time.monotonic() - started, error) from error
                with self._retries_lock:
                    self.retries += 1
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    def _gave_up(
        self, op: str, name: str, attempts: int, seconds: float, error: TransientBlobError
    ) -> BlobStoreError:
        """The error raised once the retry budget is spent; backends add what to check."""
        return BlobStoreError(
            f"{op} {name!r} in {self.url} failed after {attempts} attempts in {seconds:.1f} s: {error}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def _size_of(path: Path) -> int:
    """The size of a file just uploaded, for :func:`~blobstate.blobstore.activity.note` (0 if gone)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
