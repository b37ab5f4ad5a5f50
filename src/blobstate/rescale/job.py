"""Rescale a query checkpoint: its newest version with M partitions becomes a new version with N.

One Spark job, two stages (docs/RESCALE.md):

1. one task per old partition restores it at the newest version ``L`` (the load rules, in a scratch
   directory), splits its records by the new partition of their grouping key
   (:mod:`blobstate.rescale.split`) and emits ``(new partition, chunk)`` pairs;
2. Spark shuffles the chunks by new partition (exactly: the partitioner is the identity), and one task
   per new partition writes them into a fresh RocksDB store, uploads it as the snapshot of version
   ``R = L + 1`` under a new uid, with an empty delta whose lineage is empty, all pending (with a TTL).

The driver then writes ``commits/<R>.json`` create-only: it names every new partition's uid and objects,
``num_partitions`` N and ``layout_from`` R, and carries the watermark, the side streams' offsets, the
batch id and the retention window of version L over unchanged. Broadcast adjunct stores keep their one
partition: their version R is an empty delta on top of L. Only then does the post-commit cleanup make
version R's objects permanent. A crash before the commit leaves the old layout (the new objects stay
pending and expire; a rerun starts again with new uids); a crash after it leaves the new layout, whose
cleanup any later run (the rescale again, ``gc``, a query start) finishes. Versions before R stay
readable until retention removes them.

Memory per task does not grow with the state: every store a task writes (the restore of an old
partition, a new partition) is opened with :data:`~blobstate.state.store.SCRATCH` (small write buffers,
no compactions, a small private block cache), a restore applies a slice of one delta at a time, and a
split holds a chunk per target.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blobstate.blobstore import DEFAULT_PENDING_TTL_SECONDS, BlobStore, open_blob_store
from blobstate.encoding.layout import META_CF
from blobstate.ids import CheckpointId, new_uid
from blobstate.layout import delta_name
from blobstate.lineage.commitlog import Commit, CommitLog, IncompleteCommitLogError, QueryMetadata
from blobstate.lineage.delta import encode_delta
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from blobstate.rescale.keys import KeyForm, timestamp_positions
from blobstate.rescale.limits import MAX_PARTITIONS
from blobstate.rescale.split import KeyRouter, RescaleError, SplitStats, chunk_records, split_store
from blobstate.stored_schema import StoredSchemaError, parse_stored_schema

Fault = Callable[[str], None]
"""A hook called at each step of a rescale with the step's name (tests inject crashes with it)."""

STEPS = ("planned", "built", "committed", "cleaned")
"""The driver's steps, in order, as passed to a :data:`Fault` hook (``built``: every new partition is
uploaded, pending, and nothing is committed); tasks call it with ``split:<op>/<p>``
before emitting a partition's last chunk and ``build:<op>/<q>`` after uploading a new partition's snapshot
and before its delta."""


@dataclass(frozen=True)
class RescalePlan:
    """What a rescale does, fixed on the driver before any task runs (sent to every task)."""

    url: str
    """The checkpoint's location, as messages name it (never with a URL's options)."""
    query_id: str
    version: int
    """The newest committed version ``L`` (with the old layout)."""
    old_partitions: int
    new_partitions: int
    processors: tuple[str, ...]
    """The operators whose partitions follow the keys."""
    old_uids: dict[str, dict[int, str]]
    key_schemas: dict[str, Any]
    """Each processor operator's key schema as JSON (``metadata.json``'s ``key_schema``)."""
    pending_ttl: float
    store_url: str = ""
    """The URL tasks open the store with (with a query's blob store options); empty: :attr:`url`."""
    legacy_zone: str | None = None
    """Convert TIMESTAMP keys an earlier release stored as wall-clock readings to instants, taking naive
    readings in this zone (None: the keys are kept as stored)."""
    instant_keys: bool = False
    """Whether the new version's TIMESTAMP keys are instants (``Commit.instant_keys``)."""

    def key_form(self, op: str) -> KeyForm:
        """How the stored grouping keys of operator ``op`` become the keys the new version stores."""
        schema = parse_stored_schema(self.key_schemas[op], where=f"key_schema of operator {op}")
        types = tuple(f.dataType for f in schema.fields)
        return KeyForm(len(schema.fields), timestamp_positions(schema), self.legacy_zone, types)

    @property
    def new_version(self) -> int:
        """The version the rescale commits, ``R = L + 1``."""
        return self.version + 1


@dataclass
class RescaleResult:
    """What a rescale did."""

    url: str
    old_partitions: int
    new_partitions: int
    version: int
    """The version it committed (or found committed): the first with the new layout."""
    previous_version: int
    records: int = 0
    bytes_uploaded: int = 0
    seconds: float = 0.0
    already: bool = False
    """The newest version already had the requested layout: nothing was done but its cleanup."""
    partitions: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "url": self.url,
            "old_partitions": self.old_partitions,
            "new_partitions": self.new_partitions,
            "version": self.version,
            "previous_version": self.previous_version,
            "records": self.records,
            "bytes_uploaded": self.bytes_uploaded,
            "seconds": round(self.seconds, 3),
            "already": self.already,
        }


# ---------------------------------------------------------------------------------------------- planning
def _processors(metadata: QueryMetadata) -> list[str]:
    return sorted(op for op, spec in metadata.operators.items() if "partitions" not in spec)


def check_partition_count(partitions: object, what: str = "the number of partitions") -> int:
    """``partitions`` if it is an integer in ``1..MAX_PARTITIONS``; else :class:`RescaleError` saying so."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise RescaleError(f"{what} must be a positive integer, not {partitions!r}")
    if partitions > MAX_PARTITIONS:
        raise RescaleError(
            f"{what} is {partitions}, above blobstate's limit of {MAX_PARTITIONS} state partitions (each is"
            " a RocksDB store, a task and a delta in every batch)"
        )
    return partitions


def needs_key_conversion(metadata: QueryMetadata, newest: Commit | None, operator: str) -> bool:
    """Whether the checkpoint's newest version stores an earlier release's TIMESTAMP keys (wall-clock
    readings) that this release stores as instants: a TIMESTAMP key column and a commit before format 5."""
    if newest is None or newest.instant_keys:
        return False
    recorded = metadata.operators.get(operator, {}).get("key_schema")
    if recorded is None:
        return False
    try:
        schema = parse_stored_schema(recorded, where=f"key_schema of operator {operator}")
    except StoredSchemaError:
        return False
    return bool(timestamp_positions(schema))


def plan_rescale(
    store: BlobStore,
    partitions: int,
    *,
    pending_ttl: float = DEFAULT_PENDING_TTL_SECONDS,
    legacy_zone: str | None = None,
) -> tuple[RescalePlan, Commit]:
    """Check the checkpoint and fix the plan; raises :class:`RescaleError` naming what is wrong, and
    :class:`~blobstate.state.lost.LostCommitError` when newer commits than the newest one are known lost.

    A checkpoint of an earlier release keyed by a TIMESTAMP stores wall-clock readings of the zone its
    query ran in; its keys become instants in the same job, which needs that zone (``legacy_zone``: a
    query's start passes its session's zone). Without it such a checkpoint is refused."""
    check_partition_count(partitions)
    log = CommitLog(store)
    try:
        metadata = log.read_metadata()
    except Exception as error:  # BlobNotFoundError or a format error
        raise RescaleError(f"{store.url} is not a readable query checkpoint: {error}") from None
    from blobstate.state.lost import scan_for_writing

    try:  # LostCommitError first: its number would take a lost commit's
        scan, _ = scan_for_writing(store, action="rescale", log=log)
    except IncompleteCommitLogError as error:
        raise RescaleError(f"cannot rescale {store.url}: {error}") from None
    newest = scan.newest
    if newest is None:
        raise RescaleError(
            f"{store.url} has no committed version: a query starts with any number of partitions, there is "
            "nothing to rescale"
        )
    processors = _processors(metadata)
    m = newest.partitions_of(processors[0], metadata) if processors else metadata.num_partitions
    legacy = [op for op in processors if needs_key_conversion(metadata, newest, op)]
    if legacy and legacy_zone is None:
        raise RescaleError(
            f"cannot rescale {store.url}: an earlier blobstate release stored its TIMESTAMP keys (operator "
            f"{legacy[0]}) as wall-clock readings of its session's time zone; start the query once with "
            "this release, with spark.sql.session.timeZone set as when it last ran (the start converts "
            "the keys to instants), then rescale"
        )
    schemas: dict[str, Any] = {}
    for op in processors:
        recorded = metadata.operators[op].get("key_schema")
        where = f"key_schema of operator {op} in metadata.json of {store.url}"
        if recorded is None:
            raise RescaleError(
                f"cannot rescale {store.url}: operator {op} records no key_schema in metadata.json "
                "(written by an older blobstate), so the Spark types of its key columns, which decide "
                "each key's partition, are unknown"
            )
        try:
            from blobstate.rescale.murmur3 import UnsupportedKeyTypeError, check_key_schema

            check_key_schema(parse_stored_schema(recorded, where=where))
        except (StoredSchemaError, UnsupportedKeyTypeError) as error:
            raise RescaleError(f"cannot rescale {store.url}: {error}") from None
        schemas[op] = recorded
    plan = RescalePlan(
        url=store.url,
        query_id=metadata.query_id,
        version=newest.version,
        old_partitions=m,
        new_partitions=partitions,
        processors=tuple(processors),
        old_uids={op: dict(newest.checkpoints[op]) for op in processors},
        key_schemas=schemas,
        pending_ttl=pending_ttl,
        legacy_zone=legacy_zone if legacy else None,
        instant_keys=newest.instant_keys or bool(legacy),
    )
    return plan, newest


# ---------------------------------------------------------------------------------------------- tasks
def split_partition(
    plan: RescalePlan, op: str, partition: int, fault: Fault | None = None
) -> Iterator[tuple[int, bytes]]:
    """Stage 1, one old partition: ``(op index * N + new partition, chunk)`` pairs of all its records."""
    from blobstate.reader.checkpoint import open_version, restored_partition

    store = open_blob_store(plan.store_url or plan.url)
    checkpoint = open_version(store, plan.version)
    schema = parse_stored_schema(plan.key_schemas[op], where=f"key_schema of operator {op}")
    where = f"operator {op} partition {partition} at version {plan.version} of {plan.url}"
    router = KeyRouter(schema, plan.new_partitions, plan.old_partitions, partition, where)
    base = plan.processors.index(op) * plan.new_partitions
    stats = SplitStats()
    with restored_partition(store, checkpoint, op, partition, _open_scratch) as rocks:
        pending: tuple[int, bytes] | None = None
        for target, chunk in split_store(rocks, router, stats, plan.key_form(op)):
            if pending is not None:
                yield pending
            pending = (base + target, chunk)
        if fault is not None:
            fault(f"split:{op}/{partition}")
        if pending is not None:
            yield pending


def _open_scratch(path: Path) -> Any:
    """Open a store of a rescale task, written once and read once: an old partition's restore (the load,
    then the split's scan) or a new partition (its chunks, then its upload)."""
    from blobstate.state.store import SCRATCH, RocksStateStore

    return RocksStateStore.open(path, tuning=SCRATCH)


class PartitionBuilder:
    """Stage 2, one new partition: its records written into a fresh store (:meth:`add`), then uploaded,
    pending, as the snapshot of version R with an empty delta that names no lineage (:meth:`finish`)."""

    def __init__(self, plan: RescalePlan, op: str, partition: int) -> None:
        self.plan, self.op, self.partition = plan, op, partition
        self.cid = CheckpointId(plan.new_version, new_uid())
        self.where = f"operator {op} new partition {partition} of version {self.cid.version} of {plan.url}"
        self.scratch = Path(tempfile.mkdtemp(prefix=f"blobstate-rescale-{partition}-"))
        self.meta: dict[bytes, bytes] = {}
        self.records = 0
        self.rocks: Any = _open_scratch(self.scratch / "db")

    def add_meta(self, key: bytes, value: bytes) -> None:
        """One ``$meta`` entry of an old partition (every old partition sends them: they must agree)."""
        if self.meta.setdefault(key, value) != value:
            raise RescaleError(
                f"{self.where}: $meta entry {key.decode('utf-8', 'replace')!r} differs between old "
                "partitions; run the query for a batch (every partition then declares its state variables "
                "alike) and rescale again"
            )

    def add(self, records: Iterable[Any]) -> None:
        """Records (change records or put blocks) of the processor's column families."""
        self.records += self.rocks.apply(records)

    def add_chunk(self, chunk: bytes, index: int) -> None:
        """One chunk of records from a split task (:func:`split_partition`)."""
        batch = chunk_records(chunk, f"{self.where}, chunk {index}")
        if batch and batch[0][1] == META_CF:
            for _, _, key, value in batch:
                assert value is not None
                self.add_meta(key, value)
            return
        self.add(batch)

    def finish(self, fault: Fault | None = None) -> dict[str, Any]:
        """Upload the partition, pending; returns its uid and references. Removes the scratch directory."""
        from blobstate.state.localdirs import LineageInfo, write_info
        from blobstate.state.partition import upload_snapshot

        plan, op, partition, cid, scratch = self.plan, self.op, self.partition, self.cid, self.scratch
        try:
            try:
                self.rocks.apply((_put(META_CF, k, v) for k, v in sorted(self.meta.items())))
                self.rocks.checkpoint(scratch / "snapshot")
            finally:
                self.rocks.close()
            store = open_blob_store(plan.store_url or plan.url)
            write_info(scratch / "snapshot", LineageInfo(cid, (cid.uid,), 0, 0))
            result = upload_snapshot(
                store, scratch / "snapshot", op, partition, cid, (), ttl=plan.pending_ttl
            )
            if fault is not None:
                fault(f"build:{op}/{partition}")
            delta = encode_delta([], ())
            store.put(delta_name(op, partition, cid), delta, ttl=plan.pending_ttl)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return {
            "op": op,
            "partition": partition,
            "uid": cid.uid,
            "delta": ObjectRef.of(delta).to_json(),
            "snapshot": ObjectRef(result.index_size, result.index_sha256).to_json(),
            "records": self.records,
            "bytes_uploaded": result.stats.bytes_uploaded + result.index_size + len(delta),
        }

    def abort(self) -> None:
        """Close the store and remove the scratch directory (a failed build)."""
        with contextlib.suppress(Exception):  # already closed by a failed finish
            self.rocks.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def build_partition(
    plan: RescalePlan, op: str, partition: int, chunks: Iterable[bytes], fault: Fault | None = None
) -> dict[str, Any]:
    """Stage 2 of the in-process rescale, one new partition, from the split tasks' chunks
    (:class:`PartitionBuilder`). Returns its uid and references."""
    builder = PartitionBuilder(plan, op, partition)
    try:
        for i, chunk in enumerate(chunks):
            builder.add_chunk(chunk, i)
    except BaseException:
        builder.abort()
        raise
    return builder.finish(fault)


def _put(cf: str, key: bytes, value: bytes) -> Any:
    from blobstate.lineage.changelog import ChangeOp

    return (ChangeOp.PUT, cf, key, value)


def carry_broadcast(
    store: BlobStore, commit_log: CommitLog, newest: Commit, op: str, pending_ttl: float
) -> tuple[str, PartitionObjects]:
    """Version R of a broadcast adjunct store (one partition, not split): an empty delta on top of L."""
    from blobstate.state.chain import resolve_chain
    from blobstate.state.history import CommitCache, PartitionHistory

    cid = newest.checkpoint_id(op, 0)
    history = PartitionHistory(CommitCache(commit_log, {newest.version: newest}), op, 0)
    lineage = resolve_chain(store, op, 0, cid, history=history, cached=True).next_lineage()
    assert lineage is not None  # no local copies: resolution reads the delta or stops at the snapshot
    new = CheckpointId(newest.version + 1, new_uid())
    data = encode_delta([], lineage)
    store.put(delta_name(op, 0, new), data, ttl=pending_ttl)
    return new.uid, PartitionObjects(ObjectRef.of(data))


# ---------------------------------------------------------------------------------------------- driver
def rescale_checkpoint(
    spark: Any,
    url: str,
    partitions: int,
    *,
    fault: Fault | None = None,
    pending_ttl: float = DEFAULT_PENDING_TTL_SECONDS,
    legacy_zone: str | None = None,
) -> RescaleResult:
    """Rescale the checkpoint at ``url`` to ``partitions`` partitions (see the module docstring).

    ``legacy_zone``: the session time zone an earlier release's query ran in; with it, TIMESTAMP keys that
    release stored as wall-clock readings become instants (also at an unchanged partition count).

    Runs as a Spark job on ``spark``'s executors (``spark=None``: in this process, holding every chunk in
    memory, for tests and small checkpoints). When the newest version already has ``partitions``
    partitions only its post-commit cleanup runs (a rerun after a crash that followed the commit).
    Raises :class:`RescaleError` naming the checkpoint and what is wrong; a query must not run on the
    checkpoint meanwhile (its commit and the rescale's would conflict: the second one fails).
    """
    from blobstate.state.retention import after_commit

    started = time.monotonic()
    store = open_blob_store(url)
    plan, newest = plan_rescale(store, partitions, pending_ttl=pending_ttl, legacy_zone=legacy_zone)
    plan = replace(plan, store_url=url)
    log = CommitLog(store)
    result = RescaleResult(store.url, plan.old_partitions, partitions, newest.version, newest.version)
    if plan.old_partitions == partitions and plan.legacy_zone is None:
        after_commit(store, newest, commit_log=log)
        result.already = True
        result.previous_version = newest.layout_from - 1 if newest.layout_from > 1 else newest.version
        result.seconds = time.monotonic() - started
        return result
    _step(fault, "planned")

    built = _build(spark, plan, fault, store.url)
    targets = len(plan.processors) * partitions
    if len(built) != targets:
        raise RescaleError(f"rescale of {store.url}: {len(built)} of {targets} new partitions were built")
    _step(fault, "built")

    metadata = log.read_metadata()
    checkpoints: dict[str, dict[int, str]] = {op: {} for op in plan.processors}
    objects: dict[str, dict[int, PartitionObjects]] = {op: {} for op in plan.processors}
    for row in built:
        op, q = row["op"], int(row["partition"])
        checkpoints[op][q] = row["uid"]
        objects[op][q] = PartitionObjects(
            ObjectRef.from_json(row["delta"]), ObjectRef.from_json(row["snapshot"])
        )
        result.records += int(row["records"])
        result.bytes_uploaded += int(row["bytes_uploaded"])
        result.partitions.setdefault(op, {})[q] = {"uid": row["uid"], "records": row["records"]}
    for op in sorted(set(metadata.operators) - set(plan.processors)):
        uid, refs = carry_broadcast(store, log, newest, op, pending_ttl)
        checkpoints[op] = {0: uid}
        objects[op] = {0: refs}
    commit = Commit(
        version=plan.new_version,
        checkpoints=checkpoints,
        writer=f"rescale-{uuid.uuid4()}",
        objects=objects,
        retained_from=newest.retained_from,
        placement=None,
        watermark_ms=newest.watermark_ms,
        adjunct_offsets=newest.adjunct_offsets,
        metrics={
            # the late-row watermark of the next batch is the eviction watermark of the one before
            "eviction_watermark_ms": (newest.metrics or {}).get("eviction_watermark_ms"),
            "rescale": {
                "from_partitions": plan.old_partitions,
                "to_partitions": partitions,
                "from_version": plan.version,
                "records": result.records,
                "bytes_uploaded": result.bytes_uploaded,
                **({"keys_from_zone": plan.legacy_zone} if plan.legacy_zone is not None else {}),
            },
        },
        source=newest.source,
        batch_id=newest.batch_id,
        horizon=newest.horizon,
        num_partitions=partitions,
        layout_from=plan.new_version,
        instant_keys=plan.instant_keys,
    )
    log.write_commit(commit)
    result.version = commit.version
    _step(fault, "committed")
    after_commit(store, commit, commit_log=log)
    _step(fault, "cleaned")
    result.seconds = time.monotonic() - started
    return result


def _build(spark: Any, plan: RescalePlan, fault: Fault | None, url: str) -> list[dict[str, Any]]:
    """Both stages: with ``spark``, one Spark job (old partitions -> shuffle by new partition -> new
    partitions); without, in this process, every chunk held in memory (tests and small checkpoints)."""
    n, processors = plan.new_partitions, plan.processors
    sources = [(op, p) for op in processors for p in range(plan.old_partitions)]
    targets = len(processors) * n

    def split(items: Iterable[tuple[str, int]]) -> Iterator[tuple[int, bytes]]:
        for op, p in items:
            yield from split_partition(plan, op, p, fault)

    def build(index: int, items: Iterable[tuple[int, bytes]]) -> Iterator[dict[str, Any]]:
        yield build_partition(plan, processors[index // n], index % n, (chunk for _, chunk in items), fault)

    if spark is None:
        chunks: dict[int, list[tuple[int, bytes]]] = {}
        for key, chunk in split(sources):
            chunks.setdefault(key, []).append((key, chunk))
        return [row for t in range(targets) for row in build(t, chunks.get(t, []))]
    from blobstate.rescale.spark_job import build_with_spark

    return build_with_spark(spark, plan, fault, url)


def _step(fault: Fault | None, name: str) -> None:
    if fault is not None:
        fault(name)


__all__ = [
    "STEPS",
    "RescalePlan",
    "RescaleResult",
    "build_partition",
    "carry_broadcast",
    "plan_rescale",
    "rescale_checkpoint",
    "split_partition",
]
