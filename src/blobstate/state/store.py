"""The RocksDB store of one (operator, partition): column families, writes, changelog, replay, checkpoints.

One RocksDB database (rocksdict in raw bytes mode) per store; every state variable is a column family,
created on first write and discovered again when the store is reopened. Keys and values are ``bytes``.

Write path. Writes land in a small per-column-family overlay (a dict) and are moved into RocksDB in
write batches of up to ``SYNC_EVERY`` entries; reads look in the overlay first, so a store always reads
its own writes. This is measurably faster than one RocksDB call per put (see ``bench/state_store.py``).
Range reads (``items``), ``clear``, ``flush``, ``checkpoint`` and ``close`` move the overlay first.

Changelog. Every ``put``, ``delete`` and ``clear`` is also appended to the changelog as a change record
``(op, column_family, key, value)`` (``ChangeOp`` from ``blobstate.lineage.changelog``), and every
``put_columns`` as one bulk block of those records (:class:`~blobstate.lineage.changelog.Changelog`);
``take_changelog`` hands the records over and starts a new changelog. ``apply`` replays records without
capturing them.

Durability. RocksDB's write-ahead log is off. The source of truth is the committed deltas and snapshots in
the blob store, not the working store: a working store is trusted only while its ``CHECKPOINT-ID`` file
says it is clean, and that file is written only after ``flush()`` or ``checkpoint()``, which move every
write into SST files. A process that dies between writes and a flush loses those writes together with
the store's clean marker, so the partition is reloaded from the checkpoint it was built on. ``close()``
flushes too.

A store is not thread-safe: one task (or one standby sync) uses it at a time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    ColumnFamily,
    DBCompactionStyle,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from blobstate.errors import StateError
from blobstate.gcpause import gc_paused
from blobstate.lineage.changelog import Changelog, ChangeOp, ChangeRecord

__all__ = [
    "QUERY",
    "SCRATCH",
    "ChangeOp",
    "ChangeRecord",
    "Changelog",
    "NotAStoreError",
    "RocksStateStore",
    "StateStoreError",
    "StoreClosedError",
    "StoreLockedError",
    "StoreTuning",
]

SYNC_EVERY = 65536
"""Overlay entries (summed over column families) after which they are written to RocksDB in one batch."""

APPLY_BATCH = 65536
"""Change records per RocksDB write batch in ``apply``."""

_CF_PREFIX = "s:"
"""RocksDB column family name = prefix + state column family name. Keeps RocksDB's own ``default``
column family (always present, never droppable) out of the namespace, so a store's column families are
exactly the ones written, and a database that is not a state store is recognised on open."""

_DEFAULT_CF = "default"

_PUT = ChangeOp.PUT
_DELETE = ChangeOp.DELETE
_CLEAR = ChangeOp.CLEAR

_MISSING: Any = object()
"""Overlay lookup sentinel; an overlay value of None means "deleted"."""


class StateStoreError(StateError, RuntimeError):
    """A state store could not be opened or used. The message names the store's path."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"state store {str(path)!r}: {problem}")
        self.path = str(path)
        self.problem = problem


class NotAStoreError(StateStoreError):
    """The path is not a RocksDB store (and may not be created as one)."""


class StoreLockedError(StateStoreError):
    """Another open store (in this or another process) holds the RocksDB lock of the path."""


class StoreClosedError(StateStoreError):
    """The store was closed; open it again."""


class _ClosedHandles(dict[Any, Any]):
    """Stands in for the handle table after ``close()``: every lookup raises ``StoreClosedError``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def __missing__(self, key: object) -> Any:
        raise StoreClosedError(self._path, "the store is closed")


class _Family:
    """One column family: its overlay of unwritten changes and its RocksDB handles."""

    __slots__ = ("handle", "overlay", "view")

    def __init__(self, view: Rdict, handle: ColumnFamily) -> None:
        self.overlay: dict[bytes, bytes | None] = {}
        self.view = view
        self.handle = handle


BLOCK_CACHE_BYTES = 128 * 1024 * 1024
"""One LRU block cache of this size is shared by every store of the process (instead of one default cache
per column family of every store, which multiplies with the number of partitions)."""

_block_cache: Cache | None = None


def _shared_block_cache() -> Cache:
    global _block_cache
    if _block_cache is None:
        _block_cache = Cache(BLOCK_CACHE_BYTES)
    return _block_cache


@dataclass(frozen=True)
class StoreTuning:
    """How a store spends memory while it is written: RocksDB's write buffers, compactions, block cache.

    The default is a query's working store. :data:`SCRATCH` is for a store that is written once and
    then read once (a rescale restores each old partition to split it, and builds each new partition):
    small write buffers and no compactions while it is written keep its memory the same whatever the
    state's size (full write buffers are flushed to new files of their size, never merged), and a small
    private block cache keeps a scan of millions of keys from filling the process's shared one. A query
    that opens such a store later (a rescale's new partition) merges its files with its own compactions.
    """

    write_buffer_bytes: int | None = None
    """Each column family's write buffer (memtable) size, two of them at most, and this many bytes for
    all of a store's column families together; None: RocksDB's default (64 MiB per column family)."""
    auto_compactions: bool = True
    block_cache_bytes: int | None = None
    """A block cache of this size for this store alone, holding the files' index and filter blocks too
    (loaded when used, where RocksDB otherwise keeps every open file's in memory: a scan needs no filter,
    and those grow with the number of keys); None: the process's shared cache."""


QUERY = StoreTuning()
"""A query's working store, a standby replica, a reader's restore: RocksDB's defaults."""

SCRATCH = StoreTuning(write_buffer_bytes=8 << 20, auto_compactions=False, block_cache_bytes=8 << 20)
"""A store written once and read once; see :class:`StoreTuning`."""


def _cf_options(tuning: StoreTuning = QUERY, cache: Cache | None = None) -> Options:
    """Options of every state column family: raw bytes, bloom filters (most gets of new keys miss), and
    universal compaction, with ``tuning`` (``cache``: the store's own block cache, for a tuning that
    asks for one).

    Every batch flushes its writes (a version must be on disk before it is marked clean), and state
    updates hit keys spread over the whole key space; with leveled compaction each L0 file then
    rewrites most of L1, and at a few million keys per partition that compaction costs more CPU than
    the batch's own work (``bench/state_size.py``). Universal compaction (Kafka Streams' choice for
    its RocksDB stores) merges sorted runs far less often. Stores written with either style open
    with the other."""
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(cache if cache is not None else _shared_block_cache())
    if cache is not None:
        table.set_cache_index_and_filter_blocks(True)
    options = Options(raw_mode=True)
    options.set_block_based_table_factory(table)
    options.set_compaction_style(DBCompactionStyle.universal())
    if tuning.write_buffer_bytes is not None:
        options.set_write_buffer_size(tuning.write_buffer_bytes)
        options.set_max_write_buffer_number(2)
        options.set_db_write_buffer_size(tuning.write_buffer_bytes * 2)
    if not tuning.auto_compactions:
        # RocksDB then neither compacts nor slows writes down for the number of files flushed
        options.set_disable_auto_compactions(True)
    return options


INFO_LOG_FILES_TO_KEEP = 2
"""RocksDB info logs (``LOG`` and ``LOG.old.<time>``) kept per store directory. Every read-write open
starts a new ``LOG`` and renames the previous one; RocksDB's default keeps 1,000 of them, which for a
store reopened every batch is one more file (tens of kB) per batch and partition. Two keep the log of
the open before (a crashed process's) beside the current one."""

INFO_LOG_MAX_BYTES = 1024 * 1024
"""Size at which RocksDB rolls a store's info log (a store open for long keeps dumping statistics)."""


FILES_PER_OPENING_THREAD = 4
"""SST files per thread that opens a store's files: a store with ``n`` SST files opens them with
``n // 4`` threads, at least 1 and at most 16 (RocksDB's default). RocksDB starts its file-opening threads
at every open for every column family (the default column family too), however few files it has: 15
threads per column family, created and joined, cost a small store more CPU than the rest of its open
(``bench/partition_cost.py``). Stores reopened each batch hold few files under universal compaction, and
those were just written and are in the page cache, so one thread opens them as fast; a large store's
many files are still read in parallel on a cold disk."""


def _opening_threads(path: Path) -> int:
    """Threads RocksDB uses to open the files of the store at ``path`` (see FILES_PER_OPENING_THREAD)."""
    try:
        with os.scandir(path) as entries:
            ssts = sum(1 for e in entries if e.name.endswith(".sst"))
    except OSError:
        return 1
    return max(1, min(16, ssts // FILES_PER_OPENING_THREAD))


def _db_options(
    create: bool, tuning: StoreTuning = QUERY, cache: Cache | None = None, opening_threads: int = 1
) -> Options:
    options = _cf_options(tuning, cache)
    options.create_if_missing(create)
    options.set_max_file_opening_threads(opening_threads)
    options.set_max_background_jobs(2)
    options.set_keep_log_file_num(INFO_LOG_FILES_TO_KEEP)
    options.set_max_log_file_size(INFO_LOG_MAX_BYTES)
    return options


def _drop_options_files(path: Path) -> None:
    """Remove the ``OPTIONS-<n>`` files of the store at ``path``, which this process holds open.

    rocksdict's ``Rdict()`` parses the newest of them (and builds an LRU cache for what it parsed) at every
    open, and then uses the options and column families it was given instead; RocksDB never reads them
    (it writes and checks a new one at every read-write open, so an open store always has its own). A
    store closed without them opens without that parse. Called before the database closes: while it is
    open, RocksDB's lock keeps every other opener out, so no other open's file is removed. Best effort: a
    store that keeps them (a failed unlink, a process that died first) opens as before.
    """
    try:
        with os.scandir(path) as entries:
            names = [e.name for e in entries if _OPTIONS_FILE.fullmatch(e.name)]
        for name in names:
            os.unlink(path / name)
    except OSError:
        pass


_OPTIONS_FILE = re.compile(r"OPTIONS-[0-9]+")


def _write_options() -> WriteOptions:
    options = WriteOptions()
    # rocksdict's stub declares disable_wal a method; the extension makes it a settable property
    options.disable_wal = True  # type: ignore[method-assign,assignment]
    return options


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _raw(items: object) -> Iterator[tuple[bytes, bytes]]:
    """``items`` as what they are in raw mode: byte keys and values (rocksdict's stub types the
    default mode's keys and values)."""
    return cast(Iterator[tuple[bytes, bytes]], items)


def _holding(it: Iterator[tuple[bytes, bytes]], *refs: object) -> Iterator[tuple[bytes, bytes]]:
    """Yield from ``it`` while keeping ``refs`` alive.

    rocksdict 0.3.29 iterators point into the ``bytes`` given to ``set_iterate_upper_bound`` without
    holding a reference to it: once that object is freed the bound is garbage and scans stop early.
    """
    yield from it


class RocksStateStore:
    """The RocksDB store of one (operator, partition); see the module docstring for the write model.

    Use :meth:`open`; the store is a context manager that closes itself.
    """

    def __init__(self, path: Path, db: Rdict, names: Iterable[str]) -> None:
        """Wrap an open database; use :meth:`open` instead."""
        self.path = path
        self._db: Rdict | None = db
        self._write_opt = _write_options()
        self._cfs: dict[str, _Family] = {}
        self._changelog = Changelog()
        self._pending = 0
        self._unflushed = True
        """Whether RocksDB may hold writes not yet in SST files: true from the open (conservatively) and
        after every write, false after a flush. A flush with nothing new to write is skipped."""
        self.read_only = False
        """Opened with ``read_only``: nothing to flush on close, writes are refused by RocksDB."""
        self._tuning = QUERY
        self._cache: Cache | None = None
        for name in names:
            self._attach(name)

    # ------------------------------------------------------------------ opening and closing

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        read_only: bool = False,
        tuning: StoreTuning = QUERY,
    ) -> RocksStateStore:
        """Open the store at ``path``, creating an empty one if ``create`` and the path is absent or empty.

        ``read_only`` opens an existing store for reading only: any number of processes may hold it so
        at once (a broadcast adjunct store shared by an executor's tasks); writes raise. ``tuning``: how
        the store spends memory (:class:`StoreTuning`).

        Raises ``NotAStoreError`` when the path holds something other than a RocksDB store (or nothing
        and ``create`` is False), ``StoreLockedError`` when another open store holds it.
        """
        p = Path(path).absolute()
        exists = (p / "CURRENT").is_file()
        if read_only and not exists:
            raise NotAStoreError(p, "no RocksDB store here (no CURRENT file) to open read-only")
        if not exists:
            if p.exists() and not p.is_dir():
                raise NotAStoreError(p, "exists and is not a directory")
            if not create:
                raise NotAStoreError(p, "no RocksDB store here (no CURRENT file) and create=False")
            if p.is_dir() and any(p.iterdir()):
                raise NotAStoreError(
                    p,
                    "the directory is not empty but holds no RocksDB store (no CURRENT file); refusing to "
                    "create a store among other files",
                )
            p.mkdir(parents=True, exist_ok=True)
        names: list[str] = []
        if exists:
            try:
                rocks_names = Rdict.list_cf(str(p), _db_options(False))
            except Exception as e:
                raise NotAStoreError(p, f"cannot read the list of column families: {e}") from e
            for rocks_name in rocks_names:
                if rocks_name == _DEFAULT_CF:
                    continue
                if not rocks_name.startswith(_CF_PREFIX):
                    raise NotAStoreError(
                        p, f"unexpected RocksDB column family {rocks_name!r}: not a blobstate state store"
                    )
                names.append(rocks_name[len(_CF_PREFIX) :])
        cache = Cache(tuning.block_cache_bytes) if tuning.block_cache_bytes is not None else None
        families = {_CF_PREFIX + name: _cf_options(tuning, cache) for name in names}
        threads = _opening_threads(p) if exists else 1
        try:
            if read_only:
                db = Rdict(
                    str(p),
                    _db_options(False, tuning, cache, threads),
                    column_families=families,
                    access_type=AccessType.read_only(error_if_log_file_exist=False),
                )
            else:
                db = Rdict(str(p), _db_options(create, tuning, cache, threads), column_families=families)
        except Exception as e:
            message = str(e)
            if "/LOCK" in message or "lock hold" in message:
                raise StoreLockedError(p, f"locked by another open store ({message})") from e
            raise StateStoreError(p, f"cannot open: {message}") from e
        try:
            opened = cls(p, db, names)
        except BaseException:
            db.close()
            raise
        opened.read_only = read_only
        opened._tuning, opened._cache = tuning, cache
        return opened

    def close(self) -> None:
        """Write pending changes to SST files and close the database. Idempotent.

        Iterators from :meth:`items` that are still alive keep the database (and its lock) open until
        they are exhausted or dropped.
        """
        db = self._db
        if db is None:
            return
        try:
            if not self.read_only:
                self.flush()
                _drop_options_files(self.path)
        finally:
            # rocksdict keeps the database open while any column family object refers to it.
            self._cfs = _ClosedHandles(str(self.path))
            self._db = None
            db.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._db is None

    def __enter__(self) -> RocksStateStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else "open"
        return f"RocksStateStore({str(self.path)!r}, {state})"

    def _open_db(self) -> Rdict:
        db = self._db
        if db is None:
            raise StoreClosedError(self.path, "the store is closed")
        return db

    # ------------------------------------------------------------------ column families

    def _attach(self, name: str) -> _Family:
        db = self._open_db()
        rocks_name = _CF_PREFIX + name
        view = db.get_column_family(rocks_name)
        family = _Family(view, db.get_column_family_handle(rocks_name))
        self._cfs[name] = family
        return family

    def _create(self, name: str) -> _Family:
        if not isinstance(name, str):
            raise TypeError(f"column family name must be str, got {type(name).__name__}")
        db = self._open_db()
        self._unflushed = True
        try:
            db.create_column_family(_CF_PREFIX + name, _cf_options(self._tuning, self._cache))
        except Exception as e:
            raise StateStoreError(self.path, f"cannot create column family {name!r}: {e}") from e
        return self._attach(name)

    def _family(self, name: str) -> _Family:
        try:
            return self._cfs[name]
        except KeyError:
            return self._create(name)

    def column_families(self) -> list[str]:
        """Names of the store's column families, sorted."""
        self._open_db()
        return sorted(self._cfs)

    def estimated_keys(self) -> int:
        """RocksDB's estimate of the number of keys over all column families (cheap; not exact)."""
        return sum(self.estimated_keys_by_family().values())

    def estimated_keys_by_family(self) -> dict[str, int]:
        """RocksDB's estimate of the number of keys of each column family (cheap; not exact)."""
        self._open_db()
        self._sync()
        return {
            name: int(f.view.property_int_value("rocksdb.estimate-num-keys") or 0)
            for name, f in self._cfs.items()
        }

    # ------------------------------------------------------------------ reads

    def get(self, cf: str, key: bytes) -> bytes | None:
        """The value of ``key`` in column family ``cf``, or None (also when ``cf`` does not exist)."""
        try:
            family = self._cfs[cf]
        except KeyError:
            return None
        value: bytes | None = family.overlay.get(key, _MISSING)  # or _MISSING
        if value is _MISSING:
            stored: bytes | None = family.view.get(key)
            return stored
        return value

    def multi_get(self, cf: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), in the order of ``keys``.

        One point lookup per key: rocksdict's list form of ``get`` (RocksDB's MultiGet) measured slower
        here than a loop of single gets (``bench/state_store.py``)."""
        try:
            family = self._cfs[cf]
        except KeyError:
            return [None] * len(keys)
        overlay = family.overlay
        get = family.view.get
        if not overlay:
            return list(map(get, keys))
        values = [overlay.get(key, _MISSING) for key in keys]
        return [get(keys[i]) if value is _MISSING else value for i, value in enumerate(values)]

    def items(self, cf: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs of ``cf`` whose key starts with ``prefix``, in key order.

        The iterator reads the store as it was when it was made; later writes do not show up in it.
        """
        try:
            family = self._cfs[cf]
        except KeyError:
            return iter(())
        self._sync()
        if not prefix:
            return _raw(family.view.items())
        end = _prefix_end(prefix)
        if end is None:
            return _raw(family.view.items(from_key=prefix))
        read_opt = ReadOptions()
        read_opt.set_iterate_upper_bound(end)
        return _holding(_raw(family.view.items(from_key=prefix, read_opt=read_opt)), read_opt, end, prefix)

    # ------------------------------------------------------------------ writes

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` in ``cf`` (created on first use) and capture the change."""
        if key.__class__ is not bytes or value.__class__ is not bytes:
            raise TypeError(f"key and value must be bytes, got {type(key).__name__}, {type(value).__name__}")
        try:
            overlay = self._cfs[cf].overlay
        except KeyError:
            overlay = self._create(cf).overlay
        overlay[key] = value
        self._changelog.append((_PUT, cf, key, value))
        self._pending += 1
        if self._pending >= SYNC_EVERY:
            self._sync()

    def put_many(self, cf: str, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        """``put`` every ``(key, value)`` pair, in order, with less per-pair overhead."""
        pairs = list(pairs)
        self.put_columns(cf, [k for k, _ in pairs], [v for _, v in pairs])

    def put_columns(self, cf: str, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """``put`` ``keys[i]`` = ``values[i]`` for every i, in order: the bulk form for many keys."""
        if len(keys) != len(values):
            raise ValueError(f"put_columns got {len(keys)} keys and {len(values)} values")
        if not keys:
            return
        if set(map(type, keys)) != {bytes} or set(map(type, values)) != {bytes}:
            bad = next(
                i for i in range(len(keys)) if type(keys[i]) is not bytes or type(values[i]) is not bytes
            )
            raise TypeError(
                f"key and value must be bytes, got {type(keys[bad]).__name__}, {type(values[bad]).__name__}"
            )
        family = self._family(cf)
        self._sync()  # older overlay entries of these keys must not shadow the new values
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(family.handle)
        put = batch.put
        with gc_paused():
            for key, value in zip(keys, values, strict=True):
                put(key, value)
        self._write(batch, "write failed")
        self._changelog.add_puts(cf, list(keys), list(values))

    def delete(self, cf: str, key: bytes) -> None:
        """Delete ``key`` from ``cf`` (absent keys are fine) and capture the change."""
        if key.__class__ is not bytes:
            raise TypeError(f"key must be bytes, got {type(key).__name__}")
        try:
            overlay = self._cfs[cf].overlay
        except KeyError:
            overlay = self._create(cf).overlay
        overlay[key] = None
        self._changelog.append((_DELETE, cf, key, None))
        self._pending += 1
        if self._pending >= SYNC_EVERY:
            self._sync()

    def clear(self, cf: str) -> None:
        """Delete every key of ``cf`` with one range deletion, and capture the change."""
        self._clear(cf)
        self._changelog.append((_CLEAR, cf, b"", None))

    def _clear(self, cf: str) -> None:
        # A range tombstone from b"" to just past the largest key: one cheap write, where dropping and
        # recreating the column family would cost two MANIFEST and OPTIONS rewrites, each synced to disk.
        family = self._family(cf)
        self._sync()
        it = family.view.iter()
        it.seek_to_last()
        if not it.valid():
            return
        end = it.key() + b"\x00"
        del it
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(b"", end, family.handle)
        self._write(batch, f"cannot clear column family {cf!r}")

    def _sync(self) -> None:
        """Write every overlay entry to RocksDB in one write batch and empty the overlays."""
        if not self._pending:
            return
        batch = WriteBatch(raw_mode=True)
        for family in self._cfs.values():
            overlay = family.overlay
            if not overlay:
                continue
            batch.set_default_column_family(family.handle)
            put = batch.put
            delete = batch.delete
            for key, value in overlay.items():
                if value is None:
                    delete(key)
                else:
                    put(key, value)
        self._write(batch, "write failed")
        for family in self._cfs.values():
            family.overlay.clear()
        self._pending = 0

    def _write(self, batch: WriteBatch, failure: str) -> None:
        """Write ``batch`` to RocksDB; a failure raises :class:`StateStoreError` starting with ``failure``."""
        self._unflushed = True
        try:
            self._open_db().write(batch, self._write_opt)
        except Exception as e:
            raise StateStoreError(self.path, f"{failure}: {e}") from e

    # ------------------------------------------------------------------ changelog and replay

    def take_changelog(self) -> Changelog:
        """The change records captured since the last take (every put, delete, clear, in order); resets."""
        records = self._changelog
        self._changelog = Changelog()
        return records

    @property
    def changelog_bytes(self) -> int:
        """Size of the captured changelog: the sum of len(cf) + len(key) + len(value) over its records."""
        return self._changelog.nbytes

    def apply(self, records: Iterable[ChangeRecord]) -> int:
        """Replay change records in order, in write batches, without capturing them; returns the count.

        On an error the store holds a prefix of the records and must be treated as dirty.
        """
        self._sync()
        db = self._open_db()
        self._unflushed = True
        write_opt = self._write_opt
        families = self._cfs
        batch = WriteBatch(raw_mode=True)
        in_batch = 0
        done = 0
        current_cf: str | None = None
        handle: ColumnFamily | None = None
        try:
            for op, cf, key, value in records:
                if cf != current_cf:
                    family = families.get(cf)
                    if family is None:
                        family = self._create(cf)
                    handle = family.handle
                    current_cf = cf
                    batch.set_default_column_family(handle)
                if op == _PUT:
                    if value is None:
                        raise ValueError("a PUT record has no value")
                    batch.put(key, value)
                elif op == _DELETE:
                    batch.delete(key)
                elif op == _CLEAR:
                    if in_batch:  # the clear must see this batch's writes
                        db.write(batch, write_opt)
                        done += in_batch
                        in_batch = 0
                        batch = WriteBatch(raw_mode=True)
                        current_cf = None
                    self._clear(cf)
                    done += 1
                    continue
                else:
                    raise ValueError(f"unknown op {op!r}")
                in_batch += 1
                if in_batch >= APPLY_BATCH:
                    db.write(batch, write_opt)
                    done += in_batch
                    in_batch = 0
                    batch = WriteBatch(raw_mode=True)
                    current_cf = None
            if in_batch:
                db.write(batch, write_opt)
                done += in_batch
        except StateStoreError:
            raise
        except Exception as e:
            raise StateStoreError(
                self.path, f"cannot apply change record #{done + in_batch}: {type(e).__name__}: {e}"
            ) from e
        return done

    # ------------------------------------------------------------------ persistence

    def flush(self) -> None:
        """Write every change so far into SST files (memtables flushed); after this no WAL is needed.

        Nothing is done when nothing was written since the last flush (a commit's checkpoint flushes,
        then its close would flush again).
        """
        db = self._open_db()
        self._sync()
        if not self._unflushed:
            return
        try:
            for family in self._cfs.values():
                family.view.flush()
            db.flush()
        except Exception as e:
            raise StateStoreError(self.path, f"flush failed: {e}") from e
        self._unflushed = False

    def checkpoint(self, dest_dir: str | os.PathLike[str]) -> Path:
        """Make a RocksDB hard-link checkpoint of the current state at ``dest_dir`` (must not exist).

        Flushes first, so the checkpoint holds everything in SST files. The checkpoint opens as a store
        with :meth:`open` and does not change when this store is written later. Returns the absolute path.
        """
        dest = Path(dest_dir).absolute()
        db = self._open_db()
        if dest.exists():
            raise StateStoreError(self.path, f"checkpoint target {str(dest)!r} already exists")
        self.flush()
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            Checkpoint(db).create_checkpoint(str(dest))
        except Exception as e:
            raise StateStoreError(self.path, f"cannot create checkpoint at {str(dest)!r}: {e}") from e
        return dest
