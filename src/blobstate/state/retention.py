"""Post-commit cleanup and retention, and ``blobstate gc`` on a query checkpoint.

Every commit records ``retained_from``: the oldest version that stays restorable once its post-commit
cleanup ran (``version - min_versions_to_retain + 1``, never lower than the previous commit's). After
``commits/<v>`` exists, :func:`after_commit` runs for every partition of the commit:

1. It resolves what the retained versions ``retained_from .. v`` need to be restorable -- their deltas
   back to their bases and the base snapshots with their blobs -- with the same lineage resolution
   loading uses (:func:`blobstate.state.chain.resolve_chain`), reading the commit log for each version.
2. It removes the TTL of everything in that set (idempotent; a process-wide memo skips repeats).
3. It deletes what older versions referenced and no retained version does, oldest version first, each
   version's snapshot blobs and index before its delta. It finds those versions by walking down from the
   oldest base until a version has nothing left, so the bucket is never listed; a crash part-way leaves a
   contiguous range that the next run (after the next commit, or at start-up) picks up again.
4. Once every partition's cleanup succeeded, it prunes the commits below the commit's ``horizon``,
   oldest first (:meth:`~blobstate.lineage.commitlog.CommitLog.prune`). The horizon a commit declares
   is at most the oldest version an earlier cleanup found still needed (``RetentionStats.needed_from``:
   the oldest base any retained version loads from), so nothing at or after that commit reads a pruned
   commit, and the objects of pruned versions were deleted before their commits. A crash part-way
   leaves commits just below the horizon, which the next cleanup (or start-up and ``gc``, from their
   listing) prunes.

Objects of attempts that were never committed are never referenced and never made permanent: they stay
pending and expire. :func:`gc_checkpoint` (the ``gc`` command) first proves the commit log complete
and refuses a checkpoint whose newer commits are known lost (:mod:`blobstate.state.lost`), finishes the
newest commit's cleanup (so nothing a committed version references is still pending), and only then
expires pending objects past their TTL; with ``full`` it also lists everything and deletes
unreferenced objects that are no longer pending, never anything a retained version references.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.errors import StateError, process_ending
from blobstate.ids import CheckpointId
from blobstate.layout import METADATA, blob_prefix, delta_name, snapshot_name
from blobstate.lineage.refs import PartitionObjects
from blobstate.state.chain import LINEAGE_CACHE, Chain, resolve_chain
from blobstate.state.errors import StateLoadError
from blobstate.state.history import CommitCache, PartitionHistory, layouts
from blobstate.state.policy import validate_retention

if TYPE_CHECKING:
    from blobstate.lineage.commitlog import Commit, CommitLog, LogScan

log = logging.getLogger(__name__)


class GcRefusedError(StateError):
    """``gc`` will not delete anything: the location is not a checkpoint it can read completely."""


def retained_from(previous: Commit | None, version: int, min_versions_to_retain: int) -> int:
    """The ``retained_from`` of the commit of ``version``: the oldest version its cleanup keeps.

    ``version - min_versions_to_retain + 1`` (at least 1), never below the previous commit's, so a larger
    retention setting never claims versions that an earlier cleanup already deleted.
    """
    validate_retention(min_versions_to_retain)
    floor = previous.retained_from if previous is not None else 1
    return min(version, max(1, floor, version - min_versions_to_retain + 1))


def declared_horizon(previous: Commit | None, needed_from: int, retained: int) -> int:
    """The ``horizon`` of a new commit whose ``retained_from`` is ``retained``: the oldest version
    whose commit is still needed, as a cleanup of an earlier commit of this checkpoint found
    (``needed_from``, 0: unknown), never below the previous commit's horizon nor above ``retained``.

    Versions retained later never load from an older base than the versions retained now (a chain
    only moves to newer snapshots), so what an earlier cleanup found unneeded stays unneeded.
    """
    floor = previous.horizon if previous is not None else 1
    return max(1, min(retained, max(floor, needed_from)))


@dataclass
class RetentionStats:
    """What a cleanup did."""

    partitions: int = 0
    ttl_removed: int = 0
    ttl_pending: list[str] = field(default_factory=list)
    """Dry run: the objects of ``ttl_removed`` that still have a TTL."""
    deleted: list[str] = field(default_factory=list)
    versions_deleted: int = 0
    kept: int = 0
    seconds: float = 0.0
    needed_from: int = 0
    """The oldest version whose commit the retained versions still need (0: not computed)."""
    commits_pruned: list[int] = field(default_factory=list)
    keep_objects: frozenset[str] = frozenset()
    """One partition's cleanup: the objects it kept."""

    def add(self, other: RetentionStats) -> None:
        """Accumulate another partition's stats."""
        if other.needed_from:
            self.needed_from = min(self.needed_from or other.needed_from, other.needed_from)
        self.partitions += other.partitions
        self.ttl_removed += other.ttl_removed
        self.ttl_pending += other.ttl_pending
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
        self.floor: dict[tuple[str, str, int, int], int] = {}
        self.pruned_below: dict[str, int] = {}

    def forget(self) -> None:
        with self.lock:
            self.permanent.clear()
            self.floor.clear()
            self.pruned_below.clear()


MEMO = _Memo()


# ---------------------------------------------------------------------------------------------- reading
def snapshot_objects(
    store: BlobStore,
    history: PartitionHistory,
    cid: CheckpointId,
    refs: PartitionObjects | None = None,
    *,
    upto: int = 0,
) -> set[str]:
    """The snapshot index of ``cid`` and every blob it references.

    ``refs`` are the checkpoint's references with the snapshot's (a chain's ``refs``); by default those
    its own commit records or, for a snapshot named late, those of the first commit up to ``upto`` that
    names it. The index is checked against the size and SHA-256 its commit records before its blob list is
    believed (read through a small cache of checked indexes); an index that fails the check raises
    :class:`~blobstate.state.errors.CorruptObjectError`, a missing one
    :class:`~blobstate.state.errors.MissingObjectError`, so nothing is ever deleted on its word.
    """
    from blobstate.state.loader import read_checked_snapshot_index
    from blobstate.state.partition import SNAPSHOT_INDEX_CACHE

    name = snapshot_name(history.operator, history.partition, cid)
    index = SNAPSHOT_INDEX_CACHE.get(store.url, name)
    if index is None:
        if refs is None:
            refs = history.objects(cid)
            late = None if refs.snapshot is not None else history.late_snapshot(cid, upto)
            if late is not None:
                refs = PartitionObjects(refs.delta, late[0])
        index = read_checked_snapshot_index(store, name, cid, refs)
        SNAPSHOT_INDEX_CACHE.put(store.url, name, index)
    return {name, *index.present_blob_ids()}


def compute_keep_set(
    store: BlobStore,
    history: PartitionHistory,
    newest: CheckpointId,
    lowest: int,
    *,
    cached: bool = True,
) -> KeepSet:
    """Resolve what versions ``lowest .. newest.version`` of one partition need to stay restorable."""
    operator, partition = history.operator, history.partition
    chains: list[Chain] = []
    deltas: set[CheckpointId] = set()
    snapshots: dict[CheckpointId, PartitionObjects] = {}
    current: CheckpointId | None = newest
    oldest_base = newest.version
    while current is not None:
        chain = resolve_chain(store, operator, partition, current, history=history, cached=cached)
        chains.append(chain)
        deltas.update(chain.deltas)
        base_version = 0 if chain.base is None else chain.base.version
        oldest_base = min(oldest_base, base_version)
        if chain.base is not None:
            snapshots.setdefault(chain.base, chain.refs[chain.base])
        # A base snapshot named late (by the commit of version w) is invisible to versions from its own
        # up to w - 1: the retained ones among them load through an older base, so they need a chain too.
        gap_top = (chain.base_named_in or 0) - 1
        if base_version <= gap_top < current.version and gap_top >= lowest:
            following = gap_top
        elif base_version <= lowest:
            break
        else:
            # Retained versions below this chain's base need a chain of their own.
            following = base_version - 1
        uid = history.uid(following)
        if uid is None:
            raise StateLoadError(
                f"version {following} of {operator}/{partition} is retained but has no commit"
            )
        current = CheckpointId(following, uid)
    objects = {delta_name(operator, partition, c) for c in deltas}
    for cid, refs in snapshots.items():
        objects |= snapshot_objects(store, history, cid, refs)
    return KeepSet(frozenset(objects), frozenset(deltas), frozenset(snapshots), tuple(chains), oldest_base)


def _base_deltas(keep: KeepSet, operator: str, partition: int, lowest: int) -> set[str]:
    """The deltas of retained base versions: not needed while their snapshot is good, kept so that a
    corrupt or lost snapshot can be rebuilt from an older base (when they still exist)."""
    return {delta_name(operator, partition, c) for c in keep.snapshots if c.version >= lowest}


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


def _preview_ttls(store: BlobStore, names: Iterable[str], optional: set[str]) -> tuple[int, list[str]]:
    """What :func:`_remove_ttls` would do, changing nothing: how many objects it would make permanent (as
    it counts them) and those of them that still have a TTL. A missing required object raises as there."""
    todo = [n for n in names if (store.url, n) not in MEMO.permanent]

    def pending(name: str) -> bool | None:
        try:
            return store.has_ttl(name)
        except BlobNotFoundError:
            if name in optional:
                return None
            raise

    found = store.run_parallel(pending, todo)
    return sum(p is not None for p in found), [n for n, p in zip(todo, found, strict=True) if p]


def _present(store: BlobStore, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that exist: what :func:`_delete_all` would delete."""
    names = sorted(names)
    return [n for n, there in zip(names, store.run_parallel(store.exists, names), strict=True) if there]


def _delete_all(store: BlobStore, names: Iterable[str]) -> list[str]:
    names = sorted(names)
    done = store.run_parallel(store.delete_if_exists, names)
    with MEMO.lock:
        for n in names:
            MEMO.permanent.discard((store.url, n))
    LINEAGE_CACHE.discard(store.url, names)
    from blobstate.state.partition import SNAPSHOT_INDEX_CACHE

    SNAPSHOT_INDEX_CACHE.discard(store.url, names)
    return [n for n, d in zip(names, done, strict=True) if d]


def cleanup_partition(
    store: BlobStore, history: PartitionHistory, newest: CheckpointId, *, lowest: int, dry_run: bool = False
) -> RetentionStats:
    """Post-commit cleanup of one partition whose newest committed checkpoint is ``newest``.

    Versions ``lowest .. newest.version`` stay restorable; what only older versions reference goes.
    ``dry_run`` changes nothing and reports what the cleanup would do.
    """
    operator, partition = history.operator, history.partition
    stats = RetentionStats(partitions=1)
    keep = compute_keep_set(store, history, newest, lowest)
    stats.kept = len(keep.objects)
    stats.needed_from = max(1, keep.oldest_base)
    stats.keep_objects = keep.objects
    optional = _base_deltas(keep, operator, partition, lowest)
    if dry_run:
        stats.ttl_removed, stats.ttl_pending = _preview_ttls(store, sorted(keep.objects | optional), optional)
    else:
        stats.ttl_removed = _remove_ttls(store, sorted(keep.objects | optional), optional)
    keep_objects = keep.objects | optional

    # Versions below the oldest base are no longer needed; so is the base's own delta when the base
    # version itself is not retained.
    doomed: list[tuple[CheckpointId, bool, bool]] = []
    base = keep.oldest_base
    if 0 < base < lowest:
        base_cid = next(c for c in keep.snapshots if c.version == base)
        if store.exists(delta_name(operator, partition, base_cid)):
            doomed.append((base_cid, True, False))
    _delete_versions(store, history, base - 1, doomed, keep_objects, newest.version, stats, dry_run)
    return stats


def drop_layout_partition(
    store: BlobStore,
    history: PartitionHistory,
    last: CheckpointId,
    *,
    keep_objects: set[str] | frozenset[str],
    dry_run: bool = False,
) -> RetentionStats:
    """Delete every object of one partition of a layout no retained version uses (a rescale replaced it
    and retention moved past it): versions ``last.version`` down to the layout's first, oldest first, never
    any of ``keep_objects`` (what the retained layouts reference). Idempotent, like the cleanup."""
    stats = RetentionStats(partitions=1)
    _delete_versions(store, history, last.version, [], keep_objects, last.version, stats, dry_run)
    return stats


def _delete_versions(
    store: BlobStore,
    history: PartitionHistory,
    top: int,
    doomed: list[tuple[CheckpointId, bool, bool]],
    keep_objects: set[str] | frozenset[str],
    newest_version: int,
    stats: RetentionStats,
    dry_run: bool,
) -> None:
    """Delete the objects of versions ``top`` and below (down to the first with nothing left, or the
    partition's cleaned-below floor), oldest first, plus ``doomed``; never any of ``keep_objects``."""
    operator, partition = history.operator, history.partition
    delete = _present if dry_run else _delete_all
    key = (store.url, operator, partition, history.layout_from or 1)
    with MEMO.lock:
        floor = MEMO.floor.get(key, 0)
    version = top
    while version > floor:
        uid = history.uid(version)
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
                blobs = snapshot_objects(store, history, cid, upto=newest_version) - {sname}
            except StateLoadError as error:
                # An index that is gone or fails its check names nothing to delete; gc --full sweeps
                # whatever blobs it leaves once no retained version references them.
                log.warning("not deleting the blobs of %s: %s", sname, error)
                blobs = set()
            own = blob_prefix(operator, partition)
            stats.deleted += delete(store, {b for b in blobs - keep_objects if b.startswith(own)})
            names.append(sname)
        if has_delta:
            names.append(delta_name(operator, partition, cid))
        # The delta goes last: while it exists, the next cleanup still finds this version.
        for name in names:
            if name not in keep_objects:
                stats.deleted += delete(store, [name])
        stats.versions_deleted += 1
    if not dry_run:
        with MEMO.lock:
            MEMO.floor[key] = max(MEMO.floor.get(key, 0), top)


def _commit_log(store: BlobStore) -> CommitLog:
    from blobstate.lineage.commitlog import CommitLog

    return CommitLog(store)


def _partitions(commit: Commit) -> list[tuple[str, int, str]]:
    out = []
    for operator, parts in sorted(commit.checkpoints.items()):
        for partition, uid in sorted(parts.items()):
            out.append((operator, int(partition), uid))
    return out


def after_commit(
    store: BlobStore,
    commit: Commit,
    *,
    commit_log: CommitLog | None = None,
    listed: list[int] | None = None,
    dry_run: bool = False,
) -> RetentionStats:
    """Post-commit cleanup of every partition in ``commit`` (a :class:`blobstate.lineage.commitlog.Commit`).

    Keeps versions ``commit.retained_from .. commit.version`` restorable, then prunes the commits below
    ``commit.horizon`` (``listed``: the versions a listing of ``commits/`` found). Idempotent; safe to
    run again after a crash part-way (and at start-up, see :func:`cleanup_latest`). Raises the first
    error after trying every partition, and then prunes nothing. ``dry_run`` changes nothing (prunes
    nothing) and reports what the cleanup would do, the listed commits it would prune included.
    """
    started = time.monotonic()
    log_ = commit_log or _commit_log(store)
    cache = CommitCache(log_, {commit.version: commit})
    total = RetentionStats()
    first_error: BaseException | None = None
    found = layouts(cache, commit)
    retained = [lay for lay in found if lay.end >= commit.retained_from]
    kept: set[str] = set()
    for lay in retained:
        for operator, partition, uid in _partitions(lay.commit):
            try:
                stats = cleanup_partition(
                    store,
                    PartitionHistory(cache, operator, partition, layout_from=lay.start),
                    CheckpointId(lay.end, uid),
                    lowest=max(commit.retained_from, lay.start),
                    dry_run=dry_run,
                )
                total.add(stats)
                kept |= stats.keep_objects
            except Exception as error:
                if process_ending(error):
                    raise  # one line from the caller, not one per partition
                log.warning(
                    "cleanup of %s/%s after version %d failed: %s", operator, partition, commit.version, error
                )
                if first_error is None:
                    first_error = error
    # Layouts a rescale replaced and retention moved past: their partitions go entirely, before the
    # commits that name them are pruned.
    for lay in found[len(retained) :] if first_error is None else []:
        for operator, partition, uid in _partitions(lay.commit):
            try:
                total.add(
                    drop_layout_partition(
                        store,
                        PartitionHistory(cache, operator, partition, layout_from=lay.start),
                        CheckpointId(lay.end, uid),
                        keep_objects=kept,
                        dry_run=dry_run,
                    )
                )
            except Exception as error:
                if process_ending(error):
                    raise
                log.warning(
                    "removing %s/%s of the layout before version %d failed: %s",
                    operator,
                    partition,
                    lay.end + 1,
                    error,
                )
                if first_error is None:
                    first_error = error
    if first_error is not None:
        total.seconds = time.monotonic() - started
        raise first_error
    if not dry_run:
        total.commits_pruned = prune_commits(store, log_, commit.horizon, listed=listed)
    elif listed is not None:
        total.commits_pruned = sorted(v for v in listed if v < commit.horizon)
    total.seconds = time.monotonic() - started
    return total


def prune_commits(
    store: BlobStore, commit_log: CommitLog, horizon: int, *, listed: list[int] | None = None
) -> list[int]:
    """Delete the commits below ``horizon`` (declared by a durable commit), oldest first; ``listed``: the
    versions a listing of ``commits/`` found, else those below are found from a process-wide floor."""
    with MEMO.lock:
        floor = MEMO.pruned_below.get(store.url, 0)
    if listed is None and horizon - 1 <= floor:
        return []
    pruned = commit_log.prune(horizon, listed=listed, floor=floor)
    with MEMO.lock:
        MEMO.pruned_below[store.url] = max(MEMO.pruned_below.get(store.url, 0), horizon - 1)
    return pruned


def cleanup_latest(store: BlobStore, scan: LogScan | None = None) -> RetentionStats | None:
    """Start-up cleanup: :func:`after_commit` for the newest commit, if any, pruning every listed
    commit below its horizon. ``scan``: a :class:`~blobstate.lineage.commitlog.LogScan` already made
    (else one listing of ``commits/``); a hole in the retained window raises
    :class:`~blobstate.lineage.commitlog.IncompleteCommitLogError`."""
    log_ = _commit_log(store)
    if scan is None:
        scan = log_.scan()
    if scan.newest is None:
        return None
    return after_commit(store, scan.newest, commit_log=log_, listed=scan.versions)


# ---------------------------------------------------------------------------------------------- gc
STATE_OBJECT_RE = re.compile(r"state/([^/]+)/([0-9]+)/([0-9]+)_([0-9a-f]+)\.(delta|snapshot)")
"""Names of deltas and snapshot indexes: groups operator, partition, version, uid and kind."""

SWEEP_ATTEMPTS = 5
"""How often ``gc --full`` recomputes its mark when commits land (and cleanup deletes) while it runs."""


VANISHED = (StateLoadError, BlobNotFoundError)
"""What reading a retained version's objects raises when one is gone: a missing delta or index
(:class:`StateLoadError`), or a snapshot blob whose TTL the cleanup removes (:class:`BlobNotFoundError`)."""


def _newer_commit_landed(store: BlobStore, read: Commit) -> bool:
    """Whether the commit log (read again) has a commit newer than ``read``.

    Then the newer commit's cleanup may have deleted what a mark from ``read`` could not find, and the
    mark starts again from the newest commit; otherwise the object is retained and really missing.
    """
    return (_commit_log(store).latest_version() or 0) > read.version


@dataclass
class GcStats:
    """What ``gc`` did on a query checkpoint."""

    latest_version: int = 0
    retained_from: int = 0
    ttl_removed: int = 0
    ttl_pending: int | None = None
    """Dry run: of ``ttl_removed``, the objects that still have a TTL (None: not counted)."""
    cleanup_deleted: list[str] = field(default_factory=list)
    """Objects of versions no longer retained that the post-commit cleanup deleted."""
    commits_pruned: list[int] = field(default_factory=list)
    """Versions of the commits below the newest commit's horizon that the cleanup pruned (would prune)."""
    expired: list[str] = field(default_factory=list)
    listed: int = 0
    referenced: int = 0
    deleted: list[str] = field(default_factory=list)
    pending_kept: int = 0
    mark_attempts: int = 0
    dry_run: bool = False


def referenced_by_retained(
    store: BlobStore, commit: Commit, *, commit_log: CommitLog | None = None
) -> set[str]:
    """Every object the retained versions of ``commit`` (``retained_from .. version``) reference."""
    log_ = commit_log or _commit_log(store)
    cache = CommitCache(log_, {commit.version: commit})
    referenced: set[str] = set()
    for lay in layouts(cache, commit, down_to=commit.retained_from):
        lowest = max(commit.retained_from, lay.start)
        for operator, partition, uid in _partitions(lay.commit):
            history = PartitionHistory(cache, operator, partition, layout_from=lay.start)
            keep = compute_keep_set(store, history, CheckpointId(lay.end, uid), lowest, cached=False)
            referenced |= keep.objects | _base_deltas(keep, operator, partition, lowest)
    return referenced


def _read_checkpoint(store: BlobStore) -> tuple[CommitLog, Commit | None]:
    """The commit log and its newest commit (None: nothing committed), after proving the log complete
    and that no newer commit is known lost (:func:`blobstate.state.lost.scan_for_writing`: gc would sweep
    what a lost commit references, and what its cleanup made permanent)."""
    from blobstate.lineage.commitlog import CommitLogError
    from blobstate.state.lost import scan_for_writing

    log_ = _commit_log(store)
    try:
        log_.read_metadata()
    except BlobNotFoundError:
        from blobstate.blobstore.open import nothing_stored

        raise GcRefusedError(
            f"{store.url} is not a query checkpoint ({METADATA} is missing{nothing_stored(store)}): gc"
            " deletes nothing there"
        ) from None
    try:  # LostCommitError first, with no commit at all too: was commits/ lost?
        scan, _ = scan_for_writing(store, action="run gc on", log=log_)
    except CommitLogError as error:
        raise GcRefusedError(f"gc refuses to touch {store.url}: {error}") from error
    return log_, scan.newest


def permanent_objects_without_commits(store: BlobStore) -> list[str]:
    """State objects that were made permanent (so were once committed), in a checkpoint with no commits.

    Before the first commit, only pending objects of attempts exist; a permanent one means the commit
    log was lost.
    """
    return [name for name in store.list("state/") if _exists_permanent(store, name)]


def _exists_permanent(store: BlobStore, name: str) -> bool:
    try:
        return not store.has_ttl(name)
    except BlobNotFoundError:
        return False


def gc_checkpoint(
    store: BlobStore, *, full: bool = False, now: float | None = None, dry_run: bool = False
) -> GcStats:
    """``blobstate gc`` on a query checkpoint.

    1. Proves the commit log complete (no holes), else :class:`GcRefusedError`, and that no newer commit
       is known lost, else :class:`~blobstate.state.lost.LostCommitError`; either way nothing is touched.
    2. Finishes the newest commit's post-commit cleanup, so nothing a retained version references is
       still pending (a crash after a commit and before its cleanup leaves exactly that).
    3. Expires pending objects past their TTL (backends without native expiry).
    4. With ``full``, marks everything the retained versions reference and sweeps ``state/`` and
       ``blobs/``: unmarked objects that are no longer pending are deleted, pending ones are left to
       expire, names of versions newer than the newest commit are never touched. When commits land
       meanwhile the mark is recomputed (up to :data:`SWEEP_ATTEMPTS` times).

    ``dry_run`` changes nothing and reports what each step would do: the TTLs it would remove (and how
    many of those objects are still pending), what the cleanup, the expiry and the sweep would delete.
    """
    stats = GcStats(dry_run=dry_run)
    latest, made_permanent = _finish_cleanup(store, stats, dry_run)
    if dry_run:
        # gc expires only after the cleanup made the retained versions' objects permanent.
        stats.expired = [n for n in store.expired(now) if n not in made_permanent]
    else:
        stats.expired = list(store.expire(now))
    if full and latest is not None:
        _sweep(store, stats, dry_run)
    return stats


def _finish_cleanup(store: BlobStore, stats: GcStats, dry_run: bool) -> tuple[Commit | None, set[str]]:
    """Run the newest commit's post-commit cleanup (again); returns that commit (None: no commits) and,
    in a dry run, the pending objects it would make permanent.

    When a commit lands meanwhile, its own cleanup may delete what this one is reading: then the newer
    commit's cleanup is run instead.
    """
    last_error: Exception | None = None
    for _ in range(SWEEP_ATTEMPTS):
        log_, latest = _read_checkpoint(store)
        if latest is None:
            return None, set()
        stats.latest_version, stats.retained_from = latest.version, latest.retained_from
        try:
            listed = log_.last_scan.versions if log_.last_scan is not None else None
            done = after_commit(store, latest, commit_log=log_, listed=listed, dry_run=dry_run)
            stats.ttl_removed, stats.cleanup_deleted = done.ttl_removed, sorted(done.deleted)
            stats.commits_pruned = list(done.commits_pruned)
            if dry_run:
                stats.ttl_pending = len(done.ttl_pending)
            return latest, set(done.ttl_pending)
        except VANISHED as error:
            last_error = error
            if not _newer_commit_landed(store, latest):
                raise GcRefusedError(
                    f"gc refuses to expire anything in {store.url}: the post-commit cleanup of version "
                    f"{latest.version} cannot read what it must keep: {error}; run `blobstate verify "
                    f"{store.url}`"
                ) from error
    raise GcRefusedError(
        f"gc on {store.url} gave up after {SWEEP_ATTEMPTS} tries: commits kept landing ({last_error}); "
        "nothing was expired or deleted, run it again"
    )


def _sweep(store: BlobStore, stats: GcStats, dry_run: bool) -> None:
    last_error: Exception | None = None
    for attempt in range(1, SWEEP_ATTEMPTS + 1):
        stats.mark_attempts = attempt
        log_, latest = _read_checkpoint(store)
        if latest is None:  # the caller found a commit, and the newest commit is never pruned
            raise GcRefusedError(f"gc --full on {store.url}: the commit log is empty now; nothing was swept")
        listed = store.list("state/") + store.list("blobs/")
        try:
            referenced = referenced_by_retained(store, latest, commit_log=log_)
        except VANISHED as error:
            # A retained object is missing or unreadable. If a commit landed meanwhile, its cleanup
            # may have deleted what this (now older) mark looked for: mark again from the new commit.
            last_error = error
            if _newer_commit_landed(store, latest):
                continue
            raise GcRefusedError(
                f"gc --full refuses to sweep {store.url}: a retained version cannot be read completely: "
                f"{error}; run `blobstate verify {store.url}`"
            ) from error
        # A dry run's cleanup and expiry deleted nothing: what they would delete is reported there.
        previewed = set(stats.cleanup_deleted) | set(stats.expired) if dry_run else set()
        candidates = _unreferenced([n for n in listed if n not in previewed], referenced, latest.version)
        candidates = [n for n in candidates if not _pending(store, n, stats)]
        log_again = _commit_log(store)
        newest = log_again.latest_version()
        if newest != latest.version:
            # Objects whose TTL a newer commit's cleanup removed after the listing are marked by it.
            try:
                referenced = referenced_by_retained(
                    store, log_again.read_commit(newest), commit_log=log_again
                )
            except VANISHED as error:
                last_error = error
                continue
            candidates = _unreferenced(candidates, referenced, newest)
        stats.listed, stats.referenced = len(listed), len(referenced)
        stats.deleted = sorted(candidates) if dry_run else _delete_all(store, candidates)
        return
    raise GcRefusedError(
        f"gc --full on {store.url} gave up after {SWEEP_ATTEMPTS} marks: commits kept landing "
        f"({last_error}); nothing was deleted, run it again"
    )


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
        match = STATE_OBJECT_RE.fullmatch(name)
        if match and int(match.group(3)) > latest:
            continue  # a version not committed yet: an attempt in flight
        out.append(name)
    return out


__all__ = [
    "MEMO",
    "GcRefusedError",
    "GcStats",
    "KeepSet",
    "RetentionStats",
    "after_commit",
    "cleanup_latest",
    "cleanup_partition",
    "compute_keep_set",
    "drop_layout_partition",
    "gc_checkpoint",
    "permanent_objects_without_commits",
    "referenced_by_retained",
    "retained_from",
]
