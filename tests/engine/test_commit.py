"""A batch's commit from its plan, its tasks' results and the commit before it (no Spark, no I/O)."""

from __future__ import annotations

import pyarrow as pa

from blobstate.batch.contracts import BatchPlan, RunSpec
from blobstate.batch.steps import CommitPart
from blobstate.engine.commit import CommitContext, build_commit
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from task_results import a_result

OUTPUT = pa.schema([pa.field("key", pa.string())])


def plan(version: int, watermark_ms: int | None = None) -> BatchPlan:
    run = RunSpec(key_columns=("key",), output_schema=OUTPUT, watermark_ms=watermark_ms)
    return BatchPlan(version=version, uids={}, run=run)


def context(**changes: object) -> CommitContext:
    values: dict[str, object] = {"operator": "0", "writer": "w", "min_versions_to_retain": 3}
    values.update(changes)
    return CommitContext(**values)  # type: ignore[arg-type]


def results(version: int, **changes: object) -> dict[int, object]:
    return {p: a_result(partition=p, version=version, uid=f"{p}" * 32, **changes) for p in (1, 0)}


def test_the_commit_names_each_partitions_uid_objects_and_executor() -> None:
    commit = build_commit(plan(4), results(5), None, context(seconds=1.23456))  # type: ignore[arg-type]
    assert (commit.version, commit.batch_id, commit.writer) == (5, 4, "w")
    assert commit.checkpoints == {"0": {0: "0" * 32, 1: "1" * 32}}
    assert commit.objects["0"][0] == PartitionObjects(ObjectRef(10, "ab" * 32))
    assert commit.placement == {p: {"executor_id": "1", "host": "10.0.0.2"} for p in (0, 1)}
    assert commit.metrics is not None and commit.metrics["seconds"] == 1.235
    assert list(commit.metrics["partitions"]) == [0, 1]
    assert commit.metrics["objects"][0] == ["0/3/8_x.delta"]


def test_the_retained_window_and_horizon_follow_the_previous_commit() -> None:
    first = build_commit(plan(0), results(1), None, context())  # type: ignore[arg-type]
    assert (first.retained_from, first.horizon) == (1, 1)
    sixth = build_commit(plan(5), results(6), first, context(needed_from=3))  # type: ignore[arg-type]
    assert (sixth.retained_from, sixth.horizon) == (4, 3)  # 6 - 3 + 1; a cleanup found 3 still needed
    seventh = build_commit(plan(6), results(7), sixth, context(min_versions_to_retain=10))  # type: ignore[arg-type]
    assert (seventh.retained_from, seventh.horizon) == (4, 3)  # never below the previous commit's


def test_the_event_time_watermark_follows_the_largest_event_time_minus_the_delay() -> None:
    ctx = context(time_mode="EventTime", watermark_delay_ms=1_000)
    seen = {0: a_result(partition=0, version=3, max_event_time_ms=9_000)}
    commit = build_commit(plan(2, watermark_ms=5_000), seen, None, ctx)  # type: ignore[arg-type]
    assert commit.watermark_ms == 8_000 and commit.metrics["eviction_watermark_ms"] == 5_000  # type: ignore[index]
    late = {0: a_result(partition=0, version=3, max_event_time_ms=5_500)}
    assert build_commit(plan(2, watermark_ms=5_000), late, None, ctx).watermark_ms == 5_000  # type: ignore[arg-type]
    empty = {0: a_result(partition=0, version=3)}
    assert build_commit(plan(2, watermark_ms=5_000), empty, None, ctx).watermark_ms == 5_000  # type: ignore[arg-type]
    outside = build_commit(plan(2, watermark_ms=None), seen, None, context())  # type: ignore[arg-type]
    assert outside.watermark_ms is None


def test_each_steps_part_is_merged_into_the_commit() -> None:
    side = CommitPart(
        checkpoints={"0-rates": {0: "r" * 32}},
        objects={"0-rates": {0: PartitionObjects(ObjectRef(1, "cd" * 32))}},
        metrics={"adjuncts": {"rates": {"rows": 1}}},
        adjunct_offsets={"rates": [{"logOffset": 2}]},
    )
    placed = CommitPart(metrics={"standby": {"replicas": 1}}, placement={0: {"executor_id": "2"}})
    ctx = context(parts=(side, placed), metrics={"stage_attempts": 2}, source={"query_id": "q"})
    commit = build_commit(plan(0), results(1), None, ctx)  # type: ignore[arg-type]
    assert commit.checkpoints == {"0": {0: "0" * 32, 1: "1" * 32}, "0-rates": {0: "r" * 32}}
    assert commit.objects["0-rates"][0].delta.size == 1
    assert commit.placement == {0: {"executor_id": "2"}}
    assert commit.adjunct_offsets == {"rates": [{"logOffset": 2}]} and commit.source == {"query_id": "q"}
    metrics = commit.metrics or {}
    assert (metrics["stage_attempts"], metrics["standby"], metrics["adjuncts"]) == (
        2,
        {"replicas": 1},
        {"rates": {"rows": 1}},
    )
