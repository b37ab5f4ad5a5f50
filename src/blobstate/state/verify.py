"""Prove that every retained version of every partition is restorable, without restoring it.

For each partition of the newest commit and each retained version, :func:`verify` resolves the lineage
exactly as loading does, then checks every object the chain needs: deltas are downloaded and decoded in
full (format, checksum, record count), their lineage records are compared with the commit log, snapshot
indexes are read and validated, and every blob they reference must exist (and, with ``checksums=True``,
match its recorded CRC-32). Committed objects that still carry a TTL (and so would expire) are reported
too. Each problem names the object, the operator, partition, version and uid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.ids import CheckpointId, InvalidIdError
from blobstate.layout import blob_prefix, commit_name, delta_name, snapshot_name
from blobstate.lineage.delta import DeltaFormatError, decode_delta
from blobstate.state.chain import resolve_chain
from blobstate.state.errors import StateLoadError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: the object at fault and what is wrong with it."""

    object: str
    message: str
    operator: str | None = None
    partition: int | None = None
    version: int | None = None
    uid: str | None = None

    def __str__(self) -> str:
        where = []
        if self.operator is not None:
            where.append(f"operator {self.operator} partition {self.partition}")
        if self.version is not None:
            where.append(f"version {self.version}" + (f" uid {self.uid}" if self.uid else ""))
        context = f" ({', '.join(where)})" if where else ""
        return f"{self.object}: {self.message}{context}"


class _Checker:
    def __init__(
        self, store: BlobStore, operator: str, partition: int, checksums: bool, check_ttl: bool
    ) -> None:
        self.store = store
        self.operator = operator
        self.partition = partition
        self.checksums = checksums
        self.check_ttl = check_ttl
        self.problems: list[Problem] = []
        self.deltas: dict[CheckpointId, tuple[str, ...] | None] = {}
        self.snapshots: dict[CheckpointId, set[str] | None] = {}
        self.ttl_checked: set[str] = set()
        self._blobs: set[str] | None = None

    def problem(self, obj: str, message: str, cid: CheckpointId | None) -> None:
        self.problems.append(
            Problem(
                obj,
                message,
                self.operator,
                self.partition,
                None if cid is None else cid.version,
                None if cid is None else cid.uid,
            )
        )

    @property
    def blobs(self) -> set[str]:
        if self._blobs is None:
            self._blobs = set(self.store.list(blob_prefix(self.operator, self.partition)))
        return self._blobs

    def delta(self, cid: CheckpointId) -> tuple[str, ...] | None:
        """Decode a delta in full once; returns its lineage, or None if it is unusable."""
        if cid in self.deltas:
            return self.deltas[cid]
        name = delta_name(self.operator, self.partition, cid)
        lineage: tuple[str, ...] | None = None
        try:
            lineage = tuple(decode_delta(self.store.get(name), name=name).lineage)
        except BlobNotFoundError:
            self.problem(name, "missing", cid)
        except DeltaFormatError as error:
            self.problem(name, f"corrupt: {error.problem}", cid)
        self.deltas[cid] = lineage
        if lineage is not None:
            self.pending(name, cid)
        return lineage

    def snapshot(self, cid: CheckpointId) -> None:
        """Read a snapshot index once and check every blob it references."""
        if cid in self.snapshots:
            return
        from blobstate.snapshot import SnapshotError, read_snapshot_index

        name = snapshot_name(self.operator, self.partition, cid)
        self.snapshots[cid] = None
        try:
            index = read_snapshot_index(self.store, name)
        except BlobNotFoundError:
            self.problem(name, "missing", cid)
            return
        except SnapshotError as error:
            self.problem(name, f"corrupt snapshot index: {error}", cid)
            return
        if index.checkpoint_id != cid.name:
            self.problem(name, f"the index says it is checkpoint {index.checkpoint_id!r}", cid)
        self.pending(name, cid)
        referenced: set[str] = set()
        for path, f in index.iter_present_files():
            if not f.blobs:
                continue  # an empty file has no blobs
            for blob, length in f.chunks():
                referenced.add(blob.blob_id)
                if blob.blob_id not in self.blobs:
                    self.problem(
                        blob.blob_id, f"missing (chunk at {blob.offset} of file {path!r} of {name})", cid
                    )
                    continue
                self.pending(blob.blob_id, cid)
                if self.checksums:
                    self._checksum(
                        blob.blob_id, blob.checksum, length, f"chunk of file {path!r} of {name}", cid
                    )
        self.snapshots[cid] = referenced

    def _checksum(self, blob_id: str, expected: int, length: int, what: str, cid: CheckpointId) -> None:
        from blobstate.snapshot.checksum import crc32

        try:
            data = self.store.get(blob_id)
        except BlobNotFoundError:
            self.problem(blob_id, f"missing ({what})", cid)
            return
        if len(data) != length:
            self.problem(blob_id, f"corrupt: {len(data)} bytes instead of {length} ({what})", cid)
        elif crc32(data) != expected:
            self.problem(blob_id, f"corrupt: checksum {crc32(data)} instead of {expected} ({what})", cid)

    def pending(self, name: str, cid: CheckpointId) -> None:
        if not self.check_ttl or name in self.ttl_checked:
            return
        self.ttl_checked.add(name)
        try:
            if self.store.has_ttl(name):
                self.problem(
                    name, "committed but still pending: it will expire (run post-commit cleanup)", cid
                )
        except BlobNotFoundError:
            self.problem(name, "missing", cid)


def _commits(store: BlobStore) -> Any:
    from blobstate.lineage.commitlog import CommitLog

    return CommitLog(store)


def verify(
    store: BlobStore,
    *,
    min_versions_to_retain: int | None = None,
    checksums: bool = False,
    check_ttl: bool = True,
    operator: str | None = None,
    partition: int | None = None,
) -> list[Problem]:
    """Every problem that keeps a retained version of a partition from being restored (empty: all good).

    Retained versions are the newest ``min_versions_to_retain`` committed ones when given; otherwise the
    newest version and every older one whose delta or snapshot still exists (walking down until a version
    has neither: that is where retention cleaned up). ``checksums`` downloads every blob and checks it.
    """
    log_ = _commits(store)
    try:
        latest = log_.latest_version()
    except Exception as error:  # a malformed commit log is itself the problem
        return [Problem("commits/", f"cannot read the commit log: {error}")]
    if latest is None or latest < 1:
        return []
    commits: dict[int, Any] = {}
    problems: list[Problem] = []

    def commit(version: int) -> Any:
        if version not in commits:
            try:
                commits[version] = log_.read_commit(version)
            except BlobNotFoundError:
                commits[version] = None
            except Exception as error:
                problems.append(Problem(commit_name(version), f"unreadable commit: {error}", version=version))
                commits[version] = None
        return commits[version]

    newest = commit(latest)
    if newest is None:
        return problems or [Problem(commit_name(latest), "missing", version=latest)]
    for op, parts in sorted(newest.checkpoints.items()):
        if operator is not None and op != operator:
            continue
        for p in sorted(int(k) for k in parts):
            if partition is not None and p != partition:
                continue
            problems += _verify_partition(
                store, op, p, latest, commit, min_versions_to_retain, checksums, check_ttl
            )
    return problems


def _verify_partition(
    store: BlobStore,
    operator: str,
    partition: int,
    latest: int,
    commit: Callable[[int], Any],
    retain: int | None,
    checksums: bool,
    check_ttl: bool,
) -> list[Problem]:
    checker = _Checker(store, operator, partition, checksums, check_ttl)

    def uid_of(version: int) -> str | None:
        c = commit(version)
        if c is None:
            return None
        parts = c.checkpoints.get(operator) or {}
        return parts.get(partition, parts.get(str(partition)))

    lowest = 1 if retain is None else max(1, latest - retain + 1)
    for version in range(latest, lowest - 1, -1):
        uid = uid_of(version)
        if uid is None:
            if retain is not None:
                checker.problem(
                    commit_name(version), f"no checkpoint of {operator}/{partition} in the commit", None
                )
            break
        try:
            cid = CheckpointId(version, uid)
        except InvalidIdError as error:
            checker.problem(commit_name(version), f"bad checkpoint id: {error}", None)
            continue
        if retain is None and version != latest:
            present = store.exists(delta_name(operator, partition, cid)) or store.exists(
                snapshot_name(operator, partition, cid)
            )
            if not present:
                break  # cleaned up by retention: older versions are not retained
        _verify_version(checker, cid, uid_of)
    return checker.problems


def _verify_version(checker: _Checker, cid: CheckpointId, uid_of: Callable[[int], str | None]) -> None:
    try:
        chain = resolve_chain(checker.store, checker.operator, checker.partition, cid)
    except StateLoadError as error:
        checker.problem(getattr(error, "name", "?"), f"version {cid} cannot be restored: {error}", cid)
        return
    if chain.base is not None and chain.base_kind == "snapshot":
        checker.snapshot(chain.base)
    for d in chain.deltas:
        lineage = checker.delta(d)
        if lineage and d.version > 1:
            expected = uid_of(d.version - 1)
            if expected is not None and lineage[0] != expected:
                checker.problem(
                    delta_name(checker.operator, checker.partition, d),
                    f"lineage names uid {lineage[0]} for version {d.version - 1}, "
                    f"the commit log says {expected}",
                    d,
                )
