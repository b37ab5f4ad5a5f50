"""The head log of a standalone backup repository: ``heads/<n>.json``, one create-only record per backup.

Backup ``n`` commits by creating ``heads/<n>.json`` with ``put_if_absent``: of several backups racing for
version ``n`` exactly one wins. The record names the committed snapshot index and holds the size and
CRC-32 of its bytes, so a reader checks the index before it parses it. Heads are never deleted nor
rewritten; the log is complete when it holds every version from 1 to the newest, without a hole. The
newest snapshot is the one the highest head names; indexes that no head names were never committed.
The JSON layout is specified in ``docs/FORMATS.md``.
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
from blobstate.ids import CheckpointId, InvalidIdError, validate_uid
from blobstate.jsonfields import Fail, JsonFields, load_strict_json
from blobstate.snapshot.checksum import CHECKSUM_ALGORITHM
from blobstate.snapshot.index import SnapshotError

HEADS_PREFIX = "heads/"
HEAD_FORMAT_VERSION = 1
"""The ``heads/<n>.json`` format version this build writes and reads."""

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

    def to_json(self) -> bytes:
        """The bytes stored as ``heads/<version>.json`` (checked as a reader would)."""
        data = json.dumps(
            {
                "format_version": self.format_version,
                "version": self.version,
                "index": self.index,
                "index_size": self.index_size,
                "index_checksum": {"algorithm": CHECKSUM_ALGORITHM, "value": self.index_checksum},
                "previous": self.previous,
                "writer": self.writer,
                "created_time_ms": self.created_time_ms,
            },
            indent=1,
        ).encode("utf-8")
        parse_head(data, head_name(self.version), self.version)
        return data


def _failer(name: str) -> Fail:
    def fail(field: str, problem: str) -> NoReturn:
        where = f" field {field}" if field else ""
        raise HeadFormatError(f"invalid head record {name}:{where}: {problem}")

    return fail


def parse_head(data: bytes, name: str, version: int) -> HeadRecord:
    """Parse and validate the head record of ``version``; errors name the object and the field.

    The index must be ``<version>_<uid>.snapshot`` with the writer's uid, and the previous index
    ``<version - 1>_<uid>.snapshot`` (None exactly for version 1), so no name read from a head can point
    outside the repository's root. Unknown fields are ignored.
    """
    fail = _failer(name)
    f = JsonFields(load_strict_json(data, fail), fail)
    format_version = f.integer("format_version", 1)
    if format_version != HEAD_FORMAT_VERSION:
        f.fail("format_version", f"unknown format version {format_version} (this build reads 1)")
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
    return HeadRecord(version, index, size, value, previous, writer, created, format_version)


class HeadLog:
    """The head log of one backup repository, on its blob store."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def versions(self) -> list[int]:
        """Every committed version, ascending: exactly ``1..n``.

        Raises :class:`HeadLogError` naming what is wrong if ``heads/`` holds a name that is not a head
        record or the versions have a hole, since then the newest snapshot cannot be known for sure.
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
        found.sort()
        missing = sorted(set(range(1, found[-1] + 1)) - set(found)) if found else []
        if missing:
            shown = ", ".join(head_name(v) for v in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise HeadLogError(
                f"the head log of {self.store.url} has a hole: {shown} missing below the newest "
                f"{head_name(found[-1])}; the repository was damaged and its newest snapshot cannot be "
                "trusted to be the newest"
            )
        return found

    def read(self, version: int) -> HeadRecord:
        """Read and validate ``heads/<version>.json``; a missing one raises ``BlobNotFoundError``."""
        name = head_name(version)
        return parse_head(self.store.get(name), f"{name} in {self.store.url}", version)

    def newest(self) -> HeadRecord | None:
        """The head of the newest committed backup, or None if nothing was committed."""
        versions = self.versions()
        return self.read(versions[-1]) if versions else None

    def read_all(self) -> list[HeadRecord]:
        """Every head, ascending, checked to form one chain (each names its predecessor's index)."""
        versions = self.versions()
        heads = self.store.run_parallel(self.read, versions)
        for older, newer in itertools.pairwise(heads):
            if newer.previous != older.index:
                raise HeadLogError(
                    f"{head_name(newer.version)} in {self.store.url} says backup {newer.version} was made "
                    f"against {newer.previous!r}, but {head_name(older.version)} committed {older.index!r}"
                )
        return heads

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
        except BlobNotFoundError:  # pragma: no cover - heads are never deleted
            raise HeadLogError(f"{name} in {self.store.url} could not be created nor read") from None
