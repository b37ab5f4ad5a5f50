"""Figures the driver computes for each commit from its tasks' metadata (no Spark session)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from blobstate.batch.executor import ExecutorIdentity
from blobstate.engine.driver import BatchReport
from blobstate.engine.recovery import retried_partitions, spark_recovery_seconds
from blobstate.standby.assignment import PartitionAssignment, Plan
from blobstate.standby.step import StandbySettings, StandbyStep


def standby_metrics(plan: Plan, metas: dict[int, dict[str, Any]], versions: dict) -> dict[str, Any]:
    """The standby step's ``metrics.standby`` for a query that knows ``versions`` of the replicas."""
    syncer = SimpleNamespace(replica_versions=lambda: versions, take_rounds=lambda: [])
    step = StandbyStep(StandbySettings(num_partitions=1, operator="0", standby_replicas=1), None, syncer)  # type: ignore[arg-type]
    results = {p: SimpleNamespace(**m) for p, m in metas.items()}
    return step._metrics(plan, results)  # type: ignore[arg-type]


def test_commit_lag_versions_count_from_the_version_being_committed() -> None:
    a, b = ExecutorIdentity("1", "127.0.0.2"), ExecutorIdentity("2", "127.0.0.3")
    plan = Plan({0: PartitionAssignment(a, (b,))})
    lags = []
    for version in (2, 3, 4):  # the replica stays at version 1
        metas = {0: {"version": version, "executor_id": "1", "host": "127.0.0.2"}}
        lags.append(standby_metrics(plan, metas, {(0, "127.0.0.3"): 1})["lag_versions"]["0"]["127.0.0.3"])
    assert lags == [1, 2, 3]


def meta(started_at: float, attempt: int = 0, task_seconds: float = 0.4) -> dict[str, Any]:
    return {"started_at": started_at, "attempt": attempt, "task_seconds": task_seconds, "stage_id": 7}


# Task metadata as an ordinary batch of a shuffled input records it: the stage took 52.4 s, most of it
# reading and shuffling the input before the processing tasks (0.4 s each) started at t=1048.
T = 1000.0
ORDINARY = {0: meta(T + 48.0), 1: meta(T + 48.05)}


def test_an_ordinary_batch_recovers_nothing_whatever_its_stage_time() -> None:
    # (stage time beyond the slowest task, which this figure used to be, is 52.0 s here)
    assert spark_recovery_seconds(ORDINARY, submitted_at=T) == 0.0


def test_a_task_run_again_after_its_executor_was_lost_counts_from_the_stage_start_to_the_retry() -> None:
    # partition 0's first attempt went to an executor that was gone; Spark noticed and ran it again at t+8
    metas = {0: meta(T + 8.0, attempt=1), 1: meta(T + 0.5)}
    assert retried_partitions(metas) == [0]
    assert spark_recovery_seconds(metas, submitted_at=T) == 7.5
    # every partition retried: counted from the job's submission
    assert spark_recovery_seconds({0: meta(T + 8.0, attempt=1)}, submitted_at=T) == 8.0


def test_a_stage_resubmitted_after_a_fetch_failure_counts_its_tasks_as_retries() -> None:
    # Spark resubmitted the stage at t+6 (attempt numbers start at 0 again): partition 1 ran in it
    metas = {0: meta(T + 0.5), 1: meta(T + 6.25)}
    assert retried_partitions(metas) == []
    assert retried_partitions(metas, resubmitted_at=T + 6.0) == [1]
    assert spark_recovery_seconds(metas, submitted_at=T, resubmitted_at=T + 6.0) == 5.75


def test_runs_discarded_before_the_committed_one_count() -> None:
    assert spark_recovery_seconds(ORDINARY, submitted_at=T, earlier_runs_seconds=3.25) == 3.25


def test_the_commit_and_progress_carry_recovery_and_overhead_apart() -> None:
    report = BatchReport(
        0, 1, 10, 10, 52.4, 0.1, 0, 0, 0, spark_recovery_seconds=0.0, spark_overhead_seconds=52.0
    )
    progress = report.progress_metrics()
    assert (progress["sparkRecoverySeconds"], progress["sparkOverheadSeconds"]) == (0.0, 52.0)
