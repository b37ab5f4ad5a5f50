"""Post-commit cleanup and retention, and the full mark-and-sweep ``gc --full``.

After ``commits/<v>`` exists, :func:`after_commit` runs for every partition of the commit:

1. It resolves what the retained versions ``v-R+1 .. v`` (R = ``min_versions_to_retain``) need to be
   restorable -- their deltas back to their bases and the base snapshots with their blobs -- with the same
   lineage resolution loading uses (:func:`blobstate.state.chain.resolve_chain`).
2. It removes the TTL of everything in that set (idempotent; a process-wide memo skips repeats).
3. It deletes what older versions referenced and no retained version does, oldest version first, each
   version's snapshot blobs and index before its delta. It finds those versions by walking down from the
   oldest base until a version has nothing left, so the bucket is never listed; a crash part-way leaves a
   contiguous range that the next run (after the next commit, or at start-up) picks up again.

Objects of attempts that were never committed are never referenced and never made permanent: they stay
pending and expire. :func:`gc_full` lists everything instead and deletes unreferenced objects that are no
longer pending (plus expired ones), never anything a retained version references.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.ids import CheckpointId
from blobstate.layout import delta_name, snapshot_name
from blobstate.state.chain import Chain, resolve_chain
from blobstate.state.policy import DEFAULT_MIN_VERSIONS_TO_RETAIN, validate_retention

log = logging.getLogger(__name__)

UidOf = Callable[[int], "str | None"]
"""The committed uid of a partition at a version (None when that version has no commit)."""


@dataclass
class RetentionStats:
    """What a cleanup did."""

    partitions: int = 0
    ttl_removed: int = 0
    deleted: list[str] = field(default_factory=list)
    versions_deleted: int = 0
    kept: int = 0
    seconds: float = 0.0

    def add(self, other: RetentionStats) -> None:
        """Accumulate another partition's stats."""
        self.partitions += other.partitions
        self.ttl_removed += other.ttl_removed
        self.deleted += other.deleted
        self.versions_deleted += other.versions_deleted
        self.kept += other.kept


@dataclass(frozen=True)
class KeepSet:
    """Everything the retained versions of one partition reference."""

    objects: frozenset[str]
    deltas: frozenset[CheckpointId]
    snapshots: frozenset[CheckpointId]
    chains: tuple[Chain, ...]
    oldest_base: int
    """Version of the oldest base any retained version needs (0: the empty version 0)."""


class _Memo:
    """Process-wide memory: objects already made permanent, and per-partition cleaned-below floors."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.permanent: set[tuple[str, str]] = set()
        self.floor: dict[tuple[str, str, int], int] = {}

    def forget(self) -> None:
        with self.lock:
            self.permanent.clear()
            self.floor.clear()


MEMO = _Memo()


# ---------------------------------------------------------------------------------------------- reading
def snapshot_objects(store: BlobStore, name: str) -> set[str]:
    """The snapshot index ``name`` and every blob it references (read through a small cache)."""
    from blobstate.state.partition import SNAPSHOT_INDEX_CACHE

    index = SNAPSHOT_INDEX_CACHE.get(store.url, name)
    if index is None:
        from blobstate.snapshot import read_snapshot_index

        index = read_snapshot_index(store, name)
        SNAPSHOT_INDEX_CACHE.put(store.url, name, index)
    return {name, *index.present_blob_ids()}


def compute_keep_set(
    store: BlobStore,
    operator: str,
    partition: int,
    newest: CheckpointId,
    min_versions_to_retain: int,
    uid_of: UidOf,
    *,
    cached: bool = True,
) -> KeepSet:
    """Resolve what versions ``newest.version - R + 1 .. newest.version`` need to stay restorable."""
    lowest = max(1, newest.version - min_versions_to_retain + 1)
    chains: list[Chain] = []
    deltas: set[CheckpointId] = set()
    snapshots: set[CheckpointId] = set()
    current: CheckpointId | None = newest
    oldest_base = newest.version
    while current is not None:
        chain = resolve_chain(store, operator, partition, current, cached=cached)
        chains.append(chain)
        deltas.update(chain.deltas)
        base_version = 0 if chain.base is None else chain.base.version
        oldest_base = base_version
        if chain.base is not None:
            snapshots.add(chain.base)
        if base_version <= lowest:
            break
        # Retained versions below this chain's base need a chain of their own.
        uid = uid_of(base_version - 1)
        current = None if uid is None else CheckpointId(base_version - 1, uid)
    objects = {delta_name(operator, partition, c) for c in deltas}
    for cid in snapshots:
        objects |= snapshot_objects(store, snapshot_name(operator, partition, cid))
    return KeepSet(frozenset(objects), frozenset(deltas), frozenset(snapshots), tuple(chains), oldest_base)


# ---------------------------------------------------------------------------------------------- cleanup
def _remove_ttls(store: BlobStore, names: Iterable[str], optional: set[str]) -> int:
    todo = [n for n in names if (store.url, n) not in MEMO.permanent]

    def remove(name: str) -> int:
        try:
            store.remove_ttl(name)
        except BlobNotFoundError:
            if name in optional:
                return 0
            raise
        with MEMO.lock:
            MEMO.permanent.add((store.url, name))
        return 1

    return sum(store.run_parallel(remove, todo))


def _delete_all(store: BlobStore, names: Iterable[str]) -> list[str]:
    names = sorted(names)
    done = store.run_parallel(store.delete_if_exists, names)
    with MEMO.lock:
        for n in names:
            MEMO.permanent.discard((store.url, n))
    return [n for n, d in zip(names, done, strict=True) if d]


def cleanup_partition(
    store: BlobStore,
    operator: str,
    partition: int,
    newest: CheckpointId,
    *,
    min_versions_to_retain: int = DEFAULT_MIN_VERSIONS_TO_RETAIN,
    uid_of: UidOf,
) -> RetentionStats:
    """Post-commit cleanup of one partition whose newest committed checkpoint is ``newest``."""
    validate_retention(min_versions_to_retain)
    stats = RetentionStats(partitions=1)
    keep = compute_keep_set(store, operator, partition, newest, min_versions_to_retain, uid_of)
    stats.kept = len(keep.objects)
    lowest = max(1, newest.version - min_versions_to_retain + 1)
    # The delta of a retained base version is "its delta": keep it permanent when it still exists.
    optional = {delta_name(operator, partition, c) for c in keep.snapshots if c.version >= lowest}
    stats.ttl_removed = _remove_ttls(store, sorted(keep.objects | optional), optional)
    keep_objects = keep.objects | optional

    # Versions below the oldest base are no longer needed; so is the base's own delta when the base
    # version itself is not retained.
    key = (store.url, operator, partition)
    with MEMO.lock:
        floor = MEMO.floor.get(key, 0)
    doomed: list[tuple[CheckpointId, bool, bool]] = []
    base = keep.oldest_base
    if 0 < base < lowest:
        base_cid = next(c for c in keep.snapshots if c.version == base)
        if store.exists(delta_name(operator, partition, base_cid)):
            doomed.append((base_cid, True, False))
    version = base - 1
    while version > floor:
        uid = uid_of(version)
        if uid is None:
            break
        cid = CheckpointId(version, uid)
        has_delta = store.exists(delta_name(operator, partition, cid))
        has_snapshot = store.exists(snapshot_name(operator, partition, cid))
        if not has_delta and not has_snapshot:
            break
        doomed.append((cid, has_delta, has_snapshot))
        version -= 1
    for cid, has_delta, has_snapshot in sorted(doomed):
        names: list[str] = []
        if has_snapshot:
            sname = snapshot_name(operator, partition, cid)
            try:
                blobs = snapshot_objects(store, sname) - {sname}
            except BlobNotFoundError:
                blobs = set()
            stats.deleted += _delete_all(store, blobs - keep_objects)
            names.append(sname)
        if has_delta:
            names.append(delta_name(operator, partition, cid))
        # The delta goes last: while it exists, the next cleanup still finds this version.
        for name in names:
            if name not in keep_objects:
                stats.deleted += _delete_all(store, [name])
        stats.versions_deleted += 1
    with MEMO.lock:
        MEMO.floor[key] = max(MEMO.floor.get(key, 0), base - 1)
    return stats


def _commit_log(store: BlobStore) -> Any:
    from blobstate.lineage.commitlog import CommitLog

    return CommitLog(store)


def _uid_reader(log_: Any, operator: str, partition: int, known: dict[int, Any]) -> UidOf:
    def uid_of(version: int) -> str | None:
        if version < 1:
            return None
        if version not in known:
            try:
                known[version] = log_.read_commit(version)
            except BlobNotFoundError:
                known[version] = None
        commit = known[version]
        if commit is None:
            return None
        parts = commit.checkpoints.get(operator) or {}
        uid = parts.get(partition, parts.get(str(partition)))
        return uid

    return uid_of


def _partitions(commit: Any) -> list[tuple[str, int, str]]:
    out = []
    for operator, parts in sorted(commit.checkpoints.items()):
        for partition, uid in sorted(parts.items(), key=lambda kv: int(kv[0])):
            out.append((operator, int(partition), uid))
    return out


def after_commit(
    store: BlobStore,
    commit: Any,
    *,
    min_versions_to_retain: int = DEFAULT_MIN_VERSIONS_TO_RETAIN,
    commit_log: Any = None,
) -> RetentionStats:
    """Post-commit cleanup of every partition in ``commit`` (a :class:`blobstate.lineage.commitlog.Commit`).

    Idempotent; safe to run again after a crash part-way (and at start-up, see :func:`cleanup_latest`).
    Raises the first error after trying every partition.
    """
    started = time.monotonic()
    validate_retention(min_versions_to_retain)
    log_ = commit_log or _commit_log(store)
    known: dict[int, Any] = {commit.version: commit}
    total = RetentionStats()
    first_error: BaseException | None = None
    for operator, partition, uid in _partitions(commit):
        try:
            stats = cleanup_partition(
                store,
                operator,
                partition,
                CheckpointId(commit.version, uid),
                min_versions_to_retain=min_versions_to_retain,
                uid_of=_uid_reader(log_, operator, partition, known),
            )
            total.add(stats)
        except Exception as error:
            log.warning(
                "cleanup of %s/%s after version %d failed: %s", operator, partition, commit.version, error
            )
            if first_error is None:
                first_error = error
    total.seconds = time.monotonic() - started
    if first_error is not None:
        raise first_error
    return total


def cleanup_latest(
    store: BlobStore, *, min_versions_to_retain: int = DEFAULT_MIN_VERSIONS_TO_RETAIN
) -> RetentionStats | None:
    """Start-up cleanup: :func:`after_commit` for the newest commit, if any."""
    log_ = _commit_log(store)
    latest = log_.latest_version()
    if not latest:
        return None
    commit = log_.read_commit(latest)
    return after_commit(store, commit, min_versions_to_retain=min_versions_to_retain, commit_log=log_)


# ---------------------------------------------------------------------------------------------- gc --full
_STATE_RE = re.compile(r"state/([^/]+)/([0-9]+)/([0-9]+)_([0-9a-f]+)\.(delta|snapshot)")


@dataclass
class GcStats:
    """What ``gc --full`` did."""

    listed: int = 0
    referenced: int = 0
    expired: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    pending_kept: int = 0


def _still_present(store: BlobStore, operator: str, partition: int, latest: int, uid_of: UidOf) -> int:
    """How many versions down from ``latest`` still have a delta or a snapshot of this partition."""
    count = 0
    for version in range(latest, 0, -1):
        uid = uid_of(version)
        if uid is None:
            break
        cid = CheckpointId(version, uid)
        if version != latest and not (
            store.exists(delta_name(operator, partition, cid))
            or store.exists(snapshot_name(operator, partition, cid))
        ):
            break
        count += 1
    return max(1, count)


def referenced_by_retained(
    store: BlobStore, *, min_versions_to_retain: int | None = None
) -> tuple[int, set[str]]:
    """The newest committed version and every object its retained versions reference (all partitions).

    With ``min_versions_to_retain`` None, every committed version not yet cleaned up counts as retained
    (each partition's versions from the newest down to the first one with neither delta nor snapshot).
    """
    log_ = _commit_log(store)
    latest = log_.latest_version()
    if not latest:
        return 0, set()
    commit = log_.read_commit(latest)
    known: dict[int, Any] = {latest: commit}
    referenced: set[str] = set()
    for operator, partition, uid in _partitions(commit):
        uid_of = _uid_reader(log_, operator, partition, known)
        retain = min_versions_to_retain or _still_present(store, operator, partition, latest, uid_of)
        keep = compute_keep_set(
            store, operator, partition, CheckpointId(latest, uid), retain, uid_of, cached=False
        )
        referenced |= keep.objects
        lowest = max(1, latest - retain + 1)
        referenced |= {delta_name(operator, partition, c) for c in keep.snapshots if c.version >= lowest}
    return latest, referenced


def gc_full(
    store: BlobStore,
    *,
    min_versions_to_retain: int | None = None,
    now: float | None = None,
    dry_run: bool = False,
) -> GcStats:
    """Mark and sweep: delete unreferenced objects under ``state/`` and ``blobs/`` that are not pending.

    Marks everything a retained version of any partition references; lists ``state/`` and ``blobs/``;
    an unmarked object whose TTL was removed (it was once committed and is now unreferenced) is deleted,
    an unmarked pending object is left to expire, except that pending objects past their TTL are expired
    now (``store.expire(now)``). The mark is recomputed if a commit lands meanwhile. Marked objects are
    never deleted. Names of versions newer than the newest commit are never touched. With
    ``min_versions_to_retain`` None (the default) every version not yet cleaned up is retained.
    """
    if min_versions_to_retain is not None:
        validate_retention(min_versions_to_retain)
    stats = GcStats()
    if not dry_run:
        stats.expired = list(store.expire(now))
    listed = store.list("state/") + store.list("blobs/")
    stats.listed = len(listed)
    latest, referenced = referenced_by_retained(store, min_versions_to_retain=min_versions_to_retain)
    candidates = _unreferenced(listed, referenced, latest)
    candidates = [n for n in candidates if not _pending(store, n, stats)]
    again, referenced = referenced_by_retained(store, min_versions_to_retain=min_versions_to_retain)
    if again != latest:  # a commit landed meanwhile: only what is unreferenced by both marks goes
        candidates = _unreferenced(candidates, referenced, again)
    stats.referenced = len(referenced)
    if not dry_run:
        stats.deleted = _delete_all(store, candidates)
    else:
        stats.deleted = sorted(candidates)
    return stats


def _pending(store: BlobStore, name: str, stats: GcStats) -> bool:
    try:
        pending = store.has_ttl(name)
    except BlobNotFoundError:
        return True  # gone already: nothing to do
    if pending:
        stats.pending_kept += 1
    return pending


def _unreferenced(names: Iterable[str], referenced: set[str], latest: int) -> list[str]:
    out = []
    for name in names:
        if name in referenced:
            continue
        match = _STATE_RE.fullmatch(name)
        if match and int(match.group(3)) > latest:
            continue  # a version not committed yet: an attempt in flight
        out.append(name)
    return out


__all__ = [
    "MEMO",
    "GcStats",
    "KeepSet",
    "RetentionStats",
    "after_commit",
    "cleanup_latest",
    "cleanup_partition",
    "compute_keep_set",
    "gc_full",
    "referenced_by_retained",
]
