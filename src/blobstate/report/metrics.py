"""The commit log as a table of per-batch metrics: one :class:`BatchMetrics` per committed version.

Every ``commits/<v>.json`` carries the batch's metrics (``metrics``: batch seconds, per-partition rows,
upload and restore figures, standby figures; see ``docs/FORMATS.md``) and, always, which partitions took
a snapshot and the size of every delta (``objects``). :func:`batch_metrics` reads them from parsed
commits and nothing else, so it is pure and testable without Spark; :func:`load_batch_metrics` reads the
commits (and, optionally, the snapshot indexes for the state's size on disk) from a blob store.

``metrics`` is free-form JSON: a figure a commit does not carry (written before that metric existed, or
by another writer) is ``None`` here, never 0, so tables print "-" and plots leave a gap.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from blobstate.lineage.commitlog import Commit, QueryMetadata

_T = TypeVar("_T")
_R = TypeVar("_R")

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called as commits and snapshot indexes are read."""

STAGE_SPLIT = ("stage_seconds", "sink_seconds", "commit_seconds")
"""Driver-side parts of a batch's seconds, plotted when a commit's ``metrics`` carries them."""


def _number(raw: Mapping[str, Any] | None, key: str) -> float | None:
    """``raw[key]`` when it is a number (not a bool), else None: metrics are free-form JSON."""
    if not isinstance(raw, Mapping):
        return None
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _integer(raw: Mapping[str, Any] | None, key: str) -> int | None:
    value = _number(raw, key)
    return None if value is None else int(value)


def _total(values: Iterable[float | None]) -> float | None:
    """The sum of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _maximum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class Replica:
    """A replica of a partition as its commit's ``placement`` records it: where it is kept, and the last
    version the driver knew it at (None: not recorded)."""

    executor_id: str
    host: str
    version: int | None = None


@dataclass(frozen=True)
class PartitionMetrics:
    """One partition's figures at one version (``metrics.partitions[p]`` and the commit's ``objects``)."""

    partition: int
    snapshot: bool
    """Whether this version's state of the partition was snapshotted: recorded by the version's own
    commit, or (uploaded in the background) named late by a later commit among those read."""
    delta_bytes: int
    """Size of the partition's delta(s) at this version, from the commit's references (always known)."""
    input_rows: int | None = None
    output_rows: int | None = None
    bytes_uploaded: int | None = None
    restore_seconds: float | None = None
    """Seconds the task spent loading the partition's state (``load_seconds``)."""
    restore_bytes: int | None = None
    load_rule: str | None = None
    state_keys: int | None = None
    """RocksDB's estimate of the partition's keys after the batch: the query's own state, without its
    side stores' keys where the commit records them apart (:attr:`adjunct_keys`); with them before."""
    adjunct_keys: int | None = None
    """RocksDB's estimate of the keys of the partition's side (adjunct) stores after the batch; None in
    commits that did not record them apart."""
    state_bytes: int | None = None
    """Size of the partition's RocksDB files (its partitioned side stores' included), known at versions
    with a readable snapshot index."""
    task_seconds: float | None = None
    process_seconds: float | None = None
    commit_seconds: float | None = None
    executor_id: str | None = None
    host: str | None = None
    """Where the partition ran (its active executor and host)."""
    standbys: tuple[Replica, ...] = ()
    """Its standby replicas after the batch (the commit's ``placement``; none before standbys existed)."""
    warmup: Replica | None = None
    """A replica being warmed up to take the partition over (rebalancing), not a standby."""
    snapshot_named_in: int | None = None
    """For a snapshot uploaded in the background: the later version whose commit named it."""


@dataclass(frozen=True)
class Move:
    """A partition that changed executor in a batch (``metrics.standby.moves``)."""

    partition: int
    source: str | None
    """The executor it left (None: not recorded, as for a move during the batch)."""
    target: str | None
    reason: str | None
    """``same-host``, ``standby``, ``cold``, ``rebalance``, ``during-batch`` (its executor was lost while
    the batch ran: a failover), or ``elsewhere`` (Spark's scheduler ran the task on another executor while
    the planned one lived: no failover)."""
    source_host: str | None = None
    target_host: str | None = None

    def describe(self) -> str:
        """``partition 0: 1 (10.0.0.2) -> 2 (10.0.0.3), standby``."""

        def end(executor: str | None, host: str | None) -> str:
            text = executor if executor is not None else "?"
            return f"{text} ({host})" if host else text

        where = f"{end(self.source, self.source_host)} -> {end(self.target, self.target_host)}"
        reason = MOVE_REASONS.get(self.reason or "", self.reason)
        return f"partition {self.partition}: {where}" + (f", {reason}" if reason else "")

    @property
    def failover(self) -> bool:
        """Whether the partition moved because its executor was lost (to a standby or cold)."""
        return self.reason in ("standby", "cold", "during-batch")


MOVE_REASONS = {
    "elsewhere": "elsewhere (Spark ran the task on another executor while the planned one lived: no failover)"
}
"""How :meth:`Move.describe` words a reason that needs more than its name."""


@dataclass(frozen=True)
class StandbyMetrics:
    """A batch's standby figures (``metrics.standby``), present only when standbys were configured."""

    replicas: int | None
    failovers: int
    failovers_without_standby: int
    active_failures: int
    standby_failures: int
    moves: tuple[Move, ...]
    """The partitions that changed executor, from where to where and why."""
    max_lag_versions: int | None
    """The largest lag (versions behind the committed one) of any standby of any partition."""
    lag_versions: dict[int, int]
    """Per partition: the largest lag of its standbys."""
    sync_bytes: int | None

    @property
    def eventful(self) -> bool:
        """Whether there is anything to plot: standbys configured, or a partition failed or moved."""
        return bool(
            self.replicas or self.lag_versions or self.failovers or self.failovers_without_standby
        ) or bool(self.active_failures or self.moves)


@dataclass(frozen=True)
class BatchMetrics:
    """The figures of one committed version (the state after batch :attr:`batch_id`)."""

    version: int
    created_time_ms: int
    partitions: dict[int, PartitionMetrics]
    seconds: float | None = None
    """The batch's seconds on the driver, from its start to its commit."""
    input_rows: int | None = None
    output_rows: int | None = None
    bytes_uploaded: int | None = None
    restore_seconds: float | None = None
    """The slowest partition's load seconds (loads run in parallel)."""
    restore_bytes: int | None = None
    state_keys: int | None = None
    """RocksDB's estimate of the partitions' keys (see :attr:`PartitionMetrics.state_keys`)."""
    adjunct_keys: int | None = None
    """The partitions' side (adjunct) store keys, when the commit records them apart."""
    side_stores: tuple[str, ...] = ()
    """The side (adjunct) stores the commit's metrics name (``metrics.adjuncts``)."""
    max_task_seconds: float | None = None
    spark_recovery_seconds: float | None = None
    """Time the processing stage spent on retries after a failure (0 without one); None in commits
    written before it was measured (their ``spark_recovery_seconds`` is :attr:`spark_overhead_seconds`)."""
    spark_overhead_seconds: float | None = None
    """Stage time beyond the slowest processing task: reading and shuffling the input, scheduling and
    any recovery."""
    split: dict[str, float] = field(default_factory=dict)
    """Whichever of :data:`STAGE_SPLIT` the commit carries."""
    standby: StandbyMetrics | None = None
    writer: str = ""
    """The driver run that wrote the commit (it changes when the query restarts)."""
    recorded_batch_id: int | None = None
    """The commit's ``batch_id`` (None: ``version - 1``)."""
    num_partitions: int | None = None
    """The partition count of this version's layout when a rescale set it (None: ``metadata.json``'s)."""
    rescale: bool = False
    """Whether this version is a rescale's: no batch produced it (it repeats the batch id before it)."""

    @property
    def batch_id(self) -> int:
        """The micro-batch whose state this version holds (after a rescale, no longer ``version - 1``;
        a rescale's own version holds the state of the batch before it)."""
        return self.version - 1 if self.recorded_batch_id is None else self.recorded_batch_id

    @property
    def snapshots(self) -> int:
        """How many partitions' state at this version was snapshotted (however late the snapshot was
        named: a snapshot shows at the version, and batch, whose state it holds)."""
        return sum(1 for p in self.partitions.values() if p.snapshot)

    @property
    def delta_bytes(self) -> int:
        """Total size of this version's deltas."""
        return sum(p.delta_bytes for p in self.partitions.values())

    @property
    def checkpoint_kind(self) -> str:
        """``snapshot`` (every partition), ``delta`` (none) or ``snapshot k/n`` (some)."""
        n, k = len(self.partitions), self.snapshots
        if k == 0:
            return "delta"
        return "snapshot" if k == n else f"snapshot {k}/{n}"

    @property
    def has_metrics(self) -> bool:
        """Whether the commit carried the batch metrics at all (older commits do not)."""
        return self.seconds is not None or any(p.input_rows is not None for p in self.partitions.values())


@dataclass(frozen=True)
class CheckpointSummary:
    """What the report's header says about a checkpoint."""

    url: str
    query_id: str
    num_partitions: int
    operators: list[str]
    created_time_ms: int
    versions: list[int]
    missing: list[int]
    """Versions below the newest whose commit is missing (a hole in the log)."""

    @property
    def latest(self) -> int:
        """The newest committed version (0: none)."""
        return self.versions[-1] if self.versions else 0


def _partition_entry(raw: Mapping[Any, object], partition: int) -> Mapping[str, Any] | None:
    # keys are strings in metrics read back from JSON, ints in a commit's placement
    entry = raw.get(str(partition), raw.get(partition))
    return entry if isinstance(entry, Mapping) else None


LateNames = Mapping[tuple[int, int], int]
"""``(version, partition) -> v``: the snapshot of that version and partition was named late by commit v."""


def late_names(commits: Iterable[Commit]) -> dict[tuple[int, int], int]:
    """Which snapshots the ``commits`` name late: ``(version of the snapshot, partition) -> version of the
    first commit naming it``."""
    named: dict[tuple[int, int], int] = {}
    for commit in sorted(commits, key=lambda c: c.version):
        for parts in commit.objects.values():
            for p, refs in parts.items():
                if refs.late_snapshot is not None:
                    named.setdefault((refs.late_snapshot.version, p), commit.version)
    return named


def _partitions(
    commit: Commit, state_bytes: Mapping[tuple[int, int], int], late: LateNames
) -> dict[int, PartitionMetrics]:
    metrics = commit.metrics or {}
    per_partition = metrics.get("partitions")
    per_partition = per_partition if isinstance(per_partition, Mapping) else {}
    placement = commit.placement if isinstance(commit.placement, Mapping) else {}
    numbers = sorted({p for parts in commit.objects.values() for p in parts})
    out: dict[int, PartitionMetrics] = {}
    for p in numbers:
        refs = [parts[p] for parts in commit.objects.values() if p in parts]
        m = _partition_entry(per_partition, p)
        placed = _partition_entry(placement, p)
        rule = m.get("load_rule") if m else None
        # where it ran: the task's own report, else the commit's placement
        executor = (m or {}).get("executor_id") or (placed or {}).get("executor_id")
        host = (m or {}).get("host") or (placed or {}).get("host")
        out[p] = PartitionMetrics(
            partition=p,
            snapshot=any(r.snapshot is not None for r in refs) or (commit.version, p) in late,
            delta_bytes=sum(r.delta.size for r in refs),
            input_rows=_integer(m, "input_rows"),
            output_rows=_integer(m, "output_rows"),
            bytes_uploaded=_integer(m, "bytes_uploaded"),
            restore_seconds=_number(m, "load_seconds"),
            restore_bytes=_integer(m, "restore_bytes"),
            load_rule=rule if isinstance(rule, str) else None,
            state_keys=_integer(m, "state_keys"),
            adjunct_keys=_integer(m, "adjunct_keys"),
            state_bytes=state_bytes.get((commit.version, p)),
            task_seconds=_number(m, "task_seconds"),
            process_seconds=_number(m, "process_seconds"),
            commit_seconds=_number(m, "commit_seconds"),
            executor_id=executor if isinstance(executor, str) else None,
            host=host if isinstance(host, str) else None,
            snapshot_named_in=late.get((commit.version, p)),
            standbys=tuple(r for r in map(_replica, (placed or {}).get("standbys") or ()) if r is not None),
            warmup=_replica((placed or {}).get("warmup")),
        )
    return out


def _replica(raw: object) -> Replica | None:
    if not isinstance(raw, Mapping):
        return None
    executor, host, version = raw.get("executor_id"), raw.get("host"), raw.get("version")
    if not isinstance(executor, str) or not isinstance(host, str):
        return None
    return Replica(executor, host, version if isinstance(version, int) else None)


def _move(raw: object) -> Move | None:
    if not isinstance(raw, Mapping) or _integer(raw, "partition") is None:
        return None

    def text(key: str) -> str | None:
        value = raw.get(key)
        return value if isinstance(value, str) else None

    return Move(
        int(raw["partition"]),
        text("from"),
        text("to"),
        text("reason"),
        text("from_host"),
        text("to_host"),
    )


def _standby(raw: object) -> StandbyMetrics | None:
    if not isinstance(raw, Mapping) or not raw:
        return None
    lag: dict[int, int] = {}
    lags = raw.get("lag_versions")
    for key, hosts in (lags if isinstance(lags, Mapping) else {}).items():
        values = [v for v in hosts.values() if isinstance(v, int)] if isinstance(hosts, Mapping) else []
        if values and str(key).isdigit():
            lag[int(key)] = max(values)
    sync = raw.get("sync")
    sync_bytes = (
        _total(_integer(r, "bytes") for r in sync if isinstance(r, Mapping))
        if isinstance(sync, list)
        else None
    )
    moves = raw.get("moves")
    return StandbyMetrics(
        replicas=_integer(raw, "replicas"),
        failovers=_integer(raw, "failovers") or 0,
        failovers_without_standby=_integer(raw, "failovers_without_standby") or 0,
        active_failures=_integer(raw, "active_failures") or 0,
        standby_failures=_integer(raw, "standby_failures") or 0,
        moves=tuple(m for m in map(_move, moves if isinstance(moves, list) else ()) if m is not None),
        max_lag_versions=max(lag.values()) if lag else None,
        lag_versions=lag,
        sync_bytes=None if sync_bytes is None else int(sync_bytes),
    )


def batch_row(
    commit: Commit,
    state_bytes: Mapping[tuple[int, int], int] | None = None,
    late: LateNames | None = None,
) -> BatchMetrics:
    """The metrics of one commit; ``state_bytes`` maps (version, partition) to its snapshot's size and
    ``late`` says which of its snapshots later commits named (:func:`late_names`)."""
    metrics = commit.metrics if isinstance(commit.metrics, Mapping) else {}
    partitions = _partitions(commit, state_bytes or {}, late or {})
    parts = partitions.values()
    return BatchMetrics(
        version=commit.version,
        created_time_ms=commit.created_time_ms,
        partitions=partitions,
        seconds=_number(metrics, "seconds"),
        input_rows=_opt_int(_total(p.input_rows for p in parts)),
        output_rows=_opt_int(_total(p.output_rows for p in parts)),
        bytes_uploaded=_opt_int(_total(p.bytes_uploaded for p in parts)),
        restore_seconds=_maximum(p.restore_seconds for p in parts),
        restore_bytes=_opt_int(_total(p.restore_bytes for p in parts)),
        state_keys=_opt_int(_total(p.state_keys for p in parts)),
        adjunct_keys=_opt_int(_total(p.adjunct_keys for p in parts)),
        side_stores=_side_stores(metrics),
        max_task_seconds=_maximum(p.task_seconds for p in parts),
        **_spark_seconds(metrics),
        split={k: v for k in STAGE_SPLIT if (v := _number(metrics, k)) is not None},
        standby=_standby(metrics.get("standby")),
        writer=commit.writer,
        recorded_batch_id=commit.batch_id,
        num_partitions=commit.num_partitions,
        rescale=commit.rescaled,
    )


def _side_stores(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The side (adjunct) stores ``metrics.adjuncts`` names (its ``$held_rows`` entry is none)."""
    adjuncts = metrics.get("adjuncts")
    if not isinstance(adjuncts, Mapping):
        return ()
    return tuple(sorted(name for name in adjuncts if isinstance(name, str) and not name.startswith("$")))


def state_key_series(row: BatchMetrics) -> dict[str, int | None]:
    """A batch's keys as the state size plot draws them: ``state`` (the query's own operator state),
    ``side stores`` (its partitioned side stores, apart) and ``together`` (both, in a commit with side
    stores that did not record them apart: never drawn as the query's state). Unknown: None."""
    split = not row.side_stores or row.adjunct_keys is not None
    return {
        "state": row.state_keys if split else None,
        "side stores": row.adjunct_keys if row.side_stores else None,
        "together": None if split else row.state_keys,
    }


def _spark_seconds(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """``spark_recovery_seconds`` and ``spark_overhead_seconds`` of a commit. Commits written before the
    overhead had its own name recorded it as ``spark_recovery_seconds``, and no recovery figure."""
    if "spark_overhead_seconds" not in metrics:
        return {
            "spark_recovery_seconds": None,
            "spark_overhead_seconds": _number(metrics, "spark_recovery_seconds"),
        }
    return {
        "spark_recovery_seconds": _number(metrics, "spark_recovery_seconds"),
        "spark_overhead_seconds": _number(metrics, "spark_overhead_seconds"),
    }


def _opt_int(value: float | None) -> int | None:
    return None if value is None else int(value)


def batch_metrics(
    commits: Iterable[Commit], state_bytes: Mapping[tuple[int, int], int] | None = None
) -> list[BatchMetrics]:
    """One :class:`BatchMetrics` per commit, oldest version first; a snapshot uploaded in the background
    shows at the version it is of when one of ``commits`` names it."""
    ordered = sorted(commits, key=lambda c: c.version)
    late = late_names(ordered)
    return [batch_row(c, state_bytes, late) for c in ordered]


def summarize(
    url: str,
    metadata: QueryMetadata,
    versions: Sequence[int],
    horizon: int = 1,
    num_partitions: int | None = None,
) -> CheckpointSummary:
    """The header of a report: the query, its partitions (``num_partitions``: the newest commit's when
    a rescale set it, else ``metadata.json``'s) and operators, and which versions exist (``missing``:
    those without a commit from ``horizon``, below which the log was pruned)."""
    present = sorted(versions)
    latest = present[-1] if present else 0
    missing = sorted(set(range(horizon, latest + 1)) - set(present))
    return CheckpointSummary(
        url=url,
        query_id=metadata.query_id,
        num_partitions=metadata.num_partitions if num_partitions is None else num_partitions,
        operators=sorted(metadata.operators),
        created_time_ms=metadata.created_time_ms,
        versions=present,
        missing=missing,
    )


def _read_all(
    items: Sequence[_T], read: Callable[[_T], _R], what: str, progress: Progress | None
) -> list[_R]:
    """``read`` every item on a few threads (blob stores are I/O bound), reporting progress in order."""
    out: list[_R] = []
    if progress is not None:
        progress(0, len(items), what)
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="blobstate-report") as pool:
        for i, result in enumerate(pool.map(read, items), start=1):
            out.append(result)
            if progress is not None:
                progress(i, len(items), what)
    return out


def snapshot_sizes(
    store: Any,
    commits: Iterable[Commit],
    progress: Progress | None = None,
    operators: Collection[str] | None = None,
) -> dict[tuple[int, int], int]:
    """``(version, partition) -> bytes`` of every committed snapshot whose index can still be read, at
    the version the snapshot is of (a snapshot uploaded in the background is named by a later commit).
    With ``operators`` only their snapshots count (a broadcast side store's own operator is no
    partition's state).

    Older snapshots removed by retention are simply absent (the plot leaves a gap).
    """
    from blobstate.blobstore import BlobNotFoundError
    from blobstate.ids import CheckpointId
    from blobstate.layout import snapshot_name
    from blobstate.snapshot import SnapshotError, read_snapshot_index

    wanted = []
    for c in commits:
        for op, parts in sorted(c.objects.items()):
            if operators is not None and op not in operators:
                continue
            for p, refs in sorted(parts.items()):
                if refs.snapshot is not None:
                    wanted.append((c.version, op, p, snapshot_name(op, p, c.checkpoint_id(op, p))))
                late = refs.late_snapshot
                if late is not None:
                    cid = CheckpointId(late.version, late.uid)
                    wanted.append((late.version, op, p, snapshot_name(op, p, cid)))
    wanted = list(dict.fromkeys(wanted))  # a snapshot named by two commits is counted once

    def read(item: tuple[int, str, int, str]) -> int | None:
        try:
            return read_snapshot_index(store, item[3]).total_size
        except (BlobNotFoundError, SnapshotError):
            return None

    sizes: dict[tuple[int, int], int] = {}
    for (version, _op, p, _name), size in zip(
        wanted, _read_all(wanted, read, "snapshot indexes", progress), strict=True
    ):
        if size is not None:
            sizes[(version, p)] = sizes.get((version, p), 0) + size
    return sizes


REPORT_WINDOW = 1000
"""The most commits a report reads by default: the newest ones. The commit log keeps only the
retained window (``min_versions_to_retain`` versions and the bases they load from), so this only
binds when retention is set above it."""


def load_batch_metrics(
    store: Any,
    *,
    versions: Iterable[int] | None = None,
    state_sizes: bool = True,
    progress: Progress | None = None,
    window: int = REPORT_WINDOW,
) -> tuple[CheckpointSummary, list[BatchMetrics]]:
    """Read a checkpoint's commit log (the newest ``window`` commits, or ``versions``) into its
    per-batch metrics.

    With ``state_sizes`` the snapshot indexes are read too, for the state's size on disk. A commit that
    fails to parse raises its commit log error naming ``commits/<v>.json``.
    """
    from blobstate.lineage.commitlog import CommitLog

    log = CommitLog(store)
    metadata = log.read_metadata()
    scan = log.scan(check=False)
    present = [v for v in scan.versions if v >= scan.horizon]
    newest = scan.newest.num_partitions if scan.newest is not None else None
    summary = summarize(store.url, metadata, present, scan.horizon, newest)
    chosen = present[-window:] if versions is None else sorted(set(versions) & set(present))
    commits = _read_all(chosen, log.read_commit, "commits", progress)
    # a broadcast side store is an operator of its own (with its own partition count): not the state
    query_operators = {op for op, spec in metadata.operators.items() if "partitions" not in spec}
    sizes = snapshot_sizes(store, commits, progress, query_operators) if state_sizes else {}
    return summary, batch_metrics(commits, sizes)


__all__ = [
    "STAGE_SPLIT",
    "BatchMetrics",
    "CheckpointSummary",
    "Move",
    "PartitionMetrics",
    "Progress",
    "Replica",
    "StandbyMetrics",
    "batch_metrics",
    "batch_row",
    "late_names",
    "load_batch_metrics",
    "snapshot_sizes",
    "state_key_series",
    "summarize",
]
