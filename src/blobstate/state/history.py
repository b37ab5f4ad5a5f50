"""One partition's committed history, read lazily from the commit log.

Loading, retention and verification need, for a version ``v`` of a partition, the uid the commit log
names and the references (size and SHA-256) it records for that checkpoint's delta and snapshot index.
:class:`PartitionHistory` answers both from ``commits/<v>.json``, reading each commit at most once.
Every checkpoint a lineage record names must be the committed one: a delta whose lineage names another
uid is refused, so a chain can never pass through an attempt that was not chosen.

A snapshot uploaded in the background is named by a later commit (``late_snapshot`` of its partition
record): :meth:`PartitionHistory.late_snapshot` finds it among the commits after its version.

A rescale starts a new partition layout at its version (``Commit.layout_from``): partition ``p`` before
it and partition ``p`` from it on are different partitions that share a number. A history made with
``layout_from`` answers only for the versions of that layout (:meth:`PartitionHistory.in_layout`); no
lineage crosses a rescale, so loading never asks for a version of another layout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blobstate.blobstore import BlobNotFoundError
from blobstate.ids import CheckpointId
from blobstate.layout import commit_name
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from blobstate.state.errors import LineageError, MissingObjectError

if TYPE_CHECKING:
    from blobstate.lineage.commitlog import Commit, CommitLog


class CommitCache:
    """The commits of one commit log read so far, by version, shared by the histories of all partitions.

    ``log`` is a :class:`blobstate.lineage.commitlog.CommitLog`; ``known`` may seed commits already read
    (version -> Commit). Thread-safe; commits are immutable, so they are kept for the life of this object
    and every commit is read at most once however many partitions ask for it.
    """

    def __init__(self, log: CommitLog, known: dict[int, Commit | None] | None = None) -> None:
        self.log = log
        self._commits: dict[int, Commit | None] = dict(known or {})
        self._lock = threading.Lock()

    def commit(self, version: int) -> Commit | None:
        """The commit of ``version``, or None when ``commits/<version>.json`` does not exist."""
        if version < 1:
            return None
        with self._lock:
            if version in self._commits:
                return self._commits[version]
        try:
            commit = self.log.read_commit(version)
        except BlobNotFoundError:
            commit = None
        with self._lock:
            self._commits[version] = commit
        return commit

    def prefetch(self, versions: Iterable[int]) -> None:
        """Read the commits of ``versions`` in parallel (those not read yet)."""
        with self._lock:
            todo = sorted({v for v in versions if v >= 1 and v not in self._commits})
        if len(todo) > 1:
            self.log.store.run_parallel(self.commit, todo)


@dataclass(frozen=True)
class Layout:
    """The versions ``start .. end`` of one partition layout, and the commit of ``end`` (which names the
    layout's partitions)."""

    start: int
    end: int
    commit: Commit


def layouts(commits: CommitCache, newest: Commit, *, down_to: int = 1) -> list[Layout]:
    """The partition layouts of the commit log, newest first: the newest commit's, then each one before a
    rescale whose last commit still exists and whose last version is at least ``down_to``."""
    found = [Layout(getattr(newest, "layout_from", 1), newest.version, newest)]
    while found[-1].start > 1:
        end = found[-1].start - 1
        if end < down_to:
            break
        commit = commits.commit(end)
        if commit is None:
            break
        found.append(Layout(getattr(commit, "layout_from", 1), end, commit))
    return found


class PartitionHistory:
    """The committed uids and object references of one (operator, partition), read through ``commits``
    (one :class:`CommitCache` per commit log, shared by the partitions of one job)."""

    def __init__(
        self, commits: CommitCache, operator: str, partition: int, *, layout_from: int | None = None
    ) -> None:
        self.commits = commits
        self.operator = operator
        self.partition = partition
        self.layout_from = layout_from
        """The layout this history answers for (None: whichever layout each version has)."""

    def in_layout(self, commit: Commit) -> bool:
        """Whether ``commit`` has this partition in this history's layout."""
        if self.layout_from is not None and getattr(commit, "layout_from", 1) != self.layout_from:
            return False
        return self.partition in commit.checkpoints.get(self.operator, {})

    def commit(self, version: int) -> Commit | None:
        """The commit of ``version``, or None when ``commits/<version>.json`` does not exist."""
        return self.commits.commit(version)

    def starts_layout(self, version: int) -> bool:
        """Whether ``version`` is a rescale: the first version of a partition layout (its partitions'
        deltas there name no lineage; their snapshot is the only base)."""
        commit = self.commit(version)
        return commit is not None and version > 1 and getattr(commit, "layout_from", 1) == version

    def prefetch(self, versions: Iterable[int]) -> None:
        """Read the commits of ``versions`` in parallel (those not read yet)."""
        self.commits.prefetch(versions)

    def uid(self, version: int) -> str | None:
        """The committed uid of this partition at ``version`` (None: no commit of that version)."""
        commit = self.commit(version)
        if commit is None or not self.in_layout(commit):
            return None
        return commit.checkpoints[self.operator][self.partition]

    def objects(self, cid: CheckpointId, *, named_by: str | None = None) -> PartitionObjects:
        """The references the commit of ``cid.version`` records for this partition's checkpoint ``cid``.

        Raises :class:`MissingObjectError` when the version has no commit and :class:`LineageError` when
        the commit names another uid (``named_by``: the object whose lineage pointed at ``cid``).
        """
        commit = self.commit(cid.version)
        name = commit_name(cid.version)
        if commit is None:
            raise MissingObjectError(name, cid, why="the commit log has no such version")
        if not self.in_layout(commit):
            raise LineageError(
                named_by or "the lineage",
                cid,
                f"version {cid.version} has no partition {self.operator}/{self.partition} of this layout "
                f"({name} has layout of version {getattr(commit, 'layout_from', 1)})",
            )
        committed = commit.checkpoints[self.operator][self.partition]
        if committed != cid.uid:
            source = named_by or "the lineage"
            raise LineageError(
                source,
                cid,
                f"it names uid {cid.uid} for version {cid.version} of {self.operator}/{self.partition}, "
                f"but {name} committed uid {committed}",
            )
        return commit.objects_of(self.operator, self.partition)

    def late_snapshot(self, cid: CheckpointId, upto: int) -> tuple[ObjectRef, int] | None:
        """The snapshot of committed checkpoint ``cid`` that a commit of versions ``cid.version + 1 ..
        upto`` names late, with the version of the first commit naming it (None: no such commit).

        A late name for the version under another uid is a :class:`LineageError` (it cannot happen
        unless the commit log was tampered with: a task only names snapshots of its own lineage).
        """
        versions = range(cid.version + 1, upto + 1)
        self.prefetch(versions)
        for version in versions:
            commit = self.commit(version)
            if commit is None:
                continue
            if getattr(commit, "layout_from", 1) > cid.version:
                return None  # a rescale since: later commits name the new layout's snapshots only
            late = commit.objects_of(self.operator, self.partition).late_snapshot
            if late is None or late.version != cid.version:
                continue
            if late.uid != cid.uid:
                raise LineageError(
                    commit_name(version),
                    cid,
                    f"it names a snapshot of uid {late.uid} for version {cid.version} of "
                    f"{self.operator}/{self.partition}, but {commit_name(cid.version)} committed "
                    f"uid {cid.uid}",
                )
            return late.index, version
        return None

    def snapshot_ref(self, cid: CheckpointId, upto: int) -> tuple[ObjectRef, int] | None:
        """The committed snapshot of ``cid`` visible to versions up to ``upto``: recorded by its own commit
        or named late by a commit up to ``upto``; with the version of the commit that records it."""
        own = self.objects(cid).snapshot
        if own is not None:
            return own, cid.version
        return self.late_snapshot(cid, upto)


__all__ = ["CommitCache", "Layout", "PartitionHistory", "layouts"]
