"""The load rules: bring a partition's working store to a committed ``(v, uid)`` (docs/DESIGN.md).

1. The working store is clean and its ``CHECKPOINT-ID`` is ``(v, uid)``: use it, no I/O.
2. A local checkpoint ``checkpoints/<v>_<uid>/`` or the standby replica is at ``(v, uid)``: materialize
   the working store from it by hard links.
3. Otherwise resolve the lineage (:mod:`blobstate.state.chain`), restore the base (a local checkpoint or
   replica on the lineage, the clean working store if it is on the lineage, or a remote snapshot whose
   files are downloaded only where not already present), then replay the deltas in order.
4. A missing or corrupt object is an error naming it, its version and uid. Every delta and snapshot
   index is checked against the size and SHA-256 its commit records, every blob against the size and
   CRC-32 its index records. When a committed snapshot is missing or corrupt but an older base and the
   deltas up to the version still exist, the version is rebuilt from those (as Spark's snapshot repair
   does) and the load report says so; it never falls back to an older *version*. Nothing is
   half-applied: the working store is marked dirty before anything is touched and marked clean only
   after a commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.ids import CheckpointId
from blobstate.layout import CHECKPOINT_ID_FILE, LocalPartitionLayout, delta_name, snapshot_name
from blobstate.lineage.delta import DeltaFormatError, OpenedDelta, open_delta
from blobstate.state.chain import Chain, delta_lineage, fetch_checked_delta, resolve_chain
from blobstate.state.errors import CorruptObjectError, MissingObjectError, StateLoadError
from blobstate.state.history import PartitionHistory
from blobstate.state.localdirs import (
    LINEAGE_INFO_FILE,
    LineageInfo,
    discard_tree,
    list_checkpoints,
    mark_dirty,
    materialize,
    read_checkpoint_id,
    read_info,
    sweep_trash,
)

log = logging.getLogger(__name__)

RULE_EMPTY = "empty"
RULE_WORKING = "working"
RULE_LOCAL_CHECKPOINT = "local-checkpoint"
RULE_STANDBY = "standby"
RULE_STANDBY_DELTAS = "standby+deltas"
"""Rule 3 from the standby replica (hard links) and the deltas it had not applied yet."""
RULE_REMOTE = "remote"
"""Rule 3 from a remote snapshot (or from nothing) and deltas, or from another local copy and deltas."""


@dataclass
class LoadReport:
    """How a partition was loaded: the rule, the base, what was replayed, and the I/O it cost."""

    rule: str
    checkpoint_id: CheckpointId | None
    base: str = ""
    base_kind: str = ""
    deltas_replayed: int = 0
    records_replayed: int = 0
    bytes_downloaded: int = 0
    bytes_copied: int = 0
    delta_bytes: int = 0
    seconds: float = 0.0
    missing_snapshots: list[str] = field(default_factory=list)
    snapshot_repairs: list[str] = field(default_factory=list)
    """Committed snapshots that were missing or corrupt and loaded around (each: what was wrong)."""
    snapshot_index: Any = None
    snapshot_index_name: str | None = None


@dataclass
class Loaded:
    """The outcome of a successful load: the open store, its lineage info and the report."""

    store: Any
    info: LineageInfo
    report: LoadReport


StoreOpener = Callable[[Path], Any]


def _remote_info(
    store: BlobStore, history: PartitionHistory, cid: CheckpointId, *, delta_bytes: int = 0
) -> LineageInfo:
    """Lineage info of ``cid`` rebuilt from the commit log and its delta (a local copy had none)."""
    refs = history.objects(cid)
    if refs.snapshot is not None:
        return LineageInfo(cid, (cid.uid,), 0, 0)
    lineage = delta_lineage(
        store,
        history.operator,
        history.partition,
        cid,
        refs,
        starts_layout=history.starts_layout(cid.version),
    )
    return LineageInfo(cid, (cid.uid, *lineage), len(lineage), delta_bytes)


def catch_up(
    store: BlobStore,
    layout: LocalPartitionLayout,
    target: Path,
    committed: CheckpointId | None,
    open_store: StoreOpener,
    history: PartitionHistory,
    *,
    upto: int | None = None,
) -> Loaded:
    """Bring the local directory ``target`` of the partition to ``committed`` by the load rules.

    One function for every local copy of a partition (:class:`~blobstate.state.local_copy.LocalCopy`:
    the working store, a standby replica, a broadcast copy, a reader's restore). What ``target`` already holds
    is reused when it is on the committed lineage (then only the missing deltas are fetched); other
    local copies (local checkpoints, the standby replica when ``target`` is not it) are hard-linked;
    otherwise a remote snapshot is restored, downloading only blobs not already present. The result is
    open and dirty: it claims a checkpoint only once the caller marks it (a commit, or a replica's
    ``CHECKPOINT-ID``). The caller holds the partition lock.

    ``upto``: the newest durable commit the caller read (default: ``committed``'s own). Snapshots
    uploaded in the background and named late by commits up to it count as committed, so a version
    whose snapshot a later commit named loads from that snapshot (a reader of an older version).
    """
    started = time.monotonic()
    operator, partition = layout.operator, layout.partition
    working = target
    layout.root.mkdir(parents=True, exist_ok=True)
    prior = read_checkpoint_id(working)
    prior_info = read_info(working, prior) if prior is not None else None
    # Dirty before anything else touches the directory: a crash from here on never leaves a store
    # that claims to be at a checkpoint it does not hold.
    if working.exists():
        mark_dirty(working)

    sweep_trash(layout.root)

    if committed is None:
        discard_tree(working)
        working.mkdir(parents=True)
        report = LoadReport(RULE_EMPTY, None, base_kind="empty")
        return _finish(open_store, working, LineageInfo(None), report, [], started)

    # Rule 1.
    if prior == committed:
        info = prior_info or _remote_info(store, history, committed)
        report = LoadReport(RULE_WORKING, committed, base=committed.name, base_kind="local")
        return _finish(open_store, working, info, report, [], started)

    # Rule 2.
    local_dir = _local_copy(layout, committed, working)
    if local_dir is not None:
        copied = materialize(local_dir, working)
        info = read_info(local_dir, committed) or _remote_info(store, history, committed)
        rule = RULE_STANDBY if local_dir == layout.standby else RULE_LOCAL_CHECKPOINT
        report = LoadReport(rule, committed, base=committed.name, base_kind="local", bytes_copied=copied)
        return _finish(open_store, working, info, report, [], started)

    # Rule 3.
    def local_base(cid: CheckpointId) -> bool:
        return cid == prior or _local_copy(layout, cid, working) is not None

    local_versions = _local_versions(layout, prior, working)
    # A local copy a few versions behind beats downloading a snapshot, unless retention already removed
    # the deltas between them: then (and only then) the snapshot is used after all.
    prefer_local = bool(local_versions)

    def local_below(version: int) -> bool:
        return prefer_local and any(v < version for v in local_versions)

    data: dict[CheckpointId, bytes] = {}
    skip: list[CheckpointId] = []
    repairs: list[str] = []
    first_error: StateLoadError | None = None
    while True:
        try:
            chain = resolve_chain(
                store,
                operator,
                partition,
                committed,
                history=history,
                local_base=local_base,
                data_out=data,
                skip_snapshots=skip,
                local_below=local_below,
                upto=upto,
            )
        except StateLoadError as error:
            if isinstance(error, MissingObjectError) and prefer_local:
                prefer_local = False
                continue
            if first_error is None:
                raise
            # No older base and deltas to rebuild from: the unusable snapshot is the error to report.
            raise first_error from error
        report = LoadReport(
            RULE_REMOTE,
            committed,
            base="" if chain.base is None else chain.base.name,
            base_kind=chain.base_kind,
            missing_snapshots=[c.name for c in chain.missing_snapshots],
            snapshot_repairs=list(repairs),
        )
        # Deltas first: a missing one, or one unlike its commit, fails the load before the (larger) base is
        # restored.
        try:
            records = _download_deltas(store, operator, partition, chain, data, report)
        except MissingObjectError:
            if not prefer_local:
                raise
            prefer_local = False
            continue
        try:
            base_info = _restore_base(store, layout, working, chain, prior, prior_info, report)
        except (MissingObjectError, CorruptObjectError) as error:
            if chain.base_kind != "snapshot" or chain.base is None:
                raise
            log.warning("%s; loading %s from an older base and deltas instead", error, committed)
            skip.append(chain.base)
            repairs.append(str(error))
            first_error = first_error or error
            continue
        info = _next_info(chain, base_info, report)
        return _finish(open_store, working, info, report, records, started)


def _local_versions(layout: LocalPartitionLayout, prior: CheckpointId | None, target: Path) -> set[int]:
    """Versions of the local copies a load could start from: ``target``'s own, local checkpoints, replica."""
    versions = {c.version for c in list_checkpoints(layout.checkpoints)}
    if prior is not None:
        versions.add(prior.version)
    standby = read_checkpoint_id(layout.standby) if layout.standby != target else None
    if standby is not None:
        versions.add(standby.version)
    return versions


def _local_copy(layout: LocalPartitionLayout, cid: CheckpointId, target: Path) -> Path | None:
    """A complete local copy of ``cid`` other than ``target`` itself: a local checkpoint or the replica."""
    checkpoint = layout.checkpoint(cid)
    if (checkpoint / "CURRENT").is_file():
        return checkpoint
    standby = layout.standby
    if standby != target and read_checkpoint_id(standby) == cid and (standby / "CURRENT").is_file():
        return standby
    return None


def _restore_base(
    store: BlobStore,
    layout: LocalPartitionLayout,
    working: Path,
    chain: Chain,
    prior: CheckpointId | None,
    prior_info: LineageInfo | None,
    report: LoadReport,
) -> LineageInfo | None:
    """Put the chain's base into ``working``; returns the base's lineage info when known."""
    base = chain.base
    if chain.base_kind == "empty":
        discard_tree(working)
        working.mkdir(parents=True)
        return LineageInfo(None)
    assert base is not None
    if chain.base_kind == "local":
        if base == prior:
            return prior_info  # the working store itself is the base: nothing to copy
        source = _local_copy(layout, base, working)
        assert source is not None
        if source == layout.standby:
            report.rule = RULE_STANDBY_DELTAS
        report.bytes_copied += materialize(source, working)
        return read_info(source, base)
    return _restore_snapshot(store, layout, working, chain, report)


def _restore_snapshot(
    store: BlobStore, layout: LocalPartitionLayout, working: Path, chain: Chain, report: LoadReport
) -> LineageInfo | None:
    from blobstate.snapshot import (
        RestoreTargetError,
        SnapshotBlobMissingError,
        SnapshotCorruptError,
        SnapshotError,
        restore_directory,
    )
    from blobstate.snapshot.restore import check_restore_target

    base = chain.base
    assert base is not None
    name = snapshot_name(layout.operator, layout.partition, base)
    index = read_checked_snapshot_index(store, name, base, chain.refs[base], chain.target)
    check_restore_target(store, working, what="checkpoint")  # a local directory inside it is refused
    working.mkdir(parents=True, exist_ok=True)
    try:
        stats = restore_directory(store, index, working)
    except SnapshotBlobMissingError as error:
        raise MissingObjectError(error.blob_id, base, chain.target, f"a blob of snapshot {name!r}") from error
    except SnapshotCorruptError as error:
        raise CorruptObjectError(error.blob_id or name, base, str(error), chain.target) from error
    except RestoreTargetError:
        raise  # the local directory is refused, not the snapshot: loading around it would not help
    except SnapshotError as error:
        raise CorruptObjectError(name, base, str(error), chain.target) from error
    # Markers are never part of a snapshot's meaning: the working store is dirty until a commit.
    for marker in (CHECKPOINT_ID_FILE, LINEAGE_INFO_FILE):
        (working / marker).unlink(missing_ok=True)
    report.bytes_downloaded += stats.bytes_downloaded
    report.snapshot_index = index
    report.snapshot_index_name = name
    return LineageInfo(base, (base.uid,), 0, 0)


def read_checked_snapshot_index(
    store: BlobStore,
    name: str,
    cid: CheckpointId,
    refs: Any,
    target: CheckpointId | None = None,
) -> Any:
    """Read the snapshot index ``name`` of ``cid``, check it against its commit's size and SHA-256
    (``refs``: the checkpoint's :class:`~blobstate.lineage.refs.PartitionObjects`), then parse it.

    Raises :class:`MissingObjectError` or :class:`CorruptObjectError` naming the index, version and uid.
    """
    from blobstate.snapshot import SnapshotError, SnapshotIndex

    if refs.snapshot is None:
        raise MissingObjectError(name, cid, target, "its commit records no snapshot of this version")
    try:
        data = store.get(name, max_bytes=refs.snapshot.size)  # a larger object is not read whole
    except BlobNotFoundError:
        raise MissingObjectError(name, cid, target) from None
    problem = refs.snapshot.problem(data)
    if problem is not None:
        raise CorruptObjectError(name, cid, problem, target)
    try:
        index = SnapshotIndex.from_json(data, name=name)
    except SnapshotError as error:
        raise CorruptObjectError(name, cid, str(error), target) from error
    if index.checkpoint_id != cid.name:
        raise CorruptObjectError(
            name, cid, f"the index says it is checkpoint {index.checkpoint_id!r}", target
        )
    return index


def _download_deltas(
    store: BlobStore,
    operator: str,
    partition: int,
    chain: Chain,
    data: dict[CheckpointId, bytes],
    report: LoadReport,
) -> Iterator[tuple[CheckpointId, OpenedDelta]]:
    """Download (in parallel) every delta of the chain and check each against the size and SHA-256 its
    commit records, before anything is applied; returns an iterator that verifies and opens them one at a
    time, in order, as they are applied (a slice of one delta's records in memory at a time, however
    long the chain and however big its deltas)."""
    todo = [cid for cid in chain.deltas if cid not in data]
    fetched = store.run_parallel(
        lambda cid: fetch_checked_delta(store, operator, partition, cid, chain.refs[cid], chain.target), todo
    )
    data.update(zip(todo, fetched, strict=True))
    raws = [(cid, data[cid]) for cid in chain.deltas]
    for _, raw in raws:
        report.bytes_downloaded += len(raw)
        report.delta_bytes += len(raw)

    def decode(cid: CheckpointId, raw: bytes) -> OpenedDelta:
        name = delta_name(operator, partition, cid)
        try:
            return open_delta(raw, name=name)
        except DeltaFormatError as error:
            raise CorruptObjectError(name, cid, error.problem, chain.target) from error

    def decoded() -> Iterator[tuple[CheckpointId, OpenedDelta]]:
        while raws:
            cid, raw = raws.pop(0)
            data.pop(cid, None)  # applied from here on: no later attempt of this load reads it again
            yield cid, decode(cid, raw)
            del raw

    return decoded()


def _next_info(chain: Chain, base_info: LineageInfo | None, report: LoadReport) -> LineageInfo:
    target = chain.target
    lineage = chain.next_lineage()
    if lineage is None:  # the base is the target's own local copy: rule 2 handles that, never here
        raise AssertionError(f"chain of {target} has no lineage")
    count, nbytes = len(chain.deltas), report.delta_bytes
    if chain.target_snapshot_bypassed:
        return LineageInfo(target, lineage, 0, 0)
    if base_info is not None:
        count += base_info.deltas_since_snapshot
        nbytes += base_info.delta_bytes_since_snapshot
    return LineageInfo(target, lineage, count, nbytes)


def _finish(
    open_store: StoreOpener,
    working: Path,
    info: LineageInfo,
    report: LoadReport,
    records: Iterable[tuple[CheckpointId, OpenedDelta]],
    started: float,
) -> Loaded:
    opened = open_store(working)
    try:
        for _cid, delta in records:
            for piece in delta.slices():
                opened.apply(piece)
                del piece  # before the next slice is made
            report.deltas_replayed += 1
            report.records_replayed += len(delta)
            del delta  # before the next delta is opened
    except BaseException:
        opened.close()
        raise
    report.seconds = time.monotonic() - started
    return Loaded(opened, info, report)
