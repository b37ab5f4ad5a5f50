"""The driver side of standby replicas: after each commit, a sync job overlapping the next batch.

:meth:`StandbySyncer.start` is called after every commit with the committed uids and the assignment.
It runs one Spark job (on a background thread) with one task per replica, each placed on its replica's
executor (preferred locations through the JVM seam, ``batch.jvm.JvmSeam``) and running
:func:`blobstate.standby.sync_task.run_sync_task`. A round still running when the next commit arrives is
not interrupted: the newest commit is remembered and synced when the round ends, so replicas skip
versions rather than queue rounds. Every report updates the replica versions (by partition and host)
that the next assignment uses to pick the freshest standby, and the metrics of the next commit.

Sync tasks run in the Spark scheduler pool ``blobstate-standby`` (which matters with
``spark.scheduler.mode=FAIR``); each task holds its core for at most ``standby_sync_seconds``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blobstate import defaults
from blobstate.batch.executor import ExecutorIdentity, location_string
from blobstate.batch.jvm import JvmSeam, is_connect
from blobstate.errors import first_line
from blobstate.standby.assignment import PartitionAssignment
from blobstate.standby.sync_task import SYNC_SCHEMA, SyncSpec, SyncTask, run_sync_task

log = logging.getLogger("blobstate")

SCHEDULER_POOL = "blobstate-standby"
JOB_GROUP = "blobstate-standby-sync"


@dataclass
class SyncRound:
    """The outcome of one sync job."""

    version: int
    seconds: float
    reports: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def totals(self) -> dict[str, Any]:
        """Seconds, bytes and outcomes of the round, for the next commit's metrics."""
        outcomes: dict[str, int] = {}
        for r in self.reports:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        return {
            "version": self.version,
            "seconds": self.seconds,
            "task_seconds": round(sum(r.get("seconds") or 0.0 for r in self.reports), 4),
            "bytes": sum(r.get("bytes_downloaded") or 0 for r in self.reports),
            "snapshot_bytes": sum(r.get("snapshot_bytes") or 0 for r in self.reports),
            "deltas": sum(r.get("deltas_applied") or 0 for r in self.reports),
            "outcomes": outcomes,
            "error": self.error,
            "replicas": [
                {
                    k: r.get(k)
                    for k in (
                        "partition",
                        "executor_id",
                        "host",
                        "outcome",
                        "version",
                        "started_at",
                        "finished_at",
                    )
                }
                for r in self.reports
            ],
        }


class StandbySyncer:
    """Runs sync rounds for one query on a background thread (see the module docstring)."""

    def __init__(
        self,
        spark: Any,
        jvm: JvmSeam,
        *,
        checkpoint_url: str,
        query_id: str,
        operator: str,
        local_dir: str,
        budget_seconds: float,
        replica_versions: Mapping[tuple[int, str], int] | None = None,
        local_dir_grace_seconds: float = defaults.LOCAL_DIR_GRACE_SECONDS,
    ) -> None:
        self._spark = spark
        self._seam = jvm
        self._checkpoint_url = checkpoint_url
        self._query_id = query_id
        self._operator = operator
        self._local_dir = local_dir
        self._grace = local_dir_grace_seconds
        self._budget = budget_seconds
        self._lock = threading.Lock()
        self._versions: dict[tuple[int, str], int] = dict(replica_versions or {})
        self._pending: tuple[int, dict[int, str], dict[int, PartitionAssignment]] | None = None
        self._thread: threading.Thread | None = None
        self._finished: list[SyncRound] = []
        self._stopped = False
        self._floor = 0
        """Versions below it are of an older partition layout (``forget_below``)."""

    # ------------------------------------------------------------------ what the driver reads
    def replica_versions(self) -> dict[tuple[int, str], int]:
        """The committed version of each replica by ``(partition, host)``, as last reported."""
        with self._lock:
            return dict(self._versions)

    def take_rounds(self) -> list[SyncRound]:
        """The rounds finished since the last call."""
        with self._lock:
            out, self._finished = self._finished, []
            return out

    def seed_versions(self, versions: Mapping[tuple[int, str], int]) -> None:
        """Versions recorded by the last commit (a restarted driver); reports received since win."""
        with self._lock:
            self._versions = {**{k: v for k, v in versions.items() if v >= self._floor}, **self._versions}

    def forget_below(self, version: int) -> None:
        """A partition layout starts at ``version`` (a rescale): replicas at lower versions hold the old
        layout's partitions, which share numbers with the new ones but nothing else. Forget them, a
        pending round to such a version, and any report of one (a round running now), so that no
        assignment takes a replica of old partition ``p`` for one of new partition ``p``."""
        with self._lock:
            self._floor = max(self._floor, version)
            self._versions = {k: v for k, v in self._versions.items() if v >= self._floor}
            if self._pending is not None and self._pending[0] < self._floor:
                self._pending = None

    # ------------------------------------------------------------------ rounds
    def start(
        self, version: int, uids: Mapping[int, str], assignment: Mapping[int, PartitionAssignment]
    ) -> None:
        """Sync every replica of ``assignment`` to ``version`` (its committed ``uids``), in the background."""
        with self._lock:
            if self._stopped:
                return
            self._pending = (version, dict(uids), dict(assignment))
            if self._thread is not None and self._thread.is_alive():
                return  # the running round picks the newest pending commit up when it ends
            self._thread = threading.Thread(target=self._run, name="blobstate-standby-sync", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until no round is running or pending (tests, benchmarks, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def stop(self) -> None:
        """Start no further rounds."""
        with self._lock:
            self._stopped = True
            self._pending = None

    def _run(self) -> None:
        from pyspark import SparkContext

        if not is_connect(self._spark):  # a Connect session has no SparkContext
            sc: SparkContext = self._spark.sparkContext
            sc.setLocalProperty("spark.scheduler.pool", SCHEDULER_POOL)
            sc.setJobGroup(JOB_GROUP, "blobstate: bring standby replicas to the latest commit", False)
        while True:
            with self._lock:
                pending, self._pending = self._pending, None
                if pending is None or self._stopped:
                    self._thread = None
                    return
            version, uids, assignment = pending
            round_ = self._round(version, uids, assignment)
            with self._lock:
                for r in round_.reports:
                    if r["outcome"] in ("misplaced", "error"):
                        continue
                    key = (r["partition"], r["host"])
                    if r["version"] > 0 and r["version"] >= self._floor:
                        self._versions[key] = r["version"]
                    else:
                        self._versions.pop(key, None)
                self._finished.append(round_)

    def _round(
        self, version: int, uids: Mapping[int, str], assignment: Mapping[int, PartitionAssignment]
    ) -> SyncRound:
        tasks = tuple(
            SyncTask(p, r.executor_id, r.host, version, uids[p])
            for p, a in sorted(assignment.items())
            for r in a.replicas()
            if p in uids
        )
        started = time.monotonic()
        if not tasks:
            return SyncRound(version, 0.0)
        spec = SyncSpec(
            checkpoint_url=self._checkpoint_url,
            query_id=self._query_id,
            operator=self._operator,
            local_dir=self._local_dir,
            budget_seconds=self._budget,
            tasks=tasks,
            local_dir_grace_seconds=self._grace,
        )
        try:
            from pyspark.sql.pandas.types import from_arrow_schema

            frame = self._spark.range(0, len(tasks), 1, len(tasks))
            located = self._seam.with_preferred_locations(
                frame, [location_string(_identity(t)) for t in tasks]
            )
            rows = located.mapInArrow(
                lambda it: run_sync_task(spec, it), from_arrow_schema(SYNC_SCHEMA)
            ).collect()
            reports = [json.loads(row[0]) for row in rows]
            error = None
        except Exception as exc:  # a lost executor fails the job: the next round retries
            reports, error = [], f"{type(exc).__name__}: {first_line(exc)}"
            log.warning(
                "standby sync to version %d failed (retried after the next commit): %s", version, error
            )
        return SyncRound(version, round(time.monotonic() - started, 3), reports, error)


def _identity(task: SyncTask) -> ExecutorIdentity:
    return ExecutorIdentity(task.executor_id, task.host)
