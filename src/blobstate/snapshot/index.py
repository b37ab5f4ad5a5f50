"""The snapshot index format: SnapshotIndex, DirIndex, FileIndex, FileBlob and their JSON form.

A snapshot index describes one directory tree whose file contents live in blobs. It is itself stored as
an object (``<v>_<uid>.snapshot``) and is necessary and sufficient to rebuild the directory. All classes
are frozen; sequences are tuples. JSON (de)serialization carries an explicit schema version, and reading
validates everything a restore or cleanup will trust: names that could escape the target directory,
duplicate entries, chunk offsets, checksums, and blobs listed both as present and as removed.

JSON layout (schema version 1)::

    {"schemaVersion": 1, "checkpointId": "5_ab12...", "createdTimeMs": 1700000000000,
     "metadata": {"store": "", "operator": "0", "partition": 3, "properties": {"k": "v"}},
     "dirIndex": {"name": "", "filesPresent": [FILE...], "filesRemoved": [FILE...],
                  "subDirsPresent": [DIR...], "subDirsRemoved": [DIR...]},
     "prevSnapshotIndex": "state/0/3/4_cd34....snapshot" | null,
     "lineage": ["cd34...", ...]}
    FILE = {"name": "000009.sst", "blobs": [{"blobId": "blobs/0/3/<hex>", "offset": 0, "checksum": 123}],
            "metadata": {"size": 1024, "mtimeMs": ..., "ctimeMs": ..., "mode": 420},
            "checksum": {"algorithm": "crc32", "value": 123}}

Blob checksums use the file's algorithm; the file checksum is the checksum of the concatenated chunks.

Forward compatibility: within one schema version a reader ignores fields it does not know (a newer writer
may add optional ones, as Samza's indexes allow); a change that older readers must not ignore needs a new
schema version, and unknown schema versions are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from blobstate.blobstore.base import InvalidBlobNameError
from blobstate.blobstore.names import validate_blob_name
from blobstate.errors import CorruptionError, StateError
from blobstate.snapshot.checksum import CHECKSUM_ALGORITHM, combine_chunks

SCHEMA_VERSION = 1
"""The schema version written by this code; the only one it reads."""

SUPPORTED_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})

ROOT_DIR_NAME = ""
"""The name of the root DirIndex."""

_MAX_CRC = 0xFFFFFFFF


class SnapshotError(StateError):
    """Base class of snapshot errors."""


class SnapshotFormatError(SnapshotError, CorruptionError, ValueError):
    """A snapshot index that cannot be trusted: malformed JSON, unknown schema, or an invalid entry."""


class SnapshotCorruptError(SnapshotError, CorruptionError):
    """Downloaded or local data does not match what the snapshot index records (size or checksum)."""

    def __init__(self, message: str, *, blob_id: str | None = None, file: str | None = None) -> None:
        super().__init__(message)
        self.blob_id = blob_id
        self.file = file


class SnapshotBlobMissingError(SnapshotError):
    """A blob that a snapshot index references does not exist in the blob store."""

    def __init__(self, message: str, *, blob_id: str, file: str | None = None) -> None:
        super().__init__(message)
        self.blob_id = blob_id
        self.file = file


def validate_entry_name(name: object) -> str:
    """Return ``name`` if it is a safe single path component, else raise ``ValueError`` saying why.

    Rejected: non-strings, empty, ``.``, ``..``, anything containing ``/``, ``\\`` or NUL (so also
    absolute paths), and text that is not valid Unicode. Such a name could escape or alias the directory
    a snapshot is restored into.
    """
    if not isinstance(name, str):
        raise ValueError(f"name {name!r} is not a string")
    if name in ("", ".", ".."):
        raise ValueError(f"name {name!r} is not allowed")
    for bad, what in (("/", "a slash"), ("\\", "a backslash"), ("\x00", "NUL")):
        if bad in name:
            raise ValueError(f"name {name!r} contains {what}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"name {name!r} is not valid Unicode text") from None
    return name


def _tuple(value: Sequence[Any]) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else tuple(value)


@dataclass(frozen=True)
class FileBlob:
    """One blob holding the bytes of a file from ``offset`` up to the next blob's offset (or the end)."""

    blob_id: str
    """The full object name of the blob in the store."""
    offset: int
    """Where this chunk starts in the file."""
    checksum: int
    """Checksum of this chunk's bytes, with the algorithm of the owning FileIndex."""


@dataclass(frozen=True)
class FileMetadata:
    """POSIX attributes of a file at backup time."""

    size: int
    mtime_ms: int
    ctime_ms: int
    mode: int
    """Permission bits (``stat.S_IMODE``), restored with ``chmod``."""


@dataclass(frozen=True)
class FileIndex:
    """A file of a snapshot: its name, its chunks in offset order, its attributes and whole-file checksum."""

    name: str
    blobs: tuple[FileBlob, ...]
    metadata: FileMetadata
    checksum: int
    checksum_algorithm: str = CHECKSUM_ALGORITHM

    def __post_init__(self) -> None:
        object.__setattr__(self, "blobs", _tuple(self.blobs))

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return self.metadata.size

    def chunks(self) -> list[tuple[FileBlob, int]]:
        """``(blob, length)`` for each chunk in offset order; lengths follow from offsets and size.

        An empty file has no blobs, so no chunks.
        """
        if not self.blobs:
            return []
        ends = [b.offset for b in self.blobs[1:]] + [self.metadata.size]
        return [(b, end - b.offset) for b, end in zip(self.blobs, ends, strict=True)]


@dataclass(frozen=True)
class DirIndex:
    """A directory of a snapshot; ``*_removed`` list what the previous snapshot had and this one does not."""

    name: str
    files_present: tuple[FileIndex, ...] = ()
    files_removed: tuple[FileIndex, ...] = ()
    subdirs_present: tuple[DirIndex, ...] = ()
    subdirs_removed: tuple[DirIndex, ...] = ()

    def __post_init__(self) -> None:
        for attr in ("files_present", "files_removed", "subdirs_present", "subdirs_removed"):
            object.__setattr__(self, attr, _tuple(getattr(self, attr)))

    def iter_present_files(self, prefix: str = "") -> Iterator[tuple[str, FileIndex]]:
        """``(relative path, FileIndex)`` of every file present in this directory and its subdirectories."""
        for f in self.files_present:
            yield prefix + f.name, f
        for d in self.subdirs_present:
            yield from d.iter_present_files(f"{prefix}{d.name}/")

    def iter_removed_files(self, prefix: str = "") -> Iterator[tuple[str, FileIndex]]:
        """Every file this snapshot removed relative to the previous one, including whole removed subdirs."""
        for f in self.files_removed:
            yield prefix + f.name, f
        for d in self.subdirs_removed:
            yield from _all_files_of_removed_dir(d, f"{prefix}{d.name}/")
        for d in self.subdirs_present:
            yield from d.iter_removed_files(f"{prefix}{d.name}/")


def _all_files_of_removed_dir(d: DirIndex, prefix: str) -> Iterator[tuple[str, FileIndex]]:
    # A removed subdirectory's own present files were the previous snapshot's; its removed lists belong to
    # an older snapshot's cleanup and are not ours to delete.
    for f in d.files_present:
        yield prefix + f.name, f
    for sub in d.subdirs_present:
        yield from _all_files_of_removed_dir(sub, f"{prefix}{sub.name}/")


@dataclass(frozen=True)
class SnapshotMetadata:
    """What the snapshot is of: the store, operator and partition, plus free-form string properties."""

    store: str = ""
    operator: str = ""
    partition: int | None = None
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))

    @classmethod
    def from_mapping(cls, values: Mapping[str, str] | None) -> SnapshotMetadata:
        """Build from a flat ``str -> str`` map: ``store``, ``operator``, ``partition`` become fields."""
        rest = dict(values or {})
        store = rest.pop("store", "")
        operator = rest.pop("operator", "")
        partition = rest.pop("partition", None)
        return cls(store, operator, None if partition in (None, "") else int(partition), rest)


@dataclass(frozen=True)
class SnapshotIndex:
    """The index of one snapshot: everything needed to rebuild its directory, plus cleanup information."""

    checkpoint_id: str
    created_time_ms: int
    metadata: SnapshotMetadata
    dir_index: DirIndex
    prev_snapshot_index: str | None = None
    """Object name of the previous snapshot's index, deleted by post-commit cleanup."""
    lineage: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "lineage", _tuple(self.lineage))

    def iter_present_files(self) -> Iterator[tuple[str, FileIndex]]:
        """``(relative path, FileIndex)`` of every file of the snapshot."""
        return self.dir_index.iter_present_files()

    def present_blob_ids(self) -> set[str]:
        """Every blob this snapshot references."""
        return {b.blob_id for _, f in self.iter_present_files() for b in f.blobs}

    def removed_blob_ids(self) -> set[str]:
        """Every blob this snapshot marks for deletion (files and subdirectories gone since the previous)."""
        return {b.blob_id for _, f in self.dir_index.iter_removed_files() for b in f.blobs}

    @property
    def total_size(self) -> int:
        """Total bytes of the files present."""
        return sum(f.size for _, f in self.iter_present_files())

    def validate(self, name: str = "<snapshot index>") -> SnapshotIndex:
        """Raise :class:`SnapshotFormatError` naming ``name`` and the entry if anything is invalid."""
        _Validator(name).index(self)
        return self

    def to_json(self) -> bytes:
        """The validated JSON encoding (UTF-8)."""
        self.validate()
        return json.dumps(_index_to_dict(self), separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str, *, name: str = "<snapshot index>") -> SnapshotIndex:
        """Parse and validate; errors are :class:`SnapshotFormatError` naming ``name`` and the entry."""
        try:
            raw = json.loads(data)
            return _Parser(name).index(raw).validate(name)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SnapshotFormatError(f"snapshot index {name!r} is not valid JSON: {error}") from None
        except RecursionError:
            raise SnapshotFormatError(f"snapshot index {name!r} is nested too deeply") from None


# ---------------------------------------------------------------------------------------------- encoding


def _file_to_dict(f: FileIndex) -> dict[str, Any]:
    m = f.metadata
    return {
        "name": f.name,
        "blobs": [{"blobId": b.blob_id, "offset": b.offset, "checksum": b.checksum} for b in f.blobs],
        "metadata": {"size": m.size, "mtimeMs": m.mtime_ms, "ctimeMs": m.ctime_ms, "mode": m.mode},
        "checksum": {"algorithm": f.checksum_algorithm, "value": f.checksum},
    }


def _dir_to_dict(d: DirIndex) -> dict[str, Any]:
    return {
        "name": d.name,
        "filesPresent": [_file_to_dict(f) for f in d.files_present],
        "filesRemoved": [_file_to_dict(f) for f in d.files_removed],
        "subDirsPresent": [_dir_to_dict(s) for s in d.subdirs_present],
        "subDirsRemoved": [_dir_to_dict(s) for s in d.subdirs_removed],
    }


def _index_to_dict(index: SnapshotIndex) -> dict[str, Any]:
    md = index.metadata
    return {
        "schemaVersion": index.schema_version,
        "checkpointId": index.checkpoint_id,
        "createdTimeMs": index.created_time_ms,
        "metadata": {
            "store": md.store,
            "operator": md.operator,
            "partition": md.partition,
            "properties": dict(md.properties),
        },
        "dirIndex": _dir_to_dict(index.dir_index),
        "prevSnapshotIndex": index.prev_snapshot_index,
        "lineage": list(index.lineage),
    }


# ---------------------------------------------------------------------------------------------- parsing


class _Parser:
    """Turns decoded JSON into dataclasses, checking keys and types; errors name the index and entry."""

    def __init__(self, index_name: str) -> None:
        self.index_name = index_name

    def fail(self, where: str, message: str) -> SnapshotFormatError:
        return SnapshotFormatError(f"snapshot index {self.index_name!r}: {where}: {message}")

    def obj(self, raw: object, where: str, required: set[str]) -> dict[str, Any]:
        # Fields this reader does not know are ignored (forward compatibility within a schema version: a
        # writer may add optional fields; anything that changes the meaning needs a new schema version).
        if not isinstance(raw, dict):
            raise self.fail(where, f"expected an object, got {type(raw).__name__}")
        missing = required - raw.keys()
        if missing:
            raise self.fail(where, f"missing required field(s) {sorted(missing)}")
        return raw

    def int_(self, raw: dict[str, Any], key: str, where: str) -> int:
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"field {key!r} must be an integer, got {value!r}")
        return value

    def str_(self, raw: dict[str, Any], key: str, where: str) -> str:
        value = raw[key]
        if not isinstance(value, str):
            raise self.fail(where, f"field {key!r} must be a string, got {value!r}")
        return value

    def list_(self, raw: dict[str, Any], key: str, where: str) -> list[Any]:
        value = raw[key]
        if not isinstance(value, list):
            raise self.fail(where, f"field {key!r} must be a list, got {type(value).__name__}")
        return value

    @staticmethod
    def entry_name(raw: object) -> str:
        name = raw.get("name") if isinstance(raw, dict) else None
        return name if isinstance(name, str) else repr(name)

    def index(self, raw: object) -> SnapshotIndex:
        where = "index"
        if isinstance(raw, dict) and "schemaVersion" in raw:
            version = raw["schemaVersion"]
            if version not in SUPPORTED_SCHEMA_VERSIONS or isinstance(version, bool):
                raise self.fail(
                    where,
                    f"unsupported schema version {version!r} (this reader supports "
                    f"{sorted(SUPPORTED_SCHEMA_VERSIONS)})",
                )
        raw = self.obj(
            raw,
            where,
            {"schemaVersion", "checkpointId", "createdTimeMs", "metadata", "dirIndex"},
        )
        prev = raw.get("prevSnapshotIndex")
        if prev is not None and not isinstance(prev, str):
            raise self.fail(where, f"field 'prevSnapshotIndex' must be a string or null, got {prev!r}")
        lineage = raw.get("lineage", [])
        if not isinstance(lineage, list) or not all(isinstance(u, str) for u in lineage):
            raise self.fail(where, f"field 'lineage' must be a list of strings, got {lineage!r}")
        return SnapshotIndex(
            checkpoint_id=self.str_(raw, "checkpointId", where),
            created_time_ms=self.int_(raw, "createdTimeMs", where),
            metadata=self.metadata(raw["metadata"]),
            dir_index=self.dir(raw["dirIndex"], "directory '' (root)", ""),
            prev_snapshot_index=prev,
            lineage=tuple(lineage),
            schema_version=raw["schemaVersion"],
        )

    def metadata(self, raw: object) -> SnapshotMetadata:
        where = "metadata"
        raw = self.obj(raw, where, set())
        store = raw.get("store", "")
        operator = raw.get("operator", "")
        partition = raw.get("partition")
        properties = raw.get("properties", {})
        if not isinstance(store, str) or not isinstance(operator, str):
            raise self.fail(where, "fields 'store' and 'operator' must be strings")
        if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)):
            raise self.fail(where, f"field 'partition' must be an integer or null, got {partition!r}")
        if not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
        ):
            raise self.fail(where, "field 'properties' must map strings to strings")
        return SnapshotMetadata(store, operator, partition, properties)

    def dir(self, raw: object, where: str, path: str) -> DirIndex:
        raw = self.obj(raw, where, {"name"})
        name = self.str_(raw, "name", where)

        def files(key: str) -> tuple[FileIndex, ...]:
            items = self.list_(raw, key, where) if key in raw else []
            out = []
            for item in items:
                entry = self.entry_name(item)
                out.append(self.file(item, f"{key} entry {path + entry!r}"))
            return tuple(out)

        def dirs(key: str) -> tuple[DirIndex, ...]:
            items = self.list_(raw, key, where) if key in raw else []
            out = []
            for item in items:
                entry = self.entry_name(item)
                out.append(self.dir(item, f"{key} directory {path + entry!r}", f"{path}{entry}/"))
            return tuple(out)

        return DirIndex(
            name, files("filesPresent"), files("filesRemoved"), dirs("subDirsPresent"), dirs("subDirsRemoved")
        )

    def file(self, raw: object, where: str) -> FileIndex:
        raw = self.obj(raw, where, {"name", "blobs", "metadata", "checksum"})
        name = self.str_(raw, "name", where)
        blobs = []
        for i, item in enumerate(self.list_(raw, "blobs", where)):
            bw = f"{where} blob #{i}"
            b = self.obj(item, bw, {"blobId", "offset", "checksum"})
            blobs.append(
                FileBlob(self.str_(b, "blobId", bw), self.int_(b, "offset", bw), self.int_(b, "checksum", bw))
            )
        mw = f"{where} metadata"
        m = self.obj(raw["metadata"], mw, {"size", "mtimeMs", "ctimeMs", "mode"})
        metadata = FileMetadata(
            self.int_(m, "size", mw),
            self.int_(m, "mtimeMs", mw),
            self.int_(m, "ctimeMs", mw),
            self.int_(m, "mode", mw),
        )
        cw = f"{where} checksum"
        c = self.obj(raw["checksum"], cw, {"algorithm", "value"})
        return FileIndex(
            name, tuple(blobs), metadata, self.int_(c, "value", cw), self.str_(c, "algorithm", cw)
        )


# ---------------------------------------------------------------------------------------------- validation


class _Validator:
    """Semantic checks on a whole index; errors name the index and the entry's path."""

    def __init__(self, index_name: str) -> None:
        self.index_name = index_name
        self.present_blobs: dict[str, str] = {}
        self.removed_blobs: dict[str, str] = {}

    def fail(self, where: str, message: str) -> SnapshotFormatError:
        return SnapshotFormatError(f"snapshot index {self.index_name!r}: {where}: {message}")

    def index(self, index: SnapshotIndex) -> None:
        if index.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
            raise self.fail("index", f"unsupported schema version {index.schema_version!r}")
        if not isinstance(index.checkpoint_id, str) or not index.checkpoint_id:
            raise self.fail("index", f"invalid checkpointId {index.checkpoint_id!r}")
        if isinstance(index.created_time_ms, bool) or not isinstance(index.created_time_ms, int):
            raise self.fail("index", f"invalid createdTimeMs {index.created_time_ms!r}")
        if index.created_time_ms < 0:
            raise self.fail("index", f"invalid createdTimeMs {index.created_time_ms!r}")
        if index.prev_snapshot_index is not None:
            self.blob_name(index.prev_snapshot_index, "prevSnapshotIndex")
        if not all(isinstance(u, str) for u in index.lineage):
            raise self.fail("index", "lineage must be a list of strings")
        md = index.metadata
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in md.properties.items()):
            raise self.fail("metadata", "properties must map strings to strings")
        if index.dir_index.name != ROOT_DIR_NAME:
            raise self.fail(
                "directory '' (root)", f"the root directory's name must be '', got {index.dir_index.name!r}"
            )
        self.dir(index.dir_index, "", removed=False)

    def blob_name(self, name: object, where: str) -> None:
        try:
            validate_blob_name(name)  # type: ignore[arg-type]
        except InvalidBlobNameError as error:
            raise self.fail(where, str(error)) from None

    def name(self, name: object, where: str) -> None:
        try:
            validate_entry_name(name)
        except ValueError as error:
            raise self.fail(where, f"unsafe name: {error}") from None

    def dir(self, d: DirIndex, path: str, *, removed: bool) -> None:
        where_dir = f"directory {path[:-1]!r}" if path else "directory '' (root)"
        for key, entries in (("filesPresent", d.files_present), ("filesRemoved", d.files_removed)):
            seen: set[str] = set()
            for f in entries:
                where = f"{key} entry {path + str(f.name)!r}"
                self.name(f.name, where)
                if f.name in seen:
                    raise self.fail(where, f"duplicate file name {f.name!r} in {where_dir}")
                seen.add(f.name)
                # Files present in a removed subdirectory are deleted with it.
                self.file(f, where, removed=removed or key == "filesRemoved")
        for key, subdirs in (("subDirsPresent", d.subdirs_present), ("subDirsRemoved", d.subdirs_removed)):
            seen = set()
            for s in subdirs:
                where = f"{key} directory {path + str(s.name)!r}"
                self.name(s.name, where)
                if s.name in seen:
                    raise self.fail(where, f"duplicate directory name {s.name!r} in {where_dir}")
                seen.add(s.name)
                self.dir(s, f"{path}{s.name}/", removed=removed or key == "subDirsRemoved")
        file_names = {f.name for f in d.files_present}
        for s in d.subdirs_present:
            if s.name in file_names:
                raise self.fail(
                    f"subDirsPresent directory {path + s.name!r}",
                    f"name {s.name!r} is both a file and a directory in {where_dir}",
                )
        present_dirs = {s.name for s in d.subdirs_present}
        for s in d.subdirs_removed:
            if s.name in present_dirs:
                raise self.fail(
                    f"subDirsRemoved directory {path + s.name!r}",
                    f"directory {s.name!r} is listed both present and removed in {where_dir}",
                )

    def file(self, f: FileIndex, where: str, *, removed: bool) -> None:
        if f.checksum_algorithm != CHECKSUM_ALGORITHM:
            raise self.fail(where, f"unsupported checksum algorithm {f.checksum_algorithm!r}")
        for value, what in ((f.checksum, "checksum"), *tuple((b.checksum, "blob checksum") for b in f.blobs)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_CRC:
                raise self.fail(where, f"{what} {value!r} is not a 32-bit unsigned integer")
        m = f.metadata
        for value, what in (
            (m.size, "size"),
            (m.mtime_ms, "mtimeMs"),
            (m.ctime_ms, "ctimeMs"),
            (m.mode, "mode"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self.fail(where, f"{what} {value!r} must be a non-negative integer")
        if m.mode > 0o7777:
            raise self.fail(where, f"mode {m.mode:#o} has bits outside the permission bits 0o7777")
        if m.size == 0:
            if f.blobs:
                raise self.fail(where, "an empty file must have no blobs")
        else:
            if not f.blobs:
                raise self.fail(where, f"a file of {m.size} bytes must have at least one blob")
            previous = -1
            for i, b in enumerate(f.blobs):
                if isinstance(b.offset, bool) or not isinstance(b.offset, int):
                    raise self.fail(where, f"blob #{i} offset {b.offset!r} is not an integer")
                if i == 0 and b.offset != 0:
                    raise self.fail(where, f"the first blob must start at offset 0, not {b.offset}")
                if b.offset <= previous:
                    raise self.fail(
                        where, f"blob #{i} offset {b.offset} does not increase (previous {previous})"
                    )
                if b.offset >= m.size:
                    raise self.fail(where, f"blob #{i} offset {b.offset} is not below the file size {m.size}")
                previous = b.offset
            combined = combine_chunks([(b.checksum, n) for b, n in f.chunks()])
            if combined != f.checksum:
                raise self.fail(
                    where,
                    f"file checksum {f.checksum} does not match its blobs' checksums (combined {combined})",
                )
        target = self.removed_blobs if removed else self.present_blobs
        for b in f.blobs:
            self.blob_name(b.blob_id, f"{where} blob {b.blob_id!r}")
            if b.blob_id in self.present_blobs or b.blob_id in self.removed_blobs:
                other = self.present_blobs.get(b.blob_id) or self.removed_blobs[b.blob_id]
                state = "present" if b.blob_id in self.present_blobs else "removed"
                raise self.fail(where, f"blob {b.blob_id!r} is also listed as {state} in {other}")
            target[b.blob_id] = where
