"""The commit log: ``metadata.json`` and ``commits/<v>.json``, the query's source of truth.

Both are written create-only (``put_if_absent``), so two drivers can never both commit a version, and
both are validated in full when read: every id is checked before anyone builds an object name from it,
so a commit cannot point outside the checkpoint root. The JSON layouts are specified in
``docs/FORMATS.md``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar, cast

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.errors import CorruptionError, StateError
from blobstate.horizon import HorizonScan
from blobstate.ids import (
    CheckpointId,
    InvalidIdError,
    validate_operator,
    validate_partition,
    validate_uid,
    validate_version,
)
from blobstate.jsonfields import Fail, JsonFields, check_record_size, load_strict_json
from blobstate.layout import COMMITS_PREFIX, METADATA, commit_name
from blobstate.lineage.acceptance import Acceptance, apply_acceptances, read_acceptances
from blobstate.lineage.refs import PartitionObjects

METADATA_FORMAT_VERSION = 2
"""The ``metadata.json`` format version this build writes and reads.

Version 1 checkpoints stored state values pickled; this build never unpickles what it reads, so it
refuses them with an error that says so (see :func:`parse_metadata`).
"""

COMMIT_FORMAT_VERSION = 3
"""The ``commits/<v>.json`` format version this build writes (3: with ``horizon``, the log may be pruned
below it)."""

RESCALED_COMMIT_FORMAT = 4
"""The format of commits from a rescale on (4: with ``num_partitions`` and ``layout_from``; ``batch_id`` may
be below ``version - 1``). Commits of a checkpoint never rescaled stay format 3, so older builds read them;
older builds refuse format 4 as written by a newer blobstate."""

INSTANT_KEYS_COMMIT_FORMAT = 5
"""The format of commits of a query keyed by a TIMESTAMP from the release that stores such keys as
instants (by their UTC reading) on (5: ``instant_keys``; ``num_partitions`` and ``layout_from`` always
present, ``layout_from`` 1 until a rescale). Earlier releases stored them as wall-clock readings of the
session's zone and refuse format 5 as written by a newer blobstate, so they never mix the two forms."""

COMMIT_FORMATS_READ = (2, 3, 4, 5)
"""The ``commits/<v>.json`` format versions this build reads (2: with object references, never pruned)."""

MAX_COMMIT_BYTES = 64 << 20
"""The largest ``commits/<v>.json`` this build reads or writes: 64 MiB. A commit grows with the partition
count (each partition's uid, object references, placement, standby records and metrics); the largest one
built (``tests/lineage/test_record_bounds.py``) has 10,000 partitions (the most a checkpoint may have,
``rescale/limits.py``), each with a delta, a snapshot and a late snapshot, an inline snapshot upload
listing 10 objects, two standby replicas and a warm-up replica, two sync rounds and a move, and is about
31.5 MiB, so the bound leaves a margin of two. A reader refuses a larger commit before it parses it
(parsed, a commit takes about 4.4 times its size in memory) and, when a listing of ``commits/`` gave its
size, before it reads it; the writer refuses to write one, so a checkpoint never holds a commit its
readers refuse."""

MAX_METADATA_BYTES = 16 << 20
"""The largest ``metadata.json`` this build reads or writes: 16 MiB, a dozen operators each with the
largest ``key_schema`` ``stored_schema`` accepts (4,096 fields, names of 256 characters: about 1.4 MiB).
Checked on its bytes before it is parsed (it is read without a listing)."""

T = TypeVar("T")

_COMMIT_NAME_RE = re.compile(re.escape(COMMITS_PREFIX) + r"(0|[1-9][0-9]{0,18})\.json")
_PARTITION_RE = re.compile(r"0|[1-9][0-9]{0,9}")
_PROCESSOR = "\x00processor"  # not an operator id: the processor operators' count


def now_ms() -> int:
    """The current wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class CommitLogError(StateError):
    """Base class of the commit log's errors."""


class CommitLogFormatError(CommitLogError, CorruptionError, ValueError):
    """A commit log object that is malformed (or larger than a reader accepts): names the object, the
    field (none for the whole object) and what is wrong."""

    def __init__(self, name: str, field: str, problem: str) -> None:
        where = f" field {field}:" if field else ""
        super().__init__(f"invalid {name}:{where} {problem}")
        self.name = name
        self.field = field
        self.problem = problem


class CommitConflictError(CommitLogError):
    """``commits/<v>.json`` already exists with other content: another driver owns the query."""

    def __init__(self, message: str, *, version: int, existing_writer: str, writer: str) -> None:
        super().__init__(message)
        self.version = version
        self.existing_writer = existing_writer
        self.writer = writer


class MetadataConflictError(CommitLogError):
    """The checkpoint's ``metadata.json`` disagrees with the query (partitions, operators or key columns)."""


class IncompleteCommitLogError(CommitLogError):
    """The commit log has holes: ``commits/<v>.json`` is missing for versions below the newest one."""

    def __init__(self, message: str, *, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


# ---------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class QueryMetadata:
    """What never changes for a checkpoint: query id, partition count, operators and their key columns.

    ``operators`` maps operator id to ``{"key_columns": [...], ...}``. An operator may have its own
    partition count (``"partitions": 1`` for a broadcast adjunct store) and the adjunct stores it keeps
    (``"adjuncts": {name: mode}``); both are part of the checkpoint's identity. Other entries are
    free-form JSON.
    """

    query_id: str
    num_partitions: int
    operators: dict[str, dict[str, Any]]
    format_version: int = METADATA_FORMAT_VERSION
    created_time_ms: int = field(default_factory=now_ms)

    @classmethod
    def new(cls, num_partitions: int, operators: Mapping[str, Mapping[str, Any]]) -> QueryMetadata:
        """Metadata for a new query with a fresh random query id."""
        return cls(str(uuid.uuid4()), num_partitions, {op: dict(v) for op, v in operators.items()})

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as ``metadata.json``."""
        return {
            "format_version": self.format_version,
            "query_id": self.query_id,
            "num_partitions": self.num_partitions,
            "operators": self.operators,
            "created_time_ms": self.created_time_ms,
        }

    def identity(self) -> tuple[int, dict[str, Any]]:
        """What must match for a query to resume this checkpoint: partition counts, operator keys and
        adjunct stores."""
        ops: dict[str, Any] = {}
        for op, v in self.operators.items():
            entry: dict[str, Any] = {"key_columns": list(v["key_columns"])}
            for extra in ("partitions", "adjuncts"):
                if extra in v:
                    entry[extra] = v[extra]
            ops[op] = entry
        return self.num_partitions, ops

    def partitions_of(self, operator: str) -> int:
        """How many partitions ``operator`` has (its own count, else the query's)."""
        own = self.operators.get(operator, {}).get("partitions")
        return own if isinstance(own, int) and not isinstance(own, bool) and own >= 1 else self.num_partitions


@dataclass(frozen=True)
class Commit:
    """``commits/<v>.json``: which uid of every (operator, partition) makes up version ``v``.

    ``version`` is v >= 1 (the state after batch ``v - 1``); ``batch_id`` is always ``version - 1``
    (derived when not given); ``checkpoints`` maps operator id to ``{partition: uid}`` and must cover
    every partition of every operator; ``writer`` identifies the driver run that wrote it.
    ``objects`` records, for every (operator, partition), the size and SHA-256 of the delta and (when
    one was taken) the snapshot index of that checkpoint, so everything a version reaches can be checked;
    and, when a background snapshot upload of an earlier version finished, that snapshot (a
    :class:`~blobstate.lineage.refs.LateSnapshot`).
    ``retained_from`` is the oldest version that stays restorable once this commit's post-commit
    cleanup ran (never lower than the previous commit's). ``horizon`` (``1..retained_from``, never lower
    than the previous commit's) is the oldest version whose commit any version from this one on still
    needs: once this commit is durable, commits below it may be pruned, and a reader takes a missing
    commit below the newest commit's horizon for a pruned prefix, not a hole. ``placement`` maps
    partition to an executor id, or to a JSON object with an ``executor_id`` (and free-form entries
    such as ``host``).
    ``adjunct_offsets`` and ``metrics`` are free-form JSON objects; ``source`` says where the batch's
    input came from (Spark's query id and offset log digest, see :mod:`blobstate.engine.replay`).
    """

    version: int
    checkpoints: dict[str, dict[int, str]]
    writer: str
    objects: dict[str, dict[int, PartitionObjects]]
    retained_from: int
    placement: dict[int, str | dict[str, Any]] | None = None
    watermark_ms: int | None = None
    adjunct_offsets: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    created_time_ms: int = field(default_factory=now_ms)
    format_version: int = COMMIT_FORMAT_VERSION
    batch_id: int = None  # type: ignore[assignment]  # derived: version - 1
    horizon: int = 1
    num_partitions: int | None = None
    """The processor operators' partition count at this version; None: ``metadata.json``'s (a checkpoint
    never rescaled). Operators with their own count in ``metadata.json`` keep it."""
    layout_from: int = 1
    """The version whose commit made this version's partition layout: 1, or the version of the newest
    rescale at or below this one. A rescale commit has ``layout_from == version``; no lineage crosses it."""
    instant_keys: bool = False
    """Whether the grouping keys' TIMESTAMP columns are stored as instants (their UTC reading): set by
    every commit of a query keyed by a TIMESTAMP from this release on (format 5). False with such a key:
    an earlier release's wall-clock readings, converted at the query's next start."""

    def __post_init__(self) -> None:
        batch_id = cast("int | None", self.batch_id)  # typed int for readers; None until derived here
        if not 1 <= self.layout_from <= self.version:
            raise ValueError(
                f"commit of version {self.version}: layout_from {self.layout_from} must be in "
                f"1..{self.version}"
            )
        if self.layout_from > 1:
            if self.num_partitions is None or self.num_partitions < 1:
                raise ValueError(
                    f"commit of version {self.version}: a rescaled layout (layout_from {self.layout_from}) "
                    "must record num_partitions"
                )
            if self.format_version == COMMIT_FORMAT_VERSION:
                object.__setattr__(self, "format_version", RESCALED_COMMIT_FORMAT)
        if self.instant_keys and self.format_version < INSTANT_KEYS_COMMIT_FORMAT:
            object.__setattr__(self, "format_version", INSTANT_KEYS_COMMIT_FORMAT)
        if self.layout_from > 1:
            if batch_id is None or not 0 <= batch_id <= self.version - 1:
                raise ValueError(
                    f"commit of version {self.version}: a rescaled layout needs a batch_id in "
                    f"0..{self.version - 1}, found {batch_id}"
                )
        elif batch_id is None:
            object.__setattr__(self, "batch_id", self.version - 1)
        elif batch_id != self.version - 1:
            raise ValueError(f"commit of version {self.version} must have batch_id {self.version - 1}")
        if not 1 <= self.retained_from <= self.version:
            raise ValueError(
                f"commit of version {self.version}: retained_from {self.retained_from} must be in "
                f"1..{self.version}"
            )
        if not 1 <= self.horizon <= self.retained_from:
            raise ValueError(
                f"commit of version {self.version}: horizon {self.horizon} must be in 1..{self.retained_from}"
            )

    @property
    def rescaled(self) -> bool:
        """Whether this commit is a rescale: the first version of a new partition layout."""
        return self.layout_from == self.version > 1

    def partitions_of(self, operator: str, metadata: QueryMetadata) -> int:
        """How many partitions ``operator`` has at this version (its own count in ``metadata``, else this
        commit's ``num_partitions``, else ``metadata``'s)."""
        own = metadata.operators.get(operator, {}).get("partitions")
        if isinstance(own, int) and not isinstance(own, bool) and own >= 1:
            return own
        return self.num_partitions if self.num_partitions is not None else metadata.num_partitions

    def checkpoint_id(self, operator: str, partition: int) -> CheckpointId:
        """The committed ``(v, uid)`` of one (operator, partition)."""
        return CheckpointId(self.version, self.checkpoints[operator][partition])

    def objects_of(self, operator: str, partition: int) -> PartitionObjects:
        """The delta and snapshot references of one (operator, partition) at this version."""
        return self.objects[operator][partition]

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as ``commits/<v>.json``."""
        return {
            "format_version": self.format_version,
            "version": self.version,
            "batch_id": self.batch_id,
            "checkpoints": {
                op: {str(p): uid for p, uid in sorted(parts.items())}
                for op, parts in self.checkpoints.items()
            },
            "objects": {
                op: {str(p): refs.to_json() for p, refs in sorted(parts.items())}
                for op, parts in self.objects.items()
            },
            "retained_from": self.retained_from,
            **({"horizon": self.horizon} if self.format_version >= 3 else {}),
            "placement": None
            if self.placement is None
            else {str(p): ex for p, ex in sorted(self.placement.items())},
            "watermark_ms": self.watermark_ms,
            "adjunct_offsets": self.adjunct_offsets,
            "metrics": self.metrics,
            "source": self.source,
            "writer": self.writer,
            "created_time_ms": self.created_time_ms,
            **(
                {"num_partitions": self.num_partitions, "layout_from": self.layout_from}
                if self.format_version >= RESCALED_COMMIT_FORMAT
                else {}
            ),
            **({"instant_keys": True} if self.format_version >= INSTANT_KEYS_COMMIT_FORMAT else {}),
        }

    def attempts_digest(self) -> str:
        """SHA-256 of the attempts (uids) this commit names: tells two commits of one version apart (a lost
        commit and the one that took its number later), since every commit names attempts of its own."""
        named = {
            op: {str(p): uid for p, uid in sorted(parts.items())} for op, parts in self.checkpoints.items()
        }
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode("utf-8")).hexdigest()

    def same_content(self, other: Commit) -> bool:
        """Whether two commits store the same JSON apart from their creation time (an idempotent retry)."""

        def content(commit: Commit) -> object:
            obj = commit.to_json()
            del obj["created_time_ms"]
            return json.loads(json.dumps(obj))  # as stored: int keys of free-form maps become strings

        return content(self) == content(other)


# ---------------------------------------------------------------------------------------------- parsing
def _failer(name: str) -> Fail:
    def fail(field: str, problem: str) -> NoReturn:
        raise CommitLogFormatError(name, field, problem)

    return fail


def _fields(name: str, data: bytes) -> JsonFields:
    fail = _failer(name)
    return JsonFields(load_strict_json(data, fail), fail)


def _format_version(f: JsonFields, supported: tuple[int, ...]) -> int:
    version = f.integer("format_version", minimum=1)
    if version == 1 and 1 not in supported:
        f.fail(
            "format_version",
            "format version 1, which stored state values pickled; this version never unpickles "
            "what it reads, so it cannot load this checkpoint: start the query on a new checkpoint "
            "location (and rebuild its state from the source)",
        )
    if version not in supported:
        known = " and ".join(map(str, supported))
        newer = " (written by a newer blobstate: upgrade to read it)" if version > max(supported) else ""
        plural = "s" if len(supported) > 1 else ""
        f.fail(
            "format_version",
            f"unknown format version {version}{newer}; this build reads version{plural} {known}",
        )
    return version


def _adjunct_names(operators: dict[str, Any]) -> set[str]:
    """The adjunct stores an identity's operators declare, as ``name (mode)``."""
    return {
        f"{name} ({mode})" for v in operators.values() for name, mode in (v.get("adjuncts") or {}).items()
    }


def parse_metadata(data: bytes, name: str = METADATA) -> QueryMetadata:
    """Parse and validate ``metadata.json``; raises :class:`CommitLogFormatError` naming the field."""
    f = _fields(name, data)
    version = _format_version(f, (METADATA_FORMAT_VERSION,))
    query_id = f.text("query_id")
    try:
        canonical = str(uuid.UUID(query_id)) == query_id
    except ValueError:
        canonical = False
    if not canonical:
        f.fail("query_id", f"expected a lowercase UUID string, found {query_id!r}")
    num_partitions = f.integer("num_partitions", minimum=1)
    raw_operators = f.mapping("operators")
    assert raw_operators is not None
    if not raw_operators:
        f.fail("operators", "no operators")
    operators: dict[str, dict[str, Any]] = {}
    for op, spec in raw_operators.items():
        where = f"operators[{op!r}]"
        try:
            validate_operator(op)
        except InvalidIdError as error:
            f.fail(where, str(error))
        f.nested(spec, f"{where}.").get(
            "key_columns",
            lambda v: isinstance(v, list) and all(isinstance(c, str) and c for c in v),
            "a list of column names",
        )
        if "partitions" in spec:
            f.nested(spec, f"{where}.").get(
                "partitions",
                lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                "a positive integer",
            )
        operators[op] = spec
    created = f.integer("created_time_ms", minimum=0)
    _check_digest(f)
    return QueryMetadata(query_id, num_partitions, operators, version, created)


def _partition_key(f: JsonFields, where: str, key: object, num_partitions: int) -> int:
    if not isinstance(key, str) or not _PARTITION_RE.fullmatch(key):
        f.fail(where, f"bad partition {key!r}: expected a decimal integer")
    try:
        return validate_partition(int(key), num_partitions)
    except InvalidIdError as error:
        f.fail(where, str(error))


def parse_commit(data: bytes, name: str, version: int, metadata: QueryMetadata) -> Commit:
    """Parse and validate ``commits/<version>.json`` against the query's metadata.

    Checks the version and batch id against ``version``, every operator id and uid, and that every
    partition ``0..N-1`` of every operator in ``metadata`` is present and no other. Raises
    :class:`CommitLogFormatError` naming the object and the offending field.
    """
    f = _fields(name, data)
    format_version = _format_version(f, COMMIT_FORMATS_READ)
    stored_version = f.integer("version", minimum=1)
    if stored_version != version:
        f.fail("version", f"{stored_version} does not match the object name (version {version})")
    batch_id = f.integer("batch_id")
    rescaled_format = format_version >= RESCALED_COMMIT_FORMAT
    layout_from = 1
    num_partitions: int | None = None
    instant_keys = format_version >= INSTANT_KEYS_COMMIT_FORMAT
    if instant_keys:
        f.get("instant_keys", lambda v: v is True, "true (format version 5)")
        num_partitions = f.integer("num_partitions", minimum=1, optional=True)
        layout_from = f.integer("layout_from", minimum=1)
        if layout_from > 1 and num_partitions is None:
            f.fail("num_partitions", f"missing: layout_from {layout_from} is a rescaled layout")
    elif rescaled_format:
        num_partitions = f.integer("num_partitions", minimum=1)
        layout_from = f.integer("layout_from", minimum=2)
    if layout_from > version:
        f.fail("layout_from", f"{layout_from} is above the commit's version {version}")
    if layout_from > 1:
        if batch_id is None or not 0 <= batch_id <= version - 1:
            f.fail("batch_id", f"{batch_id} is not a batch of version {version} (0..{version - 1})")
    elif batch_id != version - 1:
        f.fail("batch_id", f"{batch_id} but version {version} is the state after batch {version - 1}")
    n = num_partitions if num_partitions is not None else metadata.num_partitions

    def partitions_of(op: str) -> int:
        own = metadata.operators.get(op, {}).get("partitions")
        return own if isinstance(own, int) and not isinstance(own, bool) and own >= 1 else n

    raw_checkpoints = f.mapping("checkpoints")
    assert raw_checkpoints is not None
    checkpoints: dict[str, dict[int, str]] = {}
    for op, parts in raw_checkpoints.items():
        where = f"checkpoints[{op!r}]"
        try:
            validate_operator(op)
        except InvalidIdError as error:
            f.fail(where, str(error))
        if op not in metadata.operators:
            f.fail(where, f"operator {op!r} is not declared in {METADATA}")
        checkpoints[op] = _every_partition(f, where, parts, partitions_of(op), "uid", validate_uid)
    absent = sorted(set(metadata.operators) - set(checkpoints))
    if absent:
        f.fail("checkpoints", f"operators missing: {', '.join(absent)}")
    objects = _objects(f, checkpoints, partitions_of, version)
    retained_from = f.integer("retained_from", minimum=1)
    if retained_from > version:
        f.fail("retained_from", f"{retained_from} is above the commit's version {version}")
    horizon = f.integer("horizon", minimum=1, optional=True) if format_version >= 3 else None
    if format_version >= 3 and horizon is None:
        f.fail("horizon", "missing (format version 3 records it)")
    if horizon is not None and horizon > retained_from:
        f.fail("horizon", f"{horizon} is above the commit's retained_from {retained_from}")

    placement: dict[int, str | dict[str, Any]] | None = None
    raw_placement = f.mapping("placement", optional=True)
    if raw_placement is not None:
        placement = {}
        for key, executor in raw_placement.items():
            where = f"placement[{key!r}]"
            partition = _partition_key(f, where, key, n)
            executor_id = executor.get("executor_id") if isinstance(executor, dict) else executor
            if not isinstance(executor_id, str) or not executor_id:
                f.fail(where, f"expected an executor id or an object with one, found {executor!r}")
            placement[partition] = executor
        placement = dict(sorted(placement.items()))
    watermark_ms = f.integer("watermark_ms", optional=True)
    adjunct_offsets = f.mapping("adjunct_offsets", optional=True)
    metrics = f.mapping("metrics", optional=True)
    source = f.mapping("source", optional=True)
    writer = f.text("writer")
    created = f.integer("created_time_ms", minimum=0)
    _check_digest(f)
    return Commit(
        version=version,
        checkpoints=checkpoints,
        writer=writer,
        objects=objects,
        retained_from=retained_from,
        placement=placement,
        watermark_ms=watermark_ms,
        adjunct_offsets=adjunct_offsets,
        metrics=metrics,
        source=source,
        created_time_ms=created,
        format_version=format_version,
        batch_id=batch_id,
        horizon=1 if horizon is None else horizon,
        num_partitions=num_partitions,
        layout_from=layout_from,
        instant_keys=instant_keys,
    )


def _every_partition(
    f: JsonFields, where: str, parts: object, n: int, what: str, parse: Callable[[Any], T]
) -> dict[int, T]:
    """One operator's ``{partition: value}`` object: every partition ``0..n-1`` exactly once, each value
    parsed by ``parse`` (which raises ValueError); failures name ``where`` and the partition."""
    if not isinstance(parts, dict):
        f.fail(where, f"expected a JSON object of partition -> {what}, found {parts!r}")
    values: dict[int, T] = {}
    for key, raw in parts.items():
        part_where = f"{where}[{key!r}]"
        partition = _partition_key(f, part_where, key, n)
        try:
            values[partition] = parse(raw)
        except ValueError as error:
            f.fail(part_where, str(error))
    missing = sorted(set(range(n)) - set(values))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        f.fail(where, f"partitions missing: {shown} (the query has {n} partitions)")
    return dict(sorted(values.items()))


def _objects(
    f: JsonFields, checkpoints: dict[str, dict[int, str]], partitions_of: Callable[[str], int], version: int
) -> dict[str, dict[int, PartitionObjects]]:
    """The ``objects`` field: a reference for exactly the (operator, partition)s of ``checkpoints``;
    a ``late_snapshot`` must be of an earlier version than the commit's."""
    raw = f.mapping("objects")
    assert raw is not None
    out: dict[str, dict[int, PartitionObjects]] = {}
    for op, parts in raw.items():
        where = f"objects[{op!r}]"
        if op not in checkpoints:
            f.fail(where, f"operator {op!r} has no checkpoints in this commit")
        n = partitions_of(op)
        out[op] = _every_partition(f, where, parts, n, "references", PartitionObjects.from_json)
        for p, refs in out[op].items():
            late = refs.late_snapshot
            if late is not None and late.version >= version:
                f.fail(
                    f"{where}[{str(p)!r}].late_snapshot",
                    f"names a snapshot of version {late.version}: a commit of version {version} can only "
                    "name snapshots of earlier versions",
                )
    absent = sorted(set(checkpoints) - set(out))
    if absent:
        f.fail("objects", f"operators missing: {', '.join(absent)}")
    return out


DIGEST_FIELD = "sha256"
"""The field of ``metadata.json`` and ``commits/<v>.json`` that holds :func:`content_digest` of the rest."""


def content_digest(obj: dict[str, Any]) -> str:
    """SHA-256 of an object's canonical JSON (sorted keys, no whitespace), without its digest field.

    Any change to any value changes it, however the file is formatted, so a changed byte in a commit
    (a uid, a reference, a watermark, a metric) is detected on read.
    """
    body = {k: v for k, v in obj.items() if k != DIGEST_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _check_digest(f: JsonFields) -> None:
    stored = f.get(DIGEST_FIELD, lambda v: isinstance(v, str), "a SHA-256 hex string")
    expected = content_digest(f.obj)
    if stored != expected:
        f.fail(
            DIGEST_FIELD,
            f"content does not match its checksum (stored {stored[:16]}..., content {expected[:16]}...): "
            "the object was changed after it was written",
        )


def _check_written_size(data: bytes, bound: int, where: str) -> None:
    """Refuse to write a record its readers would refuse (:class:`CommitLogError`: the commit fails, the
    checkpoint keeps its previous version)."""
    if len(data) > bound:
        raise CommitLogError(
            f"cannot write {where}: {len(data):,} bytes, above the {bound:,} bytes its readers accept "
            '(docs/FORMATS.md, "Size bounds"); nothing was written'
        )


def _dump(obj: dict[str, Any], name: str) -> bytes:
    try:
        # The digest is of the object as a reader sees it: free-form maps (metrics) may have int keys,
        # which JSON stores as strings, and "10" sorts before "2" where 10 sorted after 2.
        obj = json.loads(json.dumps(obj, allow_nan=False))
        obj = {**obj, DIGEST_FIELD: content_digest(obj)}
        return json.dumps(obj, indent=1, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise CommitLogFormatError(name, "", f"cannot be written as JSON: {error}") from error


# ---------------------------------------------------------------------------------------------- the log
@dataclass(frozen=True)
class LogScan(HorizonScan[Commit]):
    """What one listing of ``commits/`` found: the versions present and the newest commit."""


class CommitLog:
    """The commit log of one checkpoint, on its blob store."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._metadata: QueryMetadata | None = None
        self._written: Commit | None = None
        self._listed_sizes: dict[str, int] = {}
        """The size of each commit the last listing of ``commits/`` found (:meth:`versions`). Commits
        are create-only, so a listed size stays the size of that commit while it exists."""
        self.last_scan: LogScan | None = None
        """What this object's last :meth:`scan` found."""
        self.assumed: list[Acceptance] = []
        """Acceptances of lost commits not written yet, applied as if they were (``accept-loss`` checks
        the version it would continue from before it writes)."""
        self._listed_newest = 0
        self._acceptances: list[Acceptance] | None = None

    def _where(self, name: str) -> str:
        return f"{name} in {self.store.url}"

    # ---- metadata
    def write_metadata(self, metadata: QueryMetadata) -> QueryMetadata:
        """Create ``metadata.json`` if it does not exist; return the checkpoint's metadata.

        If it exists with the same identity (partition count, operators and their key columns) the
        stored metadata is returned, query id and all; otherwise :class:`MetadataConflictError`.
        """
        data = _dump(metadata.to_json(), METADATA)
        parse_metadata(data, f"{METADATA} (to be written)")
        _check_written_size(data, MAX_METADATA_BYTES, self._where(METADATA))
        if self.store.put_if_absent(METADATA, data):
            self._metadata = metadata
            return metadata
        existing = self.read_metadata()
        if existing.identity() != metadata.identity():
            (n_old, ops_old), (n_new, ops_new) = existing.identity(), metadata.identity()
            if n_old != n_new:
                what = f"{n_old} partitions, the query asks for {n_new}"
            else:
                what = f"operators and key columns {ops_old}, the query has {ops_new}"
            adjuncts_old = _adjunct_names(ops_old)
            adjuncts_new = _adjunct_names(ops_new)
            if adjuncts_old != adjuncts_new:
                what = (
                    f"adjunct stores {sorted(adjuncts_old)}, the query has {sorted(adjuncts_new)}: adding or"
                    " removing a side stream changes the query's sources, which Spark also refuses on an"
                    " existing checkpoint"
                )
            raise MetadataConflictError(
                f"{self._where(METADATA)} (query {existing.query_id}) records {what}; "
                "a checkpoint's partitions and operators cannot change: use a new checkpoint location"
            )
        return existing

    def read_metadata(self) -> QueryMetadata:
        """Read and validate ``metadata.json`` (cached: it never changes).

        Raises :class:`~blobstate.blobstore.BlobNotFoundError` if the checkpoint has none.
        """
        if self._metadata is None:
            data = self._read_bounded(METADATA, MAX_METADATA_BYTES)
            self._metadata = parse_metadata(data, self._where(METADATA))
        return self._metadata

    def _read_bounded(self, name: str, bound: int) -> bytes:
        """The bytes of ``name``, refused (:class:`CommitLogFormatError` naming the object, its size and
        ``bound``) when larger than ``bound``: before the read when the last listing gave its size, else
        after reading no further than one byte past ``bound``, before it is parsed."""
        fail = _failer(self._where(name))
        listed = self._listed_sizes.get(name)
        if listed is not None:
            check_record_size(listed, bound, fail, read=False)
        data = self.store.get(name, max_bytes=bound)
        check_record_size(len(data), bound, fail, read=True, cut=len(data) > bound)
        return data

    # ---- commits
    def write_commit(self, commit: Commit) -> bool:
        """Create ``commits/<v>.json``; returns True if this call created it, False on an identical retry.

        Raises :class:`CommitConflictError` if it already exists with other content (another driver owns
        the query), :class:`CommitLogFormatError` if the commit is invalid, and :class:`CommitLogError`
        if version v-1 has no commit.
        """
        version = validate_version(commit.version)
        name = commit_name(version)
        data = _dump(commit.to_json(), name)
        parse_commit(data, f"{name} (to be written)", version, self.read_metadata())
        _check_written_size(data, MAX_COMMIT_BYTES, self._where(name))
        if version > 1:
            self._check_layout(commit, name)
        if self.store.put_if_absent(name, data):
            self._written = commit
            return True
        existing = self.read_commit(version)
        if existing.writer != commit.writer:
            raise CommitConflictError(
                f"another driver owns the query: version {version} ({self._where(name)}) was committed "
                f"by writer {existing.writer!r}, not by this writer {commit.writer!r}",
                version=version,
                existing_writer=existing.writer,
                writer=commit.writer,
            )
        if not existing.same_content(commit):
            raise CommitConflictError(
                f"version {version} ({self._where(name)}) was already committed by this writer "
                f"{commit.writer!r} with different content; the stored commit stands",
                version=version,
                existing_writer=existing.writer,
                writer=commit.writer,
            )
        return False

    def _check_layout(self, commit: Commit, name: str) -> None:
        """The previous version's commit exists and, unless ``commit`` is a rescale, has its layout."""
        previous_name = commit_name(commit.version - 1)
        known = self._written
        if known is not None and known.version == commit.version - 1:
            previous: Commit | None = known
        else:
            try:
                previous = self.read_commit(commit.version - 1)
            except BlobNotFoundError:
                previous = None
        if previous is None:
            raise CommitLogError(
                f"cannot write {self._where(name)}: the previous version has no commit "
                f"({previous_name} does not exist)"
            )
        if commit.layout_from == commit.version:
            return
        metadata = self.read_metadata()
        before = (previous.layout_from, previous.partitions_of(_PROCESSOR, metadata))
        after = (commit.layout_from, commit.partitions_of(_PROCESSOR, metadata))
        if before != after:
            raise CommitLogError(
                f"cannot write {self._where(name)}: it has {after[1]} partitions (layout of version "
                f"{after[0]}) but {previous_name} has {before[1]} (layout of version {before[0]}); only a "
                "rescale commit changes the partition layout"
            )

    def read_commit(self, version: int) -> Commit:
        """Read and validate ``commits/<version>.json``.

        Raises :class:`~blobstate.blobstore.BlobNotFoundError` if it does not exist and
        :class:`CommitLogFormatError` naming the object and field if it is invalid, or naming its size if
        it is larger than :data:`MAX_COMMIT_BYTES` (then it is not parsed, and not even read when this
        log's last listing gave its size).
        """
        name = commit_name(validate_version(version))
        data = self._read_bounded(name, MAX_COMMIT_BYTES)
        commit = parse_commit(data, self._where(name), version, self.read_metadata())
        if version == self._listed_newest:
            commit = apply_acceptances(commit, self.acceptances())
        return commit

    def acceptances(self) -> list[Acceptance]:
        """The accepted losses of this checkpoint (``accepted-loss/``, listed once per listing of
        ``commits/``) and the :attr:`assumed` ones."""
        if self._acceptances is None:
            self._acceptances = read_acceptances(self.store)
        return [*self._acceptances, *self.assumed]

    def commit_exists(self, version: int) -> bool:
        """Whether ``commits/<version>.json`` exists (without reading or validating it)."""
        return self.store.exists(commit_name(validate_version(version)))

    def versions(self) -> list[int]:
        """Every committed version, ascending (other names under ``commits/`` are ignored).

        One listing with sizes (what a listing returns anyway), kept so :meth:`read_commit` refuses a
        commit above :data:`MAX_COMMIT_BYTES` without reading it."""
        found = []
        sizes = self.store.list_sizes(COMMITS_PREFIX)
        for name in sizes:
            match = _COMMIT_NAME_RE.fullmatch(name)
            if match:
                found.append(int(match.group(1)))
        self._listed_sizes = sizes
        found.sort()
        # The newest commit a listing finds is read as an accepted loss left it (read_commit).
        self._listed_newest, self._acceptances = (found[-1] if found else 0), None
        return found

    def latest_version(self) -> int:
        """The highest committed version, or 0 (the empty state) if nothing was committed."""
        versions = self.versions()
        return versions[-1] if versions else 0

    def scan(self, *, check: bool = True) -> LogScan:
        """One listing of ``commits/`` and the newest commit: what the log holds and where its horizon is.

        With ``check``, raises :class:`IncompleteCommitLogError` naming the missing commits when a
        version from the newest commit's horizon up to the newest has none (a hole); commits missing
        below the horizon were pruned and are not an error.
        """
        versions = self.versions()
        newest = self.read_commit(versions[-1]) if versions else None
        scan = LogScan(versions, newest)
        self.last_scan = scan
        if check:
            self.check_complete(scan)
        return scan

    def check_complete(self, scan: LogScan) -> None:
        """Raise :class:`IncompleteCommitLogError` naming the missing commits if ``scan`` found holes."""
        if scan.holes:
            missing = scan.holes
            shown = ", ".join(commit_name(v) for v in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise IncompleteCommitLogError(
                f"the commit log of {self.store.url} has holes: {len(missing)} commit(s) missing in the "
                f"retained window {scan.horizon}..{scan.latest} (the horizon of {commit_name(scan.latest)}):"
                f" {shown}; restore them from a backup, or start a new checkpoint",
                missing=missing,
            )

    def complete_versions(self) -> list[int]:
        """The versions from the newest commit's horizon to the newest, ascending, after proving that
        each has its commit (see :meth:`scan`).

        Raises :class:`IncompleteCommitLogError` naming the missing commits: a checkpoint whose commit
        log cannot be read completely must not be swept or called restorable.
        """
        scan = self.scan()
        return [v for v in scan.versions if v >= scan.horizon]

    def prune(self, horizon: int, *, listed: list[int] | None = None, floor: int = 0) -> list[int]:
        """Delete the commits below ``horizon`` (the horizon of a durable commit), oldest first.

        ``listed`` are the versions a listing found (all of them below ``horizon`` go); without it the
        versions are found by walking down from ``horizon - 1`` while commits exist, down to ``floor``
        (below which everything is known to be pruned). Deleting oldest first keeps what a crash leaves
        a contiguous range just below the horizon, which the walk finds again. Returns the versions
        deleted.
        """
        if listed is not None:
            doomed = sorted(v for v in listed if v < horizon)
        else:
            doomed = []
            version = horizon - 1
            while version > floor and self.store.exists(commit_name(version)):
                doomed.append(version)
                version -= 1
            doomed.sort()
        for version in doomed:
            self.store.delete_if_exists(commit_name(version))
        return doomed

    def latest_commit(self) -> Commit | None:
        """The commit of :meth:`latest_version`, or None if nothing was committed."""
        version = self.latest_version()
        return self.read_commit(version) if version else None
