"""An in-process blob store (``memory://name``) for tests; stores with the same name share contents."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from blobstate.blobstore.base import BlobNotFoundError, BlobStore


class _Bucket:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, bytes] = {}
        self.expiry: dict[str, float] = {}


_BUCKETS: dict[str, _Bucket] = {}
_BUCKETS_LOCK = threading.Lock()


class MemoryBlobStore(BlobStore):
    """Objects in a process-wide dict keyed by the URL's name; TTLs are recorded and honoured by expire."""

    def __init__(self, url: str, **options: object) -> None:
        super().__init__(url, **options)  # type: ignore[arg-type]
        with _BUCKETS_LOCK:
            self._bucket = _BUCKETS.setdefault(url, _Bucket())

    def _store(self, name: str, data: bytes, ttl: float | None) -> None:
        b = self._bucket
        with b.lock:
            b.objects[name] = data
            if ttl is None:
                b.expiry.pop(name, None)
            else:
                b.expiry[name] = time.time() + ttl

    def _put_bytes(self, name: str, data: bytes | memoryview, ttl: float | None) -> None:
        self._store(name, bytes(data), ttl)

    def _put_file(self, name: str, path: Path, ttl: float | None) -> None:
        self._store(name, path.read_bytes(), ttl)

    def _put_if_absent(self, name: str, data: bytes, ttl: float | None) -> bool:
        b = self._bucket
        with b.lock:
            if name in b.objects:
                return False
            b.objects[name] = data
            if ttl is not None:
                b.expiry[name] = time.time() + ttl
            return True

    def _get_bytes(self, name: str) -> bytes:
        with self._bucket.lock:
            try:
                return self._bucket.objects[name]
            except KeyError:
                raise BlobNotFoundError(name, self.url) from None

    def _get_file(self, name: str, path: Path) -> int:
        data = self._get_bytes(name)
        path.write_bytes(data)
        return len(data)

    def _delete(self, name: str) -> None:
        b = self._bucket
        with b.lock:
            if b.objects.pop(name, None) is None:
                raise BlobNotFoundError(name, self.url)
            b.expiry.pop(name, None)

    def _remove_ttl(self, name: str) -> None:
        b = self._bucket
        with b.lock:
            if name not in b.objects:
                raise BlobNotFoundError(name, self.url)
            b.expiry.pop(name, None)

    def _has_ttl(self, name: str) -> bool:
        b = self._bucket
        with b.lock:
            if name not in b.objects:
                raise BlobNotFoundError(name, self.url)
            return name in b.expiry

    def _exists(self, name: str) -> bool:
        with self._bucket.lock:
            return name in self._bucket.objects

    def _list(self, prefix: str) -> list[str]:
        with self._bucket.lock:
            return [n for n in self._bucket.objects if n.startswith(prefix)]

    def _list_sizes(self, prefix: str) -> dict[str, int]:
        with self._bucket.lock:
            return {n: len(d) for n, d in self._bucket.objects.items() if n.startswith(prefix)}

    def expired(self, now: float | None = None) -> list[str]:
        """Pending objects whose TTL has passed, deleting nothing."""
        now = time.time() if now is None else now
        b = self._bucket
        with b.lock:
            return sorted(n for n, t in b.expiry.items() if t <= now and n in b.objects)

    def expire(self, now: float | None = None) -> list[str]:
        """Delete pending objects whose TTL has passed."""
        now = time.time() if now is None else now
        b = self._bucket
        with b.lock:
            gone = [n for n, t in b.expiry.items() if t <= now]
            for n in gone:
                b.objects.pop(n, None)
                b.expiry.pop(n, None)
        return sorted(gone)
