"""Prove that every retained version of every partition is restorable, without restoring it.

:func:`verify` first proves the location is a checkpoint (``metadata.json`` readable) and that its commit
log is complete (a commit for every version from the newest commit's ``horizon`` to the latest;
commits below the horizon were pruned and are not missed). The retained versions are the newest
commit's ``retained_from .. latest``; a rescale in that window splits it into partition layouts, each
checked with its own partitions (and every commit of a layout must name the same ones). For each
partition and each retained version it resolves the
lineage exactly as loading does, then checks every object the version reaches:

- deltas (those the chain replays, and each retained version's own delta, which a rebuild around its
  snapshot needs) and snapshot indexes are read in full and checked against the size and SHA-256 their
  commit records; deltas are decoded in full, every uid a lineage record names must be the
  committed one, and every state variable declaration a delta writes to ``$meta`` must parse as
  readers parse it (:mod:`blobstate.stored_schema`; declarations only in a snapshot are not read);
- blobs a snapshot index references must be present with the size the index records (one listing, no
  reads); with ``checksums=True`` every blob is read and checked against its CRC-32;
- committed objects that still carry a TTL (and so would expire) are reported too, except those the
  newest commit (and, when it is a rescale, the commit before it) brought: their post-commit cleanup may
  simply not have run yet (it runs after each commit, in the background with ``async_cleanup``, and the
  next batch waits for it), which is information (``report.notes``, "cleanup pending"), not a problem;
- permanent state objects of versions above the newest commit are the evidence of lost newest commits
  (:mod:`blobstate.state.lost`): a problem per lost version unless an operator accepted the loss;
- an operator's ``key_schema`` in ``metadata.json`` must parse as the state reader parses it.

A committed snapshot that is missing or corrupt is a problem even when the version can still be rebuilt
from an older base and deltas (the problem says so). Each problem names the object and the operator,
partition, version and uid. The :class:`VerifyReport` also says what was not read.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.encoding.layout import META_CF, meta_key
from blobstate.ids import CheckpointId
from blobstate.layout import COMMITS_PREFIX, METADATA, commit_name, delta_name, snapshot_name
from blobstate.lineage.delta import DeltaFormatError, decode_delta
from blobstate.state.chain import fetch_checked_delta, resolve_chain
from blobstate.state.errors import StateLoadError
from blobstate.state.history import CommitCache, PartitionHistory, layouts

if TYPE_CHECKING:
    from blobstate.lineage.commitlog import CommitLog

DECLARATION_KEY = meta_key("")
"""The key prefix of a state variable's declaration in ``META_CF``."""


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


@dataclass
class LayoutChecked:
    """One partition layout :func:`verify` checked: its retained versions and how many partitions."""

    start: int
    """The first version checked in this layout (its rescale, or the oldest retained version)."""
    end: int
    """The last version of this layout (the newest commit's, for the current layout)."""
    partitions: int = 0
    """The partitions checked in this layout (every operator's)."""


@dataclass
class VerifyReport:
    """What :func:`verify` found and what it checked (and did not)."""

    url: str
    problems: list[Problem] = field(default_factory=list)
    latest_version: int = 0
    retained_from: int = 0
    layouts: list[LayoutChecked] = field(default_factory=list)
    """The partition layouts checked, the current one (the newest commit's) first; more than one when
    the retained versions span a rescale."""
    versions_checked: int = 0
    deltas_read: int = 0
    delta_bytes: int = 0
    indexes_read: int = 0
    index_bytes: int = 0
    blobs_checked: int = 0
    blob_bytes: int = 0
    blobs_read: bool = False
    ttl_checked: bool = True
    cleanup_pending: list[str] = field(default_factory=list)
    """Committed objects still pending because the newest commit's post-commit cleanup has not run yet."""
    cleanup_commits: list[int] = field(default_factory=list)
    """The versions of the commits whose objects may be pending (their cleanup not run yet): the newest,
    and the one before it when the newest is a rescale."""
    accepted_loss: list[str] = field(default_factory=list)
    """Notes on lost commits an operator accepted (``blobstate accept-loss``)."""

    @property
    def notes(self) -> list[str]:
        """Information that is no problem: a post-commit cleanup not run yet, an accepted loss."""
        out = list(self.accepted_loss)
        if self.cleanup_pending:
            commits = " and ".join(commit_name(v) for v in self.cleanup_commits)
            out.append(
                f"cleanup pending: {len(self.cleanup_pending)} objects {commits} references (such as "
                f"{self.cleanup_pending[0]}) still carry their pending TTL: the post-commit cleanup of the "
                "newest commit has not run yet (a running query runs it after each commit; for a stopped "
                f"one, `blobstate gc {self.url}` or the query's next start finishes it)"
            )
        return out

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong (and there was something to check)."""
        return not self.problems

    @property
    def partitions(self) -> int:
        """The partitions checked in the checkpoint's current layout (the newest commit's), never a sum
        over the layouts before a rescale."""
        return self.layouts[0].partitions if self.layouts else 0

    def _partitions_checked(self) -> str:
        """``of 2 partition(s)``; across a rescale, each layout's count and versions, the current first."""
        if len(self.layouts) <= 1:
            return f"of {self.partitions} partition(s)"
        current, *earlier = self.layouts
        before = ", ".join(
            f"{lay.partitions} partition(s) at {_versions(lay.start, lay.end)}" for lay in earlier
        )
        return (
            f"of {current.partitions} partition(s) in the current layout ("
            f"{_versions(current.start, current.end)}) and, before a rescale, {before}"
        )

    def summary(self) -> list[str]:
        """What was checked and what was not, one sentence per line."""
        if not self.latest_version:
            return [f"{self.url}: a checkpoint with no committed version yet; nothing to restore"]
        lines = [
            f"checked versions {self.retained_from}..{self.latest_version} (the retained ones) "
            f"{self._partitions_checked()}: {self.versions_checked} partition versions",
            f"read {self.deltas_read} deltas ({self.delta_bytes:,} bytes) and {self.indexes_read} snapshot "
            f"indexes ({self.index_bytes:,} bytes) in full and checked them against their commits",
        ]
        if self.blobs_read:
            lines.append(
                f"read {self.blobs_checked} blobs ({self.blob_bytes:,} bytes) and checked their CRC-32"
            )
        else:
            lines.append(
                f"checked presence and size of {self.blobs_checked} blobs ({self.blob_bytes:,} bytes) "
                "without reading them (--checksums reads them)"
            )
        if self.retained_from > 1:
            lines.append(
                f"versions below {self.retained_from} are not retained and were not checked (their "
                "commits only for presence)"
            )
        if not self.ttl_checked:
            lines.append("did not check whether committed objects are still pending")
        return lines


def _versions(start: int, end: int) -> str:
    """``versions 2..3`` or ``version 4``."""
    return f"versions {start}..{end}" if start < end else f"version {start}"


class _Checker:
    """Checks one partition's objects, each object once."""

    def __init__(
        self,
        store: BlobStore,
        report: VerifyReport,
        history: PartitionHistory,
        sizes: dict[str, int],
        checksums: bool,
        check_ttl: bool,
        fresh: frozenset[str] = frozenset(),
    ) -> None:
        self.store = store
        self.fresh = fresh
        """Deltas and snapshot indexes the newest commit(s) brought: pending until their cleanup runs."""
        self.report = report
        self.history = history
        self.operator = history.operator
        self.partition = history.partition
        self.sizes = sizes
        self.checksums = checksums
        self.check_ttl = check_ttl
        self.seen: set[str] = set()
        self.faulty: set[str] = set()

    def problem(self, obj: str, message: str, cid: CheckpointId | None) -> None:
        if obj in self.faulty:
            return  # one problem per object: versions above a bad one would repeat it
        self.faulty.add(obj)
        self.report.problems.append(
            Problem(
                obj,
                message,
                self.operator,
                self.partition,
                None if cid is None else cid.version,
                None if cid is None else cid.uid,
            )
        )

    def version(self, cid: CheckpointId) -> None:
        """Check everything version ``cid`` reaches."""
        data: dict[CheckpointId, bytes] = {}
        try:
            chain = resolve_chain(
                self.store, self.operator, self.partition, cid, history=self.history, data_out=data
            )
        except StateLoadError as error:
            self.problem(getattr(error, "name", str(cid)), _what(error), _cid_of(error, cid))
            return
        for d in chain.deltas:
            self.delta(d, chain.refs[d], data.get(d))
        if cid not in chain.deltas:
            # The version's own delta, kept beside its snapshot: what a rebuild needs if the snapshot
            # becomes unusable.
            self.delta(cid, chain.refs[cid], None)
        if chain.base is not None and chain.base_kind == "snapshot":
            fresh = snapshot_name(self.operator, self.partition, chain.base) not in self.seen
            if not self.snapshot(chain.base, chain) and fresh:
                self.repairable(cid, chain.base)

    def delta(self, cid: CheckpointId, refs: Any, data: bytes | None) -> None:
        name = delta_name(self.operator, self.partition, cid)
        if name in self.seen:
            return
        self.seen.add(name)
        if data is None:
            try:
                data = fetch_checked_delta(self.store, self.operator, self.partition, cid, refs)
            except StateLoadError as error:
                self.problem(name, _what(error), cid)
                return
        self.report.deltas_read += 1
        self.report.delta_bytes += len(data)
        try:
            delta = decode_delta(data, name=name)
        except DeltaFormatError as error:
            self.problem(name, f"corrupt: {error.problem}", cid)
            return
        self.declarations(name, cid, delta.records)
        self.pending(name, cid, fresh=name in self.fresh)

    def declarations(self, name: str, cid: CheckpointId, records: list[Any]) -> None:
        """State variable declarations the delta writes to ``$meta`` must read back as readers and a
        restarted query read them (:mod:`blobstate.stored_schema`)."""
        written = [
            (k, v)
            for _, cf, k, v in records
            if cf == META_CF and v is not None and k.startswith(DECLARATION_KEY)
        ]
        if not written:
            return
        from blobstate.stored_schema import StoredSchemaError, parse_declaration

        for key, value in written:
            variable = key[len(DECLARATION_KEY) :].decode("utf-8", "backslashreplace")
            try:
                parse_declaration(value, where=f"state variable {variable!r} written to $meta")
            except StoredSchemaError as error:
                self.problem(name, str(error), cid)
                return

    def snapshot(self, cid: CheckpointId, chain: Any) -> bool:
        """Check a snapshot index and its blobs; whether they are all good."""
        from blobstate.state.loader import read_checked_snapshot_index

        name = snapshot_name(self.operator, self.partition, cid)
        if name in self.seen:
            return name not in self.faulty
        self.seen.add(name)
        try:
            index = read_checked_snapshot_index(self.store, name, cid, chain.refs[cid])
        except StateLoadError as error:
            self.problem(name, _what(error), cid)
            return False
        self.report.indexes_read += 1
        self.report.index_bytes += chain.refs[cid].snapshot.size
        fresh = name in self.fresh
        self.pending(name, cid, fresh=fresh)
        good = True
        for path, f in index.iter_present_files():
            for blob, length in f.chunks():
                good &= self.blob(
                    blob.blob_id, blob.checksum, length, f"chunk of file {path!r} of {name}", cid, fresh
                )
        if not good:
            self.faulty.add(name)
        return good

    def blob(
        self, blob_id: str, checksum: int, length: int, what: str, cid: CheckpointId, fresh: bool = False
    ) -> bool:
        if blob_id in self.seen:
            return blob_id not in self.faulty
        self.seen.add(blob_id)
        size = self.sizes.get(blob_id)
        if size is None:
            self.problem(blob_id, f"missing ({what})", cid)
            return False
        if size != length:
            self.problem(blob_id, f"corrupt: {size} bytes where the index records {length} ({what})", cid)
            return False
        self.report.blobs_checked += 1
        self.report.blob_bytes += size
        if self.checksums:
            from blobstate.snapshot.checksum import crc32

            try:
                data = self.store.get(blob_id)
            except BlobNotFoundError:
                self.problem(blob_id, f"missing ({what})", cid)
                return False
            if len(data) != length or crc32(data) != checksum:
                self.problem(
                    blob_id,
                    f"corrupt: {len(data)} bytes with CRC-32 {crc32(data)} where the index records "
                    f"{length} bytes with CRC-32 {checksum} ({what})",
                    cid,
                )
                return False
        self.pending(blob_id, cid, fresh=fresh)
        return True

    def repairable(self, cid: CheckpointId, bad: CheckpointId) -> None:
        """Say on the unusable snapshot ``bad``'s problems whether ``cid`` can be rebuilt without it."""
        try:
            resolve_chain(
                self.store, self.operator, self.partition, cid, history=self.history, skip_snapshots=[bad]
            )
            how = "loading rebuilds it from an older base and deltas"
        except StateLoadError:
            how = "no older base and deltas remain to rebuild it: it cannot be restored"
        problems = self.report.problems
        for i in range(len(problems) - 1, -1, -1):
            problem = problems[i]
            if problem.version != bad.version or problem.operator != self.operator:
                break
            problems[i] = Problem(
                problem.object,
                f"{problem.message}; snapshot {bad.name} is unusable (version {cid.version}: {how})",
                problem.operator,
                problem.partition,
                problem.version,
                problem.uid,
            )

    def pending(self, name: str, cid: CheckpointId, *, fresh: bool = False) -> None:
        """A committed object must not carry a TTL, unless the newest commit(s) brought it (``fresh``):
        then its post-commit cleanup may not have run yet, which is information."""
        if not self.check_ttl:
            return
        try:
            if self.store.has_ttl(name):
                if fresh:
                    self.report.cleanup_pending.append(name)
                    return
                self.problem(
                    name,
                    "committed but still pending: it will expire; the post-commit cleanup of a newer "
                    f"commit should have made it permanent (did a cleanup fail?): run `blobstate gc "
                    f"{self.store.url}` to finish post-commit cleanup",
                    cid,
                )
        except BlobNotFoundError:
            self.problem(name, "missing", cid)


def _what(error: StateLoadError) -> str:
    problem = getattr(error, "problem", None)
    if problem:
        return f"corrupt: {problem}"
    text = str(error)
    return "missing" if text.startswith("missing object") else text


def _cid_of(error: StateLoadError, default: CheckpointId) -> CheckpointId:
    cid = getattr(error, "checkpoint_id", None)
    return cid if isinstance(cid, CheckpointId) else default


def _lost_newer_commits(store: BlobStore, scan: Any, report: VerifyReport, log: CommitLog) -> None:
    """Permanent state objects of versions above the newest commit: newer commits were lost (a problem
    per version), unless an operator accepted their loss (a note). :mod:`blobstate.state.lost` finds
    them, as every command that writes does before it refuses such a checkpoint."""
    from blobstate.state.lost import scan_for_loss

    found = scan_for_loss(store, scan, log=log)
    report.accepted_loss += found.notes()
    if found.lost and not found.newest:
        report.problems.append(
            Problem(
                COMMITS_PREFIX,
                f"no commits, but {found.evidence()} (was commits/ lost?); {found.way_out()}",
            )
        )
        return
    first: dict[int, str] = {}
    for attempt in sorted(found.lost):
        first.setdefault(attempt.version, attempt.name)
    for version, name in sorted(first.items()):
        report.problems.append(
            Problem(
                commit_name(version),
                f"missing: {name} of version {version} was committed, but the commit log ends at "
                f"version {found.newest} (newer commits were lost); {found.way_out()}",
                version=version,
            )
        )


def _fresh_objects(cache: CommitCache, newest: Any, report: VerifyReport) -> frozenset[str]:
    """The deltas and snapshot indexes the newest commit brought (its own and the snapshots it names
    late), and, when it is a rescale, those of the commit before it: the objects whose post-commit
    cleanup may not have run yet (their commits' versions go to ``report.cleanup_commits``)."""
    commits = [newest]
    if newest.rescaled:
        with contextlib.suppress(Exception):  # an unreadable commit is reported on its own
            before = cache.commit(newest.version - 1)
            if before is not None:
                commits.append(before)
    names: set[str] = set()
    report.cleanup_commits = sorted(c.version for c in commits)
    for commit in commits:
        for op, parts in commit.objects.items():
            for p, refs in parts.items():
                cid = CheckpointId(commit.version, commit.checkpoints[op][p])
                names.add(delta_name(op, p, cid))
                if refs.snapshot is not None:
                    names.add(snapshot_name(op, p, cid))
                if refs.late_snapshot is not None:
                    late = CheckpointId(refs.late_snapshot.version, refs.late_snapshot.uid)
                    names.add(snapshot_name(op, p, late))
    return frozenset(names)


def _commits(store: BlobStore) -> Any:
    from blobstate.lineage.commitlog import CommitLog

    return CommitLog(store)


def _key_schemas(store: BlobStore, operators: dict[str, Any], report: VerifyReport) -> None:
    """An operator's ``key_schema`` must parse as the state reader parses it."""
    recorded = {op: spec["key_schema"] for op, spec in operators.items() if "key_schema" in spec}
    if not recorded:
        return
    from blobstate.stored_schema import StoredSchemaError, parse_stored_schema

    for op, value in sorted(recorded.items()):
        try:
            parse_stored_schema(value, where=f"key_schema of operator {op} in {METADATA} of {store.url}")
        except StoredSchemaError as error:
            report.problems.append(Problem(METADATA, str(error)))


def verify(
    store: BlobStore,
    *,
    checksums: bool = False,
    check_ttl: bool = True,
    operator: str | None = None,
    partition: int | None = None,
    commit_log: CommitLog | None = None,
) -> VerifyReport:
    """Check that every retained version of every partition (or of one) is restorable.

    ``report.problems`` is empty only when every object a retained version reaches was checked and is
    good; a location that is not a checkpoint, a commit log with holes or an unreadable commit are
    problems too. ``checksums`` also downloads every blob and checks its CRC-32. ``commit_log``: the
    log to read through (with its assumed acceptances), else a new one.
    """
    from blobstate.lineage.commitlog import CommitLogError

    report = VerifyReport(store.url, blobs_read=checksums, ttl_checked=check_ttl)
    log_ = commit_log if commit_log is not None else _commits(store)
    try:
        metadata = log_.read_metadata()
    except BlobNotFoundError:
        from blobstate.blobstore.open import nothing_stored

        report.problems.append(
            Problem(
                METADATA, f"missing: {store.url} is not a blobstate query checkpoint{nothing_stored(store)}"
            )
        )
        return report
    except CommitLogError as error:
        report.problems.append(Problem(METADATA, f"unreadable: {error}"))
        return report
    _key_schemas(store, metadata.operators, report)
    from blobstate.lineage.commitlog import LogScan

    versions = log_.versions()
    present = set(versions)
    if not versions:
        _lost_newer_commits(store, LogScan([], None), report, log_)  # was commits/ lost?
        return report
    latest = versions[-1]
    try:
        newest = log_.read_commit(latest)
    except CommitLogError as error:
        report.problems.append(Problem(commit_name(latest), f"unreadable: {error}", version=latest))
        return report
    report.latest_version, report.retained_from = latest, newest.retained_from
    # Commits below the newest commit's horizon were pruned (or are about to be); one missing from the
    # horizon up is a hole.
    for missing in (v for v in range(newest.horizon, latest + 1) if v not in present):
        report.problems.append(
            Problem(
                commit_name(missing),
                f"missing: a hole in the commit log (the retained window is {newest.horizon}..{latest})",
                version=missing,
            )
        )
    cache = CommitCache(log_, {latest: newest})
    with contextlib.suppress(CommitLogError):  # each unreadable commit is reported below
        cache.prefetch(range(newest.retained_from, latest))
    for version in range(newest.retained_from, latest):
        if version in present:
            try:
                cache.commit(version)
            except CommitLogError as error:
                report.problems.append(Problem(commit_name(version), f"unreadable: {error}", version=version))
    _lost_newer_commits(store, LogScan(versions, newest), report, log_)
    if report.problems:
        return report
    fresh = _fresh_objects(cache, newest, report)
    sizes = store.list_sizes("blobs/")
    # Each partition layout in the retained window (a rescale starts a new one) is checked with its own
    # partitions: versions before a rescale with the old ones, from it on with the new ones.
    for lay in layouts(cache, newest, down_to=newest.retained_from):
        _check_layout(store, report, cache, lay, newest.retained_from)
        checked = LayoutChecked(max(lay.start, newest.retained_from), lay.end)
        report.layouts.append(checked)
        for op, parts in sorted(lay.commit.checkpoints.items()):
            if operator is not None and op != operator:
                continue
            for p in sorted(parts):
                if partition is not None and p != partition:
                    continue
                checked.partitions += 1
                history = PartitionHistory(cache, op, p, layout_from=lay.start)
                checker = _Checker(store, report, history, sizes, checksums, check_ttl, fresh)
                for version in range(lay.end, max(lay.start, newest.retained_from) - 1, -1):
                    report.versions_checked += 1
                    uid = history.uid(version)
                    if uid is None:  # the commit was read above; only a lost one has no uid
                        report.problems.append(
                            Problem(commit_name(version), f"is missing: {op}/{p} has no uid", version=version)
                        )
                        break
                    checker.version(CheckpointId(version, uid))
    return report


def _check_layout(store: BlobStore, report: VerifyReport, cache: CommitCache, lay: Any, lowest: int) -> None:
    """Every retained commit of a layout names that layout (and the same partitions as its last one)."""
    expected = {op: sorted(parts) for op, parts in lay.commit.checkpoints.items()}
    for version in range(max(lay.start, lowest), lay.end):
        commit = cache.commit(version)
        if commit is None:
            continue
        found = {op: sorted(parts) for op, parts in commit.checkpoints.items()}
        if getattr(commit, "layout_from", 1) != lay.start or found != expected:
            report.problems.append(
                Problem(
                    commit_name(version),
                    f"names partition layout of version {getattr(commit, 'layout_from', 1)} with "
                    f"{sum(map(len, found.values()))} partitions, but versions {lay.start}..{lay.end} have "
                    f"the layout of version {lay.start} with {sum(map(len, expected.values()))} "
                    f"(in {store.url})",
                    version=version,
                )
            )


__all__ = ["LayoutChecked", "Problem", "VerifyReport", "verify"]
