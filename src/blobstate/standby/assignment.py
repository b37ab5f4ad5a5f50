"""Which executor runs each partition, and which executors keep its replicas (pure planning, no Spark).

The driver calls :func:`plan_assignment` before every batch with the previous assignment, the executors
alive now and what it knows about the replicas. The rules (docs/DESIGN.md, "Placement and standby"),
modelled on Kafka Streams' assignor:

* **Sticky actives.** A partition stays on its executor while that executor lives. When the executor
  is gone but another executor runs on the same host, the partition goes there: state lives on the
  host's disk (``local_dir``), so nothing is restored. This is also how a restarted driver resumes the
  recorded assignment: its executors have new ids, but the hosts are the same.
* **Failover.** Otherwise the partition moves to its most up-to-date live standby (or warm-up); with
  none, to the least-loaded executor, which restores from the blob store (a failover without a usable
  standby).
* **Standbys (Invariant 1).** Each partition gets up to ``replicas`` standby executors: never its active
  executor, never on the active's host while an executor on another host exists, and two standbys of
  one partition on distinct hosts when possible. Standbys are sticky too. With too few executors a
  partition gets fewer standbys (reported, never an error).
* **Gradual rebalancing.** When actives are unbalanced (a new executor joined), at most
  ``max_warmups`` partitions at a time get a warm-up replica on an under-loaded executor; a partition
  moves there only once that replica is within ``acceptable_lag`` versions of the latest commit, so a
  move costs no more than a standby failover. A standby that sits on an under-loaded executor is used
  as the warm-up directly.

Replicas live per host (the partition's directory under ``local_dir``), so replica versions are keyed
by ``(partition, host)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blobstate.batch.contracts import JsonValue, TaskResult
from blobstate.batch.executor import ExecutorIdentity


@dataclass(frozen=True)
class PartitionAssignment:
    """Where one partition runs (``active``) and where its replicas are kept."""

    active: ExecutorIdentity
    standbys: tuple[ExecutorIdentity, ...] = ()
    warmup: ExecutorIdentity | None = None
    """An executor being warmed up to take the partition over (rebalancing), not a standby."""

    def replicas(self) -> tuple[ExecutorIdentity, ...]:
        """Every executor that keeps a replica of the partition: standbys, then the warm-up."""
        return self.standbys + ((self.warmup,) if self.warmup is not None else ())

    def to_json(self) -> dict[str, Any]:
        """The form recorded in each commit (``assignment``)."""
        out: dict[str, Any] = {
            "active": _identity_json(self.active),
            "standbys": [_identity_json(s) for s in self.standbys],
        }
        if self.warmup is not None:
            out["warmup"] = _identity_json(self.warmup)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PartitionAssignment:
        """Parse :meth:`to_json`'s form; raises ``ValueError`` when malformed."""
        try:
            warmup = raw.get("warmup")
            return cls(
                _identity(raw["active"]),
                tuple(_identity(s) for s in raw.get("standbys", ())),
                None if warmup is None else _identity(warmup),
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"malformed partition assignment {raw!r}") from error


def _identity_json(identity: ExecutorIdentity) -> dict[str, str]:
    return {"executor_id": identity.executor_id, "host": identity.host}


def _identity(raw: Mapping[str, Any]) -> ExecutorIdentity:
    executor_id, host = raw["executor_id"], raw["host"]
    if not isinstance(executor_id, str) or not isinstance(host, str):
        raise TypeError("executor_id and host must be strings")
    return ExecutorIdentity(executor_id, host)


@dataclass(frozen=True)
class Move:
    """A partition that changed its active executor in this plan, and why."""

    partition: int
    source: ExecutorIdentity
    target: ExecutorIdentity
    reason: str
    """``same-host`` (its executor is gone; another executor on its host has its state), ``standby``
    (failover to a replica), ``cold`` (failover without a usable replica: restored from the blob store),
    or ``rebalance`` (a warmed-up replica takes over)."""


@dataclass
class Plan:
    """The assignment for the next batch and what changed to get there."""

    assignment: dict[int, PartitionAssignment]
    moves: list[Move] = field(default_factory=list)
    active_failures: int = 0
    """Partitions whose active executor is gone."""
    standby_failures: int = 0
    """Standby (or warm-up) replicas whose executor is gone."""
    short_of_standbys: dict[int, int] = field(default_factory=dict)
    """Partitions with fewer standbys than asked for: how many they have."""

    @property
    def failovers(self) -> int:
        """Partitions moved to a replica because their executor was gone."""
        return sum(1 for m in self.moves if m.reason == "standby")

    @property
    def failovers_without_standby(self) -> int:
        """Partitions whose executor was gone and that had no live replica to move to."""
        return sum(1 for m in self.moves if m.reason == "cold")


ReplicaVersions = Mapping[tuple[int, str], int]
"""The committed version of each replica, by ``(partition, host)``."""


def plan_assignment(
    num_partitions: int,
    replicas: int,
    previous: Mapping[int, PartitionAssignment],
    alive: Sequence[ExecutorIdentity],
    replica_versions: ReplicaVersions,
    latest_version: int,
    *,
    max_warmups: int = 2,
    acceptable_lag: int = 1,
) -> Plan:
    """The assignment of the next batch (see the module docstring). With no live executor, an empty plan."""
    live = sorted(set(alive), key=_order)
    if not live:
        return Plan({})
    by_id = {e.executor_id: e for e in live}
    by_host: dict[str, list[ExecutorIdentity]] = {}
    for e in live:
        by_host.setdefault(e.host, []).append(e)
    plan = Plan({})
    load: Counter[ExecutorIdentity] = Counter({e: 0 for e in live})

    def find(old: ExecutorIdentity) -> ExecutorIdentity | None:
        """The live executor holding ``old``'s local state: ``old`` itself, else one on its host."""
        same = by_id.get(old.executor_id)
        if same == old:
            return same
        on_host = by_host.get(old.host)
        return min(on_host, key=lambda e: (load[e], _order(e))) if on_host else None

    def version(p: int, e: ExecutorIdentity) -> int:
        return replica_versions.get((p, e.host), -1)

    # 1. Actives: sticky, else same host, else the freshest replica, else the least loaded executor.
    actives: dict[int, ExecutorIdentity] = {}
    kept: dict[int, list[ExecutorIdentity]] = {}
    warmups: dict[int, ExecutorIdentity] = {}
    orphans: list[int] = []
    for p in range(num_partitions):
        before = previous.get(p)
        if before is None:
            orphans.append(p)
            continue
        old_replicas = [r for r in before.replicas() if r != before.active]
        alive_replicas = []
        for r in old_replicas:
            if by_id.get(r.executor_id) != r:
                plan.standby_failures += 1
            found = find(r)
            if found is not None and found not in alive_replicas:
                alive_replicas.append(found)
        active = find(before.active)
        if by_id.get(before.active.executor_id) != before.active:
            plan.active_failures += 1
            if active is not None:
                plan.moves.append(Move(p, before.active, active, "same-host"))
            else:
                usable = [r for r in alive_replicas if version(p, r) > 0]
                if usable:
                    active = max(usable, key=lambda r: (version(p, r), -load[r], _neg_order(r)))
                    plan.moves.append(Move(p, before.active, active, "standby"))
                else:
                    active = min(live, key=lambda e: (load[e], _order(e)))
                    plan.moves.append(Move(p, before.active, active, "cold"))
        assert active is not None
        actives[p] = active
        load[active] += 1
        warm_now = find(before.warmup) if before.warmup is not None else None
        kept[p] = [r for r in alive_replicas if r != active and r != warm_now]
        if before.warmup is not None:
            warm = find(before.warmup)
            if warm is not None and warm != active:
                warmups[p] = warm
    for p in orphans:
        active = min(live, key=lambda e: (load[e], _order(e)))
        actives[p] = active
        load[active] += 1
        kept[p] = []

    # 2. Rebalancing: promote warm-ups that caught up, start new ones (at most max_warmups at a time).
    rebalancer = _Rebalancer(
        plan, actives, kept, warmups, load, replica_versions, max(1, latest_version - acceptable_lag)
    )
    rebalancer.promote_warmups()
    rebalancer.start_warmups(max_warmups)

    # 3. Standbys: keep the valid ones, fill up to ``replicas`` under Invariant 1.
    standby_load: Counter[ExecutorIdentity] = Counter({e: 0 for e in live})
    hosts = set(by_host)
    chosen: dict[int, list[ExecutorIdentity]] = {}
    for p in range(num_partitions):
        active = actives[p]
        valid: list[ExecutorIdentity] = []
        for r in kept[p]:
            if len(valid) < replicas and _allowed(r, active, valid, hosts, strict_hosts=True):
                valid.append(r)
                standby_load[r] += 1
        chosen[p] = valid
    for p in range(num_partitions):
        active, valid = actives[p], chosen[p]
        while len(valid) < replicas:
            candidates = [e for e in live if _allowed(e, active, valid, hosts, strict_hosts=False)]
            if not candidates:
                break
            used_hosts = {v.host for v in valid}
            best = min(
                candidates,
                key=lambda e: (e.host in used_hosts, -version(p, e), standby_load[e], load[e], _order(e)),
            )
            valid.append(best)
            standby_load[best] += 1
        if len(valid) < replicas:
            plan.short_of_standbys[p] = len(valid)
        warm = warmups.get(p)
        plan.assignment[p] = PartitionAssignment(active, tuple(valid), warm if warm not in valid else None)
    return plan


def _allowed(
    e: ExecutorIdentity,
    active: ExecutorIdentity,
    chosen: Sequence[ExecutorIdentity],
    hosts: set[str],
    *,
    strict_hosts: bool,
) -> bool:
    """Invariant 1 for a standby candidate ``e`` of a partition active on ``active``."""
    if e == active or e in chosen:
        return False
    if e.host == active.host and len(hosts) > 1:
        return False
    # Two standbys of a partition share a host only when there is no other way (kept ones never do).
    other_hosts = hosts - {active.host} - {c.host for c in chosen}
    return not (any(c.host == e.host for c in chosen) and (strict_hosts or other_hosts))


@dataclass
class _Rebalancer:
    """Gradual moves of actives onto under-loaded executors, through warm-up replicas."""

    plan: Plan
    actives: dict[int, ExecutorIdentity]
    kept: dict[int, list[ExecutorIdentity]]
    """Each partition's live standbys, best candidates first."""
    warmups: dict[int, ExecutorIdentity]
    load: Counter[ExecutorIdentity]
    versions: ReplicaVersions
    caught_up: int
    """The replica version from which a warm-up may take its partition over."""

    def version(self, p: int, e: ExecutorIdentity) -> int:
        return self.versions.get((p, e.host), -1)

    def promote_warmups(self) -> None:
        """Move partitions whose warm-up caught up; drop warm-ups that no longer even anything out."""
        for p, warm in sorted(self.warmups.items()):
            if self.load[self.actives[p]] - self.load[warm] < 2:
                del self.warmups[p]
            elif self.version(p, warm) >= self.caught_up:
                del self.warmups[p]
                self.move(p, warm)

    def start_warmups(self, max_warmups: int) -> None:
        """Start warm-ups from the most to the least loaded executor while actives are uneven."""
        incoming: Counter[ExecutorIdentity] = Counter(self.warmups.values())
        outgoing: Counter[ExecutorIdentity] = Counter(self.actives[p] for p in self.warmups)
        while len(self.warmups) < max_warmups:
            planned = Counter({e: self.load[e] + incoming[e] - outgoing[e] for e in self.load})
            source = max(planned, key=lambda e: (planned[e], _neg_order(e)))
            target = min(planned, key=lambda e: (planned[e], _order(e)))
            if planned[source] - planned[target] < 2:
                return
            # A partition moves at most once per plan: moving it on again would undo the move it made.
            moved = {m.partition for m in self.plan.moves}
            movable = [
                p
                for p, a in sorted(self.actives.items())
                if a == source and p not in self.warmups and p not in moved
            ]
            if not movable:
                return
            # A partition whose standby already sits on the target moves first (nothing to warm up).
            p = max(movable, key=lambda q: (target in self.kept[q], self.version(q, target), -q))
            if target in self.kept[p] and self.version(p, target) >= self.caught_up:
                self.move(p, target)
                continue
            self.warmups[p] = target
            incoming[target] += 1
            outgoing[source] += 1

    def move(self, p: int, target: ExecutorIdentity) -> None:
        """Move partition ``p``'s active to ``target``, a replica that caught up."""
        source = self.actives[p]
        self.actives[p] = target
        self.load[source] -= 1
        self.load[target] += 1
        # The old active holds the freshest copy: it is the first standby candidate.
        self.kept[p] = [source, *(r for r in self.kept[p] if r not in (target, source))]
        self.plan.moves.append(Move(p, source, target, "rebalance"))


def _order(e: ExecutorIdentity) -> tuple[bool, int, str, str]:
    """Executors in Spark's numeric id order (``driver`` and other names last)."""
    digits = e.executor_id.isdigit()
    return (not digits, int(e.executor_id) if digits else 0, e.executor_id, e.host)


def _neg_order(e: ExecutorIdentity) -> tuple[int, ...]:
    """For ``max`` ties: the lowest ``_order`` wins."""
    digits = e.executor_id.isdigit()
    return (-int(not digits), -(int(e.executor_id) if digits else 0))


def assignment_json(assignment: Mapping[int, PartitionAssignment]) -> dict[str, Any]:
    """Partition (as a string) to :meth:`PartitionAssignment.to_json`."""
    return {str(p): a.to_json() for p, a in sorted(assignment.items())}


def parse_assignment(raw: Mapping[str, Any] | None) -> dict[int, PartitionAssignment]:
    """Parse :func:`assignment_json`'s form (empty when absent)."""
    return {int(p): PartitionAssignment.from_json(a) for p, a in (raw or {}).items()}


def committed_assignment(
    planned: Mapping[int, PartitionAssignment], results: Mapping[int, TaskResult]
) -> dict[int, PartitionAssignment]:
    """The assignment a batch leaves behind: each partition on the executor that really ran it (Spark may
    have run it on a replica when the planned executor was lost during the batch), with its replicas."""
    out: dict[int, PartitionAssignment] = {}
    for p, result in sorted(results.items()):
        actual = ExecutorIdentity(result.executor_id, result.host)
        plan = planned.get(p)
        if plan is None:
            out[p] = PartitionAssignment(actual)
            continue
        standbys = tuple(s for s in plan.standbys if s != actual)
        warmup = plan.warmup if plan.warmup != actual else None
        out[p] = PartitionAssignment(actual, standbys, warmup)
    return out


def placement_json(
    assignment: Mapping[int, PartitionAssignment], versions: ReplicaVersions
) -> dict[int, dict[str, Any]]:
    """The commit's ``placement``: each partition's executor, its replicas and their last known versions."""
    out: dict[int, dict[str, Any]] = {}
    for p, a in sorted(assignment.items()):
        entry = a.to_json()
        record: dict[str, Any] = {**entry.pop("active"), **entry}
        for standby in record["standbys"]:
            standby["version"] = versions.get((p, standby["host"]), 0)
        if "warmup" in record:
            record["warmup"]["version"] = versions.get((p, record["warmup"]["host"]), 0)
        out[p] = record
    return out


def standby_lag(
    assignment: Mapping[int, PartitionAssignment], versions: ReplicaVersions, committed_version: int
) -> dict[str, dict[str, int]]:
    """How many versions each standby replica is behind ``committed_version``, the version of the commit
    these metrics go into: per partition, by standby host (a replica of unknown version holds nothing, 0).

    A replica at the previous commit is 1 behind: the sync to this version starts after the commit.
    """
    return {
        str(p): {s.host: committed_version - versions.get((p, s.host), 0) for s in a.standbys}
        for p, a in sorted(assignment.items())
    }


def parse_placement(placement: Mapping[Any, Any]) -> dict[int, PartitionAssignment]:
    """The assignment recorded in a commit's ``placement`` (entries without a host are skipped: commits
    of old versions recorded executor ids only, which mean nothing to another application)."""
    out: dict[int, PartitionAssignment] = {}
    for p, entry in placement.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("host"), str):
            continue
        try:
            out[int(p)] = PartitionAssignment.from_json(
                {"active": entry, "standbys": entry.get("standbys", ()), "warmup": entry.get("warmup")}
            )
        except ValueError:
            continue
    return out


def replica_versions_of(placement: Mapping[Any, Any]) -> dict[tuple[int, str], int]:
    """The replica versions a commit's ``placement`` recorded, by ``(partition, host)``."""
    out: dict[tuple[int, str], int] = {}
    for p, entry in placement.items():
        if not isinstance(entry, Mapping):
            continue
        replicas = list(entry.get("standbys") or ())
        if isinstance(entry.get("warmup"), Mapping):
            replicas.append(entry["warmup"])
        for r in replicas:
            if (
                isinstance(r, Mapping)
                and isinstance(r.get("host"), str)
                and isinstance(r.get("version"), int)
            ):
                out[(int(p), r["host"])] = r["version"]
    return out


@dataclass(frozen=True)
class StageMove:
    """A partition whose task Spark ran on another executor than the plan's active, seen after the stage.

    ``reason`` is ``during-batch`` when the planned executor was lost (a failover: ``standby`` says
    whether the task ran on one of the partition's replicas), or ``elsewhere`` when the planned executor
    is still alive: Spark's scheduler placed the task elsewhere (its locality wait ran out, or the
    executor was busy). That is no failure and no failover; the partition simply lives there now."""

    partition: int
    planned: ExecutorIdentity
    ran: ExecutorIdentity
    reason: str
    standby: bool

    def to_json(self) -> dict[str, JsonValue]:
        """The form recorded in ``metrics.standby.moves``."""
        return {
            "partition": self.partition,
            "from": self.planned.executor_id,
            "to": self.ran.executor_id,
            "reason": self.reason,
            "from_host": self.planned.host,
            "to_host": self.ran.host,
        }


def moves_in_stage(
    assignment: Mapping[int, PartitionAssignment],
    ran: Mapping[int, ExecutorIdentity],
    alive: Callable[[], Sequence[ExecutorIdentity]] | None,
) -> list[StageMove]:
    """The partitions whose task ran (``ran``) elsewhere than ``assignment``'s active, classified
    (:class:`StageMove`). ``alive`` (the executors alive after the stage) is asked only when a task ran
    elsewhere: an executor lost during the stage is gone from it by then, since Spark runs a lost task
    again only once it has declared its executor lost. Without ``alive`` (no JVM helper to ask) every
    such task counts as a failover."""
    moved: list[StageMove] = []
    live: set[ExecutorIdentity] | None = None
    for p, executor in sorted(ran.items()):
        a = assignment.get(p)
        if a is None or executor == a.active:
            continue
        if live is None:
            live = set(alive()) if alive is not None else set()
        lost = a.active not in live
        moved.append(
            StageMove(
                p, a.active, executor, "during-batch" if lost else "elsewhere", executor in a.replicas()
            )
        )
    return moved
