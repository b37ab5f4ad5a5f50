"""Assignment of actives, standbys and warm-ups (``blobstate.standby.assignment``), over random churn.

A simulated cluster (hosts with executors, executors that die, hosts that die, replacements that join)
runs many planning rounds; after each round replicas catch up (some lag at random). Each round checks
the rules a user depends on: Invariant 1, sticky actives, failover to the freshest replica, fewer
standbys instead of an error, and that a new executor gets partitions within a bounded number of rounds.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from blobstate.batch.executor import ExecutorIdentity
from blobstate.standby.assignment import (
    PartitionAssignment,
    assignment_json,
    moves_in_stage,
    parse_assignment,
    placement_json,
    plan_assignment,
    standby_lag,
)


def ex(i: int, host: int) -> ExecutorIdentity:
    return ExecutorIdentity(str(i), f"127.0.0.{host}")


def check_invariant_1(
    plan_assignment_: dict[int, PartitionAssignment], alive: list[ExecutorIdentity]
) -> None:
    hosts = {e.host for e in alive}
    for p, a in plan_assignment_.items():
        assert a.active in alive, p
        assert a.active not in a.standbys, p
        assert len(set(a.standbys)) == len(a.standbys), p
        for s in a.standbys:
            assert s in alive
            if len(hosts) > 1:
                assert s.host != a.active.host, f"partition {p}: standby {s} on its active's host"
        other_hosts = len(hosts - {a.active.host})
        standby_hosts = [s.host for s in a.standbys]
        if other_hosts >= len(a.standbys):
            assert len(set(standby_hosts)) == len(standby_hosts), f"partition {p}: standbys share a host"


def test_three_hosts_one_replica_each_partition_gets_a_standby_on_another_host() -> None:
    alive = [ex(0, 2), ex(1, 3), ex(2, 4)]
    plan = plan_assignment(6, 1, {}, alive, {}, 0)
    check_invariant_1(plan.assignment, alive)
    assert Counter(a.active for a in plan.assignment.values()) == {e: 2 for e in alive}
    assert all(len(a.standbys) == 1 for a in plan.assignment.values())
    assert not plan.short_of_standbys and not plan.moves


def test_losing_a_host_moves_its_partitions_to_their_freshest_replica() -> None:
    alive = [ex(0, 2), ex(1, 3), ex(2, 4)]
    first = plan_assignment(3, 2, {}, alive, {}, 0).assignment
    victim = first[0].active
    versions = {}
    for p, a in first.items():
        for i, s in enumerate(a.standbys):
            versions[(p, s.host)] = 10 - i  # the first standby is fresher
    survivors = [e for e in alive if e != victim]
    plan = plan_assignment(3, 2, first, survivors, versions, 10)
    moved = [m for m in plan.moves if m.source == victim]
    assert moved and all(m.reason == "standby" for m in moved)
    for m in moved:
        assert m.target == first[m.partition].standbys[0]
    assert plan.active_failures == len(moved) and plan.failovers == len(moved)
    assert plan.failovers_without_standby == 0
    # Untouched partitions keep their executor.
    for p, a in first.items():
        if a.active != victim:
            assert plan.assignment[p].active == a.active
    check_invariant_1(plan.assignment, survivors)


def test_an_executor_replaced_on_the_same_host_keeps_its_partitions_there() -> None:
    alive = [ex(0, 2), ex(1, 3)]
    first = plan_assignment(4, 1, {}, alive, {}, 0).assignment
    replaced = [ex(2, 2), ex(1, 3)]  # executor 0 died; executor 2 started on its host
    plan = plan_assignment(4, 1, first, replaced, {}, 5)
    for p, a in first.items():
        if a.active == ex(0, 2):
            assert plan.assignment[p].active == ex(2, 2)
    assert {m.reason for m in plan.moves} == {"same-host"}
    assert plan.failovers == 0 and plan.failovers_without_standby == 0


def test_a_restarted_driver_resumes_the_recorded_assignment_by_host() -> None:
    old = plan_assignment(4, 1, {}, [ex(0, 2), ex(1, 3), ex(2, 4)], {}, 0).assignment
    recorded = parse_assignment(assignment_json(old))
    assert recorded == old
    # A new application: executor ids start again, on the same hosts in another order.
    new_executors = [ex(0, 4), ex(1, 2), ex(2, 3)]
    plan = plan_assignment(4, 1, recorded, new_executors, {}, 7)
    for p, a in old.items():
        assert plan.assignment[p].active.host == a.active.host
        assert [s.host for s in plan.assignment[p].standbys] == [s.host for s in a.standbys]


def test_fewer_executors_than_replicas_plus_one_gives_fewer_standbys_not_an_error() -> None:
    alive = [ex(0, 2), ex(1, 3)]
    plan = plan_assignment(2, 3, {}, alive, {}, 0)
    assert plan.short_of_standbys == {0: 1, 1: 1}
    check_invariant_1(plan.assignment, alive)
    lone = plan_assignment(2, 1, {}, [ex(0, 2)], {}, 0)
    assert lone.short_of_standbys == {0: 0, 1: 0}


def test_one_host_allows_standbys_on_the_actives_host() -> None:
    alive = [ex(0, 2), ex(1, 2)]
    plan = plan_assignment(2, 1, {}, alive, {}, 0)
    assert all(a.standbys and a.standbys[0] != a.active for a in plan.assignment.values())


def test_a_new_executor_gets_partitions_by_warm_up_then_move() -> None:
    one = [ex(0, 2)]
    assignment = plan_assignment(4, 0, {}, one, {}, 0).assignment
    alive = [ex(0, 2), ex(1, 3)]
    versions: dict[tuple[int, str], int] = {}
    moved_in_round = {}
    for version in range(1, 8):
        plan = plan_assignment(4, 0, assignment, alive, versions, version, max_warmups=1)
        assert sum(a.warmup is not None for a in plan.assignment.values()) <= 1
        for m in plan.moves:
            assert m.reason == "rebalance"
            assert versions.get((m.partition, m.target.host), 0) >= version - 1, "moved before warm"
            moved_in_round[m.partition] = version
        assignment = plan.assignment
        for p, a in assignment.items():  # replicas catch up after the batch
            for r in a.replicas():
                versions[(p, r.host)] = version
    assert Counter(a.active for a in assignment.values()) == {ex(0, 2): 2, ex(1, 3): 2}
    assert len(moved_in_round) == 2


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    partitions=st.integers(1, 12),
    replicas=st.integers(0, 2),
    hosts=st.integers(1, 4),
)
@example(seed=12, partitions=12, replicas=1, hosts=4)  # a partition was moved on again within one plan
def test_random_churn_keeps_the_invariants(seed: int, partitions: int, replicas: int, hosts: int) -> None:
    rng = random.Random(seed)
    next_id = 0
    alive: list[ExecutorIdentity] = []
    for h in range(hosts):
        for _ in range(rng.randint(1, 2)):
            alive.append(ex(next_id, h + 2))
            next_id += 1
    assignment: dict[int, PartitionAssignment] = {}
    versions: dict[tuple[int, str], int] = {}
    quiet_rounds = 0
    for version in range(0, 40):
        before = dict(assignment)
        plan = plan_assignment(partitions, replicas, assignment, alive, versions, version)
        assignment = plan.assignment
        assert sorted(assignment) == list(range(partitions))
        check_invariant_1(assignment, alive)
        assert sum(a.warmup is not None for a in assignment.values()) <= 2
        for p, a in before.items():
            if a.active in alive:  # a live executor keeps its partitions, but for rebalancing moves
                if assignment[p].active != a.active:
                    assert [m.reason for m in plan.moves if m.partition == p] == ["rebalance"]
            elif assignment[p].active.host != a.active.host:
                fresh = [versions.get((p, r.host), -1) for r in a.replicas() if r in alive]
                fresh = [v for v in fresh if v > 0]
                if fresh:
                    assert versions.get((p, assignment[p].active.host), -1) == max(fresh)
        expected_short = {p for p, a in assignment.items() if len(a.standbys) < replicas}
        assert set(plan.short_of_standbys) == expected_short
        for p, a in assignment.items():  # replicas catch up, some stay one behind
            for r in a.replicas():
                versions[(p, r.host)] = version - (1 if rng.random() < 0.2 else 0)
        # Churn.
        event = rng.random()
        if event < 0.1 and len(alive) > 1:
            alive.remove(rng.choice(alive))
            quiet_rounds = 0
        elif event < 0.15 and len({e.host for e in alive}) > 1:
            host = rng.choice(sorted({e.host for e in alive}))
            alive = [e for e in alive if e.host != host]
            quiet_rounds = 0
        elif event < 0.25:
            alive.append(ex(next_id, rng.randint(2, hosts + 2)))
            next_id += 1
            quiet_rounds = 0
        else:
            quiet_rounds += 1
    if quiet_rounds >= 3 * partitions:
        loads = Counter({e: 0 for e in alive})
        loads.update(a.active for a in assignment.values())
        assert max(loads.values()) - min(loads.values()) <= 1, loads


MALFORMED = [{"active": {"executor_id": 1, "host": "h"}}, {"standbys": []}, {"active": "x"}]


@pytest.mark.parametrize("raw", MALFORMED)
def test_a_malformed_recorded_assignment_is_refused(raw: dict) -> None:
    with pytest.raises(ValueError, match="malformed partition assignment"):
        PartitionAssignment.from_json(raw)


def test_standby_lag_counts_versions_behind_the_commit_it_is_recorded_in() -> None:
    # The replica of partition 0 stopped syncing at version 1; commits 2, 3 and 4 follow.
    assignment = {
        0: PartitionAssignment(ex(0, 2), (ex(1, 3),)),
        1: PartitionAssignment(ex(1, 3), (ex(0, 2),)),
    }
    lags = []
    for version in (2, 3, 4):
        versions = {(0, "127.0.0.3"): 1, (1, "127.0.0.2"): version - 1}
        lag = standby_lag(assignment, versions, version)
        placement = placement_json(assignment, versions)
        # the commit's lag agrees with the replica version its own placement records
        assert lag["0"]["127.0.0.3"] == version - placement[0]["standbys"][0]["version"]
        assert lag["1"] == {"127.0.0.2": 1}, "a replica at the previous commit is one version behind"
        lags.append(lag["0"]["127.0.0.3"])
    assert lags == [1, 2, 3]
    assert standby_lag({0: PartitionAssignment(ex(0, 2), (ex(1, 3),))}, {}, 5) == {"0": {"127.0.0.3": 5}}


# ------------------------------------------------------------------ tasks Spark ran elsewhere
def test_a_task_spark_ran_elsewhere_while_its_executor_lived_is_no_failover() -> None:
    """On a healthy cluster Spark may run a task on another executor (its locality wait ran out): that is
    ``elsewhere``, no failover; only a task whose planned executor is gone after the stage failed over
    (``during-batch``), to a standby or cold."""
    assignment = {
        0: PartitionAssignment(ex(0, 0), (ex(1, 1),)),
        1: PartitionAssignment(ex(1, 1), (ex(0, 0),)),
        2: PartitionAssignment(ex(2, 2), (ex(0, 0),)),
        3: PartitionAssignment(ex(0, 0), (ex(2, 2),)),
    }
    ran = {0: ex(0, 0), 1: ex(2, 2), 2: ex(0, 0), 3: ex(1, 1)}
    alive_after = [ex(0, 0), ex(1, 1)]  # executor 2 was lost during the stage
    moved = {m.partition: (m.reason, m.standby) for m in moves_in_stage(assignment, ran, lambda: alive_after)}
    assert moved == {1: ("elsewhere", False), 2: ("during-batch", True), 3: ("elsewhere", False)}


def test_the_executors_are_asked_only_when_a_task_ran_elsewhere() -> None:
    assignment = {0: PartitionAssignment(ex(0, 0), (ex(1, 1),))}

    def never() -> list[ExecutorIdentity]:
        raise AssertionError("asked the JVM for the executors")

    assert moves_in_stage(assignment, {0: ex(0, 0)}, never) == []
