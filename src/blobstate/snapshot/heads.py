"""The head log of a standalone backup repository: ``heads/<n>.json``, one create-only record per backup.

Backup ``n`` commits by creating ``heads/<n>.json`` with ``put_if_absent``: of several backups racing for
version ``n`` exactly one wins. The record names the committed snapshot index and holds the size and
CRC-32 of its bytes, so a reader checks the index before it parses it. Heads are never rewritten. Each
head records a ``horizon`` (format 2): the oldest version whose head the repository still needs once it
is durable. After a backup's post-commit cleanup the heads below its horizon are deleted, oldest first
(:meth:`HeadLog.prune`), so the log holds a bounded number of heads however many backups ran. A reader
takes the newest head's horizon ``h``: heads missing below ``h`` were pruned; a version from ``h`` to the
newest without a head is a hole (:class:`HeadLogError`). The newest snapshot is the one the highest
head names; indexes that no head names were never committed. The JSON layout is specified in
``docs/FORMATS.md``.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import NoReturn

from blobstate.blobstore.base import BlobNotFoundError, BlobStore
from blobstate.errors import CorruptionError
from blobstate.horizon import HorizonScan
from blobstate.ids import CheckpointId, InvalidIdError, validate_uid
from blobstate.jsonfields import Fail, JsonFields, check_record_size, load_strict_json
from blobstate.snapshot.checksum import CHECKSUM_ALGORITHM
from blobstate.snapshot.index import SnapshotError

HEADS_PREFIX = "heads/"
HEAD_FORMAT_VERSION = 2
"""The ``heads/<n>.json`` format version this build writes (2: with ``horizon``, the log may be pruned)."""
HEAD_FORMATS_READ = (1, 2)
"""The head formats this build reads: a format-1 head has no horizon (its log was never pruned)."""

_SCAN_RETRIES = 5

INDEX_SUFFIX = ".snapshot"

_HEAD_NAME_RE = re.compile(re.escape(HEADS_PREFIX) + r"(0|[1-9][0-9]{0,18})\.json")
_MAX_CRC = 0xFFFFFFFF


class HeadLogError(SnapshotError):
    """The head log of a backup repository is incomplete or cannot be trusted."""


class HeadFormatError(HeadLogError, CorruptionError, ValueError):
    """A head record that is malformed: names the object, the field and what is wrong."""


def head_name(version: int) -> str:
    """``heads/<version>.json``."""
    return f"{HEADS_PREFIX}{version}.json"


def index_name(cid: CheckpointId) -> str:
    """``<v>_<uid>.snapshot``: the name of a repository's snapshot index at its root."""
    return f"{cid.name}{INDEX_SUFFIX}"


def parse_index_name(name: str) -> CheckpointId | None:
    """The checkpoint id of a root-level ``<v>_<uid>.snapshot`` name, or None for any other name."""
    if "/" in name or not name.endswith(INDEX_SUFFIX):
        return None
    try:
        return CheckpointId.parse(name[: -len(INDEX_SUFFIX)])
    except InvalidIdError:
        return None


def now_ms() -> int:
    """The current wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class HeadRecord:
    """``heads/<version>.json``: the snapshot index backup ``version`` committed, with its size and CRC-32."""

    version: int
    index: str
    """Object name of the committed index, ``<version>_<uid>.snapshot``."""
    index_size: int
    index_checksum: int
    """CRC-32 of the index's bytes."""
    previous: str | None
    """The index this backup was made against (the one head ``version - 1`` names); None for version 1."""
    writer: str
    """The uid of the backup run that wrote it (the uid in the index name)."""
    created_time_ms: int = field(default_factory=now_ms)
    format_version: int = HEAD_FORMAT_VERSION
    horizon: int = 1
    """The oldest version whose head is still needed once this one is durable (``1..version``); heads
    below it may be pruned. Format 1 has none: 1 (its log was never pruned)."""

    def to_json(self) -> bytes:
        """The bytes stored as ``heads/<version>.json`` (checked as a reader would)."""
        obj: dict[str, object] = {
            "format_version": self.format_version,
            "version": self.version,
            "index": self.index,
            "index_size": self.index_size,
            "index_checksum": {"algorithm": CHECKSUM_ALGORITHM, "value": self.index_checksum},
            "previous": self.previous,
        }
        if self.format_version >= 2:
            obj["horizon"] = self.horizon
        obj.update(writer=self.writer, created_time_ms=self.created_time_ms)
        data = json.dumps(obj, indent=1).encode("utf-8")
        parse_head(data, head_name(self.version), self.version)
        return data


def _failer(name: str) -> Fail:
    def fail(field: str, problem: str) -> NoReturn:
        where = f" field {field}" if field else ""
        raise HeadFormatError(f"invalid head record {name}:{where}: {problem}")

    return fail


MAX_HEAD_BYTES = 1024 * 1024
"""The largest ``heads/<n>.json`` a reader parses (a head names two indexes and a few fields: under a KB)."""


def parse_head(data: bytes, name: str, version: int) -> HeadRecord:
    """Parse and validate the head record of ``version``; errors name the object and the field.

    The index must be ``<version>_<uid>.snapshot`` with the writer's uid, and the previous index
    ``<version - 1>_<uid>.snapshot`` (None exactly for version 1), so no name read from a head can point
    outside the repository's root. Unknown fields are ignored.
    """
    fail = _failer(name)
    check_record_size(len(data), MAX_HEAD_BYTES, fail, read=True)
    f = JsonFields(load_strict_json(data, fail), fail)
    format_version = f.integer("format_version", 1)
    if format_version not in HEAD_FORMATS_READ:
        known = " and ".join(map(str, HEAD_FORMATS_READ))
        f.fail("format_version", f"unknown format version {format_version} (this build reads {known})")
    stored = f.integer("version", 1)
    if stored != version:
        f.fail("version", f"{stored} does not match the object name (version {version})")
    writer = f.get("writer")
    try:
        validate_uid(writer, "writer")
    except InvalidIdError as error:
        f.fail("writer", str(error))
    index = f.get("index")
    if index != index_name(CheckpointId(version, writer)):
        f.fail("index", f"expected {index_name(CheckpointId(version, writer))!r}, found {index!r}")
    previous = f.get("previous")
    if version == 1:
        if previous is not None:
            f.fail("previous", f"version 1 has no previous snapshot, found {previous!r}")
    else:
        cid = parse_index_name(previous) if isinstance(previous, str) else None
        if cid is None or cid.version != version - 1:
            f.fail("previous", f"expected the name of a version {version - 1} index, found {previous!r}")
    size = f.integer("index_size", 1)
    checksum = f.nested(f.get("index_checksum"), "index_checksum.")
    algorithm = checksum.get("algorithm")
    if algorithm != CHECKSUM_ALGORITHM:
        checksum.fail("algorithm", f"unsupported checksum algorithm {algorithm!r}")
    value = checksum.integer("value", 0, _MAX_CRC)
    created = f.integer("created_time_ms", 0)
    horizon = 1
    if format_version >= 2:
        horizon = f.integer("horizon", 1)
        if horizon > version:
            f.fail("horizon", f"{horizon} is above the head's own version {version}")
    return HeadRecord(version, index, size, value, previous, writer, created, format_version, horizon)


@dataclass(frozen=True)
class HeadScan(HorizonScan[HeadRecord]):
    """What one listing of ``heads/`` found: the versions present and the newest head."""

    @property
    def retained(self) -> list[int]:
        """The versions from the horizon to the newest, ascending (every one has a head when no holes)."""
        return [v for v in self.versions if v >= self.horizon]


class HeadLog:
    """The head log of one backup repository, on its blob store."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def listed(self) -> list[int]:
        """The versions of every head ``heads/`` holds, ascending (one listing; no hole check).

        Raises :class:`HeadLogError` if ``heads/`` holds a name that is not a head record.
        """
        found = []
        for name in self.store.list(HEADS_PREFIX):
            match = _HEAD_NAME_RE.fullmatch(name)
            if match is None or match.group(1) == "0":
                raise HeadLogError(
                    f"the head log of {self.store.url} holds {name!r}, which is not a head record "
                    f"({HEADS_PREFIX}<n>.json with n >= 1); remove it if it was put there by hand"
                )
            found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> int:
        """The newest committed version, 0 if none (one listing)."""
        listed = self.listed()
        return listed[-1] if listed else 0

    def scan(self) -> HeadScan:
        """One listing of ``heads/`` and the newest head, proven to have no hole from its horizon up.

        Heads missing below the newest head's horizon were pruned and are not an error; a version from
        the horizon to the newest without a head is a hole, which raises :class:`HeadLogError` naming the
        missing heads, since then the newest snapshot cannot be known for sure. A listing taken while
        backups commit and prune behind it (a paginated listing is not one instant) is taken again when
        the log moved meanwhile, so a pruned head is never mistaken for a hole.
        """
        for _ in range(_SCAN_RETRIES):
            versions = self.listed()
            if not versions:
                return HeadScan([], None)
            try:
                newest = self.read(versions[-1])
            except BlobNotFoundError:
                continue  # pruned behind newer backups since the listing: list again
            scan = HeadScan(versions, newest)
            if not scan.holes:
                return scan
            if self.latest() == scan.latest:
                self._hole(scan)
        raise self._kept_moving()

    def _kept_moving(self) -> HeadLogError:
        return HeadLogError(
            f"backups kept committing to {self.store.url} while its head log was read; try again"
        )

    def _hole(self, scan: HeadScan) -> NoReturn:
        missing = scan.holes
        shown = ", ".join(head_name(v) for v in missing[:5]) + (", ..." if len(missing) > 5 else "")
        below = f" (heads below {head_name(scan.horizon)} were pruned)" if scan.horizon > 1 else ""
        raise HeadLogError(
            f"the head log of {self.store.url} has a hole: {shown} missing from {head_name(scan.horizon)} "
            f"to the newest {head_name(scan.latest)}{below}; the repository was damaged and its newest "
            "snapshot cannot be trusted to be the newest"
        )

    def versions(self) -> list[int]:
        """The retained versions, ascending: every one from the newest head's horizon to the newest.

        Raises :class:`HeadLogError` naming what is wrong on a name under ``heads/`` that is not a head
        record or a hole (see :meth:`scan`).
        """
        return self.scan().retained

    def read(self, version: int) -> HeadRecord:
        """Read and validate ``heads/<version>.json``; a missing one raises ``BlobNotFoundError``."""
        name = head_name(version)
        return parse_head(self.store.get(name), f"{name} in {self.store.url}", version)

    def newest(self) -> HeadRecord | None:
        """The head of the newest committed backup, or None if nothing was committed."""
        return self.scan().newest

    def read_all(self) -> list[HeadRecord]:
        """Every retained head (from the newest head's horizon up), ascending, checked to form one chain:
        each names its predecessor's index and no horizon is below its predecessor's.

        Heads pruned meanwhile by backups that committed during the read are read again from the new
        newest head; a retained head that vanished while the log stood still is a :class:`HeadLogError`.
        """
        for _ in range(_SCAN_RETRIES):
            scan = self.scan()
            if scan.newest is None:
                return []
            try:
                heads = [*self.store.run_parallel(self.read, scan.retained[:-1]), scan.newest]
            except BlobNotFoundError as error:
                if self.latest() != scan.latest:
                    continue
                raise HeadLogError(
                    f"{error.name} in {self.store.url} went missing while the head log was read, though no "
                    f"backup committed; the repository was damaged"
                ) from None
            self._check_chain(heads)
            return heads
        raise self._kept_moving()

    def _check_chain(self, heads: list[HeadRecord]) -> None:
        for older, newer in itertools.pairwise(heads):
            if newer.previous != older.index:
                raise HeadLogError(
                    f"{head_name(newer.version)} in {self.store.url} says backup {newer.version} was made "
                    f"against {newer.previous!r}, but {head_name(older.version)} committed {older.index!r}"
                )
            if newer.horizon < older.horizon:
                raise HeadLogError(
                    f"{head_name(newer.version)} in {self.store.url} declares horizon {newer.horizon}, below "
                    f"the horizon {older.horizon} of {head_name(older.version)}"
                )

    def write(self, head: HeadRecord) -> HeadRecord:
        """Create ``heads/<v>.json`` unless it exists; returns the head that stands for version v.

        That is ``head`` when this call created it (or an earlier try of it landed), otherwise the head
        another backup committed first.
        """
        name = head_name(head.version)
        if self.store.put_if_absent(name, head.to_json()):
            return head
        try:
            return self.read(head.version)
        except BlobNotFoundError:  # pragma: no cover - a head is pruned only two backups later
            raise HeadLogError(f"{name} in {self.store.url} could not be created nor read") from None

    def prune(self, horizon: int, listed: list[int]) -> list[int]:
        """Delete the heads below ``horizon`` (the horizon of a durable head whose backup's cleanup is
        done) among ``listed`` (the versions a listing found), oldest first; returns the versions deleted.

        Oldest first: a crash part-way leaves a contiguous range just below the horizon, which the next
        backup or gc (which list ``heads/`` anyway) prunes.
        """
        doomed = sorted(v for v in listed if v < horizon)
        for version in doomed:
            self.store.delete_if_exists(head_name(version))
        return doomed
