"""Figures the driver computes for each commit from its tasks' metadata (no Spark session)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from blobstate.engine.driver import BatchDriver
from blobstate.engine.executor_identity import ExecutorIdentity
from blobstate.standby.assignment import PartitionAssignment, Plan


def standby_metrics(plan: Plan, metas: dict[int, dict[str, Any]], versions: dict) -> dict[str, Any]:
    """``BatchDriver._standby_metrics`` for a driver that knows ``versions`` of the replicas."""
    driver = SimpleNamespace(
        config=SimpleNamespace(standby_replicas=1), syncer=None, _replica_versions=lambda: versions
    )
    return BatchDriver._standby_metrics(driver, plan, metas)  # type: ignore[arg-type]


def test_commit_lag_versions_count_from_the_version_being_committed() -> None:
    a, b = ExecutorIdentity("1", "127.0.0.2"), ExecutorIdentity("2", "127.0.0.3")
    plan = Plan({0: PartitionAssignment(a, (b,))})
    lags = []
    for version in (2, 3, 4):  # the replica stays at version 1
        metas = {0: {"version": version, "executor_id": "1", "host": "127.0.0.2"}}
        lags.append(standby_metrics(plan, metas, {(0, "127.0.0.3"): 1})["lag_versions"]["0"]["127.0.0.3"])
    assert lags == [1, 2, 3]
