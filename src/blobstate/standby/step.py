"""Standby replicas and placement as one step of every batch (``blobstate.batch.steps``).

Before the stage it plans where each partition runs (actives, standbys and warm-ups over the executors
alive now, ``assignment.py``) and gives the stage each partition's candidates; its commit part records
failures, failovers, replica lag and sync rounds (``metrics.standby``) and the placement; after the
commit it remembers where partitions ran and starts bringing their replicas to the new commit
(``syncer.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from blobstate.batch.contracts import JsonObject, JsonValue, TaskResult
from blobstate.batch.executor import ExecutorIdentity, location_string, wait_for_hosts
from blobstate.batch.steps import CommitPart, PreparedBatch
from blobstate.lineage.commitlog import Commit
from blobstate.standby.assignment import (
    PartitionAssignment,
    Plan,
    committed_assignment,
    moves_in_stage,
    parse_placement,
    placement_json,
    plan_assignment,
    replica_versions_of,
    standby_lag,
)
from blobstate.standby.syncer import StandbySyncer

log = logging.getLogger("blobstate")


class Executors(Protocol):
    """What the step asks of the JVM seam (``batch.jvm.JvmSeam``): the executors alive now."""

    def executors(self) -> list[ExecutorIdentity]:
        """The executors alive now."""
        ...


@dataclass(frozen=True)
class StandbySettings:
    """The query's standby and placement settings (``QueryConfig``'s of the same names)."""

    num_partitions: int
    operator: str
    standby_replicas: int = 0
    max_warmup_replicas: int = 2
    acceptable_recovery_lag: int = 1
    restart_executor_wait_seconds: float = 10.0


class StandbyStep:
    """Places partitions and keeps their standby replicas at the latest commit (see the module)."""

    name = "standby"

    def __init__(self, settings: StandbySettings, jvm: Executors, syncer: StandbySyncer | None) -> None:
        self.settings = settings
        self.syncer = syncer
        """Keeps standby (and warm-up) replicas at the latest commit."""
        self.assignment: dict[int, PartitionAssignment] = {}
        """Where each partition ran in the last committed batch and where its replicas are kept."""
        self._seam = jvm
        self._plan: Plan | None = None
        self._ran: dict[int, PartitionAssignment] | None = None
        self._layout_from: int | None = None
        """The first version of the partition layout the assignment and replica versions are of."""

    # ------------------------------------------------------------------ the step
    def prepare(self, batch: PreparedBatch) -> None:
        """Plan this batch's assignment; the stage prefers each partition's active, then its replicas."""
        self._plan = self._assign(batch.previous)
        self._ran = None
        batch.placement = _Placement(self, self._plan)

    def contribute(self, batch: PreparedBatch, results: Mapping[int, TaskResult]) -> CommitPart:
        """``metrics.standby`` and the placement: where partitions really ran (Spark may have moved a
        task to a replica during the batch) and their replicas with their versions."""
        plan = self._plan
        part = CommitPart(metrics={"standby": self._metrics(plan, results)})
        if plan is not None:
            self._ran = committed_assignment(plan.assignment, results)
            part.placement = placement_json(self._ran, self._replica_versions())
        return part

    def after_commit(self, commit: Commit, results: Mapping[int, TaskResult]) -> None:
        """Remember where partitions ran, and start bringing their replicas to this commit."""
        if self._ran is None:
            return
        self.assignment = self._ran
        if self.syncer is not None:
            self.syncer.start(commit.version, commit.checkpoints[self.settings.operator], self.assignment)

    def wants_another_batch(self) -> bool:
        """Standby replicas never ask for a batch."""
        return False

    def stop(self) -> None:
        """Stop standby syncs, waiting for a running round."""
        if self.syncer is not None:
            self.syncer.stop()
            self.syncer.wait(60)

    # ------------------------------------------------------------------ planning
    def _enter_layout(self, previous: Commit | None) -> None:
        """Keep the assignment and replica versions of the batch's partition layout only: after a
        rescale, partition ``p`` is another partition than before it, so the old layout's actives and
        replicas are dropped and the new partitions' replicas are built from their snapshots."""
        layout = previous.layout_from if previous is not None else 1
        if layout == self._layout_from:
            return
        if self._layout_from is not None:
            self.assignment = {}
        self._layout_from = layout
        if self.syncer is not None:
            self.syncer.forget_below(layout)

    def _assign(self, previous: Commit | None) -> Plan:
        """This batch's assignment: actives, standbys and warm-ups over the executors alive now."""
        settings = self.settings
        self._enter_layout(previous)
        # A rescale's commit records no placement: its partitions never ran anywhere.
        before = self.assignment or parse_placement((previous.placement or {}) if previous else {})
        if not self.assignment and before:  # a restarted driver: wait for the recorded actives' hosts
            hosts = {a.active.host for a in before.values()}
            alive = wait_for_hosts(hosts, self._seam.executors, settings.restart_executor_wait_seconds)
            missing = sorted(hosts - {e.host for e in alive})
            if missing:
                log.warning(
                    "no executor on host(s) %s after %.0f s (restart_executor_wait_seconds): their"
                    " partitions move",
                    ", ".join(missing),
                    settings.restart_executor_wait_seconds,
                )
        else:
            alive = self._seam.executors()
        if not self.assignment and previous is not None and self.syncer is not None:
            # A restarted driver: the replica versions the last commit recorded.
            self.syncer.seed_versions(replica_versions_of(previous.placement or {}))
        plan = plan_assignment(
            settings.num_partitions,
            settings.standby_replicas,
            before,
            alive,
            self._replica_versions(),
            previous.version if previous else 0,
            max_warmups=settings.max_warmup_replicas,
            acceptable_lag=settings.acceptable_recovery_lag,
        )
        if plan.short_of_standbys and settings.standby_replicas > 0:
            log.warning(
                "standby_replicas=%d but only %d executor(s) on %d host(s) are alive: %d partition(s) have"
                " fewer standbys",
                settings.standby_replicas,
                len(alive),
                len({e.host for e in alive}),
                len(plan.short_of_standbys),
            )
        for move in plan.moves:
            log.info(
                "partition %d moves from executor %s (%s) to %s (%s): %s",
                move.partition,
                move.source.executor_id,
                move.source.host,
                move.target.executor_id,
                move.target.host,
                move.reason,
            )
        return plan

    def _assign_again(self, plan: Plan) -> Plan:
        """Before a rerun of the stage: the same plan, without executors lost meanwhile."""
        alive = set(self._seam.executors())
        if all(a.active in alive for a in plan.assignment.values()):
            return plan
        return plan_assignment(
            self.settings.num_partitions,
            self.settings.standby_replicas,
            plan.assignment,
            sorted(alive),
            self._replica_versions(),
            0,
            max_warmups=0,
        )

    def _replica_versions(self) -> dict[tuple[int, str], int]:
        """The last reported version of each replica of the layout's partitions, by (partition, host)."""
        versions = self.syncer.replica_versions() if self.syncer is not None else {}
        floor = self._layout_from or 0
        return {k: v for k, v in versions.items() if v >= floor}

    def _locations(self, plan: Plan) -> list[str | None] | None:
        """Each partition's candidates for the processing task: its active, then its replicas freshest
        first (the JVM helper picks the first one alive when the stage is submitted)."""
        if not plan.assignment:
            return None
        versions = self._replica_versions()
        out: list[str | None] = []
        for p in range(self.settings.num_partitions):
            a = plan.assignment.get(p)
            if a is None:
                out.append(None)
                continue
            replicas = sorted(a.replicas(), key=lambda r: -versions.get((p, r.host), -1))
            out.append(",".join(location_string(e) for e in (a.active, *replicas)))
        return out

    def _metrics(self, plan: Plan | None, results: Mapping[int, TaskResult]) -> JsonObject:
        """Failures, failovers, replica lag and the sync rounds finished since the last commit."""
        if plan is None:
            return {}
        failovers, cold = plan.failovers, plan.failovers_without_standby
        ran = {p: ExecutorIdentity(r.executor_id, r.host) for p, r in results.items()}
        in_stage = moves_in_stage(plan.assignment, ran, self._seam.executors if self._seam else None)
        lost_in_stage = [m for m in in_stage if m.reason == "during-batch"]
        failovers += sum(1 for m in lost_in_stage if m.standby)
        cold += sum(1 for m in lost_in_stage if not m.standby)
        versions = self._replica_versions()
        rounds = self.syncer.take_rounds() if self.syncer is not None else []
        committing = max((r.version for r in results.values()), default=0)
        lag = standby_lag(plan.assignment, versions, committing)
        moves: list[JsonValue] = [
            {
                "partition": m.partition,
                "from": m.source.executor_id,
                "to": m.target.executor_id,
                "reason": m.reason,
                "from_host": m.source.host,
                "to_host": m.target.host,
            }
            for m in plan.moves
        ]
        moves += [m.to_json() for m in in_stage]
        return {
            "replicas": self.settings.standby_replicas,
            "active_failures": plan.active_failures + len(lost_in_stage),
            "standby_failures": plan.standby_failures,
            "failovers": failovers,
            "failovers_without_standby": cold,
            "moves": moves,
            "short_of_standbys": {str(p): n for p, n in plan.short_of_standbys.items()},
            "lag_versions": lag,
            "sync": [r.totals() for r in rounds],
        }


@dataclass
class _Placement:
    """The stage's view of the step's plan (``batch.steps.Placement``)."""

    step: StandbyStep
    plan: Plan

    def locations(self) -> list[str | None] | None:
        return self.step._locations(self.plan)

    def replan(self) -> None:
        self.plan = self.step._assign_again(self.plan)
