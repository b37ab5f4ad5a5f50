"""Resolving a checkpoint's lineage: which base and which deltas rebuild ``(v, uid)``.

The rules are docs/DESIGN.md's "Lineage" and "Load rules".

Resolution starts at the target. If the commit of the target records a snapshot, that snapshot is the
base. A snapshot of a version counts as committed when its own commit records it or, for a snapshot
uploaded in the background, when a later commit up to ``upto`` (by default the target's version) names
it late (``late_snapshot``); versions committed before the late name walk past it as before, unless the
caller read the naming commit and passes the newest durable commit as ``upto`` (a reader of an older
version), which makes the target's own late-named snapshot its base. Otherwise
the target's delta is read (and checked against the size and SHA-256 its commit records): its lineage
record names the uids of versions v-1, v-2, ... back to the newest presumed snapshot. Every uid it names
must be the one the commit log committed for that version. Walking that list newest first, the first
checkpoint available locally is the base. If none is, the presumed snapshot (the list's last entry) is
the base when its commit records one; where it does not (the snapshot upload failed) or the snapshot is
known to be unusable (``skip_snapshots``: missing or corrupt, found while loading), resolution continues
through that version's own delta lineage (docs/DESIGN.md, "Load rules", rule 3). A delta of version 1
with an empty lineage ends the walk at the empty version 0.

Only objects named ``<v>_<uid>`` for uids on the lineage are ever opened, so the files of other attempts
at the same version are never looked at. Loading, retention and verification all use this one function,
so what cleanup keeps is exactly what loading reads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Literal

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.ids import CheckpointId
from blobstate.layout import delta_name, snapshot_name
from blobstate.lineage.delta import DeltaFormatError, read_delta_lineage
from blobstate.lineage.refs import PartitionObjects
from blobstate.state.errors import CorruptObjectError, LineageError, MissingObjectError
from blobstate.state.history import PartitionHistory

BaseKind = Literal["snapshot", "local", "empty"]


@dataclass(frozen=True)
class Chain:
    """How to rebuild ``target``: start from ``base`` and replay ``deltas`` (oldest first).

    ``base`` is None for the empty version 0. ``deltas`` ends with ``target`` unless the base is the
    target itself. ``target_lineage`` is the lineage record of the target's delta when it was read
    (None when the target's own snapshot or local copy was the base). ``missing_snapshots`` lists
    presumed snapshots that were never committed (their upload failed) and were walked through.
    ``refs`` has the committed references of the base and of every delta.
    """

    target: CheckpointId
    base: CheckpointId | None
    base_kind: BaseKind
    deltas: tuple[CheckpointId, ...]
    target_lineage: tuple[str, ...] | None
    missing_snapshots: tuple[CheckpointId, ...] = ()
    refs: dict[CheckpointId, PartitionObjects] = field(default_factory=dict, compare=False)
    target_snapshot_bypassed: bool = False
    """The target's own snapshot is committed and usable but a local copy plus deltas was cheaper."""
    base_named_in: int | None = None
    """For a snapshot base: the version of the commit that records it (its own version, or the later
    commit that named it late). Versions between the base and that commit cannot use it."""

    def next_lineage(self) -> tuple[str, ...] | None:
        """The lineage record a delta built on the target carries, when resolution alone determines it."""
        if (self.base == self.target and self.base_kind == "snapshot") or self.target_snapshot_bypassed:
            return (self.target.uid,)
        if self.target_lineage is None:
            return None
        return (self.target.uid, *self.target_lineage)

    def versions(self) -> range:
        """The versions from the base (exclusive of version 0) to the target, inclusive."""
        return range(0 if self.base is None else self.base.version, self.target.version + 1)


class _LineageCache:
    """Lineage records of deltas by (store url, object name): deltas are immutable, so this is safe.

    Only retention fills it (the driver's cleanup after every commit reads the lineage of each retained
    version's delta), and retention drops the entry of every delta it deletes (:meth:`discard`), so a
    query that runs for years holds about its retained versions' deltas, not one entry per batch ever
    run; ``capacity`` bounds what several checkpoints cleaned by one process hold together.
    """

    def __init__(self, capacity: int = 50_000) -> None:
        self._items: OrderedDict[tuple[str, str], tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def get(self, url: str, name: str) -> tuple[str, ...] | None:
        with self._lock:
            value = self._items.get((url, name))
            if value is not None:
                self._items.move_to_end((url, name))
            return value

    def put(self, url: str, name: str, lineage: tuple[str, ...]) -> None:
        with self._lock:
            self._items[(url, name)] = lineage
            self._items.move_to_end((url, name))
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def discard(self, url: str, names: Iterable[str]) -> None:
        """Forget the lineage of ``names`` (deleted deltas) of the store at ``url``."""
        with self._lock:
            for name in names:
                self._items.pop((url, name), None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


LINEAGE_CACHE = _LineageCache()


def fetch_delta(
    store: BlobStore,
    operator: str,
    partition: int,
    cid: CheckpointId,
    target: CheckpointId | None = None,
    *,
    max_bytes: int | None = None,
) -> bytes:
    """The bytes of ``cid``'s delta (with ``max_bytes``, its recorded size: read no further than one byte
    past it); raises :class:`MissingObjectError` naming it, its version and uid."""
    name = delta_name(operator, partition, cid)
    try:
        return store.get(name, max_bytes=max_bytes)
    except BlobNotFoundError:
        raise MissingObjectError(name, cid, target) from None


def fetch_checked_delta(
    store: BlobStore,
    operator: str,
    partition: int,
    cid: CheckpointId,
    refs: PartitionObjects,
    target: CheckpointId | None = None,
) -> bytes:
    """The bytes of ``cid``'s delta after checking them against the size and SHA-256 its commit records."""
    data = fetch_delta(store, operator, partition, cid, target, max_bytes=refs.delta.size)
    problem = refs.delta.problem(data)
    if problem is not None:
        raise CorruptObjectError(delta_name(operator, partition, cid), cid, problem, target)
    return data


def delta_lineage(
    store: BlobStore,
    operator: str,
    partition: int,
    cid: CheckpointId,
    refs: PartitionObjects,
    *,
    target: CheckpointId | None = None,
    data_out: dict[CheckpointId, bytes] | None = None,
    cached: bool = False,
    starts_layout: bool = False,
) -> tuple[str, ...]:
    """The validated lineage record of ``cid``'s delta (whose bytes are checked against ``refs``).

    ``data_out`` receives the delta's bytes (so a loader downloads each delta once); ``cached`` uses and
    fills the process-wide lineage cache instead (retention). ``starts_layout``: ``cid`` is the version
    of a rescale, whose deltas name no lineage (any other delta above version 1 must name one).
    """
    name = delta_name(operator, partition, cid)
    lineage = LINEAGE_CACHE.get(store.url, name) if cached else None
    if lineage is None:
        data = fetch_checked_delta(store, operator, partition, cid, refs, target)
        if data_out is not None:
            data_out[cid] = data
        try:
            lineage = tuple(read_delta_lineage(data, name=name))
        except DeltaFormatError as error:
            raise CorruptObjectError(name, cid, error.problem, target) from error
        if cached:
            LINEAGE_CACHE.put(store.url, name, lineage)
    if len(lineage) > cid.version - 1:
        raise LineageError(
            name,
            cid,
            f"{len(lineage)} uids reach below version 1 (a delta of version {cid.version} can name "
            f"at most {cid.version - 1})",
        )
    if starts_layout and lineage:
        raise LineageError(name, cid, "a rescale version's delta names a lineage: it must start a new one")
    if not lineage and cid.version > 1 and not starts_layout:
        raise LineageError(name, cid, "empty lineage record at a version above 1: the chain has a gap")
    return lineage


def lineage_entries(cid: CheckpointId, lineage: tuple[str, ...]) -> list[CheckpointId]:
    """The checkpoint ids a lineage record of ``cid`` names, newest first: ``(v-1, l[0]), (v-2, l[1])``..."""
    return [CheckpointId(cid.version - 1 - i, uid) for i, uid in enumerate(lineage)]


def resolve_chain(
    store: BlobStore,
    operator: str,
    partition: int,
    target: CheckpointId,
    *,
    history: PartitionHistory,
    local_base: Callable[[CheckpointId], bool] | None = None,
    data_out: dict[CheckpointId, bytes] | None = None,
    cached: bool = False,
    skip_snapshots: Collection[CheckpointId] = (),
    local_below: Callable[[int], bool] | None = None,
    upto: int | None = None,
) -> Chain:
    """Find the base and the deltas that rebuild ``target`` (see the module docstring).

    ``history`` reads the commit log; ``local_base(cid)`` says whether a checkpoint on the lineage is
    available locally; ``skip_snapshots`` are committed snapshots not to use. ``local_below(v)`` says
    whether some local copy older than version ``v`` exists: then, at a version with a committed
    snapshot, the version's delta lineage is read first, and a local copy named on it (a replica one or
    a few versions behind) is preferred to downloading the snapshot. Snapshots named late by commits up
    to ``upto`` (default: the target's version) count as committed; ``chain.refs`` then carries their
    reference as the version's ``snapshot``. Raises
    :class:`MissingObjectError`, :class:`CorruptObjectError` or :class:`LineageError` naming the object,
    its version and uid; never falls back to an empty state.
    """
    has_local = local_base or (lambda _cid: False)
    newest_first: list[CheckpointId] = []
    missing: list[CheckpointId] = []
    refs: dict[CheckpointId, PartitionObjects] = {}
    target_lineage: tuple[str, ...] | None = None
    current = target
    named_by: str | None = None
    bypassed = False
    horizon = target.version if upto is None else max(upto, target.version)
    named_in: dict[CheckpointId, int] = {}

    def chain(base: CheckpointId | None, kind: BaseKind) -> Chain:
        return Chain(
            target,
            base,
            kind,
            tuple(reversed(newest_first)),
            target_lineage,
            tuple(missing),
            refs,
            target_snapshot_bypassed=bypassed,
            base_named_in=named_in.get(base) if kind == "snapshot" and base is not None else None,
        )

    while True:
        refs[current] = history.objects(current, named_by=named_by)
        if refs[current].snapshot is not None:
            named_in[current] = current.version
        elif current.version < horizon:
            late = history.late_snapshot(current, horizon)
            if late is not None:
                refs[current] = PartitionObjects(refs[current].delta, late[0], refs[current].late_snapshot)
                named_in[current] = late[1]
        if current != target and has_local(current):
            return chain(current, "local")
        lineage: tuple[str, ...] | None = None
        if refs[current].snapshot is not None:
            usable = current not in skip_snapshots
            if usable and not (local_below and local_below(current.version)):
                return chain(current, "snapshot")
            if usable:
                lineage = delta_lineage(
                    store,
                    operator,
                    partition,
                    current,
                    refs[current],
                    target=target,
                    data_out=data_out,
                    starts_layout=history.starts_layout(current.version),
                )
                if not any(has_local(e) for e in lineage_entries(current, lineage)):
                    return chain(current, "snapshot")
                bypassed = bypassed or current == target
        elif current != target:
            missing.append(current)
        if lineage is None:
            lineage = delta_lineage(
                store,
                operator,
                partition,
                current,
                refs[current],
                target=target,
                data_out=data_out,
                cached=cached,
                starts_layout=history.starts_layout(current.version),
            )
        if current == target:
            target_lineage = lineage
        newest_first.append(current)
        entries = lineage_entries(current, lineage)
        if not entries and current.version > 1:
            # A rescale version: its snapshot is the only base, and it was skipped or never committed.
            raise MissingObjectError(
                snapshot_name(operator, partition, current),
                current,
                target,
                why="the snapshot of a rescale version is unusable and no older version rebuilds it",
            )
        if not entries:
            return chain(None, "empty")
        named_by = delta_name(operator, partition, current)
        history.prefetch(e.version for e in entries)
        for entry in entries[:-1]:
            refs[entry] = history.objects(entry, named_by=named_by)
            if has_local(entry):
                return chain(entry, "local")
            newest_first.append(entry)
        current = entries[-1]
