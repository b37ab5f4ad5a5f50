"""Helpers for snapshot tests: file trees, real RocksDB databases, and a fault-injecting store wrapper."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from blobstate.blobstore import BlobStore, BlobStoreError


def write_tree(root: Path, files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> Path:
    """Create ``files`` (relative path -> content) and empty ``dirs`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for rel in dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    return root


def read_tree(root: Path) -> dict[str, tuple[str, bytes | None, int]]:
    """Everything under ``root``: relative path -> ("file", content, mode) or ("dir", None, 0)."""
    out: dict[str, tuple[str, bytes | None, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = Path(dirpath, d)
            out[str(p.relative_to(root))] = ("link" if p.is_symlink() else "dir", None, 0)
        for f in filenames:
            p = Path(dirpath, f)
            st = p.lstat()
            kind = "file" if stat.S_ISREG(st.st_mode) else "other"
            out[str(p.relative_to(root))] = (
                kind,
                p.read_bytes() if kind == "file" else None,
                stat.S_IMODE(st.st_mode),
            )
    return out


class RocksFixture:
    """A real RocksDB (rocksdict) database with helpers to write keys, flush and take checkpoints."""

    def __init__(self, root: Path) -> None:
        from rocksdict import Options, Rdict

        self.root = root
        self.path = root / "db"
        self.db = Rdict(str(self.path), Options(raw_mode=True))
        self.expected: dict[bytes, bytes] = {}
        self._n = 0

    def write(self, count: int, value_size: int = 100, prefix: bytes = b"k") -> None:
        """Write ``count`` keys with random values and flush them to a new SST."""
        for i in range(count):
            key = prefix + b"%08d" % (self._n + i)
            value = os.urandom(value_size)
            self.db[key] = value
            self.expected[key] = value
        self._n += count
        self.db.flush()

    def checkpoint(self, name: str) -> Path:
        """A RocksDB checkpoint (hard links + copied metadata files) under ``root/name``."""
        from rocksdict import Checkpoint

        dest = self.root / name
        Checkpoint(self.db).create_checkpoint(str(dest))
        return dest

    def close(self) -> None:
        """Close the database."""
        self.db.close()


def open_and_read(path: Path) -> dict[bytes, bytes]:
    """Open the RocksDB at ``path`` and return all its key/value pairs."""
    from rocksdict import Options, Rdict

    db = Rdict(str(path), Options(raw_mode=True))
    try:
        return dict(db.items())
    finally:
        db.close()


class FaultyStore(BlobStore):
    """Wraps a real store and raises ``BlobStoreError`` on chosen operations (fault injection only)."""

    def __init__(
        self, inner: BlobStore, *, fail_put_after: int | None = None, fail_delete_after: int | None = None
    ):
        super().__init__(inner.url, io_threads=2)
        self.inner = inner
        self.fail_put_after = fail_put_after
        self.fail_delete_after = fail_delete_after
        self.puts: list[str] = []
        self.deletes: list[str] = []
        self._lock = threading.Lock()

    def _count(self, log: list[str], limit: int | None, op: str, name: str) -> None:
        with self._lock:
            if limit is not None and len(log) >= limit:
                raise BlobStoreError(f"injected failure: {op} {name!r}")
            log.append(name)

    def _put_bytes(self, name, data, ttl):  # type: ignore[no-untyped-def]
        self._count(self.puts, self.fail_put_after, "put", name)
        self.inner.put(name, data, ttl=ttl)

    def _put_file(self, name, path, ttl):  # type: ignore[no-untyped-def]
        self._count(self.puts, self.fail_put_after, "put", name)
        self.inner.put(name, path, ttl=ttl)

    def _put_if_absent(self, name, data, ttl):  # type: ignore[no-untyped-def]
        self._count(self.puts, self.fail_put_after, "put", name)
        return self.inner.put_if_absent(name, data, ttl=ttl)

    def _get_bytes(self, name):  # type: ignore[no-untyped-def]
        return self.inner.get(name)

    def _get_file(self, name, path):  # type: ignore[no-untyped-def]
        return self.inner.get_file(name, path)

    def _delete(self, name):  # type: ignore[no-untyped-def]
        self._count(self.deletes, self.fail_delete_after, "delete", name)
        self.inner.delete(name)

    def _remove_ttl(self, name):  # type: ignore[no-untyped-def]
        self.inner.remove_ttl(name)

    def _has_ttl(self, name):  # type: ignore[no-untyped-def]
        return self.inner.has_ttl(name)

    def _exists(self, name):  # type: ignore[no-untyped-def]
        return self.inner.exists(name)

    def _list(self, prefix):  # type: ignore[no-untyped-def]
        return self.inner.list(prefix)

    def _list_sizes(self, prefix):  # type: ignore[no-untyped-def]
        return self.inner.list_sizes(prefix)


class HookedStore(BlobStore):
    """Wraps a real store and calls ``hook(op, name)`` before every operation (to inject a crash or a pause).

    ``op`` is one of put, put_if_absent, get, delete, remove_ttl, has_ttl, exists, list; the hook may
    raise (a crash at that point) or block (to line up two writers).
    """

    def __init__(self, inner: BlobStore, hook):  # type: ignore[no-untyped-def]
        super().__init__(inner.url, io_threads=4)
        self.inner = inner
        self.hook = hook

    def _put_bytes(self, name, data, ttl):  # type: ignore[no-untyped-def]
        self.hook("put", name)
        self.inner.put(name, data, ttl=ttl)

    def _put_file(self, name, path, ttl):  # type: ignore[no-untyped-def]
        self.hook("put", name)
        self.inner.put(name, path, ttl=ttl)

    def _put_if_absent(self, name, data, ttl):  # type: ignore[no-untyped-def]
        self.hook("put_if_absent", name)
        return self.inner.put_if_absent(name, data, ttl=ttl)

    def _get_bytes(self, name):  # type: ignore[no-untyped-def]
        self.hook("get", name)
        return self.inner.get(name)

    def _get_file(self, name, path):  # type: ignore[no-untyped-def]
        self.hook("get", name)
        return self.inner.get_file(name, path)

    def _delete(self, name):  # type: ignore[no-untyped-def]
        self.hook("delete", name)
        self.inner.delete(name)

    def _remove_ttl(self, name):  # type: ignore[no-untyped-def]
        self.hook("remove_ttl", name)
        self.inner.remove_ttl(name)

    def _has_ttl(self, name):  # type: ignore[no-untyped-def]
        self.hook("has_ttl", name)
        return self.inner.has_ttl(name)

    def _exists(self, name):  # type: ignore[no-untyped-def]
        self.hook("exists", name)
        return self.inner.exists(name)

    def _list(self, prefix):  # type: ignore[no-untyped-def]
        self.hook("list", prefix)
        return self.inner.list(prefix)

    def _list_sizes(self, prefix):  # type: ignore[no-untyped-def]
        self.hook("list", prefix)
        return self.inner.list_sizes(prefix)

    def expire(self, now=None):  # type: ignore[no-untyped-def]
        return self.inner.expire(now)

    def close(self) -> None:
        super().close()
        self.inner.close()
